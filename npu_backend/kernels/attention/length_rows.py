"""Causal attention over a symbolic length with a bias row per head (Bloom's ALiBi): one kernel.

Stage: partition (`_patterns`, `length_row_spec`) and kernel definition (flash_length.py's kernel,
its whole-row branches in rows_length.py and its key tiles in length_pipeline.py, each adding the
row: `row_gemm`). In: normalise/attentions.py's normal form over a symbolic length s whose scores
get, after the causal mask attention_lengths.py builds, `strided_slice(T, [4], [0], [s])`: the
first s columns of a constant (1, Hk, G, 1, bound) table T (normalise/length_rows.py: slope_h * j
for Bloom). Out: the attention family's kernel over the length with T as its `mask` operand
(spec.mask_shape T's shape): each query head's scores S (tq rows, keys k0 .. k1) get the row's
columns k0 .. k1 added as a GEMM of k = 1 onto S (a column of ones times the row): fl(S + r), as
an ELTWISE add rounds, on the PE array; the causal triangle after, as HF adds the mask after ALiBi.

The same family takes an open attention over the length (every key seen) whose scores get a bias
box, `strided_slice(B, [3, 4], [0, 0], [s, s])` of a constant (1, Hk, G, T, T) table B
(normalise/length_boxes.py: T5's relative-position bias): each item's (query rows, keys) box of
B is loaded by DMA into its scores and the Q Kᵀ GEMM accumulates onto it (rows_length.load_box),
fl(B + Q Kᵀ) in the GEMM's order, as the static kernel's mask in the GEMM.

A family of its own (op "length_attention"), beside the attention family whose patterns and
static kernels another module keeps; its spec is flash_length.length_spec's with the table.

Why: at a symbolic length Bloom's (H, s, s) ALiBi add stayed on the host before the mask, and the
attention fell apart into its matmul, add and softmax kernels (Bloom at 16 / 128 tokens: 1.90 /
2.10 times the static compile's cycles, 26,068 / 271,390 host cycles).
"""

from __future__ import annotations

import dataclasses

from tvm.relax.dpl import is_const, is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of, shape_dims
from ..family import OpFamily
from . import head_layouts
from .attention import _length_mask, _scale, attention_compute, schedule_attention, softmax_times_v
from .flash_length import choose_tiling, length_spec
from .spec import AttentionSpec


@dataclasses.dataclass(frozen=True)
class LengthRowSpec(AttentionSpec):
    """An AttentionSpec over a symbolic length with a bias row table (mask_shape (1, Hk, G, 1, T))."""

    op = "length_attention"


def _patterns() -> list:
    """attention.py's causal-over-a-length patterns with the table's prefix added after the mask:
    each form of operands (merged, head splits, plain), scaled or not, safe or not; then the
    open attention over a length with a bias box (`_box_pattern`)."""
    return [_pattern(form, scaled, safe) for form in ("merged", "heads", "") for scaled in (True, False)
            for safe in (True, False)] + \
        [_box_pattern(form, scaled) for form in ("merged", "heads", "") for scaled in (True, False)]


def _operands(form: str) -> tuple:
    """(q, k, v, their roles): the head layouts' operand patterns of a `form` ("merged", "heads"),
    or three wildcards."""
    if form:
        (q, q_roles), (k, k_roles), (v, v_roles) = (head_layouts.operand(role) for role in head_layouts.ROLES)
    else:
        q, k, v = wildcard(), wildcard(), wildcard()
        q_roles, k_roles, v_roles = {"lhs": q}, {"rhs": k}, {"value": v}
    return q, k, v, {**q_roles, **k_roles, **v_roles}


def _box_pattern(form: str, scaled: bool) -> tuple:
    """Every key of a length seen, the scores plus `strided_slice(B, [3, 4], [0, 0], [s, s])`, the
    top-left s x s box of a constant (1, Hk, G, T, T) table (normalise/length_boxes.py: T5's
    relative-position bias; attention_lengths.py drops its safe guard: the box is finite)."""
    q, k, v, operand_roles = _operands(form)
    kt = is_op("relax.permute_dims")(k)
    x = scores = is_op("relax.matmul")(q, kt)
    roles = {**operand_roles, "transpose": kt, "scores": scores}
    if scaled:
        roles["scale"] = is_const()
        x = roles["scaled"] = is_op("relax.multiply")(x, roles["scale"])
    table = roles["mask"] = wildcard()
    roles["box"] = is_op("relax.strided_slice")(table, wildcard(), wildcard(), wildcard())
    x = roles["masked"] = is_op("relax.add")(x, roles["box"])
    root = softmax_times_v(x, v, roles, False, form)
    name = "cgra.attention" + "_scale" * scaled + "_length_box" + "_merged" * (form == "merged")
    return name, root, {"root": root, **roles}


