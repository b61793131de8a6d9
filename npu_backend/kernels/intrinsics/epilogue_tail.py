"""The EPILOGUE intrinsic with a float32 activation and a multiplier after it.

Stage: schedule and tensorize. A GEMM or conv2d kernel's epilogue (kernels/gemm/epilogue.py and
epilogue_tail.py) may end, after EPILOGUE's own [+ bias] [+ residual] [relu | clip] and a fabric
chain, in an activation the EPILOGUE command lacks, and then a multiply by a second tensor of the
output's shape (SwiGLU's gate x up):

    out = (act(epilogue(acc)) [* mul])      act: sigmoid, silu, gelu_tanh (FABRIC bodies,
                                            smooth.py, or with act_vfunc one VFUNC of the
                                            function unit's) or gelu (erf form: one VFUNC)

Each piece runs the very commands its standalone kernel runs on the tile in the scratchpad, so the
result is bit-exact to the unfused kernels: the smooth activations read the EPILOGUE's value from
the accumulator tile (the EPILOGUE writes it in place there; the accumulator is dead after it)
and write the output tile, GELU's VFUNC and the multiply's ELTWISE work on the output tile in
place. An EPILOGUE with nothing to do (no bias, residual, relu, clip, scale or chain: a copy) is
left out: the first piece reads the accumulator tile and writes the output tile. Without an activation or a multiplier this is vector_unit.epilogue_intrin itself.
"""

from __future__ import annotations

from cgra_sim.mapping.sigmoid import passes

from .builder import SPAD, Tile, intrinsic
from .fabric import body_value, fabric_call
from .rounded_residual import rounded_residual_intrin
from .row_ops import vfunc_call, vfunc_value
from .smooth import smooth_calls, smooth_value
from .vector_unit import activation, eltwise_call, epilogue_call, epilogue_value
from .vector_unit import epilogue_intrin as plain_epilogue_intrin

#: Activations after the epilogue: the smooth family's (FABRIC bodies) and those only a VFUNC
#: computes, GELU's erf form and tanh (BERT's and ViT's pooler).
SMOOTH_ACTS = ("sigmoid", "silu", "gelu_tanh")
VFUNC_ACTS = ("gelu", "tanh")
TAIL_ACTS = SMOOTH_ACTS + VFUNC_ACTS


def act_value(act: str, x, vfunc: bool = False):
    """The TIR of the activation of one element, as its standalone kernel's compute writes it, or
    (`vfunc`, a smooth activation) as the VFUNC of the function unit computes it."""
    return vfunc_value(act, x) if act in VFUNC_ACTS or vfunc else smooth_value(act, x)


def act_passes(act: str) -> tuple:
    """The FABRIC bodies a smooth activation runs (none for GELU's or tanh's VFUNC)."""
    return tuple(passes(act)) if act in SMOOTH_ACTS else ()


