"""The attention family: softmax(Q Kᵀ * scale + mask) V as one kernel, the scores never in DRAM.

Stage: partition (its patterns and spec), kernel definition, tiling and schedule. Input: the
normal form of normalise/attentions.py, q (B, Hk, G, Sq, D), k and v (B, Hk, 1, Sk, D | Dv), a
float32 mask broadcasting to (B, Hk, G, Sq, Sk) or none, a scalar scale, a safe softmax's guard
or none. Per (batch, K / V head): Kᵀ (the DMA reads K with its strides swapped: no transpose
copy) and V into the scratchpad once, shared by the G query heads of the group; then per query
head and tile of tq query rows: the Q tile (times the scale, VFUNC identity), S = Q Kᵀ (GEMM),
S + mask (ELTWISE, a broadcast row or column read with stride 0), the row max (FILL, REDUCE MAX),
S - max (ELTWISE), exp (VFUNC), the row sum (REDUCE SUM), O = P V (GEMM over the unnormalised
P), 1 / sum (VFUNC, a column) and O * 1 / sum (ELTWISE): the normalisation on tq x Dv, not on
tq x Sk. Only Q, K, V, the mask and O cross DRAM (`attention_tiles.py` sizes tq).

A row that is all -inf (a safe softmax, PyTorch's SDPA with a padding mask): its max starts at
the lowest finite float32 instead of -inf, so S - max is -inf and exp gives 0, and the sum's
reciprocal is of sum + FLT_MIN (every other row's sum is at least 1, where FLT_MIN vanishes in the
rounding): the row gives 0, as PyTorch's does, at the cost of one offset on a column. A plain
softmax keeps -inf, so such a row gives NaN, as PyTorch's plain softmax does.

This kernel holds whole rows of the scores and the whole K and V of a head. An attention whose
K / V head and one tile of score rows do not fit the scratchpad, or whose mask it would read once
per head where the other reads it once, runs over key tiles with an online softmax instead
(flash.py, written as lowered TIR; the tile search, attention_tiles.choose_attention_tiling,
picks the kernel moving fewer DRAM bytes).
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx
from tvm.relax.dpl import is_const, is_op, wildcard

from ...errors import UnsupportedOperator
from ...normalise.attentions import causal_offset
from ...relax_info import dtype_of, shape_dims
from ..common.operands import padded, prim_func
from ..common.spad_layout import a_row_stride, align_rows
from ..common.spec import SINGLE_BUFFERED
from ..family import OpFamily
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.row_ops import vfunc_value
from ..intrinsics.vector_unit import eltwise_value
from .attention_tiles import LOWEST, TINY
from .flash import flash_compute
from .flash_length import choose_tiling, length_compute, length_spec
from .flash_tiles import FlashTiling
from .spec import F32, AttentionSpec



# ------------------------------------------------------------------ partition

def _patterns() -> list:
    """matmul(q, permute_dims(k)) [* scale] [+ mask] -> softmax [-> where(kept, ., 0)] -> matmul(., v):
    the normal form, each optional piece an alternative (sixteen patterns: the mask a constant
    causal triangle, the causal mask over a symbolic length that normalise/attention_lengths.py
    builds from arange, less_equal and where (flash_length.py), any tensor, or none)."""
    entries = []
    for scaled in (True, False):
        for masked in ("causal", "length", "mask", ""):  # a causal mask first: the kernel builds it
            for safe in (True, False):
                q, k, v, mask = wildcard(), wildcard(), wildcard(), is_const() if masked == "causal" else wildcard()
                role = "causal" if masked == "causal" else "mask"
                kt = is_op("relax.permute_dims")(k)
                scores = is_op("relax.matmul")(q, kt)
                roles = {"lhs": q, "rhs": k, "value": v, "transpose": kt, "scores": scores}
                if masked == "length":  # causal over a symbolic length (normalise/attention_lengths.py)
                    mask, role = _length_mask(roles), "length_mask"
                x = scores
                if scaled:
                    scale = is_const()
                    x = roles["scaled"] = is_op("relax.multiply")(x, scale)
                    roles["scale"] = scale
                if masked:
                    x = roles["masked"] = is_op("relax.add")(x, mask)
                    roles[role] = mask
                p = roles["softmax"] = is_op("relax.nn.softmax")(x)
                if safe:
                    finite = is_op("relax.astype")(is_op("relax.not_equal")(x, is_const()))
                    kept = is_op("relax.greater")(is_op("relax.max")(finite), is_const())
                    p = roles["where"] = is_op("relax.where")(kept, p, is_const())
                root = is_op("relax.matmul")(p, v)
                name = "cgra.attention" + "_scale" * scaled + f"_{masked}" * bool(masked) + "_safe" * safe
                entries.append((name, root, {"root": root, **roles}))
    return entries


def _length_mask(roles: dict):
    """where(less_equal(reshape(p, (1, s)), reshape(p, (s, 1))), 0, -inf), p = arange(0, s, 1)."""
    positions = roles["positions"] = is_op("relax.arange")(wildcard(), wildcard(), wildcard())
    keys = roles["key_positions"] = is_op("relax.reshape")(positions, wildcard())
    queries = roles["query_positions"] = is_op("relax.reshape")(positions, wildcard())
    return is_op("relax.where")(is_op("relax.less_equal")(keys, queries), is_const(), is_const())


def _scale(annotated: dict) -> float | None:
    if "scale" not in annotated:
        return None
    value = annotated["scale"].value.numpy()
    if value.size != 1:
        raise UnsupportedOperator("attention scaled by a tensor: the kernel takes a scalar scale")
    return float(value.reshape(()))


def attention_spec(name: str, annotated: dict) -> AttentionSpec:
    """The AttentionSpec of a matched normal form; raises UnsupportedOperator saying why not."""
    if "length_mask" in annotated:
        return length_spec(annotated, _scale(annotated), "where" in annotated)
    q, k, v = annotated["lhs"], annotated["rhs"], annotated["value"]
    shapes = [shape_dims(x) for x in (q, k, v)]
    if any(s is None or len(s) != 5 or not all(isinstance(d, int) for d in s) for s in shapes):
        raise UnsupportedOperator("attention of symbolic or unknown shapes: its NPU kernel takes static shapes "
                                  "(bind the sequence length)")
    if any(dtype_of(x) != F32 for x in (q, k, v)):
        raise UnsupportedOperator("attention on another dtype than float32: the vector unit's REDUCE and VFUNC "
                                  "compute float32")
    (b, hk, g, sq, d), (kb, khk, one, sk, kd), (vb, vhk, vone, vsk, dv) = shapes
    axes = annotated["transpose"].attrs.axes
    if (kb, khk, one, kd) != (b, hk, 1, d) or (vb, vhk, vone, vsk) != (b, hk, 1, sk) or \
            axes is None or [int(a) for a in axes] != [0, 1, 2, 4, 3]:
        raise UnsupportedOperator(f"attention of q {shapes[0]}, k {shapes[1]}, v {shapes[2]}: not the normal form "
                                  "(normalise/attentions.py)")
    if min(sk, d, dv) < 2:
        raise UnsupportedOperator(f"attention over {sk} keys of {d} + {dv} dims: the kernel's GEMMs and row reductions "
                                  "take at least 2 keys and 2 dims (one key: its softmax is 1, the output V)")
    scale = _scale(annotated)
    mask_shape, causal = (), None
    if "causal" in annotated:
        causal = causal_offset(annotated["causal"].value.numpy(), sq, sk)
        if causal is None:
            raise UnsupportedOperator("attention with a constant mask that is no causal triangle: the kernel reads it "
                                      "as a mask operand (the next pattern)")
    elif "mask" in annotated:
        mask_shape = _mask_shape(annotated["mask"], (b, hk, g, sq, sk))
    return AttentionSpec(b, hk, g, sq, sk, d, dv, scale=scale, mask_shape=mask_shape, safe="where" in annotated,
                         causal=causal, param_roles=("lhs", "rhs", "value") + (("mask",) if mask_shape else ()))


def _mask_shape(mask, full: tuple) -> tuple:
    shape = shape_dims(mask)
    if shape is None or not all(isinstance(d, int) for d in shape) or dtype_of(mask) != F32:
        raise UnsupportedOperator("attention mask of a symbolic shape or another dtype than float32")
    shape = (1,) * (5 - len(shape)) + tuple(shape)
    if len(shape) != 5 or any(m not in (1, f) for m, f in zip(shape, full)):
        raise UnsupportedOperator(f"attention mask of shape {shape} does not broadcast to the scores {full}")
    if shape[3] == 1 and shape[4] == 1:
        raise UnsupportedOperator("attention mask of one value per head: a constant shift, which the softmax "
                                  "ignores; the kernel takes a row, a column or a tile of the scores")
    if shape[1] == 1 and shape[2] != 1 and full[1] > 1:  # one K / V head: (1, G) is every head
        raise UnsupportedOperator(f"attention mask of shape {shape}: per query head of a group but shared by the "
                                  "groups")
    return shape


# ------------------------------------------------------------------ kernel definition

def _steps(spec: AttentionSpec) -> list:
    """The blocks under a query tile, in order."""
    return (["q_pad"] + (["q_scaled"] if spec.scale is not None else []) + ["scores"]
            + (["mask_pad", "masked"] if spec.mask_shape else [])
            + ["row_max", "shifted", "exps", "row_sum", "o_acc", "inverse", "o_norm"])


def attention_compute(spec: AttentionSpec, tiling):
    """The TensorIR: q viewed as (B, H, Sq, D), k and v as (B, Hk, Sk, D), the output as
    (B, H, Sq, Dv), the mask as (Bm, Hm, Sqm, Skm); the intermediates per (b, hk, g, row). With a
    FlashTiling, the key-tile kernel (flash.py), already lowered."""
    if isinstance(tiling, FlashTiling):
        return length_compute(spec, tiling) if spec.length is not None else flash_compute(spec, tiling)
    b, hk, g, sq, sk, d, dv = spec.b, spec.hk, spec.g, spec.sq, spec.sk, spec.d, spec.dv
    h, sqp = hk * g, tiling.mp
    q = te.placeholder((b, h, sq, d), F32, name="lhs")
    k = te.placeholder((b, hk, sk, d), F32, name="rhs")
    v = te.placeholder((b, hk, sk, dv), F32, name="value")
    inputs = {"lhs": q, "rhs": k, "value": v}
    views = {"lhs": (b, hk, g, sq, d), "rhs": (b, hk, 1, sk, d), "value": (b, hk, 1, sk, dv),
             "out": (b, hk, g, sq, dv)}
    grid = (b, hk, g, sqp)
    x = te.compute(grid + (d,), lambda n, c, j, i, e: padded(q, q.shape, (n, c * g + j, i, e)), name="q_pad")
    kt = te.compute((b, hk, d, sk), lambda n, c, e, j: k[n, c, j, e], name="kt_pad")
    vp = te.compute((b, hk, sk, dv), lambda n, c, j, e: v[n, c, j, e], name="v_pad")
    if spec.scale is not None:
        x = te.compute(grid + (d,), lambda n, c, j, i, e: vfunc_value("identity", x[n, c, j, i, e], spec.scale),
                       name="q_scaled")
    r = te.reduce_axis((0, d), name="r")
    s = te.compute(grid + (sk,), lambda n, c, j, i, t: te.sum(x[n, c, j, i, r] * kt[n, c, r, t], axis=r),
                   name="scores")
    if spec.mask_shape:
        s = _masked(spec, s, inputs, views, grid)
    start = LOWEST if spec.safe else -np.inf
    t = te.reduce_axis((0, sk), name="t")
    fold = te.comm_reducer(lambda a, e: tirx.max(a, e), lambda dtype: tirx.const(start, dtype), name="max")
    row_max = te.compute(grid + (1,), lambda n, c, j, i, z: fold(s[n, c, j, i, t], axis=t), name="row_max")
    shifted = te.compute(grid + (sk,), lambda n, c, j, i, u: eltwise_value(
        "subtract", s[n, c, j, i, u], row_max[n, c, j, i, 0]), name="shifted")
    exps = te.compute(grid + (sk,), lambda n, c, j, i, u: vfunc_value("exp", shifted[n, c, j, i, u]), name="exps")
    t2 = te.reduce_axis((0, sk), name="t2")
    row_sum = te.compute(grid + (1,), lambda n, c, j, i, z: te.sum(exps[n, c, j, i, t2], axis=t2), name="row_sum")
    t3 = te.reduce_axis((0, sk), name="t3")
    o_acc = te.compute(grid + (dv,), lambda n, c, j, i, e: te.sum(exps[n, c, j, i, t3] * vp[n, c, t3, e], axis=t3),
                       name="o_acc")
    inverse = te.compute(grid + (1,), lambda n, c, j, i, z: vfunc_value(
        "reciprocal", row_sum[n, c, j, i, 0], offset=TINY if spec.safe else None), name="inverse")
    o_norm = te.compute(grid + (dv,), lambda n, c, j, i, e: eltwise_value(
        "multiply", o_acc[n, c, j, i, e], inverse[n, c, j, i, 0]), name="o_norm")
    out = te.compute((b, h, sq, dv), lambda n, hh, i, e: o_norm[n, hh // g, hh % g, i, e], name="out")
    func = prim_func(spec.param_roles, inputs, out, views)
    # K and V once: a head's are loaded while the tiles of the head before wait (they are the
    # largest buffers, and doubling them would halve the sequence that fits).
    single = [name for name in _steps(spec)[1:-1] if name != "mask_pad" or tiling.tw] + ["kt_pad", "v_pad"]
    return func.with_attr(SINGLE_BUFFERED, single)


def _masked(spec: AttentionSpec, s, inputs: dict, views: dict, grid: tuple):
    """scores + the mask tile, the mask read as (Bm, Hm, Sqm, Skm): a row (Sqm 1) or a column
    (Skm 1) is loaded as one and broadcast by the ELTWISE's stride 0."""
    mb, mhk, mg, msq, msk = spec.mask_shape
    mh = mhk * mg
    mask = te.placeholder((mb, mh, msq, msk), F32, name="mask")
    inputs["mask"] = mask
    views["mask"] = spec.mask_shape
    g = spec.g
    # A mask shared by the heads has no head axes here, so that the schedule can load it whole
    # once per batch (tiling.tw) instead of a tile per query tile and head.
    tile = (grid[0], grid[1] if mh > 1 else 1, grid[2] if mh > 1 else 1, grid[3] if msq > 1 else 1, msk)

    def load(n, c, j, i, u):
        index = (n if mb > 1 else 0, (c * g + j) if mh > 1 else 0, i if msq > 1 else 0, u if msk > 1 else 0)
        return padded(mask, mask.shape, index)

    mask_pad = te.compute(tile, load, name="mask_pad")
    return te.compute(grid + (spec.sk,), lambda n, c, j, i, u: eltwise_value(
        "add", s[n, c, j, i, u], mask_pad[n, c if mh > 1 else 0, j if mh > 1 else 0, i if msq > 1 else 0,
                                          u if msk > 1 else 0]), name="masked")


