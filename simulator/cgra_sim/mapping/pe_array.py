"""The PE array's program for GEMM and DEPTHWISE: the systolic cell mapped on the chip's fabric,
and what that mapping makes every such command cost.

Stage: shared by the cost model (cost.py, so by the simulator's timing layer and the compiler's
tile searches alike) and `cgra-sim map --intrinsic mac`. No tvm.

GEMM and DEPTHWISE run on the PE fabric configured as a systolic array: every PE is a cell that
multiplies the operand arriving from its west neighbour by the one from its north neighbour, adds
the product to its accumulator and passes both operands on. The cell's body is the `mac`
intrinsic (intrinsics.mac: acc += a * b, its loads standing for the operands arriving, its store
for the drain), and the mapper maps it on the chip's fabric like any other body. Its mapping sets:

    step     cycles between two MACs of a cell: the mapping's II (the accumulator's recurrence
             through the adder, the registers that must hold a, b and the product at once, the
             units), times the turns the cells take on a multiplier where not every PE has one
             (ceil(PEs / multiplier PEs): a checkerboard's cells without one use a neighbour's).
             A GEMM's and a DEPTHWISE's steady cycles are their MAC steps times `step`.
    slots    the context slots the configuration takes in every PE (`step`): its configuration is
             PEs x slots x config_word_bits, loaded in cost.fabric_config_cycles of it
             (config_load_cycles a slot), and it shares the context memory with FABRIC bodies.
    fill     how operands reach the cells, from the fabric's latencies: a GEMM's skew moves them
             one PE a cycle (every cell must see each value, so express links do not shorten it):
             rows + cols - 2 cycles for a full array; a DEPTHWISE has no skew and pays one
             scratchpad read and the accumulate, latency[mem] + latency[alu].

Every preset maps the cell at II 1 with multipliers everywhere (step 1, one slot, fill 2 for a
DEPTHWISE), which are the closed forms the timing model had before its costs came from here: the
SCALE-Sim comparisons are unchanged. A fabric whose adder takes 2 cycles makes every GEMM twice as
long, because a cell can start a MAC only every other cycle; one with two registers a PE (the
heuristic maps the cell at II 3) three times; a checkerboard of multipliers twice.
"""

from __future__ import annotations

import dataclasses
import math
import weakref

from ..fabric import Fabric
from .intrinsics import mac
from .mapper import Mapping, MappingError, map_graph


class PeArrayError(ValueError):
    """The fabric cannot run the systolic cell (no mapping of the `mac` body)."""


@dataclasses.dataclass(frozen=True)
class PeArrayProgram:
    cell: Mapping  # the `mac` body's mapping on the chip's fabric
    share: int  # cells taking turns on one multiplier
    depthwise_fill: int

    @property
    def step(self) -> int:
        """Cycles between two MACs of one cell."""
        return self.cell.ii * self.share

    @property
    def slots(self) -> int:
        return self.step


def cell_dtype(dtype: str) -> str:
    """The cell's arithmetic for a PE-array input dtype: float32 (float32, and bfloat16 / float16
    accumulating in float32), or an integer one (int8 into int32; int16 x int8 into int64, timed as
    the same single-cycle integer cell)."""
    return "int32" if dtype in ("int8", "int16") else "float32"


# id(arch) -> (a weak reference to it, {cell dtype: program}): the tile searches ask per candidate.
_PROGRAMS: dict[int, tuple] = {}


def program(arch, dtype: str) -> PeArrayProgram:
    """The PE array's program on `arch`'s fabric for `dtype` inputs (cached per description)."""
    entry = _PROGRAMS.get(id(arch))
    if entry is None or entry[0]() is not arch:
        entry = _PROGRAMS[id(arch)] = (weakref.ref(arch, lambda _, key=id(arch): _PROGRAMS.pop(key, None)), {})
    programs = entry[1]
    kind = cell_dtype(dtype)
    if kind not in programs:
        programs[kind] = _program(Fabric.of(arch), kind)
    return programs[kind]


def _program(fabric: Fabric, kind: str) -> PeArrayProgram:
    try:
        cell = map_graph(mac(kind), fabric)
    except MappingError as error:
        raise PeArrayError(f"GEMM and DEPTHWISE need the systolic cell (acc += a * b) on every PE, and the "
                           f"fabric cannot run it: {error}") from None
    share = math.ceil(fabric.num_pes / fabric.units("mul"))
    return PeArrayProgram(cell, share, fabric.latency["mem"] + fabric.latency["alu"])