def epilogue_intrin(rows: int, cols: int, dtype: str, *, bias: bool, relu: bool, residual: bool = False,
                    clip=None, zero_point: int | None = None, body=None, act: str | None = None,
                    multiplier: bool = False, channel_scale: bool = False, channel_shift: bool = False,
                    out_dtype: str | None = None, act_vfunc: bool = False, gated: bool = False,
                    gated_via: str | None = None, round_via: str | None = None, dequantise: bool = False,
                    qadd=None, qadd_swapped: bool = False, fabric_rows: int = 0, scope: str = SPAD):
    """EPILOGUE over a rows x cols tile of the accumulator (`dtype`): out = requantise?(clip?(relu?(acc +
    bias? + residual?)), scale, zero_point), then with `body` (a FabricBody) a FABRIC runs it over
    the output tile in place; float32: with `channel_scale` (and `channel_shift`) the sum is
    multiplied by a row of cols (ELTWISE) and that row added (a second EPILOGUE, with the relu or
    clip) before the relu or clip; then with `act` a sigmoid, silu, gelu_tanh (FABRIC bodies)
    or gelu or tanh (VFUNC) of it (`act_vfunc`: a smooth one as a VFUNC too, through the function unit) and
    with `multiplier` an ELTWISE multiply by a rows x cols tile. bias: a
    row of cols; residual: a rows x cols tile; clip: None or (lo, hi); zero_point: None, or an int8
    output requantised with a float32 scale row (int32 accumulators only); out_dtype: None, or a
    16-bit float the float32 result is rounded to (vector_unit.epilogue_intrin; no tail then);
    round_via: None, or a 16-bit float the float32 result is rounded to and widened straight back
    (round_trip_intrin); dequantise: the requantised int8 dequantised to float32
    (vector_unit.epilogue_intrin; no tail); qadd, qadd_swapped: the requantised int8 result's QLinearAdd
    with an int8 tile (vector_unit.epilogue_intrin; no tail); fabric_rows: GELU's (erf) first rows as
    FABRIC passes on the PE array (kernels/gemm/fabric_gelu.py), the VFUNC taking the others."""
    if gated:
        return gated_intrin(rows, cols, act, gated_via, scope=scope)
    plain = dict(bias=bias, relu=relu, residual=residual, clip=clip, zero_point=zero_point, body=body)
    if round_via is not None and residual and out_dtype == round_via:  # rounded, then + residual, rounded
        if act is not None or multiplier or channel_scale or dequantise or relu or clip is not None or body is not None:
            raise ValueError("a rounded epilogue's residual add fuses [+ bias] before it only")
        return rounded_residual_intrin(rows, cols, round_via, bias=bias, scope=scope)
    if round_via is not None and act is not None and out_dtype == round_via:
        if multiplier or channel_scale or dequantise or residual or body is not None:
            raise ValueError("a rounded epilogue's activation fuses [+ bias] [relu | clip] before it only")
        return rounded_act_intrin(rows, cols, round_via, act, bias=bias, relu=relu, clip=clip,
                                  act_vfunc=act_vfunc, scope=scope)
    if round_via is not None:
        if act is not None or multiplier or channel_scale or out_dtype is not None or dequantise:
            raise ValueError("an epilogue rounded and widened back fuses [+ bias] [+ residual] [relu | clip] only")
        return round_trip_intrin(rows, cols, round_via, bias=bias, relu=relu, residual=residual, clip=clip,
                                 scope=scope)
    if act is None and not multiplier and not channel_scale:
        return plain_epilogue_intrin(rows, cols, dtype, **plain, out_dtype=out_dtype, dequantise=dequantise,
                                     qadd=qadd, qadd_swapped=qadd_swapped, scope=scope)
    if dtype != "float32" or zero_point is not None or dequantise or qadd is not None or (act is not None and act not in TAIL_ACTS) or \
            (channel_shift and not channel_scale) or out_dtype is not None:
        raise ValueError(f"an epilogue's activation {act} and multiplier are float32 ({dtype}, requantising: "
                         f"{zero_point is not None}); activations {TAIL_ACTS}")
    inputs = [Tile("Acc", (rows, cols), dtype)] + ([Tile("Bias", (cols,), dtype)] if bias else []) \
        + ([Tile("Res", (rows, cols), dtype)] if residual else []) \
        + ([Tile("Mul", (rows, cols), dtype)] if multiplier else []) \
        + ([Tile("CScale", (cols,), dtype)] if channel_scale else []) \
        + ([Tile("CShift", (cols,), dtype)] if channel_shift else [])

    def value(buffers, i, j):
        if channel_scale:
            total = epilogue_value(buffers, i, j, dtype, bias=bias, relu=False, residual=residual, clip=None)
            total = total * buffers["CScale"][j]
            total = total + buffers["CShift"][j] if channel_shift else total
            total = activation(total, dtype, relu, clip)
        else:
            total = epilogue_value(buffers, i, j, dtype, bias=bias, relu=relu, residual=residual, clip=clip)
        total = body_value(body, total) if body is not None else total
        total = act_value(act, total, act_vfunc) if act is not None else total
        return total * buffers["Mul"][i, j] if multiplier else total

    # Nothing to add, clip or scale: the EPILOGUE would copy the accumulator, so the activation
    # (or the multiply) reads the accumulator itself (the same values: the results are the
    # same bits) and the vector unit, and the PE array waiting for it, skip a pass over the tile.
    identity = not (bias or residual or relu or clip is not None or body is not None or channel_scale)
    fabric = act in SMOOTH_ACTS and not act_vfunc  # else a VFUNC (GELU's, or a smooth one's)
    shared = fabric_rows if act == "gelu" else 0  # the fabric's rows of GELU (fabric_gelu.py)
    if not 0 <= shared <= rows or (shared and (relu or residual or clip is not None or body is not None
                                               or channel_scale or multiplier)):
        raise ValueError(f"the fabric's GELU takes 0 to {rows} rows of a tile whose epilogue is [+ bias], "
                         f"not {fabric_rows}")

    def call(buffers, strides):
        if shared:  # only [+ bias] before it (fabric_gelu.applies)
            return _shared_gelu(buffers, strides, rows, cols, shared, bias)
        acc, out = (buffers["Acc"], strides["Acc"][0]), (buffers["Out"], strides["Out"][0])
        first = acc if fabric or identity else out  # where the EPILOGUE's value goes
        if identity:
            calls = []
        elif channel_scale:  # the sum, times the row, plus the row with the relu or clip
            calls = [epilogue_call(buffers, strides, rows, cols, dtype, dtype, bias=bias, relu=False,
                                   residual=residual, clip=None, out=first),
                     eltwise_call("multiply", dtype, rows, cols, (*first, 1), (buffers["CScale"], 0, 1), first)]
            shift = {"Acc": first[0], **({"Bias": buffers["CShift"]} if channel_shift else {})}
            if channel_shift or relu or clip is not None:  # (else it would copy the tile onto itself)
                calls.append(epilogue_call(shift, {"Acc": (first[1],)}, rows, cols, dtype, dtype, bias=channel_shift,
                                           relu=relu, residual=False, clip=clip, out=first))
        else:
            calls = [epilogue_call(buffers, strides, rows, cols, dtype, dtype, bias=bias, relu=relu,
                                   residual=residual, clip=clip, out=first)]
        if body is not None:
            calls.append(fabric_call(body, rows, cols, *first, *first))
        if fabric:
            calls += smooth_calls(act, rows, cols, acc, out)
        elif act is not None:
            calls.append(vfunc_call(act, rows, cols, first, out))
        if multiplier:  # of the activation's result, or of the accumulator itself
            calls.append(eltwise_call("multiply", dtype, rows, cols, (*(out if act else first), 1),
                                      (buffers["Mul"], strides["Mul"][0], 1), out))
        return calls

    return intrinsic(inputs, Tile("Out", (rows, cols), dtype), "epi", value, call, scope=scope)


