"""Issue 37 item 0: int8 models quantized by onnxruntime against their float32 twins.

Each model is built at random weights (float32 ONNX), quantized by onnxruntime's own
`quantize_static` (QDQ, int8 activations and weights, per channel, calibrated on four random
inputs: tests/qdq_models.onnxruntime_quantized), and both are compiled for the NPU and run once
on one random input. Per model and preset it prints:

- NPU cycles (every kernel launch) float32 and int8, and int8 / float32;
- host cycles (the host operator calls, modelled at the NPU's clock from the chip's host table:
  the quantize, dequantize and pad calls that did not become NPU kernels) and the whole run's
  (NPU + host) int8 / float32;
- NPU kernels and host calls of each;
- the largest difference of the output to onnxruntime's, of cgra and of stock llvm
  (`tvm.compile(target="llvm")`), for both models; and the int8 model's cgra output against
  onnxruntime's integer kernels (`i8 int`: the session option `session.qdqisint8allowed` = 1).
  onnxruntime on x86 fuses a QDQ layer with int8 (not uint8) activations into QLinearConv,
  QLinearAdd, QLinearSigmoid, ... only with that option (or on Arm): by default it runs them as
  float DequantizeLinear -> op -> QuantizeLinear, as stock llvm does, and its results differ from
  the integer kernels' by a rounding step here and there (YOLO: 330 of 576 outputs, 1-3 steps).
  The NPU computes the integer kernels' arithmetic, so `i8 int` is 0 where it is exact.

With --families, the kernels and cycles per family (the model ops a kernel fused), int8 against
float32, and the host calls per operator: what splits into extra kernels.

    python benchmarks/bench_quantized.py [--arch cgra-8x8 ...] [--size 64] [--models resnet18 ...] [--families]
                                         [--set macs_per_pe.int8=4 ...]

--set FIELD=VALUE changes each preset as `cgra-sim sweep --set` does (one value a field): with
`macs_per_pe.int8=4`, a chip whose PEs do four int8 MACs a cycle beside one float32 MAC
(docs/hardware-description.md, "What each number format costs"), the chip issue 37 measures
against (int8 <= 0.6x float32); the presets keep one (the SCALE-Sim comparisons).

Models: mobilenet_v3_small (HardSwish and squeeze-excite), resnet18, resnet50, squeezenet
(concat of differently scaled inputs), yolo_v8n (SiLU, concat, upsampling), text_cnn (a conv1d
text classifier exported from PyTorch: skipped with a message when torch is missing). --size
sets the image models' height and width (default 64: the whole list in minutes; 224 is the
models' own size).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests")  # the model builders are test-side

PRESETS = ("cgra-4x4", "cgra-8x8", "cgra-16x16")


def _text_cnn(size: int):
    """A conv1d text classifier (embedded tokens in, 4 classes out) exported by torch.onnx.export
    at random weights; None when torch is missing."""
    try:
        import torch
    except ImportError:
        return None
    import io

    import onnx

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv1d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv1d(64, 64, 3, padding=1),
        torch.nn.ReLU(), torch.nn.AdaptiveMaxPool1d(1), torch.nn.Flatten(), torch.nn.Linear(64, 4)).eval()
    buffer = io.BytesIO()
    torch.onnx.export(model, (torch.randn(1, 32, size),), buffer, input_names=["input"], output_names=["logits"],
                      opset_version=17, dynamo=False)
    proto = onnx.load_from_string(buffer.getvalue())
    proto.ir_version = min(proto.ir_version, 10)
    return proto


def models(size: int) -> dict:
    """name -> a function returning the float32 ONNX model (None when it cannot be built here)."""
    sys.path.insert(0, TESTS)
    import onnx_models
    import zoo_models

    return {
        "mobilenet_v3_small": lambda: zoo_models.mobilenet_v3_small(size=size, classes=100),
        "resnet18": lambda: onnx_models.resnet18(size=size, classes=100),
        "resnet50": lambda: zoo_models.resnet50(size=size, classes=100),
        "squeezenet": lambda: zoo_models.squeezenet11(size=size, classes=100),
        "yolo_v8n": lambda: zoo_models.yolo_v8n(size=size),
        "text_cnn": lambda: _text_cnn(size),
    }


def quantized(model, directory: str):
    """`model` quantized by onnxruntime's quantize_static: QDQ, int8, per channel."""
    from qdq_models import onnxruntime_quantized

    return onnxruntime_quantized(model, directory, "QInt8", "QInt8", per_channel=True)


def _input(model):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return model.graph.input[0].name, np.random.default_rng(1).normal(0, 1, shape).astype(np.float32)


def _first(result) -> np.ndarray:
    """The model's first output of a VM call's result (a tensor, or a tuple of them)."""
    return result.numpy() if hasattr(result, "numpy") else result[0].numpy()


def chips(names, settings) -> list:
    """The presets `names`, each changed by `settings` (["macs_per_pe.int8=4", ...]), as
    hardware descriptions named after the change."""
    import npu_backend
    from npu_backend.tools.sweep import chip, parse_setting

    changes = {}
    for text in settings:
        field, values = parse_setting(text)
        if len(values) != 1:
            raise SystemExit(f"--set {text}: one value a field here (a sweep takes several: cgra-sim sweep)")
        changes[field] = values[0]
    return [chip(npu_backend.load_arch(name), changes) if changes else npu_backend.load_arch(name) for name in names]


