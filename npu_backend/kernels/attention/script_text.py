"""The text of attention kernels written as lowered TIR: device calls, loops and buffers.

Stage: kernel definition (flash.py, flash_length.py and rows.py write their kernels as TVMScript
text, no blocks to schedule, as layout/copy_kernel.py writes its copies). In: operands as text.
Out: lines of TVMScript: `T.call_extern` of a device call (cgra_codegen's table gives each
operand's position; a scratchpad operand is (buffer, element offset)), float32 constants, and a
`Writer` that indents loops and allocates scratchpad buffers.
"""

from __future__ import annotations

from cgra_codegen import device_call_positions
from cgra_sim.isa import GEMM_ACCUMULATE, VFUNC_OFFSET, VFUNC_SCALE, DType, EltwiseFunc, ReduceFunc, VFunc

from tvm.script.ir_builder import tirx as T

from ..intrinsics import SPAD
from .head_layouts import base_role, buffer_of, stored, stored_shape

F32 = int(DType.from_name("float32"))


def head_shapes(spec) -> dict:
    """role -> (B, H, S, D) of q, k, v and the output, heads before the sequence."""
    b, hk, g, sq, sk, d, dv = spec.b, spec.hk, spec.g, spec.sq, spec.sk, spec.d, spec.dv
    return {"lhs": (b, hk * g, sq, d), "rhs": (b, hk, sk, d), "value": (b, hk, sk, dv), "out": (b, hk * g, sq, dv)}


def element(spec, role: str, n: str, head: str, row: str, col: str) -> str:
    """The text of `role`'s element (n, head, row, col) where its tensor keeps it."""
    return f"{buffer_of(spec, role)}[{', '.join(map(str, stored(spec, role, (n, head, row, col))))}]"


def call(name: str, **operands):
    """Device call `name`, its operands in the table's order: a scratchpad operand is (buffer,
    element offset), a float an operand's bits (f32). Buffers given by name (text) give the text
    of the call; tirx Buffers (prim_build.py) give the call itself, a PrimExpr."""
    positions = device_call_positions(name)
    args = [None] * max(i for where in positions.values() for i in where)
    built = False
    for param, where in positions.items():
        value = operands[param]
        if len(where) == 2 and isinstance(value, int) and value == 0:  # a disabled operand's placeholder
            value = [0, 0]
        elif len(where) == 2:
            buffer, offset = value
            built = not isinstance(buffer, str)
            value = [buffer.data if built else f"{buffer}.data", offset]
        for i, arg in zip(where, value if isinstance(value, list) else [value]):
            args[i - 1] = arg
    if built:
        return T.call_extern("int32", name, *(f32(a, built) if isinstance(a, float) else a for a in args))
    args = [f32(a) if isinstance(a, float) else str(a) for a in args]
    return f'T.call_extern("int32", "{name}", {", ".join(args)})'


def f32(value: float, built: bool = False):
    """A float32 constant: its text, or (`built`) the FloatImm the text parses to."""
    value = float(value)
    if built:
        return T.float32(value if abs(value) != float("inf") else str(value))
    return f"T.float32({value!r})" if abs(value) != float("inf") else f'T.float32("{value}")'


def eltwise(func: str, rows, cols, a, b, out) -> str:
    """ELTWISE: a, b (buffer, offset, row stride, column stride), out (buffer, offset, row stride)."""
    return call("cgra_eltwise", func=int(EltwiseFunc[func.upper()]), dtype=F32, rows=rows, cols=cols,
                 a_addr=a[:2], a_row_stride=a[2], a_col_stride=a[3], b_addr=b[:2], b_row_stride=b[2],
                 b_col_stride=b[3], out_addr=out[:2], out_stride=out[2])


def vfunc(func: str, rows, cols, a, out, scale=None, offset=None) -> str:
    flags = (VFUNC_SCALE if scale is not None else 0) | (VFUNC_OFFSET if offset is not None else 0)
    return call("cgra_vfunc", flags=flags, func=int(VFunc[func.upper()]), dtype=F32, rows=rows, cols=cols,
                 a_addr=a[:2], a_row_stride=a[2], a_col_stride=1, out_addr=out[:2], out_stride=out[2],
                 scale_bits=float(scale) if scale is not None else 0,
                 offset_bits=float(offset) if offset is not None else 0)


