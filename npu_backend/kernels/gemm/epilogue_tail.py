"""A float32 epilogue's tail: a reshape, an activation and a multiply after a GEMM-shaped kernel.

Stage: partition (the patterns, and the spec fields a match fixes). Transformers write a linear
layer as reshape(matmul(reshape(x), permute_dims(W)) [+ b]) and follow it with a residual add, a
SiLU / GELU, or SwiGLU's gate x up multiply, each of which ran as a kernel of its own: a round
trip through DRAM. Here, for each root of epilogue.py (matmul, linear, conv2d), one pattern

    [* multiplier] ( act ( [+ residual] ( [reshape] ( root [+ bias] ) ) )  |  relu | clip of that )

    act: sigmoid, nn.silu, multiply(x, sigmoid(x)) (either order), nn.gelu_tanh, nn.gelu (erf), tanh

is tried before the plain chains; each optional piece is an alternative the matcher takes when it
is there. A match whose tail holds nothing the plain chains lack (no activation of the list, no
multiplier, no reshape followed by an add or relu) is refused, so those keep their own patterns.
The reshape is free: the kernel stores its compact (rows, cols) output, which the caller reads as
the reshape's shape (a view, KernelSpec.caller_shapes); the residual and the multiplier are
read through the same view. The multiplier is a tensor of the output's shape, loaded per output
tile like the residual. SwiGLU thus runs as two kernels instead of four: the gate's linear with
SiLU in its epilogue, and the up projection's with the multiply by the gate's result in its.

Every piece computes what its standalone kernel computes on the same float32 values, with the
same commands (intrinsics/epilogue_tail.py), so the fused kernel is bit-exact to the unfused ones;
except that on a chip whose function unit has the smooth activation it runs as one VFUNC of
that unit beside the next tile's GEMM instead of FABRIC bodies on the PE array (act_on_vector).
"""

from __future__ import annotations

import dataclasses
import functools
import math

from tvm.relax.dpl import is_op, wildcard

from cgra_sim import cost, function_unit
from cgra_sim.isa import DType
from cgra_sim.mapping.body import reads_b

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of, require_static_shape, shape_dims
from ..common.chains import require_program
from ..common.dynamic import read_shape, symbols_of
from ..intrinsics.epilogue_tail import SMOOTH_ACTS, TAIL_ACTS, VFUNC_ACTS, act_passes
from .post_norm import post_norm_tile_cycles
from .rope_epilogue import rope_tile_cycles

#: The pattern-name suffix of a root's tail pattern: "cgra.linear_epilogue".
SUFFIX = "_epilogue"
#: Relax op -> the activation it is (the multiply form of SiLU is read from its operands).
_ACT_OPS = {"relax.sigmoid": "sigmoid", "relax.nn.silu": "silu", "relax.nn.gelu_tanh": "gelu_tanh",
            "relax.nn.gelu": "gelu", "relax.tanh": "tanh", "relax.multiply": "silu"}


def tail_graphs(roots) -> list[tuple]:
    """(name, pattern, annotations, root name) of every root's tail pattern (module doc)."""
    graphs = []
    # A linear (permute_dims + matmul) before a bare matmul, which would leave its transpose out.
    for root in sorted(roots, key=lambda root: -len(root.roles)):
        bias, residual, multiplier = wildcard(), wildcard(), wildcard()
        with_bias = is_op("relax.add")(root.pattern, bias)
        reshape = is_op("relax.reshape")(with_bias | root.pattern, wildcard())
        # The alternatives in the order the matcher must try them: an add of a bias is a bias
        # add before it is a residual one, as among the plain chains.
        with_res = functools.reduce(lambda a, b: a | b, [
            *(is_op("relax.add")(*pair) for inner in (reshape, with_bias) for pair in ((residual, inner), (inner, residual))),
            reshape, with_bias,
            is_op("relax.add")(residual, root.pattern), is_op("relax.add")(root.pattern, residual), root.pattern])
        # Wildcards, not constants: inside the composite the constants are its parameters, and the
        # target hook matches the pattern there again (a multiply by a tensor of the output's
        # shape with nothing after it is read as the multiplier).
        ch_scale, ch_shift = wildcard(), wildcard()
        scaled = is_op("relax.multiply")(with_res, ch_scale)
        shifted = is_op("relax.add")(scaled, ch_shift) | scaled | with_res  # a batch norm as Mul + Add
        sigmoid = is_op("relax.sigmoid")(shifted)
        act = functools.reduce(lambda a, b: a | b, [
            sigmoid, is_op("relax.nn.silu")(shifted), is_op("relax.nn.gelu_tanh")(shifted),
            is_op("relax.nn.gelu")(shifted), is_op("relax.tanh")(shifted), is_op("relax.multiply")(shifted, sigmoid),
            is_op("relax.multiply")(sigmoid, shifted)])
        relu = is_op("relax.nn.relu")(shifted)
        clip = is_op("relax.clip")(shifted, wildcard(), wildcard())
        activated = act | relu | clip | shifted
        top = activated | is_op("relax.multiply")(multiplier, activated) | \
            is_op("relax.multiply")(activated, multiplier)
        annotations = {"root": root.pattern, **root.roles, "bias": bias, "residual": residual, "reshape": reshape,
                       "act": act, "relu": relu, "clip": clip, "multiplier": multiplier, "ch_scale": ch_scale,
                       "ch_shift": ch_shift}
        graphs.append((f"cgra.{root.name}{SUFFIX}", top, annotations, root.name))
    return graphs


