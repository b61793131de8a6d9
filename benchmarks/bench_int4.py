"""A Llama-style MLP block with 4-bit weights (MatMulNBits) against its float32 twin, on the NPU.

The block is Llama's feed-forward layer, down(silu(gate(x)) * up(x)), hidden 512, intermediate
1376 (Llama's 8/3 ratio, rounded to whole blocks), random weights; its 4-bit twin has the three
MatMuls as onnxruntime's MatMulNBits (block 32, zero points), quantized by the C++ routine
onnxruntime's MatMulNBitsQuantizer calls (examples/int4_mlp.py); its int8 x int4 twin is the
block quantized by onnxruntime's `quantize_static` with int4 weights per channel (QDQ; the weights
packed two per byte in DRAM, normalise/qdq_int4.py). Per number of rows (1: a decode step), per
model: NPU cycles, DRAM bytes the DMA moved, energy, and the largest difference from
onnxruntime running the same ONNX model.

    python benchmarks/bench_int4.py [--arch cgra-8x8] [--rows 1 16]
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
HIDDEN, INTERMEDIATE = 512, 1376


def llama_mlp(rng, rows: int):
    """x (rows, HIDDEN) -> down(silu(gate(x)) * up(x)) as ONNX MatMul / Sigmoid / Mul."""
    from onnx import TensorProto, helper, numpy_helper

    shapes = {"gate": (HIDDEN, INTERMEDIATE), "up": (HIDDEN, INTERMEDIATE), "down": (INTERMEDIATE, HIDDEN)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32), f"w_{n}")
             for n, s in shapes.items()]
    nodes = [helper.make_node("MatMul", ["x", "w_gate"], ["g"], name="gate"),
             helper.make_node("MatMul", ["x", "w_up"], ["u"], name="up"),
             helper.make_node("Sigmoid", ["g"], ["sg"], name="sigmoid"),
             helper.make_node("Mul", ["g", "sg"], ["silu"], name="silu"),
             helper.make_node("Mul", ["silu", "u"], ["h"], name="gated"),
             helper.make_node("MatMul", ["h", "w_down"], ["y"], name="down")]
    graph = helper.make_graph(nodes, "llama_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, HIDDEN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, HIDDEN])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def measure(model, x, arch) -> dict:
    """NPU cycles, DMA bytes, energy (uJ) and the largest difference from onnxruntime."""
    import onnxruntime as ort
    import tvm
    from tvm import relax

    import npu_backend

    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    mod = npu_backend.from_onnx(model)
    placements = npu_backend.explain(mod, arch)
    with npu_backend.profile() as prof:
        out = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    kernels = [k.to_dict() for k in prof.kernels]
    return {"cycles": prof.total_cycles,
            "dram_bytes": sum(k["dma_load_bytes"] + k["dma_store_bytes"] for k in kernels),
            "energy_uj": sum(k["energy_pj"] for k in kernels) / 1e6,
            "npu_macs": sum(p.macs for p in placements if p.where == "npu"),
            "macs": sum(p.macs for p in placements),
            "diff": float(np.abs(out - expected).max()), "scale": float(np.abs(expected).max())}


def _int8_int4(model):
    """`model` quantized by onnxruntime's quantize_static with int4 weights (format_models.py)."""
    sys.path.insert(0, HERE)
    import format_models

    with tempfile.TemporaryDirectory() as directory:
        return format_models.int8_int4_static(model, directory)


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cgra-8x8", help="preset name or JSON file (default cgra-8x8)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16], help="rows of x (default 1 16)")
    args = parser.parse_args(argv)
    import npu_backend

    quantize = runpy.run_path(os.path.join(HERE, "..", "examples", "int4_mlp.py"))["quantize_with_ort_kernel"]
    arch = npu_backend.load_arch(args.arch)
    results = []
    print(f"{'rows':>4} {'weights':<9} {'cycles':>9} {'DRAM bytes':>11} {'energy uJ':>10} {'NPU MACs':>9} {'max diff':>9}")
    for rows in args.rows:
        rng = np.random.default_rng(rows)
        model = llama_mlp(rng, rows)
        x = rng.standard_normal((rows, HIDDEN)).astype(np.float32)
        for name, variant in (("float32", model), ("int4", quantize(model, symmetric=False)),
                              ("int8xint4", _int8_int4(model))):
            r = measure(variant, x, arch)
            results.append(dict(rows=rows, weights=name, **r))
            print(f"{rows:>4} {name:<9} {r['cycles']:>9} {r['dram_bytes']:>11} {r['energy_uj']:>10.1f} "
                  f"{r['npu_macs'] / max(1, r['macs']):>9.1%} {r['diff']:>9.2g} (of {r['scale']:.2g})")
    return results


if __name__ == "__main__":
    main()
