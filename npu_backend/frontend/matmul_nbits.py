"""ONNX `MatMulNBits` (com.microsoft, bits = 4): onnxruntime's weight-only 4-bit matmul, imported.

Stage: import (onnx_import's importer calls `convert` for every MatMulNBits node; TVM 0.27's ONNX
importer has no converter for it). In: the node's inputs as the importer holds them (A a Relax
value, B / scales / zero points constants) and attributes. Out: a call_tir of a TensorIR PrimFunc
computing Y = A @ dequant(B) from the packed tensors as they are, marked with `LAYER_ATTR`
(m, k, n, block, zero points). The PrimFunc is a plain host computation (nibble, minus zero
point, times scale, then the matmul), so the imported module builds for any target; the
normalise stage replaces it with the NPU kernel for the chip (normalise/int4_weights.py,
kernels/gemm/int4_matmul.py), which keeps the weights packed in DRAM.

The packed tensors are int8 constants holding the uint8 bits (the NPU's DMA moves bytes; its
tensors are int8, int32 or float32): B reshaped to (N, k_blocks * blob_size), scales to (N,
k_blocks), zero points to (N, ceil(k_blocks / 2)). An A of rank > 2 is flattened to rows and the
result reshaped back; the optional bias (input 5) is an add after it.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, tirx

from ..errors import InvalidModel, UnsupportedOperator
from ..relax_info import shape_dims

#: The PrimFunc attribute naming a MatMulNBits layer: [m, k, n, block, zero points (0 / 1)].
LAYER_ATTR = "cgra.matmul_nbits"


def _const(value, what: str, node: str) -> np.ndarray:
    if not isinstance(value, tvm.ir.GenericConst):
        raise UnsupportedOperator(f"MatMulNBits '{node}': its {what} must be an initializer (a constant), not a "
                                  "value computed at run time; keep the quantizer's initializers in the model")
    return value.value.numpy()


def host_prim_func(m: int, k: int, n: int, block: int, zero_points: bool) -> tirx.PrimFunc:
    """Y[m, n] = sum_r X[m, r] * float32(q[n, r] - z) * s[n, r / block], q and z nibbles of the
    int8 (uint8 bits) packed tensors; z 8 without zero points. Host-runnable TensorIR."""
    groups = -(-k // block)
    x = te.placeholder((m, k), "float32", "X")
    q = te.placeholder((n, groups * block // 2), "int8", "Q")
    s = te.placeholder((n, groups), "float32", "S")
    z = te.placeholder((n, -(-groups // 2)), "int8", "Z") if zero_points else None

    def nibble(tensor, j, index):
        byte = tensor[j, index // 2].astype("int32") & 0xFF
        return (byte >> ((index % 2) * 4)) & 0xF

    def weight(r, j):
        zero = nibble(z, j, r // block) if zero_points else tirx.const(8, "int32")
        return (nibble(q, j, r) - zero).astype("float32") * s[j, r // block]

    w = te.compute((k, n), weight, "W")
    r = te.reduce_axis((0, k), "r")
    y = te.compute((m, n), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), "Y")
    params = [x, q, s] + ([z] if zero_points else []) + [y]
    return te.create_prim_func(params).with_attr(LAYER_ATTR, [m, k, n, block, int(zero_points)])


def convert(bb: relax.BlockBuilder, inputs: list, attrs: dict, name: str, add_func) -> relax.Expr:
    """The Relax value of one MatMulNBits node (see the module docstring); `add_func(func, name)`
    adds a PrimFunc to the module and returns its GlobalVar."""
    bits, k, n, block = (int(attrs.get(key, default)) for key, default in
                         (("bits", 4), ("K", 0), ("N", 0), ("block_size", 0)))
    if bits != 4:
        raise UnsupportedOperator(f"MatMulNBits '{name}': bits={bits}; the NPU takes 4-bit weights (bits=4)")
    if block < 16 or block & (block - 1) or k < 1 or n < 1:
        raise InvalidModel(f"MatMulNBits '{name}': block_size {block}, K {k}, N {n}: block_size must be a power "
                           "of 2 >= 16 and K, N positive (onnxruntime's contract)")
    a, packed, scales = inputs[0], inputs[1], inputs[2]
    zeros = inputs[3] if len(inputs) > 3 else None
    if len(inputs) > 4 and inputs[4] is not None:
        raise UnsupportedOperator(f"MatMulNBits '{name}': g_idx (act-order) is not supported; quantize without "
                                  "act-order")
    bias = inputs[5] if len(inputs) > 5 else None
    groups = -(-k // block)
    q = _const(packed, "B", name).reshape(n, groups * block // 2)
    s = _const(scales, "scales", name).astype(np.float32).reshape(n, groups)
    z = None
    if zeros is not None:
        z = _const(zeros, "zero_points", name)
        if z.dtype != np.uint8:
            raise UnsupportedOperator(f"MatMulNBits '{name}': float zero points are not supported (uint8 only)")
        z = z.reshape(n, -(-groups // 2))
    dims = shape_dims(a)
    if dims is None or not all(isinstance(d, int) for d in dims) or dims[-1] != k:
        raise UnsupportedOperator(f"MatMulNBits '{name}': A must have a static shape ending in K={k}, got {dims}")
    m = int(np.prod(dims[:-1]))
    rows = a if len(dims) == 2 else bb.emit(relax.op.reshape(a, (m, k)))
    gvar = add_func(host_prim_func(m, k, n, block, z is not None), name)
    args = [rows, relax.const(q.view(np.int8)), relax.const(s)] + ([relax.const(z.view(np.int8))] if z is not None else [])
    out = bb.emit(relax.call_tir(gvar, args, relax.TensorType((m, n), "float32")))
    if len(dims) != 2:
        out = bb.emit(relax.op.reshape(out, tuple(dims[:-1]) + (n,)))
    if bias is not None:
        out = bb.emit(relax.op.add(out, bias))
    return out


def layer_module(m: int, k: int, block: int, packed: np.ndarray, scales: np.ndarray,
                 zeros: np.ndarray | None = None) -> tvm.IRModule:
    """main(x: (m, k) float32) = one MatMulNBits layer on x, from its packed tensors as
    onnxruntime lays them out (uint8 packed (N, k_blocks * blob), float32 scales (N, k_blocks),
    uint8 zero points (N, ceil(k_blocks / 2)) or None): what the importer makes of one node.
    `cgra-sim verify --weight-dtype int4` runs it."""
    n = packed.shape[0]
    attrs = {"bits": 4, "K": k, "N": n, "block_size": block}
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            inputs = [x, relax.const(packed), relax.const(scales)] + ([relax.const(zeros)] if zeros is not None else [])
            out = bb.emit_output(convert(bb, inputs, attrs, "matmul_int4",
                                         lambda func, hint: bb.add_func(func.with_attr("global_symbol", hint), hint)))
        bb.emit_func_output(out)
    return bb.get()