# ------------------------------------------------------------------ schedule

def schedule_attention(sch, spec: AttentionSpec, tiling, arch) -> None:
    """Per (b, hk): Kᵀ and V in the scratchpad; per (g, query tile): every step tensorized; a
    mask shared by the heads whole per batch (tiling.tw), else a tile per query tile. The
    flash kernel is written lowered: nothing to schedule."""
    if isinstance(tiling, FlashTiling):
        return
    out = sch.get_sblock("out")
    n, hh, i, _ = sch.get_loops(out)
    c, _ = sch.split(hh, [spec.hk, spec.g])
    tile, _ = sch.split(i, [None, tiling.tm])
    for name in reversed(_steps(spec)):
        block = sch.get_sblock(name)
        sch.compute_at(block, n if name == "mask_pad" and tiling.tw else tile)
        sch.set_scope(block, 0, SPAD)
    for name in ("v_pad", "kt_pad"):
        block = sch.get_sblock(name)
        sch.compute_at(block, c)
        sch.set_scope(block, 0, SPAD)
    at = len(sch.get_loops(sch.get_sblock("q_pad"))) - 2  # the tile's row loop
    tq, sk, d, dv = tiling.tm, spec.sk, spec.d, spec.dv
    if spec.scale is not None:
        sch.tensorize(sch.get_loops(sch.get_sblock("q_scaled"))[at],
                      get_intrin("vfunc", tq, d, "identity", scale=spec.scale))
    _gemm(sch, "scores", at, tq, sk, d)
    if spec.mask_shape:
        msq, msk = spec.mask_shape[3:]
        sch.tensorize(sch.get_loops(sch.get_sblock("masked"))[at], get_intrin(
            "eltwise", tq, sk, "add", F32, a_full=(True, True), b_full=(msq > 1, msk > 1)))
    _reduce(sch, "row_max", at, tq, sk, "max", LOWEST if spec.safe else -np.inf)
    _eltwise(sch, "shifted", at, tq, sk, "subtract", (True, False))
    sch.tensorize(sch.get_loops(sch.get_sblock("exps"))[at], get_intrin("vfunc", tq, sk, "exp"))
    _reduce(sch, "row_sum", at, tq, sk, "sum", 0.0)
    _gemm(sch, "o_acc", at, tq, dv, sk)
    inverse = sch.get_sblock("inverse")
    sch.add_unit_loop(inverse)
    sch.tensorize(sch.get_loops(inverse)[at], get_intrin("vfunc", tq, 1, "reciprocal",
                                                         offset=TINY if spec.safe else None))
    _eltwise(sch, "o_norm", at, tq, dv, "multiply", (True, False))
    # The GEMMs' A tiles (Q, and P of the P V GEMM) with rows padded against bank conflicts, as
    # gemm.py pads its A (the PE array reads one element of each row a cycle); a tensorized
    # block is its blockized "_o" now.
    for name, depth in (("q_scaled_o" if spec.scale is not None else "q_pad", d), ("exps_o", sk)):
        align_rows(sch, sch.get_sblock(name), depth, a_row_stride(tq, depth, 4, arch), F32, arch)


