"""Statistics of one simulated kernel launch.

Stage: simulator, step 5. In: the decoded commands, their `Timeline` and the hardware
description. Out: a frozen `KernelStats` (cycles, work, traffic, unit occupancy, the bounds of
roofline.py) with `to_dict()` and `to_json()`. The per-command timeline stays in the `Timeline`
(see simulate.simulate_detailed).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from fractions import Fraction

from .arch import HardwareDescription
from .commands import Command, DmaCommand
from .energy import launch_energy
from .isa import Op, Unit
from .roofline import ideal_cycles, launch_roofline
from .timing import Timeline


@dataclasses.dataclass(frozen=True)
class KernelStats:
    """What one kernel launch cost on the simulated NPU. Times in cycles of `arch`'s clock."""

    name: str
    source_ops: tuple[str, ...]  # model ops the kernel came from
    arch: str  # hardware description name
    cycles: int  # last command's end
    time_us: float  # cycles at the arch's clock
    # The model operator's multiply-accumulates: the kernel's MACs per output element (from the
    # launch) times the output's size; without that, the PE array's own (padded_macs).
    macs: int
    # The bound on this stream as issued (roofline.ideal_cycles): max(`macs` on the PE array at
    # peak, dma_load_bytes and dma_store_bytes each at the full DMA bandwidth), no latency. The
    # bytes moved, a tiling's reloads included: not the roofline (roofline_cycles, below).
    ideal_cycles: int
    utilisation: float  # `macs` / the PE array's MAC slots over `cycles` (0 without PE-array commands)
    dma_load_bytes: int  # bytes read from host memory (halo excluded)
    dma_store_bytes: int  # bytes written to host memory (halo excluded)
    dma_load_box_bytes: int  # bytes the load engine streamed (halo zeros included)
    dma_store_box_bytes: int  # bytes the store engine streamed (dropped halo included)
    busy_cycles: dict  # unit name (load, compute, store, vector) -> cycles spent running commands
    config_loads: int  # PE-array configuration loads
    num_commands: int
    op_counts: dict  # opcode name -> number of commands
    # Per unit, with busy + stall + idle == cycles (definitions in timing.py and docs/simulator.md):
    stall_cycles: dict = dataclasses.field(default_factory=dict)  # unit free, next command waits
    idle_cycles: dict = dataclasses.field(default_factory=dict)  # unit's last command has left it
    # Per source op: the model nodes (ONNX node names, "+"-joined) it came from, "" if unknown.
    source_nodes: tuple[str, ...] = ()
    # Per slot, the shape of the tensor the launch ran on (inputs, then the output): the sizes
    # of this launch when the kernel was compiled for symbolic ones.
    tensor_shapes: tuple[tuple[int, ...], ...] = ()
    # What the PE array executed: sum of m * n * k over its commands (GEMM, DEPTHWISE), the
    # padding of partial tiles included, and the MAC slots used / offered over `cycles`.
    padded_macs: int = 0
    array_utilisation: float = 0.0
    # Energy in pJ: the total and per component (energy.COMPONENTS: mac, vector, spad, dram,
    # config, leakage), priced by the description's energy table (energy.py).
    energy_pj: float = 0.0
    energy_breakdown: dict = dataclasses.field(default_factory=dict)
    # The roofline (roofline.py): DRAM bytes the launch cannot avoid (each host element it reads
    # loaded once, each it writes stored once; constant slots' part), and three bounds in cycles:
    # on an idle chip; on its own window when its constants may load during the launch before
    # (dma_prefetch); the load engine's compulsory work. Profile.roofline_cycles chains them.
    compulsory_load_bytes: int = 0
    compulsory_store_bytes: int = 0
    compulsory_constant_bytes: int = 0
    roofline_cycles: int = 0
    roofline_own_cycles: int = 0
    roofline_load_cycles: int = 0

    @property
    def model_nodes(self) -> tuple[str, ...]:
        """The model nodes the kernel came from, in order, each once."""
        return tuple(dict.fromkeys(n for nodes in self.source_nodes for n in nodes.split("+") if n))

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["source_ops"] = list(self.source_ops)
        data["source_nodes"] = list(self.source_nodes)
        data["tensor_shapes"] = [list(shape) for shape in self.tensor_shapes]
        return data

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=indent)


