"""The epilogue a PE-array kernel fuses: [+ bias] [+ residual] [relu | clip], or [requantise].

Stage: partition (the chain patterns after a family's root op, and the epilogue fields of its
KernelSpec) and kernel definition (the TE epilogue and the EPILOGUE intrinsic a tile is
tensorized onto). A family with `roots` (matmul.py, conv2d.py) gets, for each root, every chain

    root [+ bias] [+ residual] [relu | clip]          float32, or int8 x int8 -> int32
    root [+ bias [+ residual]] [relu] -> requantise   int8 x int8 -> int32 -> int8 (QDQ layers, qdq.py)
                                                      int16 x int8 -> int64 -> int16 (qdq16.py)

a bias being one value per output channel / column, a residual a tensor of the output's exact
shape in the accumulator dtype (ResNet's shortcut), clip constant bounds (relu6), and the
requantisation quantize(multiply(astype(x, float32), scale), 1.0, zero point) as the normalise
stage writes it. Roles come from the patterns' annotations: the spec reader looks up "bias",
"residual", "relu", "clip", "requant" in what the match extracted, never the pattern's name.
"""

from __future__ import annotations

import dataclasses

import tvm
from tvm import te
from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of, require_static_shape
from ..common.chains import CHAIN_MARK, chain_body, clip_bounds, level_pattern
from ..common.dynamic import read_shape, symbols_of
from ..intrinsics import get_intrin
from ..intrinsics.fabric import FabricBody, body_value
from ..intrinsics.epilogue_tail import act_value
from ..intrinsics.vector_unit import activation, requantise
from ..common.operands import padded
from ..common.spec import KernelSpec
from .dequant_epilogue import dequant_row, dequant_tail, dequant_value, with_dequant
from .epilogue_tail import caller_out_shape, is_tail_pattern, with_float_tail, with_reshape
from .channel_rows import channel_row
from .gated import is_gated_pattern, with_gated
from .half_bias import half_bias_graphs, rounded_via, stored_dtype, with_rounded_act
from .half_residual import with_rounded_residual
from .qadd_epilogue import qadd_body, qadd_tail, qadd_value, with_qadd
from .half_post_norm import is_half_post_norm_pattern, with_half_post_norm
from .post_norm import is_post_norm_pattern, post_norm_intrin, with_post_norm
from .rope_epilogue import combine_intrin, is_rope_pattern, with_rope
from .residual_lhs import reads_lhs_twice, with_lhs_residual
from .roots import Root  # noqa: F401  (the families import it from here)

#: The accumulator dtype of each input dtype of a PE-array kernel: also its output's, but for the
#: 16-bit floats, whose kernels store their own dtype (the EPILOGUE rounds to nearest even).
ACC_DTYPE = {"int8": "int32", "float32": "float32", "bfloat16": "float32", "float16": "float32", "int16": "int64"}
#: The weights' dtype where it is not the activations': int16 activations x int8 weights (16x8).
RHS_DTYPE = {"int16": "int8"}
#: What a requantisation stores from each integer accumulator.
REQUANT_DTYPE = {"int32": "int8", "int64": "int16"}
#: Input dtypes whose kernels accumulate in float32 and store the input's 16-bit format.
HALF_FLOATS = ("bfloat16", "float16")


#: Activation suffix -> (pattern around x, its role or None).
_ACTIVATIONS = {
    "": (lambda x: x, None),
    "_relu": (lambda x: is_op("relax.nn.relu")(x), "relu"),
    "_clip": (lambda x: is_op("relax.clip")(x, wildcard(), wildcard()), "clip"),
}


