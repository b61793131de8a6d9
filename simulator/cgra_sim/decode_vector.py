"""Decoding the vector unit's records: FILL, EPILOGUE, POOL, ELTWISE, REDUCE and VFUNC.

Stage: simulator, step 1 (decode.py's table calls these). Checks: flags and the words of an
operand a flag turns off (they must be 0), dtypes, positive sizes, strides, every region inside
the scratchpad, a FILL or clip value that fits its dtype, a pool's rectangles.
"""

from __future__ import annotations

import numpy as np

from .commands import (NUMPY_DTYPE, Checker, EltwiseCommand, EpilogueCommand, FillCommand, PoolCommand,
                       ReduceCommand, VfuncCommand)
from .isa import (EPILOGUE_BIAS, EPILOGUE_CLIP, EPILOGUE_DEQUANTISE, EPILOGUE_RELU, EPILOGUE_REQUANTISE, EPILOGUE_RESIDUAL,
                  FIELDS, HALF_FLOATS, POOL_AVERAGE, VECTOR_DTYPES, VFUNC_FLOAT32_IN, VFUNC_FLOAT32_OUT, VFUNC_OFFSET,
                  VFUNC_SCALE, DType, EltwiseFunc, Op, ReduceFunc, VFunc)
from .regions import Region


def decode_pool(check: Checker, index: int, op: Op, record: list[int], tensors) -> PoolCommand:
    fields = dict(zip(FIELDS[op], record))
    flags, average = fields["flags"], bool(fields["flags"] & POOL_AVERAGE)
    check.flags(flags, POOL_AVERAGE)
    # A max pool also takes int16 (stream v11): the 16x8 mode's activations (qlayouts16.py).
    dtype = check.dtype("dtype", fields["dtype"], (DType.FLOAT32,) if average else VECTOR_DTYPES + (DType.INT16,))
    oh, ow, n, kh, kw = (fields[name] for name in ("oh", "ow", "n", "kh", "kw"))
    check.positive(oh=oh, ow=ow, n=n, kh=kh, kw=kw, stride_y=fields["stride_y"], stride_x=fields["stride_x"],
                   dilation_y=fields["dilation_y"], dilation_x=fields["dilation_x"])
    strides = {name: fields[name] for name in ("a_row_stride", "a_col_stride", "out_y_stride", "out_x_stride")}
    negative = {name: value for name, value in strides.items() if value < 0}
    if negative:
        check.fail(f"strides must be >= 0, got {negative}")
    out_y, out_x = strides["out_y_stride"], strides["out_x_stride"]
    if (oh > 1 and out_y < ow * out_x) or (ow > 1 and out_x < n):
        check.fail(f"out strides (y {out_y}, x {out_x}) overlap its {oh} x {ow} x {n} elements")
    cmd = PoolCommand(index, op)
    cmd.dtype, cmd.average, cmd.oh, cmd.ow, cmd.n, cmd.kh, cmd.kw = dtype, average, oh, ow, n, kh, kw
    size, row, col = dtype.itemsize, strides["a_row_stride"], strides["a_col_stride"]
    sy, sx, dy, dx = (fields[name] for name in ("stride_y", "stride_x", "dilation_y", "dilation_x"))
    cmd.a = check.region(Region("A", fields["a_addr"], (oh, ow, kh, kw, n),
                                tuple(s * size for s in (sy * row, sx * col, dy * row, dx * col, 1)),
                                NUMPY_DTYPE[dtype]))
    cmd.out = check.region(Region("out", fields["out_addr"], (oh, ow, n),
                                  (out_y * size, out_x * size, size), NUMPY_DTYPE[dtype]))
    positions = (np.arange(oh)[:, None] * sy + np.arange(kh)[None, :] * dy,
                 np.arange(ow)[:, None] * sx + np.arange(kw)[None, :] * dx)  # (oh, kh), (ow, kw)
    rows, cols = _pool_rectangle(check, fields, "valid", positions)
    cmd.valid = (rows[:, None, :, None] & cols[None, :, None, :])[..., None]
    cmd.count = None
    if average:
        rows, cols = _pool_rectangle(check, fields, "count", positions)
        counts = rows.sum(axis=1)[:, None] * cols.sum(axis=1)[None, :]
        cmd.count = np.maximum(counts, 1).astype(np.float32)[..., None]
    elif any(fields[f"count_{edge}"] for edge in ("y_lo", "y_hi", "x_lo", "x_hi")):
        check.fail("count_* words are set but POOL_AVERAGE is off: words of a disabled operand must be 0")
    cmd.reads, cmd.writes = (cmd.a,), (cmd.out,)
    return cmd