def is_tail_pattern(name: str) -> bool:
    return name.endswith(SUFFIX)


def with_reshape(spec, annotated: dict):
    """`spec` whose output the caller reads as the reshape after its root (a view of the
    compact output), when the match has one."""
    if "reshape" not in annotated:
        return spec
    if spec.op != "matmul" or spec.symbols:
        raise UnsupportedOperator(f"a reshape after a {spec.op} with symbolic sizes or another layout is "
                                  "a host view; the epilogue after it runs on its own")
    shape = tuple(require_static_shape(annotated["reshape"], "reshape", UnsupportedOperator))
    if math.prod(shape) != math.prod(spec.output_shape):
        raise UnsupportedOperator(f"the reshape to {shape} is not of the {spec.op}'s {spec.output_shape} elements")
    callers = tuple((role, s) for role, s in spec.caller_shapes if role != "out")
    out = () if shape == tuple(spec.output_shape) else (("out", shape),)
    return dataclasses.replace(spec, caller_shapes=callers + out)


def caller_out_shape(spec) -> tuple:
    """The output's shape as the caller passes it (a view of the kernel's, or its own)."""
    if spec.op == "matmul":
        return tuple(dict(spec.caller_shapes).get("out", spec.output_shape))
    return tuple(spec.output_shape["NCHW".index(axis)] for axis in spec.out_layout)


def with_float_tail(spec, annotated: dict, name: str):
    """`spec` with the activation and the multiplier of a tail pattern's match; refuses a
    match the plain chains take (module doc) and what the kernel cannot run."""
    annotated = _scale_as_multiplier(spec, annotated)
    act = _act(annotated)
    plain_after_reshape = "reshape" in annotated and any(r in annotated for r in ("residual", "relu", "clip"))
    if act is None and "multiplier" not in annotated and "ch_scale" not in annotated and not plain_after_reshape:
        raise UnsupportedOperator(f"'{name}' matched only what the plain epilogue chains take")
    if (act or "multiplier" in annotated) and (spec.acc_dtype != "float32" or spec.requant_zero_point is not None):
        raise UnsupportedOperator(f"an activation or a multiply after a {spec.op} is fused for float32 "
                                  f"(this one accumulates {spec.acc_dtype})")
    # With symbolic rows, lower/ragged.py cuts the last tile's FABRIC and VFUNC rows as its EPILOGUE's.
    spec = dataclasses.replace(spec, act=act)
    spec = _with_channel_affine(spec, annotated) if "ch_scale" in annotated else spec
    return _with_multiplier(spec, annotated) if "multiplier" in annotated else spec


def _scale_as_multiplier(spec, annotated: dict) -> dict:
    """A "ch_scale" of the output's shape, with nothing after its multiply, is the multiplier."""
    if "ch_scale" not in annotated or any(r in annotated for r in ("ch_shift", "act", "relu", "clip", "multiplier")):
        return annotated
    dims = shape_dims(annotated["ch_scale"])
    if dims is not None and all(isinstance(d, int) for d in dims):  # symbolic: no constant per channel
        shape = tuple(dims)
        if _per_channel(spec, shape) and shape != caller_out_shape(spec):
            return annotated
    roles = {role: expr for role, expr in annotated.items() if role != "ch_scale"}
    return {**roles, "multiplier": annotated["ch_scale"]}