def chain_pattern_graphs(roots: list[Root]) -> list[tuple]:
    """(name, pattern, annotations, root name) of every root with every epilogue chain, most
    specific (most ops) first, the order FuseOpsByPattern must try them in. Among chains of one length a bias
    add comes before a residual add, so that an add that qualifies as a bias is fused as one.

    The matcher tries a commutative add's operands in the pattern's order first and the check
    cannot send it back for the other order; so each residual add also comes mirrored, under
    the same name, tried second: in `add(a, b)` where both a and b are a conv + bias, but a is
    used elsewhere (MobileNetV2's `x + block(x)` when x is itself a conv + bias), it fuses b."""
    bias, residual = wildcard(), wildcard()
    graphs = []
    for root in roots:
        with_bias = is_op("relax.add")(root.pattern, bias)
        sums = [  # (suffix, pattern, annotations, ops); the mirrored add first here: tried second
            ("", root.pattern, {}, 1),
            ("_residual", is_op("relax.add")(residual, root.pattern), {"residual": residual}, 2),
            ("_residual", is_op("relax.add")(root.pattern, residual), {"residual": residual}, 2),
            ("_bias", with_bias, {"bias": bias}, 2),
            ("_bias_residual", is_op("relax.add")(residual, with_bias), {"bias": bias, "residual": residual}, 3),
            ("_bias_residual", is_op("relax.add")(with_bias, residual), {"bias": bias, "residual": residual}, 3),
        ]
        for suffix, summed, extra, ops in sums:
            for act, (wrap, role) in _ACTIVATIONS.items():
                pattern = wrap(summed)
                annotations = {"root": root.pattern, **root.roles, **extra, **({role: pattern} if role else {})}
                graphs.append((ops + (act != ""), f"cgra.{root.name}{suffix}{act}", pattern, annotations,
                               root.name))
    graphs += _requant_graphs(roots, bias)
    graphs += _tail_graphs(roots, bias)
    graphs += half_bias_graphs(roots)  # a 16-bit linear's bias, its sum rounded once (half_bias.py)
    graphs.sort(key=lambda graph: graph[0])  # stable: keeps the tie order above
    return [graph[1:] for graph in reversed(graphs)]


def _requant_graphs(roots: list[Root], bias) -> list[tuple]:
    """(ops, name, pattern, annotations, root name) of the int8 chains ending in a requantisation."""
    graphs = []
    residual = wildcard()
    for root in roots:
        with_bias = is_op("relax.add")(root.pattern, bias)
        for suffix, summed, extra, ops in (("", root.pattern, {}, 1), ("_bias", with_bias, {"bias": bias}, 2),
                                           # a QDQ conv's zero-point padding correction (normalise/qdq_borders.py)
                                           ("_bias_residual", is_op("relax.add")(with_bias, residual),
                                            {"bias": bias, "residual": residual}, 3)):
            for act in ("", "_relu"):
                value = is_op("relax.nn.relu")(summed) if act else summed
                scale = wildcard()
                multiply = is_op("relax.multiply")(is_op("relax.astype")(value), scale)
                tail = is_op("relax.quantize")(multiply, wildcard(), wildcard())
                annotations = {"root": root.pattern, **root.roles, **extra, **({"relu": value} if act else {}),
                               "requant": tail, "requant_multiply": multiply, "scale": scale}
                graphs.append((ops + (act != "") + 3, f"cgra.{root.name}{suffix}{act}_requant", tail, annotations,
                               root.name))
                # then dequantized to float32, a conv2d's multiplier a (1, F, 1, 1) view (dequant_epilogue.py)
                tail, dequant = dequant_tail(value, reshaped=root.name.startswith("conv2d"))
                graphs.append((ops + (act != "") + 6, f"cgra.{root.name}{suffix}{act}_requant_dequant", tail,
                               {**annotations, **dequant}, root.name))
                graphs += [(ops + (act != "") + 15, f"cgra.{root.name}{suffix}{act}_requant{CHAIN_MARK}_qadd", qadd, {
                    **annotations, **more}, root.name) for qadd, more in qadd_tail(annotations["requant"])
                    if "residual" not in extra and root.name.startswith("conv2d")]  # (qadd_epilogue.py)
    return graphs


#: Links of an elementwise chain a kernel's epilogue takes on as a FABRIC body (chains.py).
TAIL_DEPTH = 5


