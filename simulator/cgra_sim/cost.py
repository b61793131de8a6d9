"""The cost model: how many cycles one command of each kind keeps its unit busy, in closed form.

Stage: shared by the simulator's timing layer (timing.py, which reads a decoded command's sizes
and bank slowdowns and adds the queues, the dependencies and the PE array's state) and the
compiler's tile searches (npu_backend/kernels, which call these with a candidate tile's sizes and
price the tiled loop with `double_buffered_cycles`). Plain ints in, ints out (slowdowns are exact
Fractions >= 1 from banks.py); no decoded commands, no tvm. One formula, one place: the compiler's
estimates cannot drift from what the simulator charges.

    DMA          dma_latency + ceil(box_bytes / dma_bytes_per_cycle) * slowdown
                 box_bytes counts every box element, halo included (the engine makes zeros at
                 full rate); the engine is busy for the transfer, the latency only delays the end.
    FILL,        ceil(operands * rows * cols / vector_lanes) * slowdown + VECTOR_OVERHEAD_CYCLES
    EPILOGUE     operands: tiles streamed through the lanes' one read port (1, or 2 for an
                 EPILOGUE with a residual); the bias row and clip bounds sit in registers, relu,
                 clip and requantisation are more stages of the lanes' pipeline (free).
    POOL         ceil(oh * ow * n * kh * kw / vector_lanes) + VECTOR_OVERHEAD_CYCLES
                 every tap of the window, valid or not (the rectangles only mask lanes).
    ELTWISE      ceil(max(rows * cols, reads) / vector_lanes) + VECTOR_OVERHEAD_CYCLES
                 reads: the elements of both operands the command streams (a broadcast axis,
                 stride 0, is read once and held in registers, as EPILOGUE's bias row is).
    REDUCE       ceil(rows / vector_lanes) * cols + VECTOR_OVERHEAD_CYCLES
                 a lane folds one row, a column a cycle (the order the ISA specifies)
    VFUNC        lanes:  ceil(rows * cols * depth / vector_lanes) + VECTOR_OVERHEAD_CYCLES
                 unit:   max(k depth, ceil((rows * cols - k vector_lanes) / function_unit.lanes)
                             + depth - 1) + VECTOR_OVERHEAD_CYCLES
                 depth: the lane operations of the function's specified sequence (special.OPS,
                 a divide or square root counting 4), + 1 for each of the scale and offset. On
                 the lanes an element takes its sequence one operation a cycle; a chip whose
                 `function_unit` has the function pipelines it (function_unit.py): an element
                 a pipeline a cycle, plus the fill, while the lanes run k rounds of an element
                 a lane beside it (k balancing the two: function_unit.split; 0 for a short
                 VFUNC). The command runs where it ends first. On the unit the vector unit is
                 busy only while it issues the elements and runs its rounds,
                 max(k depth, ceil((rows * cols - k vector_lanes) / function_unit.lanes))
                 + VECTOR_OVERHEAD_CYCLES (`vfunc_issue_cycles`); the fill delays the end (its
                 results), as a DMA's latency does: the next command, a VFUNC into the same
                 pipelines too, starts while the last elements are still in the stages.
    UNPACK4      ceil(rows * cols / vector_lanes) + VECTOR_OVERHEAD_CYCLES
                 a nibble a lane a cycle: select, subtract the zero point, convert, scale
    LOOKUP       ceil(rows * cols / vector_lanes) + VECTOR_OVERHEAD_CYCLES
                 an element a lane a cycle: its byte indexes the 256-byte table (a register file)
    GEMM         steady = ceil(m / rows) * ceil(n / cols) * ceil(k / macs_per_pe)
                          * max(step, A's bank conflict, operand bytes a cycle / scratchpad bytes a cycle)
                 fill   = min(m, rows) + min(n, cols) - 2 (the sub-array the GEMM occupies)
    DEPTHWISE    steady = max(ceil(m / rows) * ceil(n / cols) * ceil(k / macs_per_pe) * step,
                              ceil(scratchpad traffic / (spad_banks * bank_width_bytes)))
                 fill   = latency[mem] + latency[alu] (operand read and accumulate: no systolic skew)
                 step (cycles between a cell's MACs), the fill's latencies and the configuration
                 (config_load_cycles a context slot) come from the systolic cell's mapping on the
                 chip's fabric (mapping/pe_array.py); every preset: step 1, one slot
    FABRIC       steady = max((ceil(elements / lanes) - 1) * II, ceil(scratchpad traffic / bank bandwidth))
                 fill   = the mapping's latency (one iteration's first load to its last store)
                 lanes, II and latency are the body's mapping's (mapping/body.py); loading its
                 configuration takes config_bytes at the bandwidth that loads a one-slot
                 configuration of every PE in config_load_cycles (fabric_config_cycles)

    LOOP         a double-buffered loop of steps (load, work, store): `double_buffered_cycles`,
                 the one overlap estimate of every tile search (below)

How the PE array overlaps consecutive GEMMs (a fill hidden under the previous drain, partial
sums kept in the array) and how the four queues overlap is the timing layer's (timing.py); the
assumptions behind every number are in docs/simulator.md.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from . import function_unit
from .arch import HardwareDescription
from .banks import slowed
from .isa import DType
from .mapping import pe_array

ONE = Fraction(1)
VECTOR_OVERHEAD_CYCLES = 2  # issue + write-back of a vector-unit command


def _itemsize(dtype: str) -> int:
    return DType.from_name(dtype).itemsize


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def dma_transfer_cycles(arch: HardwareDescription, nbytes: int, slowdown: Fraction = ONE) -> int:
    """Cycles a DMA keeps its engine busy moving `nbytes` (halo included), stretched by the
    scratchpad banks' `slowdown` of its beats."""
    return slowed(_ceil(nbytes, arch.dma_bytes_per_cycle), slowdown)


