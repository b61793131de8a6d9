"""A requantising chain whose int8 result is dequantized to float32: the EPILOGUE's dequantising form.

Stage: partition (the chain's pattern tail, the KernelSpec fields) and kernel definition (the
staged scale row and the TE value the EPILOGUE intrinsic is tensorized onto). The normalise stage
(normalise/qdq_outputs.py) writes a quantized model's last layer as

    dequantize(quantize(multiply(astype(acc), take(T, 0, axis=1)), 1.0, zp), take(T, 1, axis=1), zp)

T an (N, 2) float32 table, T[j] = (requantisation multiplier, dequantisation scale) of output
channel j: exactly the row EPILOGUE_DEQUANTISE reads at scale_addr (channel j's at 2j, 2j + 1,
docs/command-stream.md). The kernel takes T as its "scale" parameter viewed as a flat row of 2N,
stages 2 tn values of it per output tile (one DMA) and stores float32(q - zp) * T[j, 1],
onnxruntime's QGemm + DequantizeLinear bit for bit. 2-D matmuls (a classifier's Gemm) and static
conv2ds of one group (a detector's last convs: the multiplier a reshape of T's first column to
(1, F, 1, 1), the dequantize along the output's channel axis); the epilogue reads channel j's pair
at 2j, 2j + 1 of the staged row as the matmul's does.
"""

from __future__ import annotations

import dataclasses

from tvm import te
from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of, require_static_shape
from ..common.operands import padded
from ..intrinsics.vector_unit import dequantise_value, requantise


def dequant_tail(value, reshaped: bool = False) -> tuple:
    """(the chain's pattern after `value`, the acc [+ bias] [relu], and its annotations);
    `reshaped`: the multiplier a conv2d's (1, F, 1, 1) view of the table's column."""
    table = wildcard()
    column = is_op("relax.take")(table, wildcard())
    scale = is_op("relax.reshape")(column, wildcard()) if reshaped else column
    multiply = is_op("relax.multiply")(is_op("relax.astype")(value), scale)
    requant = is_op("relax.quantize")(multiply, wildcard(), wildcard())
    dscale = is_op("relax.take")(table, wildcard())
    tail = is_op("relax.dequantize")(requant, dscale, wildcard())
    return tail, {"requant": requant, "requant_multiply": multiply, "scale": scale, "dequant": tail,
                  "dequant_table": table, "dequant_scale": dscale, **({"dequant_column": column} if reshaped else {})}


def _constant(expr):
    value = getattr(expr, "value", None)
    return value.numpy() if value is not None and hasattr(value, "numpy") else None


def with_dequant(spec, annotated: dict):
    """`spec` (its requantisation read) storing float32: its scale parameter the (N, 2) table read
    as a flat row of 2N. Raises UnsupportedOperator where the chain is not the EPILOGUE's."""
    dequant, table = annotated["dequant"], annotated["dequant_table"]
    takes = (annotated.get("dequant_column", annotated["scale"]), annotated["dequant_scale"])
    n = max(spec.scale_shape)  # a matmul's (N,), a conv2d's (1, F, 1, 1) in its output layout
    matmul = spec.op == "matmul" and len(spec.lhs_shape) == 2
    conv = spec.op == "conv2d" and spec.compute_name != "conv2d_layout"
    if not (matmul or conv) or spec.grouped or spec.symbols:
        raise UnsupportedOperator("the EPILOGUE dequantises after a static 2-D matmul or a static conv2d (groups "
                                  "1) for now; the dequantize runs on the host")
    columns = [_constant(call.args[1]) for call in takes]
    axes = [int(call.attrs.axis) for call in takes]
    zero_point = _constant(dequant.args[2])
    channel = len(spec.output_shape) - 1 if matmul else spec.out_layout.index("C")
    if dtype_of(table) != "float32" or tuple(require_static_shape(table, "table", UnsupportedOperator)) != (n, 2) \
            or any(c is None or c.ndim != 0 for c in columns) or [int(c) for c in columns] != [0, 1] \
            or axes != [1, 1] or zero_point is None or zero_point.size != 1 \
            or int(dequant.attrs.axis) % len(spec.output_shape) != channel \
            or int(zero_point.reshape(())) != spec.requant_zero_point or str(dequant.attrs.out_dtype) != "float32":
        raise UnsupportedOperator("a dequantising EPILOGUE reads (multiplier, scale) pairs of one (N, 2) float32 "
                                  "table with the requantisation's zero point (normalise/qdq_outputs.py)")
    return dataclasses.replace(spec, dequantise=True, scale_shape=(2 * n,),
                               caller_shapes=spec.caller_shapes + (("dequant_table", (n, 2)),),
                               source_ops=spec.source_ops + ("dequantize",))


def dequant_row(tiling, scale):
    """The staged scale row of a dequantising EPILOGUE: 2 np values, channel j's pair at 2j, 2j + 1."""
    return te.compute((2 * tiling.np,), lambda k: padded(scale, list(scale.shape), [k]), name="scale_pad")


def dequant_value(value, scale_pad, j, zero_point: int):
    """float32(requantise(value) - zp) * dscale[j]: the intrinsic's expression (vector_unit.py)."""
    quantised = requantise(value, scale_pad[2 * j], zero_point, "int8")
    return dequantise_value(quantised, scale_pad[2 * j + 1], zero_point)