def _tail_graphs(roots: list[Root], bias) -> list[tuple]:
    """(ops, name, pattern, annotations, root name) of root [+ bias] followed by 1..TAIL_DEPTH
    links of an elementwise chain (roles n1.., the chain's input the root's value): a leaky relu
    or a hard-swish after a convolution runs on each output tile in place. Ranked by their calls,
    like the other chains, after an equally long chain of the epilogue's own (a relu stays the
    EPILOGUE's)."""
    graphs = []
    for root in roots:
        for suffix, summed, extra, ops in (("", root.pattern, {}, 1),
                                           ("_bias", is_op("relax.add")(root.pattern, bias), {"bias": bias}, 2)):
            inner, links = summed, {}
            for depth in range(1, TAIL_DEPTH + 1):
                inner = links[f"n{depth}"] = level_pattern(inner, summed)
                annotations = {"root": root.pattern, **root.roles, **extra, **links}
                graphs.append((ops + depth - 0.5, f"cgra.{root.name}{suffix}{CHAIN_MARK}{depth}", inner, annotations,
                               root.name))
    return graphs


def is_epilogue_chain(pattern: str) -> bool:
    """Whether `pattern` is a root's epilogue followed by an elementwise chain (_tail_graphs)."""
    return CHAIN_MARK in pattern and not pattern.startswith("cgra.fabric")


# ------------------------------------------------------------------ reading a matched chain

def check_distinct_operands(op: str, annotated: dict) -> None:
    """The kernel DMAs each operand from its own parameter: x @ x would give the offloaded
    function one parameter in two roles."""
    operands = [(role, annotated[role]) for role in ("lhs", "rhs", "bias") if role in annotated]
    for index, (role, expr) in enumerate(operands):
        for other, other_expr in operands[index + 1:]:
            if expr.same_as(other_expr):
                raise UnsupportedOperator(f"{op} takes the same tensor as {role} and {other}; the NPU "
                                          "kernel needs each operand as its own tensor")


def static_shape(expr, role: str) -> tuple:
    return require_static_shape(expr, role, UnsupportedOperator)


def epilogue_fields(op: str, annotated: dict) -> dict:
    """The KernelSpec fields a matched chain fixes before the op's own: dtype, acc_dtype,
    bias_shape, relu, clip. Raises UnsupportedOperator with the reason it cannot run."""
    check_distinct_operands(op, annotated)
    dtype, rhs_dtype = dtype_of(annotated["lhs"]), dtype_of(annotated["rhs"])
    if rhs_dtype != RHS_DTYPE.get(dtype, dtype):
        raise UnsupportedOperator(f"{op} mixes {dtype} and {rhs_dtype}; the PE array multiplies equal dtypes, "
                                  "or int16 activations by int8 weights")
    if dtype not in ACC_DTYPE:
        raise UnsupportedOperator(f"{op} on {dtype} is not supported (float32, bfloat16, float16, int8 with "
                                  "int32 output, or int16 x int8 with int64 output)")
    acc_dtype = ACC_DTYPE[dtype]
    # A 16-bit float's product may be stored in its format (rounded) or as the float32 sum itself.
    stored = stored_dtype(annotated, dtype_of(annotated["root"]))
    if stored not in ((dtype, acc_dtype) if dtype in HALF_FLOATS else (acc_dtype,)):
        raise UnsupportedOperator(f"{op} of {dtype} must produce {acc_dtype}, this one produces {stored} "
                                  f"(use out_dtype=\"{acc_dtype}\")")
    bias_shape = None
    if "bias" in annotated:
        bias_shape = static_shape(annotated["bias"], "bias")
        if len(bias_shape) == 0:  # a scalar input (a constant one is reshaped: normalise/scalars.py)
            raise UnsupportedOperator(f"the bias of {op} is a scalar (shape ()): the NPU's DMA moves tensors of rank "
                                      "1..4; the add runs on its own")
        if dtype_of(annotated["bias"]) != (rounded_via(annotated) or stored):
            raise UnsupportedOperator(f"the bias is {dtype_of(annotated['bias'])}, the kernel's output {stored}")
    clip = clip_bounds(annotated["clip"], acc_dtype) if "clip" in annotated else None
    return dict(dtype=dtype, acc_dtype=acc_dtype, bias_shape=bias_shape, relu="relu" in annotated, clip=clip,
                half_out=stored if stored in HALF_FLOATS else None, half_via=rounded_via(annotated))


