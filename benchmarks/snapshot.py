"""A behaviour snapshot: what a set of models does on the NPU, launch by launch, to compare two
versions of the compiler ("did this refactor move any figure?").

For each case and preset it records every kernel launch's statistics (cycles, MACs, DMA bytes,
commands, ..., host timings left out) and a SHA-256 of every output, into DIR/results.json.
Cases: two CNNs and a text-line encoder from ONNX, two model-zoo networks at 64 x 64, and
symbolic-size models (dense rows, conv2d / depthwise / pools / global pool on an n x n image) at
several sizes with their static twins. Compare two snapshots with `cmp` (the file is written with
sorted keys) or `--compare OTHER_DIR`, which names the first case that differs.

    CGRA_KERNEL_CACHE=off python benchmarks/snapshot.py DIR [--compare OTHER_DIR] [--arch A ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys
import time

import numpy as np
import tvm
from tvm.relax.transform import BindSymbolicVars

import npu_backend

sys.path[:0] = [str(pathlib.Path(__file__).resolve().parents[1] / "tests"),
                str(pathlib.Path(__file__).resolve().parent)]
import bench_dynamic as dyn  # noqa: E402
import onnx_models  # noqa: E402
from zoo_models import ZOO  # noqa: E402


def _onnx_case(model, shape):
    return lambda: (npu_backend.from_onnx(model),
                    [np.random.default_rng(1).standard_normal(shape).astype("float32")])


def _dynamic_case(build, size, static=False):
    def make():
        mod, inputs = build()
        dyn.RNG = np.random.default_rng(1)
        return (BindSymbolicVars({"n": size})(mod) if static else mod), inputs(size)
    return make


def cases() -> dict:
    out = {"resnet_32": _onnx_case(onnx_models.resnet(32), (1, 3, 32, 32)),
           "mobilenet_v2_32": _onnx_case(onnx_models.mobilenet_v2(32), (1, 3, 32, 32)),
           "text_line_37": _onnx_case(onnx_models.text_line_encoder(), (1, 1, 16, 37)),
           "squeezenet_64": _onnx_case(ZOO["squeezenet1.1"](64), (1, 3, 64, 64)),
           "shufflenet_64": _onnx_case(ZOO["shufflenet_v2"](64), (1, 3, 64, 64))}
    symbolic = {"dense_f32": lambda: dyn.dense("float32"), "dense_i8": lambda: dyn.dense("int8"),
                "conv_square": dyn.conv_square, "conv_width": dyn.conv_width,
                "depthwise_square": dyn.depthwise_square, "pool_square": dyn.pool_square,
                "global_square": lambda: dyn.global_square(64)}
    sizes = {"dense_f32": (1, 97), "dense_i8": (1, 97), "conv_width": (1, 9, 97)}
    for name, build in symbolic.items():
        for size in sizes.get(name, (1, 4, 7, 9, 14)):
            out[f"{name}_n{size}"] = _dynamic_case(build, size)
            out[f"{name}_static{size}"] = _dynamic_case(build, size, static=True)
    return out


def run_case(make, arch) -> dict:
    mod, inputs = make()
    vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    with npu_backend.profile() as prof:
        out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs])
    outs = [out] if hasattr(out, "numpy") else list(out)
    launches = [{k: v for k, v in stats.to_dict().items() if "seconds" not in k} for stats in prof.kernels]
    for launch in launches:  # an opcode the ISA gained since the other snapshot counts 0: not a change
        launch["op_counts"] = {op: count for op, count in launch["op_counts"].items() if count}
    return {"launches": launches,
            "outputs": [hashlib.sha256(np.ascontiguousarray(o.numpy()).tobytes()).hexdigest() for o in outs]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=pathlib.Path, help="where results.json goes")
    parser.add_argument("--arch", action="append", help="presets (default: every preset)")
    parser.add_argument("--compare", type=pathlib.Path, help="a snapshot directory to compare with")
    args = parser.parse_args()
    results, start = {}, time.time()
    for arch in args.arch or npu_backend.preset_names():
        for name, make in cases().items():
            results[f"{arch}/{name}"] = run_case(make, arch)
            print(f"[{time.time() - start:6.1f} s] {arch}/{name}: "
                  f"{sum(k['cycles'] for k in results[f'{arch}/{name}']['launches'])} cycles", flush=True)
    args.dir.mkdir(parents=True, exist_ok=True)
    (args.dir / "results.json").write_text(json.dumps(results, sort_keys=True, indent=1))
    if args.compare:
        other = json.loads((args.compare / "results.json").read_text())
        differ = [key for key in sorted(set(results) | set(other)) if results.get(key) != other.get(key)]
        print("identical" if not differ else f"{len(differ)} cases differ, first: {differ[0]}")
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