def _gemm(sch, name: str, at: int, rows: int, cols: int, depth: int) -> None:
    block = sch.get_sblock(name)
    init = sch.decompose_reduction(block, sch.get_loops(block)[at])
    sch.tensorize(sch.get_loops(init)[at], get_intrin("fill", rows, cols, F32))
    sch.tensorize(sch.get_loops(block)[at], get_intrin("gemm", rows, cols, depth, F32, F32))


def _reduce(sch, name: str, at: int, rows: int, cols: int, func: str, start: float) -> None:
    """FILL the column with `start`, then one REDUCE (rows.py's shape of the loops)."""
    block = sch.get_sblock(name)
    init = sch.decompose_reduction(block, sch.get_loops(block)[at])
    sch.add_unit_loop(init)
    sch.tensorize(sch.get_loops(init)[at], get_intrin("fill", rows, 1, F32, value=tirx.const(start, F32)))
    loops = sch.get_loops(block)
    sch.add_unit_loop(loops[at + 1])
    sch.tensorize(sch.get_loops(block)[at], get_intrin("reduce", rows, cols, func))


def _eltwise(sch, name: str, at: int, rows: int, cols: int, func: str, b_full: tuple) -> None:
    sch.tensorize(sch.get_loops(sch.get_sblock(name))[at],
                  get_intrin("eltwise", rows, cols, func, F32, a_full=(True, True), b_full=b_full))


ATTENTION = OpFamily(
    name="attention", ops=("attention",), pairs=_patterns, spec_from_match=attention_spec,
    choose_tiling=choose_tiling, compute=attention_compute, schedule=schedule_attention,
    checks_pe_dtype=True)