def with_epilogue_tail(spec: KernelSpec, annotated: dict, name: str = "") -> KernelSpec:
    """`spec` with the residual add, the requantisation or the elementwise chain the chain
    ends in, if any; for a tail pattern (pattern `name`, epilogue_tail.py) its reshape,
    activation and multiplier."""
    if is_gated_pattern(name):
        return with_gated(spec, annotated)
    if is_rope_pattern(name):
        return with_rope(spec, annotated)
    if is_half_post_norm_pattern(name):  # half_post_norm.py: rounded, added in h, normed, rounded
        return with_half_post_norm(spec, annotated, with_epilogue_tail, with_reshape)
    if is_post_norm_pattern(name):  # post_norm.py: this chain, then a layer norm of its rows
        return with_post_norm(spec, annotated, name, with_epilogue_tail)
    if "half_residual" in annotated:  # half_residual.py: a rounded linear's residual add, rounded
        return _with_residual(with_rounded_residual(spec, annotated), annotated)
    if "half_act_cast" in annotated:  # half_bias.py: a rounded linear's activation, rounded
        return with_rounded_act(spec, annotated)
    tail = is_tail_pattern(name)
    if (spec.half_out or spec.half_via) and (tail or "n1" in annotated or "requant" in annotated):
        raise UnsupportedOperator(f"a {spec.dtype} {spec.op} fuses [+ bias] [+ residual] [relu | clip]; the ops "
                                  "after them run on their own (the vector unit computes float32, int32 and int8)")
    spec = with_reshape(spec, annotated) if tail else spec
    spec = _with_residual(spec, annotated) if "residual" in annotated and "qadd" not in annotated else spec
    spec = _with_fabric_tail(spec, annotated) if "n1" in annotated else spec
    spec = with_float_tail(spec, annotated, name) if tail else spec
    spec = _with_requant(spec, annotated) if "requant" in annotated else spec
    spec = with_qadd(spec, annotated, caller_out_shape(spec)) if "qadd" in annotated else spec
    return with_dequant(spec, annotated) if "dequant" in annotated else spec


def _with_fabric_tail(spec: KernelSpec, annotated: dict) -> KernelSpec:
    """`spec` with the chain after its epilogue as a FABRIC body, run on each output tile."""
    calls = [annotated[f"n{depth}"] for depth in range(1, TAIL_DEPTH + 1) if f"n{depth}" in annotated]
    ops = [str(call.op.name) for call in calls]
    what = f"{spec.op} -> " + " -> ".join(op.removeprefix("relax.") for op in ops)
    if spec.acc_dtype not in ("float32", "int32"):
        raise UnsupportedOperator(f"{what}: the PE fabric computes float32 or int32, not {spec.acc_dtype}")
    if len(calls) == 1 and ops[0] in ("relax.nn.relu", "relax.clip"):
        raise UnsupportedOperator(f"{what}: the EPILOGUE's own relu or clip")
    shape = static_shape(calls[-1], "result")
    if dtype_of(calls[-1]) != spec.acc_dtype or tuple(shape) != tuple(static_shape(calls[0], "result")):
        raise UnsupportedOperator(f"{what}: a constant broadcasts its result to {tuple(shape)}")
    return dataclasses.replace(spec, fabric_body=chain_body(calls, spec.acc_dtype, what),
                               source_ops=spec.source_ops + tuple(op.removeprefix("relax.") for op in ops))