def _with_channel_affine(spec, annotated: dict):
    """`spec` with a multiply by a constant per output channel (and an add of one) before its
    relu / clip / activation: a batch norm after the bias, as Mul + Add (DenseNet's)."""
    if spec.acc_dtype != "float32" or spec.compute_name not in ("conv2d", "matmul") or spec.grouped or spec.symbols:
        raise UnsupportedOperator(f"a per-channel multiply after a {spec.compute_name} is fused for float32 NCHW "
                                  "conv2d and 2-D matmul with static sizes: it runs on its own")
    shapes = {}
    for role in ("ch_scale", "ch_shift"):
        if role in annotated:
            shape = tuple(require_static_shape(annotated[role], role, UnsupportedOperator))
            if dtype_of(annotated[role]) != "float32" or not _per_channel(spec, shape):
                raise UnsupportedOperator(f"the {spec.op}'s multiply or add by a constant of shape {shape} is not "
                                          "one float32 value per output channel")
            shapes[role] = shape
    return dataclasses.replace(spec, channel_scale_shape=shapes["ch_scale"],
                               channel_shift_shape=shapes.get("ch_shift"))


def _per_channel(spec, shape: tuple) -> bool:
    """Whether a constant of `shape` broadcasts one value per output channel over the output."""
    if spec.op == "matmul":
        return len(shape) >= 1 and shape[-1] == spec.gemm_extents[1] and all(d == 1 for d in shape[:-1])
    channels = spec.rhs_shape[0]
    return len(shape) in (3, 4) and shape[-3] == channels and all(d == 1 for d in shape[:-3] + shape[-2:])


def _act(annotated: dict) -> str | None:
    if "act" not in annotated:
        return None
    act = _ACT_OPS[str(annotated["act"].op.name)]
    assert act in TAIL_ACTS
    return act


def _with_multiplier(spec, annotated: dict):
    """`spec` times a float32 tensor of the output's shape (as the caller passes the output)."""
    multiplier = annotated["multiplier"]
    for role in ("lhs", "rhs", "bias", "residual"):
        if role in annotated and annotated[role].same_as(multiplier):
            raise UnsupportedOperator(f"the multiplier is also the {spec.op}'s {role}: each operand of an NPU "
                                      "kernel must be its own tensor")
    if spec.op != "matmul" or spec.compute_name != "matmul":
        raise UnsupportedOperator(f"a multiply by a tensor is fused after a 2-D or shared-weight matmul, not a "
                                  f"{spec.compute_name}: it runs on its own")
    if dtype_of(multiplier) != "float32":
        raise UnsupportedOperator(f"the multiplier is {dtype_of(multiplier)}, the output float32")
    out_symbols = spec.symbolic("out")  # symbolic rows: the multiplier's, loaded and cut like a residual
    shape, names = read_shape(multiplier, "multiplier", symbolic_axes=tuple(out_symbols), expressions=True)
    if names != out_symbols:
        raise UnsupportedOperator(f"the multiplier's symbolic axes {names} are not the output's {out_symbols}")
    if shape != caller_out_shape(spec):
        raise UnsupportedOperator(f"the multiplier of shape {shape} is not of the output's shape "
                                  f"{caller_out_shape(spec)} (a broadcast multiply runs on its own)")
    # (under both roles: a multiply read as the scale's pattern passes its tensor as "ch_scale")
    view = (("multiplier", shape), ("ch_scale", shape)) if shape != tuple(spec.output_shape) else ()
    return dataclasses.replace(spec, multiplier_shape=shape, caller_shapes=spec.caller_shapes + view,
                               symbols=spec.symbols + symbols_of("multiplier", names) + symbols_of("ch_scale", names))


def act_on_vector(spec, arch) -> bool:
    """Whether the smooth activation runs as one VFUNC through the chip's function unit rather
    than as FABRIC bodies: where the unit has the function. Its pipeline takes an element per lane
    a cycle on the vector unit, beside the next tile's GEMM; the bodies take the PE array itself
    (1.6 cycles an element on cgra-8x8, between two tiles' GEMMs). A chip without the unit (or
    without the function in it) keeps the bodies: on the lanes alone the function's 36-41
    operations an element cost more than they do."""
    return spec.act in SMOOTH_ACTS and function_unit.runs(arch.function_unit, spec.act)


