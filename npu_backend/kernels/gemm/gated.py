"""A gated linear unit in one GEMM kernel: act(x W_gate^T) * (x W_up^T) (SwiGLU, GeGLU).

Stage: partition (the pattern and the spec fields a match fixes), kernel definition (the
epilogue's TE compute) and schedule (its intrinsic). normalise/gated_linears.py writes a
gate and an up projection of one input as one linear over their weights interleaved row by
row (W[2j] = W_gate[j], W[2j + 1] = W_up[j]) followed by

    multiply(act(strided_slice(y, [0::2])), strided_slice(y, [1::2]))      y = x W^T

which is what the host would compute too. Here that chain is one kernel: each output tile of
tm x tn / 2 is the GEMM's tm x tn accumulator tile, whose even columns are the gate's and odd
columns the up projection's, so every tile holds both halves of its outputs whatever tn the
tile search takes. The epilogue runs act over the even columns (one VFUNC reading the
accumulator with a column stride of 2, through the chip's function unit) into the output tile,
and an ELTWISE multiplies that by the odd columns: the gate's activations never leave the
scratchpad, and the input is read once for both projections.

A bfloat16 / float16 model's unit rounds the activation to its format and widens it back before
the multiply (normalise/gated_linears.py: `astype(astype(act(.), h), float32) * up`): the
epilogue's VFUNC then rounds its result to h and holds it widened back in the float32 output
tile (a VFUNC of dtype h, float32 in and out: isa.VFUNC_FLOAT32_OUT, stream v14), before the
multiply: the model's one rounding at no pass more, where the unit fused without it (or the
model's round trip as a cast kernel between two GEMMs) would drop it or cost a kernel. (Before
stream v14 two EPILOGUEs rounded the float32 VFUNC's output into the upper half of each output
row and widened it back: two passes of the vector unit a tile.)
"""

from __future__ import annotations

import dataclasses

from tvm import relax, te
from tvm.relax.dpl import is_op

from ...errors import UnsupportedOperator
from ...relax_info import shape_dims
from ..intrinsics.epilogue_tail import act_value
from .roots import linear_roots

#: The pattern-name suffix: "cgra.linear_gated".
SUFFIX = "_gated"
HALF_FLOATS = ("bfloat16", "float16")
#: Relax op of the activation -> its name (kernels/intrinsics/row_ops.py's VFUNC functions).
GATED_ACTS = {"relax.nn.silu": "silu", "relax.nn.gelu_tanh": "gelu_tanh", "relax.nn.gelu": "gelu"}


def gated_graphs(roots) -> list[tuple]:
    """(name, pattern, annotations, root name) of the gated unit after a linear root."""
    graphs = []
    for root in linear_roots(roots, ("rms_norm",)):  # a linear normalising its own rows (row_norm.py) first
        gate = is_op("relax.strided_slice")(root.pattern, varg_default_wildcard=True)
        up = is_op("relax.strided_slice")(root.pattern, varg_default_wildcard=True)
        act = is_op("relax.nn.silu")(gate) | is_op("relax.nn.gelu_tanh")(gate) | is_op("relax.nn.gelu")(gate)
        narrow = is_op("relax.astype")(act)
        wide = is_op("relax.astype")(narrow)
        annotations = {"root": root.pattern, **root.roles, "gate": gate, "up": up, "act": act}
        for rounded, factor in ((True, wide), (False, act)):  # module doc: a 16-bit model's rounding
            top = is_op("relax.multiply")(factor, up) | is_op("relax.multiply")(up, factor)
            graphs.append((f"cgra.{root.name}{'_rounded' * rounded}{SUFFIX}", top,
                           annotations | ({"narrow": narrow, "wide": wide} if rounded else {}), root.name))
    return graphs


def is_gated_pattern(name: str) -> bool:
    return name.endswith(SUFFIX)


def with_gated(spec, annotated: dict):
    """`spec` as the gated unit of its matmul's output (module doc); refuses what the kernel
    does not compute."""
    rows_only = all(role in ("lhs", "out") and axis == 0 for role, axis, _ in spec.symbols)
    if spec.op != "matmul" or spec.batch > 1 or not rows_only or spec.acc_dtype != "float32" \
            or spec.bias_shape or spec.half_out or not spec.rhs_transposed:
        raise UnsupportedOperator("a gated linear unit is fused after a float32 2-D linear without a bias, with "
                                  "static columns and reduction (its rows may be symbolic): this one runs as its parts")
    n = spec.gemm_extents[1]
    for role, start in (("gate", 0), ("up", 1)):
        if n % 2 or _slice_of(annotated[role]) != (start, 2, n // 2):
            raise UnsupportedOperator(f"the {role} of a gated linear unit must be the linear's "
                                      f"{'even' if start == 0 else 'odd'} columns")
    return dataclasses.replace(spec, act=GATED_ACTS[str(annotated["act"].op.name)], gated=True,
                               gated_via=_rounding(annotated))


def _rounding(annotated: dict) -> str | None:
    """The 16-bit float a matched unit rounds its activations to (module doc), else None."""
    if "narrow" not in annotated:
        return None
    via, back = str(annotated["narrow"].attrs.dtype), str(annotated["wide"].attrs.dtype)
    if via not in HALF_FLOATS or back != "float32":
        raise UnsupportedOperator(f"a gated linear unit's activation cast to {via}, then {back}: the kernel rounds it "
                                  "to bfloat16 / float16 and widens it back")
    return via


def _slice_of(call) -> tuple | None:
    """(begin, step, extent) of a strided_slice of a 2-D tensor's last axis, else None."""
    shape, out = shape_dims(call.args[0]), shape_dims(call)  # the rows may be symbolic
    args = list(call.args[1:])
    if shape is None or out is None or len(shape) != 2 or not isinstance(out[1], int) or len(args) < 4 or \
            not all(isinstance(a, relax.Tuple) for a in args[:4]):
        return None
    axes, begin, steps = (_ints(args[i]) for i in (0, 1, 3))
    if len(axes) != 1 or axes[0] % 2 != 1 or len(steps) != 1 or begin[0] < 0:
        return None
    return begin[0], steps[0], out[1]


def _ints(expr) -> list:
    return [int(getattr(f, "value", f)) for f in expr.fields]


def gated_epilogue(spec, acc, tiling):
    """epi[i, j] = act(acc[i, 2j]) * acc[i, 2j + 1] over the padded (mp, np / 2) output (mp
    symbolic with symbolic rows: acc's); the activation rounded to spec.gated_via and widened back."""
    def value(i, j):
        activated = act_value(spec.act, acc[i, 2 * j], True)
        if spec.gated_via:
            activated = activated.astype(spec.gated_via).astype("float32")
        return activated * acc[i, 2 * j + 1]

    return te.compute((acc.shape[0], tiling.np // 2), value, name="epi")
