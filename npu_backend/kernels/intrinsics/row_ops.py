"""The vector unit's row intrinsics: REDUCE (a row's sum, max or sum of squares) and VFUNC (a
special function of a scaled and offset element).

Stage: schedule and tensorize. `reduce_intrin` is the update of a reduction over a tile's rows
into a column (its start a FILL: 0, or -inf for a max); `vfunc_intrin` an elementwise special
function over a tile (or a column). `reduce_value` / `vfunc_value` are the TIR a kernel's TE
compute builds identically (kernels/rows/rows.py), so tensorize matches. The float32 arithmetic the
hardware performs for each function is specified in the simulator (cgra_sim/special.py);
the TIR here names the function (tirx.exp, ...), which a host build of the description computes
with the C library: the three-way test compares them within special.ERROR_BOUNDS.
"""

from __future__ import annotations

from tvm import te, tirx

from cgra_codegen import device_call
from cgra_sim.isa import VFUNC_FLOAT32_IN, VFUNC_FLOAT32_OUT, VFUNC_OFFSET, VFUNC_SCALE, ReduceFunc, VFunc
from cgra_sim.special import GELU_CUBIC, GELU_LINEAR

from .builder import SPAD, Tile, intrinsic
from .pe_array import dtype_code

F32 = "float32"
SQRT1_2 = 0.7071067811865476

#: REDUCE func name -> (ISA func, the start value a FILL writes, the TIR fold of (old, element)).
REDUCE_FUNCS = {
    "sum": (ReduceFunc.SUM, 0.0, lambda old, a: old + a),
    "max": (ReduceFunc.MAX, float("-inf"), tirx.max),
    "sum_squares": (ReduceFunc.SUM_SQUARES, 0.0, lambda old, a: old + a * a),
}


def _gelu(t):
    half = tirx.const(0.5, F32)
    return t * half * (tirx.const(1.0, F32) + tirx.erf(t * tirx.const(SQRT1_2, F32)))


def _sigmoid(t):
    return tirx.const(1.0, F32) / (tirx.const(1.0, F32) + tirx.exp(-t))


def _gelu_tanh(t):  # special.gelu_tanh's form: t sigmoid(z), no cancellation for t << 0
    z = t * (tirx.const(float(GELU_CUBIC), F32) * (t * t) + tirx.const(float(GELU_LINEAR), F32))
    return t * _sigmoid(z)


#: VFUNC func name -> (ISA func, the TIR of f(t)).
VFUNCS = {
    "identity": (VFunc.IDENTITY, lambda t: t),
    "exp": (VFunc.EXP, tirx.exp),
    "tanh": (VFunc.TANH, tirx.tanh),
    "erf": (VFunc.ERF, tirx.erf),
    "gelu": (VFunc.GELU, _gelu),
    "rsqrt": (VFunc.RSQRT, tirx.rsqrt),
    "reciprocal": (VFunc.RECIPROCAL, lambda t: tirx.const(1.0, F32) / t),
    "sigmoid": (VFunc.SIGMOID, _sigmoid),
    "silu": (VFunc.SILU, lambda t: t * _sigmoid(t)),
    "gelu_tanh": (VFunc.GELU_TANH, _gelu_tanh),
}


def reduce_start(func: str) -> float:
    """The value a reduction's FILL starts its column with."""
    return REDUCE_FUNCS[func][1]


def reduce_fold(func: str, old, element):
    """The TIR of one step of the reduction: old folded with one element."""
    return REDUCE_FUNCS[func][2](old, element)


def reducer(func: str):
    """The TE comm_reducer of a REDUCE `func`: its fold (a sum of squares adds: the square is the
    element's) from its FILL's start."""
    start = reduce_start(func)
    return te.comm_reducer(lambda old, a: reduce_fold("max" if func == "max" else "sum", old, a),
                           lambda dtype: tirx.const(start, dtype), name=func)


def vfunc_value(func: str, a, scale: float | None = None, offset: float | None = None):
    """f(a * scale + offset) in TIR, each step only when given."""
    t = a
    if scale is not None:
        t = t * tirx.const(scale, F32)
    if offset is not None:
        t = t + tirx.const(offset, F32)
    return VFUNCS[func][1](t)


