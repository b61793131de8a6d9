"""The EPILOGUE of a 16-bit linear rounded, then its residual added in h, rounded again.

Stage: schedule and tensorize (kernels/gemm/half_residual.py's chains; epilogue_tail.
epilogue_intrin dispatches here). PyTorch's bfloat16 / float16 `x + linear(h)` (GPT-2's and ViT's
residual adds after the attention's output projection and fc2) rounds twice: the linear's float32
sum plus its bias to h, then the sum of the two h tensors (computed in float32) to h again:

    out = round_h(widen(round_h(acc + widen(bias))) + widen(res))

Two commands per output tile, each the one a standalone kernel runs: an EPILOGUE rounds acc +
bias into the output tile (vector_unit.epilogue_intrin's rounding store), then an ELTWISE add in
h of that tile and the residual tile, in place (the lanes widen both, add in float32, round to
nearest even: the add kernel's own arithmetic on the same values). One EPILOGUE with the residual
would round once, which is not the model's value.
"""

from __future__ import annotations

from .builder import SPAD, Tile, intrinsic
from .vector_unit import eltwise_call, epilogue_call, epilogue_value

HALF_FLOATS = ("bfloat16", "float16")


def rounded_residual_intrin(rows: int, cols: int, via: str, *, bias: bool, scope: str = SPAD):
    """(description, implementation) of the rows x cols tile's rounded sum plus its rounded
    residual add (module doc); the bias and the residual tile in `via`."""
    if via not in HALF_FLOATS:
        raise ValueError(f"a rounded residual add rounds to bfloat16 or float16, not {via}")
    inputs = [Tile("Acc", (rows, cols), "float32")] + ([Tile("Bias", (cols,), via)] if bias else []) \
        + [Tile("Res", (rows, cols), via)]

    def value(buffers, i, j):
        total = epilogue_value(buffers, i, j, "float32", bias=bias, relu=False, residual=False, clip=None)
        return (total.astype(via).astype("float32") + buffers["Res"][i, j].astype("float32")).astype(via)

    def call(buffers, strides):
        out, stride = buffers["Out"], strides["Out"][0]
        return [epilogue_call(buffers, strides, rows, cols, "float32", via, bias=bias, relu=False, residual=False,
                              clip=None, out=(out, stride)),
                eltwise_call("add", via, rows, cols, (out, stride, 1), (buffers["Res"], strides["Res"][0], 1),
                             (out, stride))]

    return intrinsic(inputs, Tile("Out", (rows, cols), via), "epi", value, call, scope=scope)