def _with_residual(spec: KernelSpec, annotated: dict) -> KernelSpec:
    """`spec` with the residual add: a tensor of the output's exact shape in the acc dtype."""
    residual = annotated["residual"]
    for role in ("lhs", "rhs", "bias"):
        if role in annotated and annotated[role].same_as(residual) and not (role == "lhs" and reads_lhs_twice(spec)):
            raise UnsupportedOperator(f"the residual is also the {spec.op}'s {role}: each operand of an NPU "
                                      "kernel must be its own tensor (but a static 2-D matmul's or NCHW conv2d's "
                                      "left operand, residual_lhs.py)")
    if spec.compute_name in ("conv2d_layout", "batch_matmul"):
        form = "batched matmul" if spec.compute_name == "batch_matmul" else \
            f"{spec.data_layout}/{spec.kernel_layout} conv2d"
        raise UnsupportedOperator(f"a residual add is fused after NCHW and depthwise conv2d and 2-D matmul, "
                                  f"not yet after a {form}: the add runs on the host")
    if dtype_of(residual) != spec.operand_dtype:
        raise UnsupportedOperator(f"the residual is {dtype_of(residual)}, the kernel's sum {spec.operand_dtype}")
    out_symbols = spec.symbolic("out")
    shape, names = read_shape(residual, "residual", symbolic_axes=tuple(out_symbols), expressions=True)
    if names != out_symbols:
        raise UnsupportedOperator(f"the residual's symbolic axes {names} are not the output's {out_symbols}: "
                                  "they must be one size")
    out = caller_out_shape(spec)  # a (1, s, hidden) residual of a matmul folded to (s, hidden) rows
    if shape != out:
        raise UnsupportedOperator(f"the added tensor of shape {shape} is neither a bias (one value per output "
                                  f"channel) nor a residual of the output's shape {out}")
    if "lhs" in annotated and annotated["lhs"].same_as(residual):
        return with_lhs_residual(spec, shape)
    view = (("residual", shape),) if spec.op == "matmul" and shape != tuple(spec.output_shape) else ()
    return dataclasses.replace(spec, residual_shape=shape, symbols=spec.symbols + symbols_of("residual", names),
                               caller_shapes=spec.caller_shapes + view)


def _with_requant(spec: KernelSpec, annotated: dict) -> KernelSpec:
    """`spec` ending in a requantisation to int8 (int16 after an int64 accumulator):
    quantize(multiply(astype(x, float32), scale), 1.0, zp) with a float32 scale per output
    channel (shaped like a bias) and a zero point of the output's dtype."""
    quantize, multiply = annotated["requant"], annotated["requant_multiply"]
    if spec.acc_dtype not in REQUANT_DTYPE:
        raise UnsupportedOperator(f"requantisation to int8 follows an int8 x int8 -> int32 {spec.op} (to int16 an "
                                  f"int16 x int8 -> int64 one), not {spec.dtype}")
    out_dtype = REQUANT_DTYPE[spec.acc_dtype]
    if spec.compute_name in ("conv2d_layout", "batch_matmul"):
        raise UnsupportedOperator("requantisation is fused after NCHW conv2d and 2-D matmul, not yet after a "
                                  f"{spec.compute_name}: it runs on the host")
    if str(quantize.attrs.out_dtype) != out_dtype or _scalar_value(quantize.args[1], "float32") != 1.0:
        raise UnsupportedOperator(f"a requantisation is quantize(x * scale, 1.0, zero point) to {out_dtype}; this "
                                  "quantize has another scale or output dtype (the normalise stage writes the "
                                  "fused form)")
    zero_point = _scalar_value(quantize.args[2], out_dtype)
    if zero_point is None:
        raise UnsupportedOperator(f"the requantisation's zero point is not an {out_dtype} constant")
    if dtype_of(multiply.args[0]) != "float32" or dtype_of(annotated["scale"]) != "float32":
        raise UnsupportedOperator("the requantisation multiplies float32(acc) by a float32 scale row")
    shape = static_shape(annotated["scale"], "requantisation scale")
    expected = spec.bias_shape or _channel_row_shape(spec)
    if tuple(shape) != tuple(expected):
        raise UnsupportedOperator(f"the requantisation scale of shape {shape} is not one value per output "
                                  f"channel (expected {tuple(expected)})")
    return dataclasses.replace(spec, requant_zero_point=int(zero_point), scale_shape=tuple(shape))


def _channel_row_shape(spec: KernelSpec) -> tuple:
    """The shape of a per-output-channel row broadcast over the output: (n,) for a matmul,
    (1, F, 1, 1) (in the output layout) for a conv2d."""
    if spec.op == "matmul":
        return (spec.gemm_extents[1],)
    return tuple(spec.rhs_shape[0] if axis == "C" else 1 for axis in spec.out_layout)