def tail_tile_cycles(spec, arch):
    """cycles(elements) -> (PE array, vector unit) cycles of the activation's and the multiply's
    work on one output tile, as their standalone kernels price it (sigmoid.py, special.py,
    eltwise.py); None without them. A smooth activation's FABRIC bodies run on the PE array
    (between two tiles' GEMMs), a VFUNC (GELU's, or a smooth one through the function unit:
    act_on_vector) and the multiplies on the vector unit, a VFUNC priced by its issue
    (cost.vfunc_issue_cycles: on the function unit its fill overlaps the next tile's commands,
    as the simulator times it). A smooth activation's bodies must map onto the chip's fabric."""
    if getattr(spec, "rope_pattern", None):  # rope_epilogue.py
        return rope_tile_cycles(spec, arch)
    if getattr(spec, "post_norm", None):  # post_norm.py
        return post_norm_tile_cycles(spec, arch)
    if not spec.act and not spec.multiplier_shape:
        return None
    if spec.gated:  # gated.py: the VFUNC (rounding to gated_via itself: isa.VFUNC_FLOAT32_OUT) and the multiply
        return lambda elements: (0, cost.vfunc_cycles(arch, elements // 2, spec.act)
                                 + cost.eltwise_cycles(arch, elements // 2, elements))
    vfunc = spec.act in VFUNC_ACTS or act_on_vector(spec, arch)
    programs = [(require_program(nodes, "float32", arch, spec.act), nodes) for nodes in act_passes(spec.act)] \
        if spec.act and not vfunc else []

    def cycles(elements: int) -> tuple[int, int]:
        array = sum(cost.fabric_run_cycles(arch, program, elements, (12 if reads_b(nodes) else 8) * elements)
                    for program, nodes in programs)
        vector = cost.vfunc_issue_cycles(arch, elements, spec.act) if vfunc else 0
        multiplies = (not vfunc and spec.act not in (None, "sigmoid")) + bool(spec.multiplier_shape)
        # (A 16-bit linear's value rounded before its activation and after, half_bias.py: the
        # EPILOGUE's store and the VFUNC's own rounding, no pass more.)
        return array, vector + multiplies * cost.eltwise_cycles(arch, elements, 2 * elements)

    return cycles


def check_tail_padding(spec, tiling, arch) -> None:
    """Refuse an activation whose run over the padded tiles (rows and columns rounded up to
    whole tiles: 17 tokens are 24 rows) costs more than its own kernel would over the real
    elements, whose extra cost is the round trip of the tensor through DRAM; unless the whole
    padded tail, with the epilogue's own streams, fits beside the kernel's weight load
    (`hidden_by_weights`: ConvNeXt's 4-row fc1 + GELU reads 256 KB of weights)."""
    if tail_padding_refused(spec, tiling, arch):
        rows, cols, _ = spec.gemm_extents
        raise UnsupportedOperator(f"{spec.act} after the {spec.op}: its tiles pad {rows} x {cols} to {tiling.mp} x "
                                  f"{tiling.np}, and the activation over the padding costs more than its own kernel")


def tail_padding_refused(spec, tiling, arch) -> bool:
    """Whether check_tail_padding refuses `tiling`."""
    tail = tail_tile_cycles(spec, arch) if spec.act else None
    if tail is None:
        return False
    rows, cols, _ = spec.gemm_extents
    real, padded = rows * cols * max(spec.batch, 1), tiling.mp * tiling.np * max(spec.batch, 1)
    if spec.op == "matmul" and spec.batch <= 1 and isinstance(rows, int) and rows < tiling.tm == tiling.mp:
        padded = rows * tiling.np  # one padded row tile: its commands run on the valid rows (lower/padded_rows.py)
    return sum(tail(padded)) > sum(tail(real)) + _apart_round_trip(spec, arch, real) and \
        not hidden_by_weights(spec, arch, sum(tail(padded)) + cost.vector_stream_cycles(arch, 2 * padded))


def _apart_round_trip(spec, arch, elements: int) -> int:
    """The DMA cycles at least that the activation's own kernel adds over `elements`: a float32
    round trip (8 bytes an element); a 16-bit linear's rounded activation (half_bias.py) runs as
    the linear storing its widened float32 value, the activation and the cast kernel, 16 bytes
    an element more than the one kernel storing h, and two kernels more, each paying its load's
    and its store's latency."""
    if spec.half_via and spec.half_out and spec.act:
        return cost.dma_transfer_cycles(arch, 16 * elements) + 4 * arch.dma_latency
    return cost.dma_transfer_cycles(arch, 8 * elements)


def hidden_by_weights(spec, arch, work: int) -> bool:
    """Whether `work` cycles of the vector unit and the PE array's tail fit in the time the load
    engine needs for the kernel's weights alone (B, read at least once: a bound no tiling
    beats), so that they cost the kernel nothing."""
    _, cols, depth = spec.gemm_extents
    weights = depth * cols * DType.from_name(spec.dtype).itemsize
    return work <= cost.dma_transfer_cycles(arch, weights)
