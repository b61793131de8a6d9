"""The smooth activations' intrinsic: sigmoid, SiLU and GELU's tanh form as FABRIC bodies in turn.

Stage: schedule and tensorize. The fabric has no exp, divider or lookup, and a FABRIC record holds
16 nodes: sigmoid is three bodies of adds, multiplies, max and min (cgra_sim/mapping/sigmoid.py
says how and how close), each run over the whole tile before the next, Out holding each pass's
result; SiLU and GELU multiply by x on the vector unit. `smooth_value` is the TIR of one element
that the kernel's TE compute (kernels/elementwise/sigmoid.py) builds identically, so tensorize matches.
"""

from __future__ import annotations

from tvm import tirx

from cgra_sim.mapping import sigmoid as smooth

from .builder import SPAD, Tile, intrinsic
from .fabric import FabricBody, fabric_call
from .vector_unit import eltwise_call



def smooth_value(kind: str, x):
    """The TIR of one element of sigmoid(x), x sigmoid(x) or GELU's tanh form, as the kernel's
    TE compute (kernels/elementwise/sigmoid.py) writes it, so tensorize matches."""
    if kind == "sigmoid":
        return tirx.sigmoid(x)
    if kind == "silu":
        return x * tirx.sigmoid(x)
    argument = x * (tirx.const(smooth.GELU_LINEAR, "float32") + tirx.const(smooth.GELU_CUBIC, "float32") * (x * x))
    return x * tirx.sigmoid(argument)


def smooth_intrin(rows: int, cols: int, kind: str, *, scope: str = SPAD):
    """FABRIC bodies in turn (then, for SiLU and GELU, an ELTWISE multiply by A): Out[rows, cols] =
    sigmoid(A), A sigmoid(A) or GELU's tanh form over a float32 tile, Out holding each pass's result
    (cgra_sim/mapping/sigmoid.py: exp from a polynomial and squarings, the reciprocal by Newton
    steps; within 3.1e-5 relative of float32's sigmoid).

    The description is TIR's own sigmoid: tensorize matches the kernel's block, and a user's
    schedule gets the fabric's arithmetic for it."""

    def value(buffers, i, j):
        return smooth_value(kind, buffers["A"][i, j])

    def call(buffers, strides):
        return smooth_calls(kind, rows, cols, (buffers["A"], strides["A"][0]), (buffers["Out"], strides["Out"][0]))

    return intrinsic([Tile("A", (rows, cols), "float32")], Tile("Out", (rows, cols), "float32"), "smooth", value,
                     call, scope=scope)


def smooth_calls(kind: str, rows: int, cols: int, a: tuple, out: tuple) -> list:
    """The device calls of sigmoid, SiLU or GELU's tanh form from tile `a` into tile `out` (each
    (address, row stride); distinct tiles, `a` kept: the logistic pass and the multiply read
    it), as the smooth intrinsic and a GEMM epilogue's activation (vector_unit.py) run them."""
    *passes, logistic = smooth.passes(kind)
    calls = [fabric_call(FabricBody(nodes, "float32"), rows, cols, *(out if index else a), *out)
             for index, nodes in enumerate(passes)]
    calls.append(fabric_call(FabricBody(logistic, "float32"), rows, cols, *a, *out, b=(*out, 1)))
    if kind != "sigmoid":  # x times the sigmoid, in place
        calls.append(eltwise_call("multiply", "float32", rows, cols, (*a, 1), (*out, 1), out))
    return calls