def run(model, arch) -> dict:
    """Compile `model` for `arch` and stock llvm, run one input: cycles, kernels, host calls,
    the outputs' largest differences to onnxruntime."""
    import onnxruntime as ort
    import tvm
    from tvm import relax

    import npu_backend

    name, x = _input(model)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {name: x})[0]
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdqisint8allowed", "1")  # its integer QLinear kernels
    integer = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, {name: x})[0]
    mod = npu_backend.from_onnx(model)
    vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(x))
    got = _first(got)
    stock = _first(relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)))
    families, host = collections.defaultdict(lambda: [0, 0]), collections.defaultdict(lambda: [0, 0])
    for kernel in prof.kernels:
        entry = families[",".join(kernel.source_ops)]
        entry[0], entry[1] = entry[0] + 1, entry[1] + kernel.cycles
    for call in prof.host_calls:
        entry = host[call.name.rstrip("0123456789")]
        entry[0], entry[1] = entry[0] + 1, entry[1] + call.cycles
    scale = float(np.abs(expected).max()) or 1.0
    return {"npu": prof.total_cycles, "host": prof.host_cycles, "kernels": len(prof.kernels),
            "host_calls": len(prof.host_calls), "families": dict(families), "host_ops": dict(host),
            "cgra_diff": float(np.abs(got - expected).max()) / scale,
            "llvm_diff": float(np.abs(stock - expected).max()) / scale,
            "int_diff": float(np.abs(got - integer).max()) / (float(np.abs(integer).max()) or 1.0)}


def _row(name, arch, f, q, width: int = 10) -> str:
    whole = (q["npu"] + q["host"]) / max(f["npu"] + f["host"], 1)
    return (f"{name:<19} {arch.name:<{width}} {f['npu']:>11} {q['npu']:>11} {q['npu'] / f['npu']:>6.2f} {f['host']:>9} "
            f"{q['host']:>10} {whole:>6.2f} {f['kernels']:>4}/{q['kernels']:<4} {f['host_calls']:>3}/{q['host_calls']:<4}"
            f" {f['cgra_diff']:>8.1e} {f['llvm_diff']:>8.1e} {q['cgra_diff']:>8.1e} {q['llvm_diff']:>8.1e} {q['int_diff']:>8.1e}")


def _header(width: int = 10) -> str:
    return (f"{'model':<19} {'arch':<{width}} {'NPU f32':>11} {'NPU int8':>11} {'ratio':>6} {'host f32':>9} "
            f"{'host int8':>10} {'whole':>6} {'kernels':>9} {'host':>8} {'f32 cgra':>8} {'f32 llvm':>8} "
            f"{'i8 cgra':>8} {'i8 llvm':>8} {'i8 int':>8}")


FOOTER = ("ratio: int8 / float32 NPU cycles; whole: (NPU + host cycles) int8 / float32; kernels, host: "
          "float32/int8 counts; the next four: the output's largest difference to onnxruntime's over its "
          "largest magnitude, float32 and int8 models, cgra and stock llvm; i8 int: the int8 model's cgra "
          "output against onnxruntime's integer kernels (session.qdqisint8allowed = 1).")


def _families(f, q) -> str:
    lines = [f"  {'family (model ops a kernel fused)':<52} {'f32 n':>6} {'f32 cycles':>11} {'i8 n':>5} {'i8 cycles':>10}"]
    keys = sorted(set(f["families"]) | set(q["families"]),
                  key=lambda k: -max(f["families"].get(k, [0, 0])[1], q["families"].get(k, [0, 0])[1]))
    for key in keys:
        a, b = f["families"].get(key, [0, 0]), q["families"].get(key, [0, 0])
        lines.append(f"  {key[:52]:<52} {a[0]:>6} {a[1]:>11} {b[0]:>5} {b[1]:>10}")
    for key, (count, cycles) in sorted(q["host_ops"].items(), key=lambda kv: -kv[1][1]):
        lines.append(f"  host {key[:47]:<47} {'':>6} {'':>11} {count:>5} {cycles:>10}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", nargs="+", default=list(PRESETS))
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--models", nargs="+")
    parser.add_argument("--families", action="store_true", help="kernels and cycles per family, int8 vs float32")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change each preset's FIELD (e.g. macs_per_pe.int8=4: four int8 MACs a PE a cycle)")
    args = parser.parse_args(argv)
    archs = chips(args.arch, args.set)
    builders = models(args.size)
    width = max(10, *(len(arch.name) for arch in archs))
    print(_header(width), flush=True)
    for name in args.models or builders:
        model = builders[name]()
        if model is None:
            print(f"{name:<19} skipped: torch is not installed (run with /work/venv-hf/bin/python)", flush=True)
            continue
        with tempfile.TemporaryDirectory(prefix="bench-quantized-") as directory:
            twin = quantized(model, directory)
        for arch in archs:
            f, q = run(model, arch), run(twin, arch)
            print(_row(name, arch, f, q, width), flush=True)
            if args.families:
                print(_families(f, q), flush=True)
    print(FOOTER)


if __name__ == "__main__":
    main()