def _scalar_value(expr, dtype: str):
    """The value of a 0-d constant of `dtype`, else None."""
    if not isinstance(expr, tvm.ir.GenericConst) or dtype_of(expr) != dtype:
        return None
    value = expr.value.numpy()
    return value.item() if value.ndim == 0 else None


# ------------------------------------------------------------------ the epilogue in the kernel

def epilogue_operands(spec: KernelSpec, out_shape) -> dict:
    """The epilogue's parameters as placeholders (None where the spec has none): the bias, the
    residual and the multiplier (shaped as the kernel stores its output, `out_shape`), the
    requantisation scale."""
    multiplier = te.placeholder(out_shape, spec.acc_dtype, name="multiplier") if spec.multiplier_shape else None
    scale = te.placeholder(spec.scale_shape, "float32", name="scale") if spec.scale_shape else None
    return {**({"dequant_table": scale} if spec.dequantise else {}),  # the parameter's role (dequant_epilogue.py)
            "bias": te.placeholder(spec.bias_shape, spec.operand_dtype, name="bias") if spec.bias_shape else None,
            "residual": te.placeholder(out_shape, "int8" if spec.qadd_body else spec.operand_dtype, name="residual")
            if spec.residual_shape else None,
            "multiplier": multiplier,
            "scale": scale,
            **{role: te.placeholder(shape, spec.acc_dtype, name=role) if shape else None
               for role, shape in (("ch_scale", spec.channel_scale_shape), ("ch_shift", spec.channel_shift_shape))},
            # a multiply by a tensor matched as the scale's pattern passes it as "ch_scale"
            **({"ch_scale": multiplier} if multiplier is not None and not spec.channel_scale_shape else {})}


def epilogue_compute(spec: KernelSpec, acc, tiling, operands: dict, out_index=None, residual_tile=None,
                     name: str = "epi"):
    """epi = requantise(clip(relu(acc + bias[col] + residual)), scale[col]) over the padded tile
    grid (the expression of the EPILOGUE intrinsic, so tensorize matches it). A grouped conv2d's
    image b holds group b % G, whose channels start at (b % G) * F/G. The residual is read
    through `out_index(*acc_indices)`, the output element an accumulator element becomes;
    outside the output (tile padding) it reads zero. The bias and the scale are staged in the
    scratchpad as rows (blocks bias_pad, scale_pad), the residual as a tile (res_pad), or
    `residual_tile`, a tile of acc's shape the kernel computes from what it already holds.
    `name`: the block's (a post-norm's program reads it: post_norm.py)."""
    bias_pad = channel_row(spec, acc, tiling, operands["bias"], spec.bias_shape, "bias_pad")
    scale_pad = dequant_row(tiling, operands["scale"]) if spec.dequantise else \
        channel_row(spec, acc, tiling, operands["scale"], spec.scale_shape, "scale_pad")
    cscale_pad = channel_row(spec, acc, tiling, operands.get("ch_scale") if spec.channel_scale_shape else None,
                              spec.channel_scale_shape, "cscale_pad")
    cshift_pad = channel_row(spec, acc, tiling, operands.get("ch_shift"), spec.channel_shift_shape, "cshift_pad")
    residual, res_pad = operands["residual"], residual_tile
    if residual is not None and res_pad is None:
        shape = list(residual.shape)  # ints, or a symbolic axis's variable
        res_pad = te.compute(acc.shape, lambda *idx: padded(residual, shape, out_index(*idx)), name="res_pad")
    multiplier, mul_pad = operands.get("multiplier"), None
    if multiplier is not None:
        mul_pad = te.compute(acc.shape, lambda *idx: padded(multiplier, list(multiplier.shape), out_index(*idx)),
                             name="mul_pad")

    def row(pad, idx):
        return pad(idx[0], idx[-1]) if spec.grouped else pad(idx[-1])

    def widened(value):  # a 16-bit float operand, exactly as float32 (the EPILOGUE's sum)
        return value.astype(spec.acc_dtype) if spec.half_out or spec.half_via else value

    def epi_value(*idx):
        value = acc(*idx)
        value = value + widened(row(bias_pad, idx)) if bias_pad is not None else value
        late = res_pad is not None and spec.half_via and spec.half_out  # added after the rounding (half_residual.py)
        value = value + widened(res_pad(*idx)) if res_pad is not None and not spec.qadd_body and not late else value
        value = value * row(cscale_pad, idx) if cscale_pad is not None else value
        value = value + row(cshift_pad, idx) if cshift_pad is not None else value
        value = activation(value, spec.acc_dtype, spec.relu, spec.clip)
        if spec.fabric_body:
            value = body_value(FabricBody(spec.fabric_body, spec.acc_dtype), value)
        if spec.half_via and spec.half_out:  # the linear's value rounded before its activation (half_bias.py)
            value = value.astype(spec.half_via).astype(spec.acc_dtype)
            value = value + widened(res_pad(*idx)) if late else value
        value = act_value(spec.act, value, tiling.act_on_vector) if spec.act else value
        value = value * mul_pad(*idx) if mul_pad is not None else value
        if spec.half_out:
            return value.astype(spec.half_out)  # rounded to nearest even on store
        if spec.half_via:  # rounded so, and widened straight back (half_bias.py)
            return value.astype(spec.half_via).astype(spec.acc_dtype)
        if scale_pad is None:
            return value
        if spec.dequantise:  # channel j's (multiplier, scale) at 2j, 2j + 1 (dequant_epilogue.py)
            return dequant_value(value, scale_pad, idx[-1], spec.requant_zero_point)
        value = requantise(value, row(scale_pad, idx), spec.requant_zero_point, REQUANT_DTYPE[spec.acc_dtype])
        return qadd_value(qadd_body(spec), spec.qadd_swapped, value, res_pad(*idx)) if spec.qadd_body else value

    return te.compute(acc.shape, epi_value, name=name)