def reduce_intrin(rows: int, cols: int, func: str, scope: str = SPAD):
    """REDUCE: Out[rows, 1] = fold(Out, A[rows, cols]) along the columns, in order."""
    def value(buffers, i, _, k):
        element = buffers["A"][i, k]
        return element * element if func == "sum_squares" else element

    def combine(old, element):
        return old + element if func != "max" else tirx.max(old, element)

    def call(buffers, strides):
        return device_call("cgra_reduce", func=int(REDUCE_FUNCS[func][0]), dtype=dtype_code(F32), rows=rows, cols=cols,
                           a_addr=buffers["A"], a_row_stride=strides["A"][0], a_col_stride=1,
                           out_addr=buffers["Out"], out_stride=strides["Out"][0])

    return intrinsic([Tile("A", (rows, cols), F32)], Tile("Out", (rows, 1), F32), "red", value, call,
                     grid=(rows, 1, cols), kinds="SSR", accumulate=True, combine=combine, scope=scope)


def vfunc_intrin(rows: int, cols: int, func: str, *, scale: float | None = None, offset: float | None = None,
                 half: str | None = None, float32_in: bool = False, float32_out: bool = False, scope: str = SPAD):
    """VFUNC: Out[rows, cols] = f(A * scale + offset) over a float32 tile (a column: cols 1). With
    `half` (bfloat16 / float16, stream v14) A and Out are in that format (A widened, the result
    rounded to nearest even), or float32 with `float32_in` (A read as it is) / `float32_out` (the
    rounded result widened back)."""
    a_dtype, out_dtype = vfunc_dtypes(half, float32_in, float32_out)

    def value(buffers, i, j):
        return vfunc_rounded(func, buffers["A"][i, j], half, a_dtype, out_dtype, scale, offset)

    def call(buffers, strides):
        return vfunc_call(func, rows, cols, (buffers["A"], strides["A"][0]), (buffers["Out"], strides["Out"][0]),
                          scale=scale, offset=offset, half=half, float32_in=float32_in, float32_out=float32_out)

    return intrinsic([Tile("A", (rows, cols), a_dtype)], Tile("Out", (rows, cols), out_dtype), "vfn", value, call,
                     scope=scope)


def vfunc_dtypes(half: str | None, float32_in: bool, float32_out: bool) -> tuple[str, str]:
    """(A's dtype, Out's dtype) of a VFUNC computing in float32, rounding to `half` if given."""
    if half is None:
        if float32_in or float32_out:
            raise ValueError("a float32 VFUNC's operands are float32: float32_in / float32_out go with a 16-bit `half`")
        return F32, F32
    if half not in ("bfloat16", "float16"):
        raise ValueError(f"a VFUNC rounds to bfloat16 or float16, not {half}")
    return (F32 if float32_in else half), (F32 if float32_out else half)


def vfunc_rounded(func: str, a, half: str | None, a_dtype: str, out_dtype: str, scale: float | None = None,
                  offset: float | None = None):
    """The TIR of a VFUNC's element (vfunc_value) with its 16-bit format (vfunc_dtypes): `a`, of
    `a_dtype`, widened to float32, the result rounded to `half` (and widened back for a float32
    `out_dtype`)."""
    value = vfunc_value(func, a.astype(F32) if a_dtype != F32 else a, scale, offset)
    if half is None:
        return value
    value = value.astype(half)
    return value.astype(F32) if out_dtype == F32 else value


def vfunc_call(func: str, rows: int, cols: int, a: tuple, out: tuple, *, scale: float | None = None,
               offset: float | None = None, half: str | None = None, float32_in: bool = False,
               float32_out: bool = False, a_col_stride: int = 1):
    """The device call of one VFUNC from tile `a` to tile `out` (each (address, row stride)), in
    float32 or, with `half`, reading / rounding to that 16-bit format (vfunc_intrin)."""
    vfunc_dtypes(half, float32_in, float32_out)
    flags = (VFUNC_SCALE if scale is not None else 0) | (VFUNC_OFFSET if offset is not None else 0) \
        | (VFUNC_FLOAT32_IN if float32_in else 0) | (VFUNC_FLOAT32_OUT if float32_out else 0)
    return device_call(
        "cgra_vfunc", flags=flags, func=int(VFUNCS[func][0]), dtype=dtype_code(half or F32), rows=rows, cols=cols,
        a_addr=a[0], a_row_stride=a[1], a_col_stride=a_col_stride, out_addr=out[0], out_stride=out[1],
        scale_bits=tirx.const(scale, F32) if scale is not None else 0,
        offset_bits=tirx.const(offset, F32) if offset is not None else 0)
