"""The conv2d walk: how many of the project's files, and calls between them, one ONNX layer's way
from `tvm.compile` to its cycle count goes through (issue 33's readability figure).

Stage: tooling (not part of any pipeline). In: nothing (an ONNX Conv with bias + Relu is built
with onnx.helper and imported by `npu_backend.from_onnx` before tracing starts). It is compiled
with `tvm.compile(mod, target="cgra")` and run on the VM inside `npu_backend.profile()`, under
sys.setprofile and threading.setprofile. A call counts when its callee is in the project's own
files (npu_backend/, codegen/, simulator/, cgra_cli/) and its caller is too, in another file
(through TVM's frames back to the nearest project frame: a pass TVM runs for us is called from
the project function that ran the pass). Out: the project files whose functions ran, the distinct
cross-file hops (caller function -> callee function), the distinct file -> file edges (how
the issue counted "hops"; of them, those back to a file entered earlier), the files starting the most hops, and the
simulated cycles.

Kernel compiles may go to worker processes (target/parallel.py) whose calls no tracer here sees:
the walk sets CGRA_COMPILE_JOBS=1 (one kernel would compile here anyway) and CGRA_KERNEL_CACHE=off,
so the kernel's stages run in this process and are not read back from an earlier compile. A
first, smaller compile warms what happens once per process (intrinsics, the runtime library).

    python benchmarks/walk.py [--top 12] [--list]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading

os.environ["CGRA_COMPILE_JOBS"] = "1"
os.environ["CGRA_KERNEL_CACHE"] = "off"

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import tvm  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import npu_backend  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(npu_backend.__file__)))
PROJECT = tuple(os.path.join(REPO, folder) + os.sep for folder in ("npu_backend", "codegen", "simulator", "cgra_cli"))


def conv_bias_relu(channels: int, size: int, filters: int, seed: int = 0) -> onnx.ModelProto:
    """An ONNX model: Conv 3x3, padding 1, with its bias input, then Relu (float32, batch 1)."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((filters, channels, 3, 3)).astype("float32")
    bias = rng.standard_normal(filters).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["conv"], ["y"], name="relu")],
        "conv_bias_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, filters, size, size])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def project_file(path: str) -> str | None:
    """`path` relative to the repository when it is one of the project's files, else None."""
    return os.path.relpath(path, REPO) if path.startswith(PROJECT) else None


def compile_and_run(channels: int, size: int, filters: int) -> int:
    """The layer compiled for target "cgra" and run once; its simulated cycles."""
    mod = npu_backend.from_onnx(conv_bias_relu(channels, size, filters))
    return _compile_and_run(mod, channels, size)


def _compile_and_run(mod, channels: int, size: int) -> int:
    """`mod` compiled and run on random input; the profile's total cycles."""
    ex = tvm.compile(mod, target="cgra")
    data = np.random.default_rng(1).standard_normal((1, channels, size, size)).astype("float32")
    with npu_backend.profile() as prof:
        tvm.relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(data))
    return prof.total_cycles


def walk(channels: int = 16, size: int = 28, filters: int = 32):
    """(files in first-entered order, distinct function hops, cycles) of the layer's compile and run."""
    compile_and_run(3, 8, 8)  # warm: intrinsics, runtime library
    mod = npu_backend.from_onnx(conv_bias_relu(channels, size, filters))
    files, hops = collections.OrderedDict(), set()

    def tracer(frame, event, arg):
        if event != "call":
            return
        callee = project_file(frame.f_code.co_filename)
        if callee is None:
            return
        files.setdefault(callee, None)
        caller = frame.f_back
        while caller is not None and project_file(caller.f_code.co_filename) is None:
            caller = caller.f_back  # through TVM's own frames back to the project's
        if caller is not None:
            source = project_file(caller.f_code.co_filename)
            if source != callee:
                hops.add(((source, caller.f_code.co_qualname), (callee, frame.f_code.co_qualname)))

    threading.setprofile(tracer)
    sys.setprofile(tracer)
    try:
        cycles = _compile_and_run(mod, channels, size)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return list(files), hops, cycles


def main():
    """Prints the walk's figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=12, help="files starting the most hops to show")
    parser.add_argument("--list", action="store_true", help="every file and every hop, too")
    args = parser.parse_args()
    files, hops, cycles = walk()
    edges = {(caller[0], callee[0]) for caller, callee in hops}
    started = collections.Counter(caller[0] for caller, _ in hops)
    edges_from = collections.Counter(source for source, _ in edges)
    print(f"ONNX Conv 16x28x28 -> 32, 3x3 + bias + Relu, tvm.compile(target='cgra') and run: {cycles} cycles")
    by_folder = collections.Counter(name.split(os.sep)[0] for name in files)
    opened = {name: index for index, name in enumerate(files)}
    backwards = [edge for edge in edges if opened[edge[1]] < opened[edge[0]]]
    print(f"project files touched: {len(files)} ({', '.join(f'{f} {n}' for f, n in sorted(by_folder.items()))})")
    print(f"distinct cross-file hops (caller function -> callee function): {len(hops)}")
    print(f"distinct file -> file edges: {len(edges)}, of which {len(backwards)} go back to a file entered earlier")
    print("top files by hops started (function hops / file edges):")
    for name, count in started.most_common(args.top):
        print(f"  {count:4d} {edges_from[name]:4d}  {name}")
    if args.list:
        print("\n".join(files))
        for (source, caller), (target, callee) in sorted(hops):
            print(f"  {source}:{caller} -> {target}:{callee}")


if __name__ == "__main__":
    main()