def epilogue_intrin(spec: KernelSpec, tiling, rows: int | None = None) -> str:
    """The EPILOGUE intrinsic for a tile of `rows` (tiling.tm by default) x tiling.tn."""
    rows = tiling.tm if rows is None else rows
    if spec.post_norm:  # post_norm.py: the norm's last command (its sum's EPILOGUE is this without it)
        return post_norm_intrin(spec, tiling, rows)
    if spec.rope_pattern:  # rope_epilogue.py: x * C + the rotated products
        return combine_intrin(tiling, rows)
    if spec.gated:  # gated.py: a tile of tn / 2 outputs from the tn accumulator columns
        return get_intrin("epilogue", rows, tiling.tn // 2, "float32", bias=False, relu=False, act=spec.act,
                          gated=True, **({"gated_via": spec.gated_via} if spec.gated_via else {}))
    body = FabricBody(spec.fabric_body, spec.acc_dtype) if spec.fabric_body else None
    tail = dict(act=spec.act, multiplier=bool(spec.multiplier_shape)) if spec.act or spec.multiplier_shape else {}
    if spec.act and tiling.act_on_vector:
        tail = dict(tail, act_vfunc=True)
    if spec.act == "gelu" and tiling.fabric_gelu_rows:  # fabric_gelu.py
        tail = dict(tail, fabric_rows=tiling.fabric_gelu_rows)
    if spec.channel_scale_shape:
        tail = dict(tail, channel_scale=True, channel_shift=bool(spec.channel_shift_shape))
    if spec.half_out:
        tail = dict(tail, out_dtype=spec.half_out)
    if spec.half_via:  # (with half_out too: rounded before its activation, half_bias.py)
        tail = dict(tail, round_via=spec.half_via)
    return get_intrin("epilogue", rows, tiling.tn, spec.acc_dtype, bias=bool(spec.bias_shape), relu=spec.relu,
                      residual=bool(spec.residual_shape) and not spec.qadd_body, clip=spec.clip,
                      zero_point=spec.requant_zero_point, body=body, **tail,
                      **({"dequantise": True} if spec.dequantise else {}),
                      **({"qadd": qadd_body(spec), "qadd_swapped": spec.qadd_swapped} if spec.qadd_body else {}))