def dma_cycles(arch: HardwareDescription, nbytes: int, slowdown: Fraction = ONE) -> int:
    """Cycles from a DMA's issue to its end: the latency, then the transfer."""
    return arch.dma_latency + dma_transfer_cycles(arch, nbytes, slowdown)


def vector_stream_cycles(arch: HardwareDescription, elements: int, slowdown: Fraction = ONE) -> int:
    """Cycles the vector unit's lanes take to stream `elements` through its one read port."""
    return slowed(_ceil(elements, arch.vector_lanes), slowdown)


def vector_cycles(arch: HardwareDescription, rows: int, cols: int, operands: int = 1,
                  slowdown: Fraction = ONE) -> int:
    """Cycles of a FILL or EPILOGUE over a rows x cols tile streaming `operands` tiles."""
    return vector_stream_cycles(arch, operands * rows * cols, slowdown) + VECTOR_OVERHEAD_CYCLES


def pool_cycles(arch: HardwareDescription, taps: int) -> int:
    """Cycles of a POOL stepping through `taps` window elements (oh * ow * n * kh * kw)."""
    return _ceil(taps, arch.vector_lanes) + VECTOR_OVERHEAD_CYCLES


def eltwise_cycles(arch: HardwareDescription, elements: int, reads: int) -> int:
    """Cycles of an ELTWISE writing `elements` outputs and streaming `reads` operand elements."""
    return _ceil(max(elements, reads), arch.vector_lanes) + VECTOR_OVERHEAD_CYCLES


def eltwise_operand_reads(rows: int, cols: int, walks_rows: bool, walks_cols: bool) -> int:
    """Elements an ELTWISE streams of one operand of a rows x cols tile: a broadcast axis
    (stride 0) is read once."""
    return (rows if walks_rows else 1) * (cols if walks_cols else 1)


def reduce_cycles(arch: HardwareDescription, rows: int, cols: int) -> int:
    """Cycles of a REDUCE over a rows x cols tile: a lane a row, a column a cycle."""
    return _ceil(rows, arch.vector_lanes) * cols + VECTOR_OVERHEAD_CYCLES


def vfunc_cycles(arch: HardwareDescription, elements: int, func: str, scale: bool = False,
                 offset: bool = False) -> int:
    """Cycles of a VFUNC computing `func` ("exp", ...: special.OPS) over `elements` elements: on
    the lanes, a sequence's operation a cycle each, or, when the chip has a function unit with
    `func`, through its pipelines with rounds of the lanes beside them where that ends sooner
    (function_unit.split)."""
    return _vfunc_split(arch, elements, func, scale, offset)[1] + VECTOR_OVERHEAD_CYCLES