def reduce(func: str, rows, cols, a, out) -> str:
    return call("cgra_reduce", func=int(ReduceFunc[func.upper()]), dtype=F32, rows=rows, cols=cols,
                 a_addr=a[:2], a_row_stride=a[2], a_col_stride=1, out_addr=out[:2], out_stride=1)


def fill(buffer: str, rows, cols, stride, value: float, offset=0) -> str:
    return call("cgra_fill", dtype=F32, addr=(buffer, offset), rows=rows, cols=cols, stride=stride,
                 value_bits=float(value))


def rounded(rows, cols, a, out, dtype: str) -> str:
    """EPILOGUE: a (buffer, offset, row stride) of float32 rounded to nearest even into out
    (buffer, offset, row stride) of the 16-bit float `dtype`, nothing added: a rounding store."""
    return call("cgra_epilogue", flags=0, acc_dtype=F32, out_dtype=int(DType.from_name(dtype)), m=rows, n=cols,
                acc_addr=a[:2], acc_stride=a[2], bias_addr=0, out_addr=out[:2], out_stride=out[2], residual_addr=0,
                residual_stride=0, clip_lo_bits=0, clip_hi_bits=0, scale_addr=0, out_zero_point=0)


def gemm(accumulate: bool, m, n, k, a, b, c) -> str:
    return call("cgra_gemm", flags=GEMM_ACCUMULATE if accumulate else 0, dtype=F32, m=m, n=n, k=k,
                 a_addr=a[:2], a_stride=a[2], b_addr=b[:2], b_stride=b[2], acc_addr=c[:2], acc_stride=c[2])


class Writer:
    """Lines of TVMScript at an indentation."""

    def __init__(self):
        self.lines, self.depth = [], 1

    def add(self, *lines: str) -> None:
        self.lines += ["    " * self.depth + line for line in lines]

    def loop(self, var: str, extent: int) -> str:
        """A loop over `extent` (none for 1: its variable is then 0); the index text."""
        if extent == 1:
            return "0"
        self.add(f"for {var} in range({extent}):")
        self.depth += 1
        return var

    def alloc(self, name: str, shape: tuple, dtype: str = "float32") -> None:
        self.add(f'{name} = T.alloc_buffer(({", ".join(str(s) for s in shape)},), "{dtype}", scope="{SPAD}")')


def guarded(row: str, sq: int, tq: int, load: str) -> str:
    return load if sq % tq == 0 else f"T.if_then_else({row} < {sq}, {load}, T.float32(0))"


def kernel_writer(spec, name: str) -> Writer:
    """A Writer opened with the prim_func `name`'s header: q, k, v [, mask] and out as flat float32
    buffers of their stored shapes (a mask's heads as Hk * G), out in spec.half_out where it is set."""
    shapes = {role: stored_shape(spec, role, shape) for role, shape in head_shapes(spec).items()}
    if spec.mask_shape:
        mb, mhk, mg, msq, msk = spec.mask_shape
        shapes["mask"] = (mb, mhk * mg, msq, msk)
    params = [(role, shapes[role]) for role in (base_role(r) for r in spec.param_roles)]
    params.append(("out", shapes["out"]))
    dtypes = {"out": spec.half_out or "float32"}
    args = ", ".join(f'{name}: T.Buffer(({", ".join(map(str, shape))},), "{dtypes.get(name, "float32")}")'
                     for name, shape in params)
    w = Writer()
    w.lines = ["@T.prim_func", f"def {name}({args}):", '    T.func_attr({"tirx.noalias": True})']
    return w


def with_arg_shapes(func, spec):
    """`func` with the caller's rank-5 views of its parameters in `cgra.arg_shapes`: q, k, v and
    out as (B, Hk, G, S, D), K and V shared by a group's G heads, a sequence-major operand as it
    is stored."""
    b, hk, g, sq, sk, d, dv = spec.b, spec.hk, spec.g, spec.sq, spec.sk, spec.d, spec.dv
    views = {"lhs": (b, hk, g, sq, d), "rhs": (b, hk, 1, sk, d), "value": (b, hk, 1, sk, dv),
             "mask": spec.mask_shape, "out": (b, hk, g, sq, dv)}
    views.update({role: stored_shape(spec, role, shape) for role, shape in head_shapes(spec).items()
                  if role in spec.seq_major})
    return func.with_attr("cgra.arg_shapes", [list(views[base_role(role)])
                                              for role in list(spec.param_roles) + ["out"]])
