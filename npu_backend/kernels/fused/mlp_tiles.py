"""The fused MLP's tile search (mlp.py): rows per tile and hidden columns per block.

Stage: tiling. Among the (tm, th) whose buffers, each twice (double buffering), fit the
scratchpad, the one with the fewest estimated cycles; and the pair is fused only if that
estimate is below the two linears' own kernels' (their GEMM tile searches' estimates): otherwise
the search refuses, with the figures, and the two stay as they were. The estimate prices every
command with the simulator's cost model (cgra_sim.cost), as separable_tiles.py does: per row tile
the PE array's two GEMMs per block and, because a block's fc2 GEMM waits for its hidden's
EPILOGUE and activation, that vector work as a bubble on the PE array; the vector unit's FILLs,
EPILOGUEs and activation; the loads (A's panel once per row tile, both weights' blocks per
block, the residual) and the one store.
"""

from __future__ import annotations

import dataclasses
import functools

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ...errors import ScratchpadTooSmall, UnsupportedOperator
from ..common.spec import Tiling, aligned, round_up
from ..gemm.epilogue_tail import act_on_vector, tail_tile_cycles
from ..intrinsics.epilogue_tail import VFUNC_ACTS
from ..gemm.gemm import choose_gemm_tiling
from ..gemm.gemm_estimate import estimate_cycles as gemm_estimate_cycles
from ..gemm.gemm_estimate import may_hold_a_panel
from .separable_tiles import searched


@dataclasses.dataclass(frozen=True)
class MlpTiling(Tiling):
    """tm rows per tile; tk hidden columns per block (fc1's output block, fc2's reduction step);
    kp fc1's whole depth; hp the hidden padded to whole blocks; tn = np fc2's columns, whole;
    act_on_vector: fc1's smooth activation as one VFUNC (epilogue_tail.act_on_vector)."""

    hp: int = 0


def hidden_tiling(spec, tiling: MlpTiling) -> Tiling:
    """The tiling fc1's EPILOGUE intrinsic is sized by: tm x tk hidden columns."""
    del spec
    return Tiling(tiling.tm, tiling.tk, tiling.kp, tiling.mp, tiling.hp, tiling.kp, act_on_vector=tiling.act_on_vector)


def choose_mlp_tiling(spec, arch: HardwareDescription) -> MlpTiling:
    """The fitting tiling with the fewest estimated cycles; raises ScratchpadTooSmall or
    UnsupportedOperator (the pair stays two kernels), remembered per (spec, chip)."""
    return searched(_search, spec, arch)


@functools.lru_cache(maxsize=1024)
def _search(spec, arch: HardwareDescription):
    """(tiling, None), or (None, (error class, message))."""
    m, h, k = spec.fc1.gemm_extents
    n = spec.fc2.gemm_extents[1]
    kp, np_ = max(k, 2), round_up(max(n, 2), arch.cols)
    vfunc = act_on_vector(spec.fc1, arch)
    # b1 loaded into fc1's accumulator where its activation is one VFUNC (gemm/bias_acc.py)
    bias_in_acc = bool(spec.fc1.bias_shape) and not spec.fc1.relu and (spec.fc1.act in VFUNC_ACTS or (
        spec.fc1.act is not None and vfunc))
    best = None
    for tm in range(arch.rows, round_up(m, arch.rows) + 1, arch.rows):
        for th in range(arch.cols, round_up(h, arch.cols) + 1, arch.cols):
            hp = round_up(h, th)
            if hp - h >= arch.cols:  # a block of padding only
                continue
            tiling = MlpTiling(tm, np_, th, round_up(m, tm), np_, kp, act_on_vector=vfunc, hp=hp,
                               bias_in_acc=bias_in_acc)
            if footprint(spec, tiling) > arch.spad_bytes:
                continue
            key = (estimate_cycles(spec, tiling, arch), -tm * th)
            if best is None or key < best[0]:
                best = (key, tiling)
    what = f"MLP {m} x {k} -> {h} -> {n}"
    if best is None:
        return None, (ScratchpadTooSmall, (
            f"{what}: its smallest fused tile ({arch.rows} rows, {arch.cols} hidden columns, the whole depth and "
            f"output, double-buffered) does not fit the {arch.spad_bytes}-byte scratchpad of '{arch.name}'; "
            "the two linears run as separate kernels"))
    separate = separate_cycles(spec, arch)
    if best[0][0] >= separate:
        return None, (UnsupportedOperator, (
            f"{what}: fused, an estimated {best[0][0]} cycles on '{arch.name}' (tile {best[1].tm} rows x "
            f"{best[1].tk} hidden columns), against {separate} as two kernels; the two linears run as "
            "separate kernels"))
    return best[1], None