def _pool_rectangle(check: Checker, fields: dict, name: str, positions):
    """Per (output row, tap row) and (output column, tap column): whether the tap's window
    position lies inside the `name` rectangle (0 <= lo <= hi on each axis)."""
    inside = []
    for axis, position in zip("yx", positions):
        lo, hi = fields[f"{name}_{axis}_lo"], fields[f"{name}_{axis}_hi"]
        if not 0 <= lo <= hi:
            check.fail(f"{name} rectangle {axis} range [{lo}, {hi}) is not 0 <= lo <= hi")
        inside.append((position >= lo) & (position < hi))
    return inside


def _fill_value(check: Checker, dtype: DType, bits: int):
    """The constant of a FILL: an integer in range of `dtype`, or a float32 bit pattern."""
    if dtype is DType.FLOAT32:
        return np.array([bits & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]
    info = np.iinfo(NUMPY_DTYPE[dtype])
    if not info.min <= bits <= info.max:
        check.fail(f"value {bits} does not fit {dtype.numpy_name} [{info.min}, {info.max}]")
    return NUMPY_DTYPE[dtype].type(bits)


def decode_fill(check: Checker, index: int, op: Op, record: list[int], tensors) -> FillCommand:
    _, flags, dtype_code, addr, rows, cols, stride, bits = record[:len(FIELDS[op])]
    check.flags(flags, 0)
    dtype = check.dtype("dtype", dtype_code, VECTOR_DTYPES)
    check.positive(rows=rows, cols=cols)
    cmd = FillCommand(index, op)
    cmd.region = check.matrix("region", addr, rows, cols, stride, dtype, written=True)
    cmd.value = _fill_value(check, dtype, bits)
    cmd.writes = (cmd.region,)
    return cmd


def decode_epilogue(check: Checker, index: int, op: Op, record: list[int],
                     tensors) -> EpilogueCommand:
    (_, flags, acc_code, out_code, m, n, acc_addr, acc_stride, bias_addr, out_addr,
     out_stride) = record[:11]
    check.flags(flags, EPILOGUE_BIAS | EPILOGUE_RELU | EPILOGUE_RESIDUAL | EPILOGUE_CLIP | EPILOGUE_REQUANTISE
                | EPILOGUE_DEQUANTISE)
    requantise = bool(flags & EPILOGUE_REQUANTISE)
    dequantise = _epilogue_dequantise(check, flags, acc_code)
    acc_dtype = check.dtype("acc_dtype", acc_code, (DType.INT32, DType.INT64, DType.FLOAT32) if requantise
                            else (DType.INT32, DType.INT64, DType.FLOAT32) + HALF_FLOATS)
    # A float32 accumulator may be stored rounded to a 16-bit float, whose bias and residual are in that dtype;
    # an int32 one requantises to int8, an int64 one (16x8 GEMM) to int16, a float32 one quantises to int8
    # (x / scale, onnxruntime's QuantizeLinear); a 16-bit float one is only widened to float32 (a cast: no flags).
    narrow = {DType.INT32: DType.INT8, DType.INT64: DType.INT16, DType.FLOAT32: DType.INT8}
    outs = (DType.FLOAT32,) if dequantise else (narrow[acc_dtype],) if requantise else (DType.FLOAT32,) if acc_dtype in HALF_FLOATS else \
        (acc_dtype,) + (HALF_FLOATS if acc_dtype is DType.FLOAT32 else ())
    out_dtype = check.dtype("out_dtype", out_code, outs)
    if acc_dtype in HALF_FLOATS and flags:
        check.fail(f"a {acc_dtype.numpy_name} accumulator is only widened to float32 (a cast): flags must be 0, "
                   f"got {flags}")
    check.positive(m=m, n=n)
    cmd = EpilogueCommand(index, op)
    cmd.half = out_dtype if out_dtype in HALF_FLOATS else None
    cmd.widen = acc_dtype if acc_dtype in HALF_FLOATS else None
    operand_dtype = cmd.half or acc_dtype
    cmd.acc = check.matrix("acc", acc_addr, m, n, acc_stride, acc_dtype, written=False)
    cmd.bias = None
    if flags & EPILOGUE_BIAS:
        cmd.bias = check.matrix("bias", bias_addr, 1, n, n, operand_dtype, written=False)
    cmd.residual = _epilogue_residual(check, flags, record, m, n, operand_dtype)
    cmd.clip = _epilogue_clip(check, flags, record, acc_dtype)
    cmd.scale, cmd.zero_point = _epilogue_requantise(check, flags, record, n,
                                                     DType.INT8 if dequantise else out_dtype)
    cmd.dequantise = dequantise
    cmd.out = check.matrix("out", out_addr, m, n, out_stride, out_dtype, written=True)
    cmd.relu = bool(flags & EPILOGUE_RELU)
    cmd.reads = tuple(r for r in (cmd.acc, cmd.bias, cmd.residual, cmd.scale) if r is not None)
    cmd.writes = (cmd.out,)
    return cmd


def _unused_when_off(check: Checker, flags: int, flag: int, record: list[int], names) -> bool:
    """Whether `flag` is set; without it its words must be 0 (a stale operand is a bug upstream)."""
    if flags & flag:
        return True
    for name in names:
        value = record[FIELDS[Op.EPILOGUE].index(name)]
        if value:
            check.fail(f"{name} is {value} but flag {flag:#x} is off: words of a disabled operand must be 0")
    return False


def _epilogue_residual(check: Checker, flags: int, record: list[int], m: int, n: int, dtype: DType):
    """The residual tile (m x n, acc dtype, its own row stride), or None without EPILOGUE_RESIDUAL."""
    names = ("residual_addr", "residual_stride")
    if not _unused_when_off(check, flags, EPILOGUE_RESIDUAL, record, names):
        return None
    addr, stride = (record[FIELDS[Op.EPILOGUE].index(name)] for name in names)
    return check.matrix("residual", addr, m, n, stride, dtype, written=False)


def _epilogue_clip(check: Checker, flags: int, record: list[int], dtype: DType):
    """(lo, hi) in the acc dtype, or None without EPILOGUE_CLIP. Bounds are FILL-style value bits;
    lo <= hi and neither NaN, so min(max(x, lo), hi) == max(min(x, hi), lo): the order of the two
    comparisons (which differs between frameworks) cannot change a result."""
    names = ("clip_lo_bits", "clip_hi_bits")
    if not _unused_when_off(check, flags, EPILOGUE_CLIP, record, names):
        return None
    lo, hi = (_fill_value(check, dtype, record[FIELDS[Op.EPILOGUE].index(name)]) for name in names)
    if np.isnan(lo) or np.isnan(hi) or not lo <= hi:
        check.fail(f"clip bounds [{lo}, {hi}] are not an ordered pair of numbers (need lo <= hi, no NaN)")
    return lo, hi


def decode_eltwise(check: Checker, index: int, op: Op, record: list[int], tensors) -> EltwiseCommand:
    (_, flags, func, dtype_code, rows, cols, a_addr, a_row, a_col, b_addr, b_row, b_col, out_addr,
     out_stride) = record[:len(FIELDS[op])]
    check.flags(flags, 0)
    if func not in {int(f) for f in EltwiseFunc}:
        check.fail(f"func {func} is not an elementwise function (known: "
                   f"{', '.join(f'{f.name}={int(f)}' for f in EltwiseFunc)})")
    dtype = check.dtype("dtype", dtype_code, VECTOR_DTYPES + HALF_FLOATS)  # 16-bit floats: via float32
    check.positive(rows=rows, cols=cols)
    strides = dict(a_row_stride=a_row, a_col_stride=a_col, b_row_stride=b_row, b_col_stride=b_col)
    negative = {name: value for name, value in strides.items() if value < 0}
    if negative:
        check.fail(f"strides must be >= 0, got {negative}")
    size, np_dtype = dtype.itemsize, NUMPY_DTYPE[dtype]
    cmd = EltwiseCommand(index, op)
    cmd.func, cmd.dtype = EltwiseFunc(func), dtype
    cmd.a = check.region(Region("A", a_addr, (rows, cols), (a_row * size, a_col * size), np_dtype))
    cmd.b = check.region(Region("B", b_addr, (rows, cols), (b_row * size, b_col * size), np_dtype))
    cmd.out = check.matrix("out", out_addr, rows, cols, out_stride, dtype, written=True)
    cmd.reads = (cmd.a, cmd.b)
    cmd.writes = (cmd.out,)
    return cmd


def _epilogue_dequantise(check: Checker, flags: int, acc_code: int) -> bool:
    """Whether EPILOGUE_DEQUANTISE is set (stream v13): only after a requantisation of an int32
    accumulator, whose int8 result it dequantises to a float32 out."""
    if not flags & EPILOGUE_DEQUANTISE:
        return False
    if not flags & EPILOGUE_REQUANTISE or acc_code != DType.INT32:
        check.fail(f"EPILOGUE_DEQUANTISE ({EPILOGUE_DEQUANTISE:#x}) dequantises the int8 result of a "
                   f"requantised int32 accumulator: it needs EPILOGUE_REQUANTISE and acc_dtype int32 "
                   f"(flags {flags:#x}, acc_dtype {acc_code})")
    return True


def _epilogue_requantise(check: Checker, flags: int, record: list[int], n: int, out_dtype: DType):
    """(scale row, zero point) of a requantisation to int8 or int16, or (None, 0) without
    EPILOGUE_REQUANTISE: the scale a (1, n) float32 region, the zero point an `out_dtype` value;
    with EPILOGUE_DEQUANTISE a (1, 2n) region, per channel (multiplier, dequantisation scale)."""
    names = ("scale_addr", "out_zero_point")
    if not _unused_when_off(check, flags, EPILOGUE_REQUANTISE, record, names):
        return None, 0
    addr, zero_point = (record[FIELDS[Op.EPILOGUE].index(name)] for name in names)
    info = np.iinfo(out_dtype.numpy_name)
    if not info.min <= zero_point <= info.max:
        check.fail(f"out_zero_point {zero_point} does not fit {out_dtype.numpy_name} [{info.min}, {info.max}]")
    width = 2 * n if flags & EPILOGUE_DEQUANTISE else n
    return check.matrix("scale", addr, 1, width, width, DType.FLOAT32, written=False), zero_point


def _strided_input(check: Checker, fields: dict, rows: int, cols: int, dtype: DType = DType.FLOAT32) -> Region:
    """The (rows, cols) window A of a REDUCE or VFUNC in `dtype` (strides >= 0, 0 broadcasts)."""
    a_row, a_col = fields["a_row_stride"], fields["a_col_stride"]
    if a_row < 0 or a_col < 0:
        check.fail(f"A's strides must be >= 0, got ({a_row}, {a_col})")
    size = dtype.itemsize
    return check.region(Region("A", fields["a_addr"], (rows, cols), (a_row * size, a_col * size), NUMPY_DTYPE[dtype]))


def _func(check: Checker, code: int, enum) -> object:
    if code not in {int(f) for f in enum}:
        check.fail(f"func {code} is not one of {', '.join(f'{f.name}={int(f)}' for f in enum)}")
    return enum(code)


def decode_reduce(check: Checker, index: int, op: Op, record: list[int], tensors) -> ReduceCommand:
    """REDUCE: a known func, float32, the strided A window and the written out column inside the scratchpad."""
    fields = dict(zip(FIELDS[op], record))
    check.flags(fields["flags"], 0)
    cmd = ReduceCommand(index, op)
    cmd.func = _func(check, fields["func"], ReduceFunc)
    check.dtype("dtype", fields["dtype"], (DType.FLOAT32,))
    rows, cols = fields["rows"], fields["cols"]
    check.positive(rows=rows, cols=cols)
    cmd.a = _strided_input(check, fields, rows, cols)
    cmd.out = check.matrix("out", fields["out_addr"], rows, 1, fields["out_stride"], DType.FLOAT32, written=True)
    cmd.reads, cmd.writes = (cmd.a, cmd.out), (cmd.out,)
    return cmd


def decode_vfunc(check: Checker, index: int, op: Op, record: list[int], tensors) -> VfuncCommand:
    """VFUNC: its flags (scale and offset words 0 without them; FLOAT32_IN / FLOAT32_OUT with a
    16-bit dtype only), a known func, float32 or a 16-bit float (stream v14), A and out inside the
    scratchpad in their formats."""
    fields = dict(zip(FIELDS[op], record))
    flags = fields["flags"]
    check.flags(flags, VFUNC_SCALE | VFUNC_OFFSET | VFUNC_FLOAT32_IN | VFUNC_FLOAT32_OUT)
    cmd = VfuncCommand(index, op)
    cmd.func = _func(check, fields["func"], VFunc)
    cmd.dtype = check.dtype("dtype", fields["dtype"], (DType.FLOAT32,) + HALF_FLOATS)
    if cmd.dtype is DType.FLOAT32 and flags & (VFUNC_FLOAT32_IN | VFUNC_FLOAT32_OUT):
        check.fail(f"VFUNC_FLOAT32_IN ({VFUNC_FLOAT32_IN:#x}) and VFUNC_FLOAT32_OUT ({VFUNC_FLOAT32_OUT:#x}) "
                   f"keep an operand float32 beside a 16-bit float dtype: dtype float32 takes neither (flags {flags:#x})")
    a_dtype = DType.FLOAT32 if flags & VFUNC_FLOAT32_IN else cmd.dtype
    out_dtype = DType.FLOAT32 if flags & VFUNC_FLOAT32_OUT else cmd.dtype
    rows, cols = fields["rows"], fields["cols"]
    check.positive(rows=rows, cols=cols)
    cmd.a = _strided_input(check, fields, rows, cols, a_dtype)
    cmd.out = check.matrix("out", fields["out_addr"], rows, cols, fields["out_stride"], out_dtype, written=True)
    values = []
    for flag, name in ((VFUNC_SCALE, "scale_bits"), (VFUNC_OFFSET, "offset_bits")):
        if flags & flag:
            values.append(_fill_value(check, DType.FLOAT32, fields[name]))
        elif fields[name]:
            check.fail(f"{name} is {fields[name]} but flag {flag:#x} is off: words of a disabled operand must be 0")
        else:
            values.append(None)
    cmd.scale, cmd.offset = values
    cmd.reads, cmd.writes = (cmd.a,), (cmd.out,)
    return cmd