def _shared_gelu(buffers, strides, rows: int, cols: int, shared: int, bias: bool) -> list:
    """GELU(Acc [+ Bias]) into Out with the first `shared` rows on the fabric (fabric_gelu.share_calls)."""
    from ..gemm.fabric_gelu import share_calls  # (kernels/gemm imports this module)

    def tile(name: str) -> tuple:
        return buffers[name].data, buffers[name].elem_offset, strides[name][0]

    at = (buffers["Bias"].data, buffers["Bias"].elem_offset) if bias else None
    return share_calls(rows, cols, shared, tile("Acc"), tile("Out"), at)


def gated_intrin(rows: int, cols: int, act: str, via: str | None = None, scope: str = SPAD):
    """A gated linear unit's epilogue (kernels/gemm/gated.py): Out[i, j] = act(Acc[i, 2j]) *
    Acc[i, 2j + 1] from a rows x 2 cols accumulator tile, float32: one VFUNC of the even columns
    (column stride 2) into the output tile, one ELTWISE multiplying it by the odd columns. With
    `via` (a 16-bit float) the activation is rounded to it and widened back before the multiply:
    the VFUNC's own rounding (dtype via, float32 in and out: isa.VFUNC_FLOAT32_OUT), no pass more."""
    if act not in TAIL_ACTS:
        raise ValueError(f"a gated unit's activation is one of {TAIL_ACTS}, not {act}")
    if via is not None and via not in ("bfloat16", "float16"):
        raise ValueError(f"a gated unit rounds its activation to bfloat16 or float16, not {via}")

    def value(buffers, i, j):
        activated = act_value(act, buffers["Acc"][i, 2 * j], True)
        if via is not None:
            activated = activated.astype(via).astype("float32")
        return activated * buffers["Acc"][i, 2 * j + 1]

    def call(buffers, strides):
        acc, out = buffers["Acc"], buffers["Out"]
        odd = (acc.data, acc.elem_offset + 1)
        # With `via` the VFUNC itself rounds (stream v14): float32 in and out, the result rounded
        # to via and held widened back, where two EPILOGUEs rounded and widened it after a float32 VFUNC.
        rounding = dict(half=via, float32_in=True, float32_out=True) if via is not None else {}
        calls = [vfunc_call(act, rows, cols, (acc, strides["Acc"][0]), (out, strides["Out"][0]), a_col_stride=2,
                            **rounding)]
        return calls + [eltwise_call("multiply", "float32", rows, cols, (out, strides["Out"][0], 1),
                                     (odd, strides["Acc"][0], 2), (out, strides["Out"][0]))]

    return intrinsic([Tile("Acc", (rows, 2 * cols), "float32")], Tile("Out", (rows, cols), "float32"), "epi", value,
                     call, scope=scope)