def footprint(spec, t: MlpTiling) -> int:
    """Scratchpad bytes of the kernel's buffers, each twice (lower/double_buffer.py)."""
    item = DType.from_name(spec.dtype).itemsize
    # A's panel, fc1's weight block, its accumulator, the tile's whole hidden, fc2's weight
    # block, the accumulator and the output tile (+ 8 elements a row: spad_layout's row padding)
    buffers = [t.tm * (t.kp + 8), t.tm * t.tk, t.tm * (t.hp + 8), t.tm * t.np, t.tm * t.np]
    if t.bias_in_acc:
        buffers.append(t.tm * t.tk // 2)  # the accumulator's third copy
    held = aligned(t.kp * t.hp * item) + aligned(t.hp * t.np * item)  # both weights, loaded once
    buffers += [t.tk] if spec.fc1.bias_shape else []
    buffers += [t.np] if spec.fc2.bias_shape else []
    buffers += [t.tm * t.np] if spec.fc2.residual_shape else []
    return held + sum(aligned(2 * elements * item) for elements in buffers)


def estimate_cycles(spec, t: MlpTiling, arch: HardwareDescription) -> int:
    """First-order cycles of the fused kernel (module doc), the busiest unit per row tile
    setting the pace (cost.double_buffered_cycles)."""
    fc1, fc2 = spec.fc1, spec.fc2
    item = DType.from_name(spec.dtype).itemsize
    blocks = t.hp // t.tk
    hidden = t.tm * t.tk
    tail = tail_tile_cycles(fc1, arch)
    act_array, act_vector = tail(hidden) if tail is not None else (0, 0)
    epilogue1 = act_vector + (0 if t.bias_in_acc else cost.vector_cycles(arch, t.tm, t.tk, 2 if fc1.bias_shape else 1))
    gemm1 = cost.gemm_steady_cycles(arch, t.tm, t.tk, t.kp, fc1.dtype) + cost.gemm_fill_cycles(arch, t.tm, t.tk)
    gemm2 = cost.gemm_steady_cycles(arch, t.tm, t.np, t.tk, fc2.dtype) + cost.gemm_fill_cycles(arch, t.tm, t.np)
    compute = blocks * (gemm1 + act_array + gemm2)
    operands2 = 1 + bool(fc2.bias_shape) + bool(fc2.residual_shape)
    # A tile's last fc2 GEMM and the next tile's first fc1 GEMM, in turn on the PE array, are a
    # bubble on the vector unit, which waits for them between the two tiles' activations.
    vector = blocks * epilogue1 + cost.vector_cycles(arch, t.tm, t.np, operands2) + gemm1 + gemm2 + \
        2 * arch.dma_latency
    block_load = ((t.tm if t.bias_in_acc else 1) * t.tk if fc1.bias_shape else 0) * item
    weights = (t.kp * t.hp + t.hp * t.np) * item
    tile_load = t.tm * t.kp * item + (t.tm * t.np * item if fc2.residual_shape else 0) + \
        (t.np * item if fc2.bias_shape else 0)
    store = t.tm * fc2.gemm_extents[1] * item
    tiles = t.mp // t.tm
    return cost.double_buffered_cycles(arch, cost.BufferedLoop(
        tiles, cost.dma_transfer_cycles(arch, tile_load + blocks * block_load), (compute, vector),
        cost.dma_transfer_cycles(arch, store), first_load=cost.dma_transfer_cycles(arch, weights + tile_load + block_load),
        last_work=0, round_trips=(), whole_last_step=True)).total


def separate_cycles(spec, arch: HardwareDescription) -> float:
    """The estimates of fc1's and fc2's own kernels (their GEMM tile searches'), infinite if
    either does not run alone (then the fused kernel is the only NPU form)."""
    total = 0
    for linear in (spec.fc1, spec.fc2):
        try:
            tiling = choose_gemm_tiling(linear, arch)
        except (ScratchpadTooSmall, UnsupportedOperator):
            return float("inf")
        item, acc = DType.from_name(linear.dtype).itemsize, DType.from_name(linear.acc_dtype).itemsize
        total += gemm_estimate_cycles(tiling, linear.dtype, item, acc, arch, bool(linear.residual_shape),
                                      tail_cycles=tail_tile_cycles(linear, arch), a_panel=may_hold_a_panel(linear))
    return total
