"""The attention family: softmax(Q Kᵀ * scale + mask) V as one kernel, the scores never in DRAM.

Stage: partition (its patterns and spec), kernel definition (rows.py, flash.py), tiling. Input: the
normal form of normalise/attentions.py, q (B, Hk, G, Sq, D), k and v (B, Hk, 1, Sk, D | Dv), a
float32 mask broadcasting to (B, Hk, G, Sq, Sk) or none, a scalar scale, a safe softmax's guard
or none. Per (batch, K / V head): Kᵀ (the DMA reads K with its strides swapped: no transpose
copy) and V into the scratchpad once, shared by the G query heads of the group; then per query
head and tile of tq query rows: the Q tile (times the scale, VFUNC identity), S = Q Kᵀ (GEMM),
S + mask (ELTWISE, a broadcast row or column read with stride 0), the row max (FILL, REDUCE MAX),
S - max (ELTWISE), exp (VFUNC), the row sum (REDUCE SUM), O = P V (GEMM over the unnormalised
P), 1 / sum (VFUNC, a column) and O * 1 / sum (ELTWISE): the normalisation on tq x Dv, not on
tq x Sk. Only Q, K, V, the mask and O cross DRAM (`attention_tiles.py` sizes tq). rows.py writes
the kernel, each (head, query tile) with two copies of its buffers, so that the PE array computes
the next one's scores while the vector unit runs this one's softmax. A constant causal triangle
(with a padding row after it or alone) is no operand: both kernels build it and skip the keys
above each query tile's diagonal (rows.py, flash.py).

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
from tvm.relax.dpl import is_const, is_op, wildcard

from ...errors import UnsupportedOperator
from ...normalise.attentions import causal_offset
from ...relax_info import dtype_of, shape_dims
from ..family import OpFamily
from .flash import flash_compute
from .flash_length import choose_tiling, length_compute, length_spec
from .flash_tiles import FlashTiling
from .rows import rows_compute
from . import head_layouts
from .spec import F32, AttentionSpec

HALF_FLOATS = ("bfloat16", "float16")



# ------------------------------------------------------------------ partition

def _patterns() -> list:
    """matmul(q, permute_dims(k)) [* scale] [+ mask] -> softmax [-> where(kept, ., 0)] -> matmul(., v):
    the normal form, each optional piece an alternative (the mask a constant causal triangle and
    a padding row added after it (normalise/causal_rows.py), a constant
    causal triangle, the causal mask over a symbolic length that normalise/attention_lengths.py
    builds from arange, less_equal and where (flash_length.py), any tensor, or none); each first with q, k and v maybe head splits of
    sequence-major tensors and the result transposed back (`_merged`), then with the head splits
    alone (the attention's result read elsewhere too), then with plain operands (a transposed K or
    V read elsewhere too, a KV cache's) (head_layouts.py)."""
    entries = []
    for rounded in (True, False):  # the result's cast to a 16-bit float first: the kernel's rounding store
        for form in ("merged", "heads", ""):
            for scaled in (True, False):
                for masked in ("causal_row", "causal", "length", "mask", ""):  # a causal mask first: the kernel builds it
                    for safe in (True, False):
                        entries.append(_pattern(form, scaled, masked, safe, rounded))
    return entries


def _pattern(form: str, scaled: bool, masked: str, safe: bool, rounded: bool = False) -> tuple:
    """One (name, root, roles) of `_patterns`."""
    if form:
        (q, q_roles), (k, k_roles), (v, v_roles) = (head_layouts.operand(role) for role in head_layouts.ROLES)
    else:
        q, k, v = wildcard(), wildcard(), wildcard()
        q_roles, k_roles, v_roles = {"lhs": q}, {"rhs": k}, {"value": v}
    mask = is_const() if masked.startswith("causal") else wildcard()
    role = "causal" if masked.startswith("causal") else "mask"
    kt = is_op("relax.permute_dims")(k)
    scores = is_op("relax.matmul")(q, kt)
    roles = {**q_roles, **k_roles, **v_roles, "transpose": kt, "scores": scores}
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
    if masked == "causal_row":  # and a padding row after the triangle (normalise/causal_rows.py)
        roles["mask"] = wildcard()
        x = roles["row_masked"] = is_op("relax.add")(x, roles["mask"])
    root = softmax_times_v(x, v, roles, safe, form)
    top = root
    if rounded:  # astype(result, h): stored rounded to h (normalise/half_attention_outputs.py)
        top = roles["half_cast"] = is_op("relax.astype")(root)
    # The head splits' form shares the plain form's name (both make the same kernel; the plain
    # one is there for when the splits' transposes are read elsewhere too).
    name = "cgra.attention" + "_scale" * scaled + f"_{masked}" * bool(masked) + "_safe" * safe \
        + "_merged" * (form == "merged") + "_rounded" * rounded
    return name, top, {"root": root, **roles}


def softmax_times_v(x, v, roles: dict, safe: bool, form: str):
    """The tail of every attention pattern: softmax(x) (guarded by a safe softmax's where), times
    V, its heads merged in the "merged" form; the softmax and where recorded in `roles`."""
    p = roles["softmax"] = is_op("relax.nn.softmax")(x)
    if safe:
        finite = is_op("relax.astype")(is_op("relax.not_equal")(x, is_const()))
        kept = is_op("relax.greater")(is_op("relax.max")(finite), is_const())
        p = roles["where"] = is_op("relax.where")(kept, p, is_const())
    root = is_op("relax.matmul")(p, v)
    return head_layouts.merged(root) if form == "merged" else root


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
    unseen = _unseen(annotated)
    half_out = _half_out(annotated)
    if "length_mask" in annotated:
        if half_out:
            raise UnsupportedOperator("attention over a symbolic length stored as a 16-bit float: its kernel stores "
                                      "float32 (the cast runs on its own)")
        if unseen:
            raise UnsupportedOperator("attention over a symbolic length whose rows that see no key take a value: "
                                      "the symbolic-length kernel gives them 0")
        return length_spec(annotated, _scale(annotated), "where" in annotated)
    q, k, v = (head_layouts.operand_of(annotated, role) for role in head_layouts.ROLES)
    shapes = [shape_dims(x) for x in (q, k, v)]
    if "mask" not in annotated and "causal" not in annotated and not unseen and \
            all(s is not None and len(s) == 5 and not isinstance(s[3], int) for s in shapes):
        # every key of a symbolic length (an encoder's: normalise/attention_lengths.py)
        return length_spec(annotated, _scale(annotated), "where" in annotated, causal=False)
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
    if "mask" in annotated:
        mask_shape = _mask_shape(annotated["mask"], (b, hk, g, sq, sk))
        if causal is not None and mask_shape[3] != 1:
            raise UnsupportedOperator(f"attention with a causal triangle and a mask of shape {mask_shape}: the kernel "
                                      "takes a row (padding, ALiBi's per head) after the triangle")
    seq_major = head_layouts.seq_major_roles(annotated, dict(zip(head_layouts.ROLES, shapes)))
    parts = head_layouts.parts(annotated)
    sliced = tuple(role for role, _, _ in parts)
    return AttentionSpec(b, hk, g, sq, sk, d, dv, scale=scale, mask_shape=mask_shape, safe="where" in annotated,
                         causal=causal, unseen=unseen, seq_major=seq_major, parts=parts,
                         param_roles=tuple(head_layouts.param_name(seq_major, role, sliced)
                                           for role in head_layouts.ROLES)
                         + (("mask",) if mask_shape else ()), half_out=half_out)


def _half_out(annotated: dict) -> str | None:
    """The 16-bit float a rounded pattern's result is cast to (the kernel's rounding store), else None."""
    if "half_cast" not in annotated:
        return None
    dtype = str(annotated["half_cast"].attrs.dtype)
    if dtype not in HALF_FLOATS:
        raise UnsupportedOperator(f"attention result cast to {dtype}: the kernel rounds its float32 output to "
                                  "bfloat16 or float16 on store (the cast runs on its own)")
    return dtype


def _unseen(annotated: dict) -> float:
    """c of a safe softmax's where(kept, p, c): each key's weight in a row that sees none (0, or a
    finite mask split's fl(1 / Sk), normalise/finite_masks.py)."""
    if "where" not in annotated:
        return 0.0
    value = annotated["where"].args[2].value.numpy()
    if value.size != 1 or not np.isfinite(value).all():
        raise UnsupportedOperator("safe softmax whose rows that see no key take a tensor or a non-finite value")
    return float(value.reshape(()))


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

def attention_compute(spec: AttentionSpec, tiling):
    """The kernel as lowered TIR: with a RowTiling the whole-row kernel (rows.py), with a
    FlashTiling the key-tile kernel (flash.py; over a symbolic length flash_length.py)."""
    if isinstance(tiling, FlashTiling):
        return length_compute(spec, tiling) if spec.length is not None else flash_compute(spec, tiling)
    return rows_compute(spec, tiling)


def schedule_attention(sch, spec: AttentionSpec, tiling, arch) -> None:
    """Nothing to schedule: both kernels are written lowered (their loops, scratchpad buffers
    and device calls are the kernel's text)."""


ATTENTION = OpFamily(
    name="attention", ops=("attention",), pairs=_patterns, spec_from_match=attention_spec,
    choose_tiling=choose_tiling, compute=attention_compute, schedule=schedule_attention,
    checks_pe_dtype=True)
