"""Decoding the PE array's records: GEMM, DEPTHWISE and FABRIC.

Stage: simulator, step 1 (decode.py's table calls these). Checks: flags, a dtype the PE array
accumulates and the chip computes, positive sizes, strides, and every region inside the
scratchpad (an accumulator's rows or pixels must not overlap), a FABRIC body well formed and
mappable onto the chip's fabric.
"""

from __future__ import annotations

from .commands import NUMPY_DTYPE, Checker, DepthwiseCommand, FabricCommand, GemmCommand
from .fabric import Fabric
from .isa import ACC_DTYPE, FABRIC_INPUT_B, FABRIC_INT8, FIELDS, GEMM_ACCUMULATE, GEMM_B_DTYPE, DType, Op
from .mapping import body as bodies
from .mapping.mapper import MappingError
from .regions import Region


def decode_gemm(check: Checker, index: int, op: Op, record: list[int], tensors) -> GemmCommand:
    (_, flags, dtype_code, m, n, k, a_addr, a_stride, b_addr, b_stride, acc_addr,
     acc_stride) = record[:len(FIELDS[op])]
    check.flags(flags, GEMM_ACCUMULATE)
    dtype = check.pe_dtype(dtype_code)
    check.positive(m=m, n=n, k=k)
    cmd = GemmCommand(index, op)
    cmd.dtype, cmd.m, cmd.n, cmd.k = dtype, m, n, k
    cmd.accumulate = bool(flags & GEMM_ACCUMULATE)
    cmd.a = check.matrix("A", a_addr, m, k, a_stride, dtype, written=False)
    cmd.b = check.matrix("B", b_addr, k, n, b_stride, GEMM_B_DTYPE.get(dtype, dtype), written=False)
    cmd.acc = check.matrix("acc", acc_addr, m, n, acc_stride, ACC_DTYPE[dtype], written=True)
    cmd.reads = (cmd.a, cmd.b, cmd.acc) if cmd.accumulate else (cmd.a, cmd.b)
    cmd.writes = (cmd.acc,)
    return cmd


def decode_depthwise(check: Checker, index: int, op: Op, record: list[int],
                      tensors) -> DepthwiseCommand:
    (_, flags, dtype_code, oh, ow, n, kh, kw, a_addr, a_y, a_x, a_ry, a_rx, b_addr, b_ry, b_rx,
     acc_addr, acc_y, acc_x) = record[:len(FIELDS[op])]
    check.flags(flags, GEMM_ACCUMULATE)
    dtype = check.pe_dtype(dtype_code)
    if dtype in GEMM_B_DTYPE:
        check.fail(f"DEPTHWISE has no {dtype.numpy_name} mode (16x8 is a GEMM's): a depthwise layer of "
                   "int16 activations runs on the host")
    check.positive(oh=oh, ow=ow, n=n, kh=kh, kw=kw)
    strides = dict(a_y_stride=a_y, a_x_stride=a_x, a_ry_stride=a_ry, a_rx_stride=a_rx,
                   b_ry_stride=b_ry, b_rx_stride=b_rx, acc_y_stride=acc_y, acc_x_stride=acc_x)
    negative = {name: value for name, value in strides.items() if value < 0}
    if negative:
        check.fail(f"strides must be >= 0, got {negative}")
    if (oh > 1 and acc_y < ow * acc_x) or (ow > 1 and acc_x < n):
        check.fail(f"acc strides (y {acc_y}, x {acc_x}) overlap its {oh} x {ow} x {n} elements")
    cmd = DepthwiseCommand(index, op)
    cmd.dtype, cmd.oh, cmd.ow, cmd.n, cmd.kh, cmd.kw = dtype, oh, ow, n, kh, kw
    cmd.accumulate = bool(flags & GEMM_ACCUMULATE)
    size, acc_size = dtype.itemsize, ACC_DTYPE[dtype].itemsize
    cmd.a = check.region(Region("A", a_addr, (oh, ow, kh, kw, n),
                                tuple(s * size for s in (a_y, a_x, a_ry, a_rx, 1)), NUMPY_DTYPE[dtype]))
    cmd.b = check.region(Region("B", b_addr, (kh, kw, n), (b_ry * size, b_rx * size, size),
                                NUMPY_DTYPE[dtype]))
    cmd.acc = check.region(Region("acc", acc_addr, (oh, ow, n), (acc_y * acc_size, acc_x * acc_size, acc_size),
                                  NUMPY_DTYPE[ACC_DTYPE[dtype]]))
    cmd.reads = (cmd.a, cmd.b, cmd.acc) if cmd.accumulate else (cmd.a, cmd.b)
    cmd.writes = (cmd.acc,)
    return cmd


def decode_fabric(check: Checker, index: int, op: Op, record: list[int], tensors) -> FabricCommand:
    fields = dict(zip(FIELDS[op], record))
    flags = fields["flags"]
    check.flags(flags, FABRIC_INPUT_B | FABRIC_INT8)
    dtype = check.dtype("dtype", fields["dtype"], (DType.INT32, DType.FLOAT32))
    int8 = bool(flags & FABRIC_INT8)
    rows, cols, nodes = fields["rows"], fields["cols"], fields["nodes"]
    check.positive(rows=rows, cols=cols, nodes=nodes)
    if nodes > bodies.BODY_MAX_NODES:
        check.fail(f"nodes {nodes} exceeds the {bodies.BODY_MAX_NODES} node words of a record")
    words = [fields[f"node{i}"] for i in range(bodies.BODY_MAX_NODES)]
    if any(words[nodes:]):
        check.fail(f"node words past nodes = {nodes} must be 0")
    two_inputs = bool(flags & FABRIC_INPUT_B)
    names = ("b_addr", "b_row_stride", "b_col_stride")
    if not two_inputs and any(fields[name] for name in names):
        check.fail("B's words are set but FABRIC_INPUT_B is off: words of a disabled operand must be 0")
    strides = {name: fields[name] for name in ("a_row_stride", "a_col_stride", "b_row_stride", "b_col_stride")}
    negative = {name: value for name, value in strides.items() if value < 0}
    if negative:
        check.fail(f"strides must be >= 0, got {negative}")
    try:
        body = bodies.decode(words[:nodes], dtype.numpy_name, two_inputs)
        bodies.program(body, dtype.numpy_name, Fabric.of(check.arch))
    except (bodies.BodyError, MappingError) as error:
        check.fail(f"body: {error}")
    stored = DType.INT8 if int8 else dtype  # what A, B and out hold in the scratchpad
    size, np_dtype = stored.itemsize, NUMPY_DTYPE[stored]
    cmd = FabricCommand(index, op)
    cmd.body, cmd.dtype, cmd.int8 = body, dtype, int8
    cmd.a = check.region(Region("A", fields["a_addr"], (rows, cols),
                                (strides["a_row_stride"] * size, strides["a_col_stride"] * size), np_dtype))
    cmd.b = check.region(Region("B", fields["b_addr"], (rows, cols), (strides["b_row_stride"] * size,
                                                                       strides["b_col_stride"] * size), np_dtype)) \
        if two_inputs else None
    cmd.out = check.matrix("out", fields["out_addr"], rows, cols, fields["out_stride"], stored, written=True)
    cmd.reads = (cmd.a, cmd.b) if two_inputs else (cmd.a,)
    cmd.writes = (cmd.out,)
    return cmd