def vfunc_issue_cycles(arch: HardwareDescription, elements: int, func: str, scale: bool = False,
                       offset: bool = False) -> int:
    """Cycles a VFUNC keeps the vector unit busy: `vfunc_cycles` on the lanes alone; with the
    function unit the issue of its elements and the lanes' rounds beside it, its pipelines' fill
    after that delaying its end, not the next command."""
    return _vfunc_split(arch, elements, func, scale, offset)[0] + VECTOR_OVERHEAD_CYCLES


def _vfunc_split(arch: HardwareDescription, elements: int, func: str, scale: bool, offset: bool) -> tuple[int, int]:
    """(issue, end) of a VFUNC without the overhead (function_unit.split)."""
    depth = function_unit.depth(func, scale, offset)
    if function_unit.runs(arch.function_unit, func):
        return function_unit.split(arch.function_unit, arch.vector_lanes, elements, depth)
    lanes = _ceil(elements * depth, arch.vector_lanes)
    return lanes, lanes


def unpack4_cycles(arch: HardwareDescription, elements: int) -> int:
    """Cycles of an UNPACK4 writing `elements` float32 weights: a lane's pipeline takes a nibble a
    cycle (select, subtract the zero point, convert, multiply by the scale: stages, like the
    EPILOGUE's requantisation)."""
    return _ceil(elements, arch.vector_lanes) + VECTOR_OVERHEAD_CYCLES


def lookup_cycles(arch: HardwareDescription, elements: int) -> int:
    """Cycles of a LOOKUP over `elements` int8 elements: a lane reads a table entry a cycle (the
    256 bytes held beside the lanes as the EPILOGUE's scale row is)."""
    return _ceil(elements, arch.vector_lanes) + VECTOR_OVERHEAD_CYCLES


def pe_folds(arch: HardwareDescription, m: int, n: int) -> int:
    """Passes of the rows x cols PE array an m x n output takes."""
    return _ceil(m, arch.rows) * _ceil(n, arch.cols)


def gemm_steady_cycles(arch: HardwareDescription, m: int, n: int, k: int, dtype: str,
                       slowdown: Fraction = ONE) -> int:
    """Cycles a GEMM streams operands through the array: its folds, k per MAC rate each, a MAC
    step (pe_array's `step`, 1 on the presets) apart, stretched when the scratchpad cannot feed
    the array. `slowdown`: A's rows conflicting in the banks (command_cycles.gemm_bank_slowdown of a
    command; 1, the default, for a tile search that lays its tiles out conflict-free); the
    bandwidth bound (`gemm_bandwidth_slowdown`) is applied here, so a tile's sizes alone give its
    cycles."""
    step = pe_array.program(arch, dtype).step
    stretch = max(Fraction(step), slowdown, gemm_bandwidth_slowdown(arch, m, n, k, dtype))
    return slowed(pe_folds(arch, m, n) * _ceil(k, arch.macs_per_pe[dtype]), stretch)


def gemm_bandwidth_slowdown(arch: HardwareDescription, m: int, n: int, k: int, dtype: str) -> Fraction:
    """A GEMM's operand bytes a cycle over the scratchpad's: each MAC step the array takes the k
    elements of each of min(m, rows) rows of A and of min(n, cols) columns of B spread over its
    ceil(k / macs_per_pe[dtype]) steps (macs_per_pe of them a step, fewer in the last; so more
    MACs a PE are never slower). At most 1 on every preset, and with four int8 MACs a PE (the
    bytes of one float32 operand) too: the banks keep up."""
    lanes = min(m, arch.rows) + min(n, arch.cols)
    per_lane = Fraction(k, _ceil(k, arch.macs_per_pe[dtype]))
    return Fraction(lanes * _itemsize(dtype) * per_lane, arch.spad_banks * arch.bank_width_bytes)


def gemm_fill_cycles(arch: HardwareDescription, m: int, n: int) -> int:
    """Pipeline fill and drain of the sub-array an m x n GEMM occupies (rows + cols - 2 when full):
    the sub-array rather than the whole array, so a tile sized for a smaller array does not get
    slower on a larger one."""
    return min(m, arch.rows) + min(n, arch.cols) - 2