def collect_stats(arch: HardwareDescription, commands: list[Command], timeline: Timeline,
                  name: str, source_ops: tuple[str, ...], source_nodes: tuple[str, ...] = (),
                  tensor_shapes: tuple = (), macs_per_output: int | None = None,
                  macs_divisor: int = 1, constant_slots=()) -> KernelStats:
    """Sums the work, traffic and occupancy of a timed stream (`constant_slots`: the slots the
    runtime flags constant, for the roofline). `macs_per_output` / `macs_divisor`
    (the model operator's MACs per element of the last tensor; None or -1: unknown) gives `macs`,
    rounded down where the fraction times the size is not whole (a size the compiler did not see)."""
    gemms = [c for c in commands if c.op in (Op.GEMM, Op.DEPTHWISE)]  # the MACs (not a FABRIC body)
    loads = [c for c in commands if isinstance(c, DmaCommand) and c.op is Op.DMA_LOAD]
    stores = [c for c in commands if isinstance(c, DmaCommand) and c.op is Op.DMA_STORE]
    macs_of = Counter()  # dtype -> MACs: one exact division per dtype, not one per GEMM
    for gemm in gemms:
        macs_of[gemm.dtype] += gemm.macs
    pe_work = sum((Fraction(macs, arch.macs_per_pe[dtype.numpy_name]) for dtype, macs in macs_of.items()),
                  Fraction(0))
    padded_macs = sum(macs_of.values())
    macs = padded_macs
    if macs_per_output is not None and macs_per_output >= 0 and tensor_shapes:
        macs = macs_per_output * math.prod(int(d) for d in tensor_shapes[-1]) // macs_divisor
    # The model's work in PE-cycles: the array's, scaled (a kernel computes one dtype).
    model_work = pe_work * Fraction(macs, padded_macs) if padded_macs else Fraction(0)
    load_bytes = sum(c.host_bytes for c in loads)
    store_bytes = sum(c.host_bytes for c in stores)
    cycles = timeline.cycles
    counts = Counter(c.op.name for c in commands)
    stalls = timeline.stalls()
    energy = launch_energy(arch, commands, cycles, timeline.config_slots)
    roof = launch_roofline(arch, commands, model_work, constant_slots)
    return KernelStats(
        name=name,
        source_ops=tuple(source_ops),
        arch=arch.name,
        cycles=cycles,
        time_us=cycles / arch.clock_mhz,
        macs=macs,
        ideal_cycles=ideal_cycles(arch, model_work, load_bytes, store_bytes),
        utilisation=float(model_work / (cycles * arch.num_pes)) if gemms else 0.0,
        dma_load_bytes=load_bytes,
        dma_store_bytes=store_bytes,
        dma_load_box_bytes=sum(c.box_bytes for c in loads),
        dma_store_box_bytes=sum(c.box_bytes for c in stores),
        busy_cycles={unit.name.lower(): timeline.busy_cycles(unit) for unit in Unit},
        config_loads=timeline.config_loads,
        num_commands=len(commands),
        op_counts={op.name: counts.get(op.name, 0) for op in Op},
        stall_cycles={unit.name.lower(): timeline.stall_cycles(unit, stalls) for unit in Unit},
        idle_cycles={unit.name.lower(): timeline.idle_cycles(unit) for unit in Unit},
        source_nodes=tuple(source_nodes) if any(source_nodes) else (),
        tensor_shapes=tuple(tuple(int(d) for d in shape) for shape in tensor_shapes),
        padded_macs=padded_macs,
        array_utilisation=float(pe_work / (cycles * arch.num_pes)) if gemms else 0.0,
        energy_pj=sum(energy.values()),
        energy_breakdown=energy,
        compulsory_load_bytes=roof.load_bytes,
        compulsory_store_bytes=roof.store_bytes,
        compulsory_constant_bytes=roof.constant_bytes,
        roofline_cycles=roof.alone,
        roofline_own_cycles=roof.own,
        roofline_load_cycles=roof.load,
    )