def round_trip_intrin(rows: int, cols: int, via: str, *, bias: bool, relu: bool, residual: bool, clip,
                      scope: str = SPAD):
    """A float32 EPILOGUE whose result is rounded to `via` (a 16-bit float) and widened straight
    back (kernels/gemm/half_bias.py: HF's bf16 ViT's q / k / v and fc1): one EPILOGUE rounds
    acc + bias? + residual? (those in `via`, widened exactly) into the upper half of each output
    row (cols even: a row of cols 16-bit values is the second half of a float32 row), a second
    widens it back over the row (its writes of element j end before the bytes of elements it has
    not read yet), as gated_intrin's rounding does."""
    if via not in ("bfloat16", "float16") or cols % 2:
        raise ValueError(f"an epilogue rounds to bfloat16 or float16 and back over an even number of columns, "
                         f"not {via} over {cols}")
    inputs = [Tile("Acc", (rows, cols), "float32")] + ([Tile("Bias", (cols,), via)] if bias else []) \
        + ([Tile("Res", (rows, cols), via)] if residual else [])

    def value(buffers, i, j):
        total = epilogue_value(buffers, i, j, "float32", bias=bias, relu=relu, residual=residual, clip=clip)
        return total.astype(via).astype("float32")

    def call(buffers, strides):
        out, stride = buffers["Out"], strides["Out"][0]
        upper = ((out.data, out.elem_offset + cols // 2), 2 * stride)  # in via's elements
        return [epilogue_call(buffers, strides, rows, cols, "float32", via, bias=bias, relu=relu,
                              residual=residual, clip=clip, out=upper),
                epilogue_call({"Acc": upper[0]}, {"Acc": (2 * stride,)}, rows, cols, via, "float32",
                              bias=False, relu=False, residual=False, clip=None, out=(out, stride))]

    return intrinsic(inputs, Tile("Out", (rows, cols), "float32"), "epi", value, call, scope=scope)


def rounded_act_intrin(rows: int, cols: int, via: str, act: str, *, bias: bool, relu: bool, clip,
                       act_vfunc: bool = False, scope: str = SPAD):
    """A float32 EPILOGUE rounded to `via` (a 16-bit float), widened back, its activation, rounded
    to `via` on store (kernels/gemm/half_bias.py: a bfloat16 GPT-2's GELU after its up projection):
    an EPILOGUE rounds acc + bias? (bias in `via`) into the output tile, and the activation runs
    over it in place as one VFUNC of dtype `via` (stream v14: widening its input, rounding its
    result; a smooth one through the function unit: `act_vfunc`), where a float32 VFUNC needed
    an EPILOGUE widening before it and one rounding after it. The values the GEMM, the
    activation and the cast kernels compute apart."""
    if via not in ("bfloat16", "float16") or act not in TAIL_ACTS or not (act in VFUNC_ACTS or act_vfunc):
        raise ValueError(f"a rounded epilogue's activation runs as a VFUNC, rounded to bfloat16 or float16, "
                         f"not {act} to {via}")
    inputs = [Tile("Acc", (rows, cols), "float32")] + ([Tile("Bias", (cols,), via)] if bias else [])

    def value(buffers, i, j):
        total = epilogue_value(buffers, i, j, "float32", bias=bias, relu=relu, residual=False, clip=clip)
        return act_value(act, total.astype(via).astype("float32"), act_vfunc).astype(via)

    def call(buffers, strides):
        out = (buffers["Out"], strides["Out"][0])
        return [epilogue_call(buffers, strides, rows, cols, "float32", via, bias=bias, relu=relu, residual=False,
                              clip=clip, out=out),
                vfunc_call(act, rows, cols, out, out, half=via)]

    return intrinsic(inputs, Tile("Out", (rows, cols), via), "epi", value, call, scope=scope)