def depthwise_compute_cycles(arch: HardwareDescription, m: int, n: int, k: int, dtype: str) -> int:
    """Cycles the PE array computes a DEPTHWISE of m output pixels, n channels and k taps, a PE
    per output, one tap (per MAC lane) a MAC step."""
    return pe_folds(arch, m, n) * _ceil(k, arch.macs_per_pe[dtype]) * pe_array.program(arch, dtype).step


def depthwise_fill_cycles(arch: HardwareDescription, dtype: str) -> int:
    """Cycles before a DEPTHWISE's first result: the operand's read and the accumulate."""
    return pe_array.program(arch, dtype).depthwise_fill


def pe_array_config_cycles(arch: HardwareDescription, dtype: str) -> int:
    """Cycles to load the PE array's GEMM or DEPTHWISE configuration: its context slots in every
    PE, config_load_cycles a slot (cost.fabric_config_cycles of its bytes)."""
    return arch.config_load_cycles * pe_array.program(arch, dtype).slots


def pe_array_slots(arch: HardwareDescription, dtype: str) -> int:
    """Context slots the PE array's configuration takes in every PE."""
    return pe_array.program(arch, dtype).slots


def depthwise_steady_cycles(arch: HardwareDescription, m: int, n: int, k: int, dtype: str,
                            traffic_bytes) -> int:
    """Cycles a DEPTHWISE (m output pixels, n channels, k taps) streams: the PE array's folds, or
    the scratchpad's bandwidth if slower. `traffic_bytes` (an int or a Fraction, the window's
    span stretched by its bank slowdown): the window read once, the weights once, the
    accumulator written (and read when accumulating)."""
    compute = depthwise_compute_cycles(arch, m, n, k, dtype)
    traffic = Fraction(traffic_bytes)
    width = arch.spad_banks * arch.bank_width_bytes
    return max(compute, -(-traffic.numerator // (traffic.denominator * width)))


def fabric_steady_cycles(arch: HardwareDescription, elements: int, lanes: int, ii: int, traffic_bytes: int) -> int:
    """Cycles after the first iteration of a FABRIC body mapped `lanes` elements per iteration
    at `ii` over `elements` elements, or the scratchpad's bandwidth for its `traffic_bytes` if
    slower."""
    iterations = _ceil(elements, lanes)
    return max((iterations - 1) * ii, _ceil(traffic_bytes, arch.spad_banks * arch.bank_width_bytes))


def fabric_run_cycles(arch: HardwareDescription, program, elements: int, traffic_bytes: int) -> int:
    """Cycles a FABRIC runs its body's mapped `program` (mapping/body.py: latency, lanes, II)
    over `elements` elements moving `traffic_bytes` through the scratchpad: the first
    iteration's latency, then the steady iterations (configuration load not included)."""
    return program.latency + fabric_steady_cycles(arch, elements, program.lanes, program.ii, traffic_bytes)


def fabric_config_cycles(arch: HardwareDescription, config_bytes: int) -> int:
    """Cycles to load a mapped body's configuration of `config_bytes`: `config_load_cycles` loads
    one configuration word (`fabric.config_word_bits`) into every PE, the GEMM's configuration."""
    whole_array = arch.rows * arch.cols * arch.fabric["config_word_bits"]  # bits
    return _ceil(config_bytes * 8 * arch.config_load_cycles, whole_array)


# ------------------------------------------------------------------ double-buffered loops

#: The buffer round trips that can bound a double-buffered step (two copies of a buffer: the
#: step two later reuses it only after this step is done with it; timing.py's scoreboard):
#:   "load"   the input buffer: its load (DMA latency + transfer), then the first work stage
#:            reading it          -> (dma_latency + load + work[0]) / 2 a step
#:   "store"  the output buffer: the work stages writing it, then its store (latency +
#:            transfer) reading it -> (sum(work) + dma_latency + store) / 2
ROUND_TRIPS = ("load", "store")


@dataclasses.dataclass(frozen=True)
class BufferedLoop:
    """A double-buffered loop of `steps` steps, each loaded, worked on and stored: cycles each
    unit is busy a step, the DMA latency excluded (dma_transfer_cycles, vector_cycles, ...).

    work: the cycles of each unit the step's data passes through in order (the PE array, then
        the vector unit); units working side by side are `others`.
    first_load / last_store / last_work: the prologue's load (the first step's, or a first
        block's), the tail's store, and the work after the last steady step that nothing
        overlaps (defaults: load, store, sum(work)).
    others: the busiest unit's cycles over the whole loop for work outside the steps (a GEMM's
        EPILOGUE per output tile, its PE array fill); it bounds the loop beside steps * step.
    stalls: cycles the loop waits beside its steps (a GEMM's PE array waiting for a tile's
        EPILOGUE); steady: the loop's steady cycles when its steps are not alike (a symbolic
        extent's cut last block: the caller sums each kind's `step`), replacing steps * step.
    round_trips: the buffer round trips (ROUND_TRIPS) that bound a step beside the busiest unit.
    copies: the buffers each step's data rotates through (2: double buffered); a round trip bounds
        `copies` steps, so a third copy shortens the bound on a step to a third of it.
    held_load: the load of every step after the first `copies` when it is smaller (a padded
        window whose halo stays in its buffer copy: lower/held_halos.py loads the inside alone).
    whole_last_step: price the last step as a whole steady step (then last_work follows it)
        rather than as its work: the coarser form the GEMM, pool, global pool, depthwise,
        separable and inverted residual searches were tuned with (the plain tail picks slower
        tiles for some of them; each says which). The eltwise and unary searches use the plain
        loop, the defaults.
    """

    steps: int
    load: int
    work: tuple = (0,)
    store: int = 0
    first_load: int | None = None
    last_store: int | None = None
    last_work: int | None = None
    others: int = 0
    stalls: int = 0
    steady: int | None = None
    round_trips: tuple = ("load", "store")
    whole_last_step: bool = False
    copies: int = 2
    held_load: int | None = None

    def __post_init__(self):
        unknown = set(self.round_trips) - set(ROUND_TRIPS)
        if unknown or self.steps < 0:
            raise ValueError(f"a double-buffered loop of {self.steps} steps with round trips {self.round_trips}: "
                             f"steps >= 0, round trips among {ROUND_TRIPS}")


@dataclasses.dataclass(frozen=True)
class LoopCycles:
    """A double-buffered loop's estimate: the prologue (the first load, which nothing overlaps),
    the steady step, the tail (the last work and store) and the total."""

    prologue: int
    step: int
    tail: int
    total: int


def buffered_step_cycles(arch: HardwareDescription, loop: BufferedLoop) -> int:
    """Cycles between steps in the steady state: the busiest unit, or a buffer's round trip
    (ROUND_TRIPS) over its copies (half of it, double buffered) when that is longer."""
    work, latency = sum(loop.work), arch.dma_latency
    trips = {"load": latency + loop.load + loop.work[0], "store": work + latency + loop.store}
    return max(loop.load, *loop.work, loop.store, *(_ceil(trips[name], loop.copies) for name in loop.round_trips))


def double_buffered_cycles(arch: HardwareDescription, loop: BufferedLoop) -> LoopCycles:
    """The one overlap estimate of a double-buffered loop (every tile search's): the first load
    with its DMA latency, then a steady step per further step (`buffered_step_cycles`), then the
    last step's work and its store with the latency:
        total = prologue + max(steady steps * step, others) + stalls + tail
    (steady steps: steps - 1, or steps with `whole_last_step`; those after the first `copies`
    steps priced with `held_load` when it is given)."""
    step = buffered_step_cycles(arch, loop)
    first = loop.load if loop.first_load is None else loop.first_load
    last = loop.store if loop.last_store is None else loop.last_store
    prologue = arch.dma_latency + first
    tail = (sum(loop.work) if loop.last_work is None else loop.last_work) + arch.dma_latency + last
    steady = loop.steady
    if steady is None:
        steady = (loop.steps if loop.whole_last_step else max(loop.steps - 1, 0)) * step
        if loop.held_load is not None and loop.steps > loop.copies:  # steps `copies`.. load the inside
            held = buffered_step_cycles(arch, dataclasses.replace(loop, load=loop.held_load, held_load=None))
            # (the whole last step is the last step's, held too)
            steady -= (loop.steps - loop.copies + loop.whole_last_step) * (step - held)
    total = prologue + max(steady, loop.others) + loop.stalls + tail
    return LoopCycles(prologue, step, tail, total)
