"""Whether a pre-norm fold (row_norm.py) pays for the tiling it forces on the GEMM.

Stage: tiling (gemm.choose_gemm_tiling calls `check_fold_pays` after row_norm.check_row_norm).
In: a float32 GEMM spec with a pre-norm on its rows, the tiling the search chose for the fold,
the chip. Out: nothing, or UnsupportedOperator when the fold is estimated dearer than the GEMM
at its own best tiling plus the norm's own kernel: the norm then runs on its own (as
post_norm_cost.check_post_norm decides for a post-norm).

Why: the fold's panel program needs each row tile's whole rows (tk = K) and the scratchpad
room for its intermediate panels (row_norm.panel_bytes), and the kernel loads every weight tile
once per row tile. With few rows and large weights the room runs out: Swin-T's and ConvNeXt-T's
stage-4 layer norm + fc1 (49 x 768 -> 3072, 9.4 MB of float32 weights) on cgra-8x8 fitted only
8-row tiles (a 56-row panel's program needs 517 KB of the 256 KB), and loaded the weights seven
times: 4,146,855 cycles, load-bound, against a roofline of 1,806,336. The plain GEMM's search
takes one 56-row tile streaming the weights once (PE-bound: 2,069,666), and the norm's kernel
(~40,000 more) is cheaper than the six extra passes over the weights. Where the fold's tiling is
the GEMM's own (a transformer's few hundred columns), the norm kernel's launch and round trip
are saved and the fold stays.

Both GEMMs are priced as the tile search prices its candidates (gemm_estimate.estimate_cycles,
the epilogue's activation included), so that the comparison is the search's own; the norm kernel
as check_row_norm prices it. Static rows only (a symbolic-rows fold's tiling is a minimax choice
over lengths: left as it is).
"""

from __future__ import annotations

import dataclasses

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ...errors import UnsupportedOperator
from ..common.spec import KernelSpec, Tiling
from .epilogue_tail import tail_tile_cycles
from .gemm_estimate import estimate_cycles, may_hold_a_panel
from .row_norm import norm_alone_cycles

F32 = "float32"


def check_fold_pays(spec: KernelSpec, tiling: Tiling, arch: HardwareDescription, choose_gemm_tiling) -> None:
    """Refuse a float32 pre-norm fold whose estimate with `tiling` exceeds the GEMM's without
    the norm at its best tiling (`choose_gemm_tiling`: gemm.py's) plus the norm's own kernel
    (row_norm.norm_alone_cycles)."""
    if not _priced(spec):
        return
    plain_spec = dataclasses.replace(spec, row_norm=None)
    fused = search_cycles(spec, tiling, arch)
    gemm = search_cycles(plain_spec, choose_gemm_tiling(plain_spec, arch), arch)
    norm = norm_alone_cycles(spec, arch)
    if fused > gemm + norm:
        m, n, k = spec.gemm_extents
        raise UnsupportedOperator(
            f"{spec.row_norm[0]} folded into a {m} x {k} -> {n} matmul: its whole-depth row tiles of {tiling.tm} "
            f"reload the weights {tiling.mp // tiling.tm} times ({fused} cycles estimated), dearer than the "
            f"matmul's own tiling ({gemm}) and the norm's kernel ({norm}); the norm runs on its own")


def _priced(spec: KernelSpec) -> bool:
    """A float32 norm (not a rounded operand's cast, not a 16-bit model's norm: half_row_norm.py)
    before a GEMM of static rows whose epilogue the search prices plainly (no RoPE, no post-norm)."""
    return spec.row_norm is not None and len(spec.row_norm) == 2 and spec.dtype == F32 and not spec.symbols \
        and not spec.rope_pattern and not spec.post_norm


def search_cycles(spec: KernelSpec, tiling: Tiling, arch: HardwareDescription) -> int:
    """gemm_estimate.estimate_cycles of `spec` with `tiling`, priced as gemm.choose_tiling prices
    a candidate of static rows (its activation or multiply from epilogue_tail, a multiplier
    loaded per tile, A's panel held where the tiling lets it)."""
    in_bytes = DType.from_name(spec.dtype).itemsize
    acc_bytes = DType.from_name(spec.acc_dtype).itemsize
    return estimate_cycles(tiling, spec.dtype, in_bytes, acc_bytes, arch, bool(spec.residual_shape),
                           extra_tiles=int(bool(spec.multiplier_shape)), tail_cycles=tail_tile_cycles(spec, arch),
                           a_panel=may_hold_a_panel(spec), piece_rows=tiling.epilogue_rows)