def _pattern(form: str, scaled: bool, safe: bool) -> tuple:
    q, k, v, operand_roles = _operands(form)
    kt = is_op("relax.permute_dims")(k)
    scores = is_op("relax.matmul")(q, kt)
    roles = {**operand_roles, "transpose": kt, "scores": scores}
    x = scores
    if scaled:
        roles["scale"] = is_const()
        x = roles["scaled"] = is_op("relax.multiply")(x, roles["scale"])
    mask = roles["length_mask"] = _length_mask(roles)
    x = roles["masked"] = is_op("relax.add")(x, mask)
    table = roles["mask"] = wildcard()  # (a constant, a parameter of the composite by then)
    roles["row"] = is_op("relax.strided_slice")(table, wildcard(), wildcard(), wildcard())
    x = roles["row_masked"] = is_op("relax.add")(x, roles["row"])
    root = softmax_times_v(x, v, roles, safe, form)
    name = "cgra.attention" + "_scale" * scaled + "_length_row" + "_safe" * safe + "_merged" * (form == "merged")
    return name, root, {"root": root, **roles}


def length_row_spec(name: str, annotated: dict) -> LengthRowSpec:
    """flash_length.length_spec's spec with the row's table as operand `mask`; raises
    UnsupportedOperator saying why not."""
    if "box" in annotated:
        return _box_spec(annotated)
    prefix = "causal attention over a symbolic length with a bias row: "
    base = length_spec(annotated, _scale(annotated), "where" in annotated)
    shape, dtype = shape_dims(annotated["mask"]), dtype_of(annotated["mask"])
    if dtype != "float32" or shape is None or len(shape) != 5 or not all(isinstance(x, int) for x in shape) or \
            tuple(shape[:4]) != (1, base.hk, base.g, 1) or shape[4] < base.sq:
        raise UnsupportedOperator(prefix + f"a table of shape {shape} ({dtype}); the kernel reads "
                                  f"(1, {base.hk}, {base.g}, 1, T) float32, T at least the bound {base.sq}")
    axes, begin, end = (_ints(arg) for arg in annotated["row"].args[1:4])
    if axes != [4] or begin != [0] or end != [base.length]:
        raise UnsupportedOperator(prefix + f"the row is the table sliced on axes {axes} from {begin} to {end}, not "
                                  f"its first {base.length} columns")
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return LengthRowSpec(**dict(fields, mask_shape=tuple(shape),
                                param_roles=tuple(base.param_roles) + ("mask",)))


def _box_spec(annotated: dict) -> LengthRowSpec:
    """flash_length.length_spec's spec of an open attention with the box's table as operand `mask`
    (mask_shape (1, Hk, G, T, T)); raises UnsupportedOperator saying why not."""
    prefix = "attention over a symbolic length with a bias box: "
    base = length_spec(annotated, _scale(annotated), False, causal=False)
    shape, dtype = shape_dims(annotated["mask"]), dtype_of(annotated["mask"])
    if dtype != "float32" or shape is None or len(shape) != 5 or not all(isinstance(x, int) for x in shape) or \
            tuple(shape[:3]) != (1, base.hk, base.g) or shape[3] != shape[4] or shape[4] < base.sq:
        raise UnsupportedOperator(prefix + f"a table of shape {shape} ({dtype}); the kernel reads "
                                  f"(1, {base.hk}, {base.g}, T, T) float32, T at least the bound {base.sq}")
    axes, begin, end = (_ints(arg) for arg in annotated["box"].args[1:4])
    if axes != [3, 4] or begin != [0, 0] or end != [base.length] * 2:
        raise UnsupportedOperator(prefix + f"the box is the table sliced on axes {axes} from {begin} to {end}, not "
                                  f"its first {base.length} rows and columns")
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return LengthRowSpec(**dict(fields, mask_shape=tuple(shape), param_roles=tuple(base.param_roles) + ("mask",)))


def _ints(arg) -> list:
    values = getattr(arg, "fields", None) or getattr(arg, "values", None) or ()
    out = []
    for value in values:
        value = getattr(value, "value", value)
        out.append(str(value.name) if hasattr(value, "name") else int(getattr(value, "value", value)))
    return out


LENGTH_ROWS = OpFamily(
    name="length_attention", ops=("length_attention",), pairs=_patterns, spec_from_match=length_row_spec,
    choose_tiling=choose_tiling, compute=attention_compute, schedule=schedule_attention, checks_pe_dtype=True)
