"""How many cycles one decoded command takes on its unit: the closed forms of cost.py read off a
command's fields, its scratchpad regions' bank slowdowns (banks.py) included.

Stage: simulator, step 4 (timing.py's helpers). In: a decoded command (decode.py) and the hardware
description. Out: cycles (a FABRIC: its configuration load, run cycles and context slots).
timing.py places these on the units' queues; the compiler's tile searches use cost.py's same
closed forms directly.
"""

from __future__ import annotations

from fractions import Fraction

from . import cost
from .arch import HardwareDescription
from .banks import beat_slowdown, operand_slowdown
from .commands import DepthwiseCommand, DmaCommand, EltwiseCommand, EpilogueCommand, FabricCommand, FillCommand, GemmCommand
from .fabric import Fabric
from .mapping import body as bodies
from .regions import Region


def gemm_steady_cycles(arch: HardwareDescription, cmd: GemmCommand) -> int:
    """Cycles the PE array streams a GEMM's operands, its bank slowdown included."""
    return cost.gemm_steady_cycles(arch, cmd.m, cmd.n, cmd.k, cmd.dtype.numpy_name, gemm_bank_slowdown(arch, cmd))


def gemm_bank_slowdown(arch: HardwareDescription, cmd: GemmCommand) -> Fraction:
    """How much slower than its folds a GEMM's A column streams (one element of each of
    min(m, rows) rows a cycle, a_stride apart) because its rows share banks; the scratchpad's
    bandwidth bound is cost.gemm_steady_cycles' own."""
    return operand_slowdown(min(cmd.m, arch.rows), cmd.a.strides[0], cmd.a.addr, cmd.dtype.itemsize,
                            arch.spad_banks, arch.bank_width_bytes)


def gemm_fill_cycles(arch: HardwareDescription, cmd: GemmCommand) -> int:
    return cost.gemm_fill_cycles(arch, cmd.m, cmd.n)


def depthwise_steady_cycles(arch: HardwareDescription, cmd: DepthwiseCommand) -> int:
    """Cycles a DEPTHWISE streams, from its scratchpad traffic: the span of its input window once
    (neighbouring outputs' taps are passed between PEs, not re-read), stretched by its bank
    slowdown, the weights once, and the accumulator written (read too when accumulating)."""
    acc_bytes = cmd.m * cmd.n * cmd.acc.dtype.itemsize * (2 if cmd.accumulate else 1)
    width = arch.spad_banks * arch.bank_width_bytes
    # The window streams at the scratchpad's full width, output pixels (x) apart: a pixel stride
    # that is not the channels' compact size can put one beat's pixels in one bank.
    size = cmd.dtype.itemsize
    window = (cmd.a.hi - cmd.a.lo) * beat_slowdown(width, (cmd.ow, cmd.n), (cmd.a.strides[1], size), size,
                                                    cmd.a.addr, arch.spad_banks, arch.bank_width_bytes)
    return cost.depthwise_steady_cycles(arch, cmd.m, cmd.n, cmd.k, cmd.dtype.numpy_name,
                                        window + cmd.k * cmd.n * size + acc_bytes)


def dma_transfer_cycles(arch: HardwareDescription, cmd: DmaCommand) -> int:
    """Cycles a DMA keeps its engine busy: the box, each beat (that many bytes of the box, in loop
    order) taking as many cycles as its busiest scratchpad bank."""
    return cost.dma_transfer_cycles(arch, cmd.box_bytes,
                                    region_slowdown(arch, arch.dma_bytes_per_cycle, cmd.region))


def vector_cycles(arch: HardwareDescription, cmd: FillCommand | EpilogueCommand) -> int:
    """Cycles of a FILL or EPILOGUE: its tiles through the lanes, the banks permitting."""
    tiles = (cmd.region,) if isinstance(cmd, FillCommand) else \
        tuple(r for r in (cmd.acc, cmd.residual, cmd.out) if r is not None)
    rows, cols = tiles[-1].shape
    streamed = 2 if isinstance(cmd, EpilogueCommand) and cmd.residual is not None else 1
    slowdown = max(region_slowdown(arch, arch.vector_lanes * tile.dtype.itemsize, tile) for tile in tiles)
    return cost.vector_cycles(arch, rows, cols, streamed, slowdown)


def region_slowdown(arch: HardwareDescription, beat: int, region: Region) -> Fraction:
    """How much a region streamed `beat` bytes a cycle is slowed by its busiest bank."""
    return beat_slowdown(beat, region.shape, region.strides, region.dtype.itemsize, region.addr,
                         arch.spad_banks, arch.bank_width_bytes)


def eltwise_reads(cmd: EltwiseCommand) -> int:
    """Elements an ELTWISE streams from the scratchpad: per operand, the extent of each axis it
    walks (a zero-stride axis is read once and held in registers)."""
    return sum(cost.eltwise_operand_reads(*operand.shape, bool(operand.strides[0]), bool(operand.strides[1]))
               for operand in (cmd.a, cmd.b))


def fabric_cycles(arch: HardwareDescription, cmd: FabricCommand) -> tuple[int, int, int]:
    """(configuration load, run) cycles of a FABRIC, its body's program on the chip's fabric, and
    the context slots that program takes in each PE (its II)."""
    program = bodies.program(cmd.body, cmd.dtype.numpy_name, Fabric.of(arch))
    rows, cols = cmd.out.shape
    traffic = (rows * cols + sum(cost.eltwise_operand_reads(rows, cols, bool(r.strides[0]), bool(r.strides[1]))
                                 for r in cmd.reads)) * (1 if cmd.int8 else cmd.dtype.itemsize)
    run = cost.fabric_run_cycles(arch, program, cmd.elements, traffic)
    return cost.fabric_config_cycles(arch, program.config_bytes), run, program.ii
