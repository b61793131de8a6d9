"""A float MLP quantized to 4-bit weights by onnxruntime (MatMulNBits), run on the NPU.

The MLP (x -> MatMul -> Relu -> MatMul -> Relu -> MatMul) is quantized by onnxruntime's
`MatMulNBitsQuantizer` (block 32; it needs the `onnx_ir` package; without it the same C++ block
quantizer it calls, `quantize_matmul_4bits`, writes the same nodes). Every MatMulNBits runs on the
NPU: its weights cross DRAM packed two per byte with their scales and zero points, and UNPACK4
makes the float32 tile in the scratchpad. Prints, per layer, the cycles and the weight bytes the
DMA moved against what float32 and int8 weights would take, and the largest difference from
onnxruntime.

    python examples/int4_mlp.py [--arch cgra-8x8] [--rows 1] [--symmetric]
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import npu_backend

SIZES = (256, 512, 512, 128)
BLOCK = 32


def float_mlp(rng, rows: int):
    """x (rows, 256) -> MatMul -> Relu -> MatMul -> Relu -> MatMul -> (rows, 128)."""
    nodes, inits, value = [], [], "x"
    for layer, (k, n) in enumerate(zip(SIZES, SIZES[1:])):
        inits.append(numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), f"w{layer}"))
        nodes.append(helper.make_node("MatMul", [value, f"w{layer}"], [f"h{layer}"], name=f"fc{layer}"))
        value = f"h{layer}"
        if layer < len(SIZES) - 2:
            nodes.append(helper.make_node("Relu", [value], [f"r{layer}"], name=f"relu{layer}"))
            value = f"r{layer}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, SIZES[0]])],
                              [helper.make_tensor_value_info(value, TensorProto.FLOAT, [rows, SIZES[-1]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def quantize(model, symmetric: bool):
    """`model` with its MatMuls as MatMulNBits (bits 4, block 32), by onnxruntime's quantizer."""
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError:  # the quantizer module needs onnx_ir
        return quantize_with_ort_kernel(model, symmetric)
    quantizer = MatMulNBitsQuantizer(model, block_size=BLOCK, is_symmetric=symmetric)
    quantizer.process()
    return quantizer.model.model


def quantize_with_ort_kernel(model, symmetric: bool):
    """What MatMulNBitsQuantizer writes, by the C++ routine it calls (quantize_matmul_4bits): each
    MatMul whose weights are an initializer as a MatMulNBits; the rest of the model as it is."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    nodes, inits = [], []
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in weights:  # a matmul of two activations stays
            nodes.append(node)
            continue
        w = weights[node.input[1]]
        (k, n), groups = w.shape, -(-w.shape[0] // BLOCK)
        packed, scales = np.zeros((n, groups, BLOCK // 2), np.uint8), np.zeros((n, groups), np.float32)
        zeros = np.zeros((n, (groups + 1) // 2), np.uint8)
        quantize_matmul_4bits(packed, np.pad(w, ((0, groups * BLOCK - k), (0, 0))), scales, zeros, BLOCK, n, k, symmetric)
        names = [f"{node.input[1]}_Q4", f"{node.input[1]}_scales"] + ([] if symmetric else [f"{node.input[1]}_zp"])
        inits += [numpy_helper.from_array(packed, names[0]), numpy_helper.from_array(scales.reshape(-1), names[1])]
        inits += [] if symmetric else [numpy_helper.from_array(zeros.reshape(-1), names[2])]
        nodes.append(helper.make_node("MatMulNBits", [node.input[0]] + names, node.output, name=f"{node.name}_Q4",
                                      domain="com.microsoft", K=k, N=n, bits=4, block_size=BLOCK))
    read = {name for node in nodes for name in node.input}  # the other nodes' initializers stay
    inits += [init for init in model.graph.initializer if init.name in read]
    graph = helper.make_graph(nodes, "mlp_q4", model.graph.input, model.graph.output, inits)
    opsets = [op for op in model.opset_import if op.domain != "com.microsoft"]  # the model's own, and ORT's
    opsets.append(helper.make_opsetid("com.microsoft", 1))
    return helper.make_model(graph, opset_imports=opsets)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cgra-8x8", help="preset name or JSON file (default cgra-8x8)")
    parser.add_argument("--rows", type=int, default=1, help="rows of x (1: a decode step; default 1)")
    parser.add_argument("--symmetric", action="store_true", help="no zero points (each is 8)")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    model = quantize(float_mlp(rng, args.rows), args.symmetric)
    x = rng.standard_normal((args.rows, SIZES[0])).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    arch = npu_backend.load_arch(args.arch)
    mod = npu_backend.from_onnx(model)
    with npu_backend.profile() as prof:
        out = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    layers = [k for k in prof.kernels if k.name.startswith("cgra_tir_")]
    print(f"{'kernel':<22} {'cycles':>8} {'DMA load B':>11} {'x B':>7} {'int4 w B':>9} {'int8 w B':>9} {'f32 w B':>9}")
    for kernel, (k, n) in zip(layers, zip(SIZES, SIZES[1:])):
        loaded = kernel.to_dict()["dma_load_bytes"]
        print(f"{kernel.name:<22} {kernel.cycles:>8} {loaded:>11} {4 * args.rows * k:>7} "
              f"{loaded - 4 * args.rows * k:>9} {k * n:>9} {4 * k * n:>9}")
    diff = float(np.abs(out - expected).max())
    print(f"total {prof.total_cycles} cycles on {arch.name}; largest difference from onnxruntime {diff:.3g} "
          f"(output scale {float(np.abs(expected).max()):.3g})")
    return {"cycles": prof.total_cycles, "max_abs_diff": diff}


if __name__ == "__main__":
    main()
