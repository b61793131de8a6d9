"""Issue 37: per number format, the NPU's cycles, DRAM bytes and energy of one CNN and one decoder
step against float32.

The models (benchmarks/format_models.py): a Llama-style decoder step (one token, 2 layers, hidden
1024, 16 query heads on 4 KV heads, SwiGLU MLP of 2816, a KV cache of 127 rows, random weights:
22 M weights, 89 MB in float32) and a ResNet-18 (tests/onnx_models.py, 64 x 64 images), each built in float32 and
converted as a user gets each format: bfloat16 and float16 (every tensor in the format), int8
(the decoder by onnxruntime's `quantize_dynamic`, the CNN by `quantize_static` QDQ per channel),
int16 x int8 (the CNN by `quantize_static` with int16 activations, the 16x8 mode: normalise/qdq16.py,
its max pools and flattens on int16 by qlayouts16.py), int8 x int4 (`quantize_static` QDQ with int4 weights per channel; a matmul's and a conv's cross
DRAM packed two per byte: docs/int4-weights.md), 4-bit weights (onnxruntime's MatMulNBits, block 32, zero
points; float32 activations; the CNN has no such form: MatMulNBits is a matmul). Each is
compiled for the chip, run once on the same random inputs, and printed as a row:

- cycles: the NPU's (every kernel launch), and x f32, over the float32 model's;
- host cycles: the host operator calls (the chip's host table at the NPU's clock): what did not
  run on the NPU (a 16-bit float model's softmax, norms and sigmoid; dynamic quantization's
  run-time scale and quantize);
- DRAM bytes: what the NPU's DMA loaded and stored, and x f32; x bf16 for the decoder, where
  4-bit weights should take about a third of bfloat16's (0.64 bytes a weight with block 32's
  float32 scale and 4-bit zero point, against 2);
- energy: the kernels' (µJ), and x f32;
- error: the largest difference of the first output from onnxruntime's float32 run of the float32
  model, over that output's largest magnitude (the format's own error, not the NPU's).

    python benchmarks/bench_formats.py [--arch cgra-8x8] [--models decoder resnet18] [--size 64]
                                       [--past 127] [--set macs_per_pe.int8=4 ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]  # the model builders



def variants(name: str, model, directory: str) -> dict:
    """format -> the model in it (None where the model has no such form)."""
    import format_models as fm

    quantized = {"decoder": lambda: fm.int8_dynamic(model, directory),
                 "resnet18": lambda: fm.int8_static(model, directory)}[name]
    return {"float32": model, "bfloat16": fm.to_half(model, "bfloat16"), "float16": fm.to_half(model, "float16"),
            "int8": quantized(), "int16 x int8": fm.int16_static(model, directory) if name == "resnet18" else None,
            "int8 x int4": fm.int8_int4_static(model, directory),
            "int4 w": fm.int4_weights(model) if fm.weight_matmuls(model) else None}


def measure(model, feeds: dict, arch) -> dict:
    """Run `model` once on the NPU: cycles, host cycles, DRAM bytes, energy (µJ), each kernel's
    source ops, the first output."""
    import ml_dtypes
    import tvm
    from tvm import relax

    import npu_backend
    from bench_quantized import _first

    types = {1: np.float32, 10: np.float16, 16: ml_dtypes.bfloat16}
    args = [tvm.runtime.tensor(feeds[i.name].astype(types[i.type.tensor_type.elem_type])) for i in model.graph.input]
    vm = relax.VirtualMachine(npu_backend.compile(npu_backend.from_onnx(model), arch), tvm.cpu())
    with npu_backend.profile() as prof:
        out = vm["main"](*args)
    kernels = [k.to_dict() for k in prof.kernels]
    return {"cycles": prof.total_cycles, "host_cycles": prof.host_cycles,
            "dram_bytes": sum(k["dma_load_bytes"] + k["dma_store_bytes"] for k in kernels),
            "energy_uj": sum(k["energy_pj"] for k in kernels) / 1e6,
            "kernels": [k.source_ops for k in prof.kernels], "output": _first(out).astype(np.float64)}


def table(name: str, model, arch) -> list:
    """One row per format of `model` (its name says how to quantize it): printed and returned."""
    import onnxruntime as ort

    import format_models as fm

    feeds = fm.random_inputs(model)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    scale = float(np.abs(expected).max())
    print(f"\n{name} on {arch.name}")
    print(f"{'format':<11} {'cycles':>9} {'x f32':>6} {'host cyc':>9} {'DRAM bytes':>11} {'x f32':>6} {'x bf16':>6} "
          f"{'energy uJ':>10} {'x f32':>6} {'error':>8}")
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for fmt, variant in variants(name, model, directory).items():
            if variant is None:
                why = "MatMulNBits is a matmul" if fmt == "int4 w" else "quantize_dynamic has no int16"
                print(f"{fmt:<11} {f'(no such form: {why})':>40}")
                continue
            r = measure(variant, feeds, arch)
            error = float(np.abs(r.pop("output") - expected).max()) / scale
            r.update(format=fmt, error=error, kernels=len(r["kernels"]))
            rows.append(r)
            f32, bf16 = rows[0], next((row for row in rows if row["format"] == "bfloat16"), rows[0])
            print(f"{fmt:<11} {r['cycles']:>9} {r['cycles'] / f32['cycles']:>6.2f} {r['host_cycles']:>9} "
                  f"{r['dram_bytes']:>11} {r['dram_bytes'] / f32['dram_bytes']:>6.2f} "
                  f"{r['dram_bytes'] / bf16['dram_bytes']:>6.2f} {r['energy_uj']:>10.1f} "
                  f"{r['energy_uj'] / f32['energy_uj']:>6.2f} {r['error']:>8.2g}", flush=True)
    return rows


def main(argv=None) -> dict:
    """A table per model: a row per format."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cgra-8x8", help="preset name or JSON file (default cgra-8x8)")
    parser.add_argument("--models", nargs="+", default=["decoder", "resnet18"], choices=["decoder", "resnet18"])
    parser.add_argument("--size", type=int, default=64, help="ResNet-18's image height and width (default 64)")
    parser.add_argument("--past", type=int, default=127, help="the decoder's KV cache rows before the step (127)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change the chip as `cgra-sim sweep --set` does (e.g. macs_per_pe.int8=4)")
    args = parser.parse_args(argv)
    import format_models as fm
    import onnx_models
    from bench_quantized import chips

    arch = chips([args.arch], args.set)[0]
    builders = {"decoder": lambda: fm.decoder_step(past=args.past),
                "resnet18": lambda: onnx_models.resnet18(size=args.size, classes=100)}
    return {name: table(name, builders[name](), arch) for name in args.models}


if __name__ == "__main__":
    main()
