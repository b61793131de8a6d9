"""Figures for variable shapes: one kernel compiled with a symbolic size against a kernel compiled
for exactly that size.

For a fully connected layer (rows symbolic: a batch or a sequence), float32 and int8, on every
preset, the cycles of the symbolic kernel over those of the static one at 1 row, one row tile of
the symbolic kernel, one tile + 1, a prime (97) and 1000 rows; then a conv2d with a symbolic batch
at 1, 2, 3 and 7 images; a conv2d with a symbolic image width (stride 1 and 2) at 1, 2, 7, 8, 9, 97 and
320 columns; the same conv2d on an n x n image (height and width symbolic) at n = 1, 7, 8, 9, 31,
56 and 112, and a 3x3 depthwise conv2d likewise; a 2x2 max pool and a 3x3 one padded 1 with a symbolic width at 2, 3, 16, 17, 97 and 320 columns, and the
3x3 one on an n x n image (both symbolic) at n = 2, 7, 8, 9, 31, 56 and 112; a global average pool
of 64 and 512 channels on an n x n image at n = 1, 7, 9, 14, 17 (one past a block), 28 and 56; then the
compile time of each symbolic model against one static compile
(best of 3 first compiles, same process; run with CGRA_KERNEL_CACHE=off). Goal (issue 11): every ratio
within 1.05.

    python benchmarks/bench_dynamic.py
"""

from __future__ import annotations

import time

import numpy as np
import tvm
from tvm import relax
from tvm.relax.transform import BindSymbolicVars

import npu_backend
from npu_backend.kernels.common.dynamic import DEFAULT_BOUND
from npu_backend.kernels.gemm.gemm import choose_tiling
from npu_backend.target.relax_ext import clear_kernel_cache

RNG = np.random.default_rng(0)


def _model(params: list, body):
    """(module main(*params) = body(*params), inputs(size)): params are (shape, dtype), "n" in
    a shape the symbolic size; inputs(size) draws data with n = size."""
    n = tvm.tirx.Var("n", "int64")
    args = [relax.Var(f"p{i}", relax.TensorType([n if d == "n" else d for d in shape], dtype))
            for i, (shape, dtype) in enumerate(params)]
    bb = relax.BlockBuilder()
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *args))
        bb.emit_func_output(out)
    return bb.get(), lambda size: [_data(tuple(size if d == "n" else d for d in shape), dtype)
                                   for shape, dtype in params]


def dense(dtype):
    """relu(x @ w + b) with x (n, 256) symbolic in n; int8 accumulates in int32 and clips."""
    acc = "int32" if dtype == "int8" else dtype

    def body(bb, x, w, b):
        y = bb.emit(relax.op.add(relax.op.matmul(x, w, out_dtype=acc), b))
        return relax.op.nn.relu(y) if dtype == "float32" else relax.op.clip(y, -128, 127)
    return _model([(("n", 256), dtype), ((256, 96), dtype), ((96,), acc)], body)


def conv(dtype="float32"):
    """relu(conv2d(x, w)) 3x3, 32 -> 64 channels on 14x14, NCHW, the batch n symbolic."""
    return _model([(("n", 32, 14, 14), dtype), ((64, 32, 3, 3), dtype)],
                  lambda bb, x, w: relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=(1, 1))))


def conv_width(dtype="float32", stride=1):
    """relu(conv2d(x, w)) 3x3, 16 -> 32 channels on a 32-row image of symbolic width n, NCHW (an
    OCR recogniser's first layers: the text line's length varies)."""
    return _model([((1, 16, 32, "n"), dtype), ((32, 16, 3, 3), dtype)], lambda bb, x, w: relax.op.nn.relu(
        relax.op.nn.conv2d(x, w, padding=(1, 1), strides=(stride, stride))))


def conv_square(dtype="float32"):
    """relu(conv2d(x, w)) 3x3, 16 -> 32 channels on an n x n image, height and width symbolic (a
    CNN whose input size changes)."""
    return _model([((1, 16, "n", "n"), dtype), ((32, 16, 3, 3), dtype)],
                  lambda bb, x, w: relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=(1, 1))))


def depthwise_square(dtype="float32"):
    """relu(depthwise conv2d 3x3) of 32 channels on an n x n image, height and width symbolic (a
    MobileNet block whose input size changes)."""
    return _model([((1, 32, "n", "n"), dtype), ((32, 1, 3, 3), dtype)],
                  lambda bb, x, w: relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=(1, 1), groups=32)))


def pool_width(dtype="float32", size=2, padding=0):
    """max_pool2d size x size, stride 2, `padding` on every side, of 32 channels, 16 rows, symbolic
    width n (2x2: an OCR front end's pool; 3x3 padded 1: a ResNet stem's)."""
    return _model([((1, 32, 16, "n"), dtype)],
                  lambda bb, x: relax.op.nn.max_pool2d(x, (size, size), (2, 2), padding=(padding, padding)))


def pool_square(dtype="float32"):
    """max_pool2d 3x3 stride 2 padding 1 of 64 channels (a ResNet stem's) on an n x n image,
    height and width symbolic."""
    return _model([((1, 64, "n", "n"), dtype)], lambda bb, x: relax.op.nn.max_pool2d(x, (3, 3), (2, 2), padding=(1, 1)))


def global_square(channels=512):
    """A global average pool (ONNX GlobalAveragePool: mean over H and W) of `channels` on an
    n x n image, height and width symbolic (a classifier's head at any input size)."""
    return _model([((1, channels, "n", "n"), "float32")], lambda bb, x: relax.op.mean(x, axis=[2, 3]))


def _data(shape, dtype):
    if dtype == "float32":
        return RNG.standard_normal(shape).astype(dtype)
    return RNG.integers(-8, 8, shape).astype(dtype)


def _cycles(executable, inputs) -> int:
    vm = relax.VirtualMachine(executable, tvm.cpu())
    with npu_backend.profile() as prof:
        vm["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return prof.total_cycles


def ratios(mod, make_inputs, sizes, arch) -> list[tuple[int, int, int]]:
    """(size, symbolic cycles, static cycles) per size; the symbolic model is compiled once."""
    dynamic = npu_backend.compile(mod, arch)
    rows = []
    for size in sizes:
        inputs = make_inputs(size)
        static = npu_backend.compile(BindSymbolicVars({"n": size})(mod), arch)
        rows.append((size, _cycles(dynamic, inputs), _cycles(static, inputs)))
    return rows


def print_ratios(title, rows):
    print(title)
    print(f"  {'size':>6} {'symbolic':>10} {'static':>10} {'ratio':>7}")
    for size, dyn, stat in rows:
        # 0 static cycles: the kernel compiled for that size does not fit the chip (host).
        print(f"  {size:>6} {dyn:>10} {stat:>10} " + (f"{dyn / stat:>7.3f}" if stat else " (static on the host)"))
    print(f"  worst ratio {_worst(rows):.3f}")


def _worst(rows) -> float:
    return max((d / s for _, d, s in rows if s), default=0.0)


def compile_seconds(mod, static_size, arch) -> tuple[float, float]:
    """First compiles: the in-memory kernel cache is emptied before each (run the script with
    CGRA_KERNEL_CACHE=off for the persistent one)."""
    def best(build):
        times = []
        for _ in range(3):
            clear_kernel_cache()
            started = time.perf_counter()
            build()
            times.append(time.perf_counter() - started)
        return min(times)
    static = BindSymbolicVars({"n": static_size})(mod)
    return best(lambda: npu_backend.compile(mod, arch)), best(lambda: npu_backend.compile(static, arch))


def main():
    worst = 0.0
    for name in npu_backend.preset_names():
        arch = npu_backend.load_arch(name)
        for dtype in ("float32", "int8"):
            acc = "int32" if dtype == "int8" else dtype
            tile = choose_tiling(DEFAULT_BOUND, 96, 256, dtype, acc, True, arch, any_rows=True).tm
            mod, make_inputs = dense(dtype)
            rows = ratios(mod, make_inputs, sorted({1, tile, tile + 1, 97, 1000}), arch)
            print_ratios(f"{name} dense 256->96 {dtype} +bias (symbolic rows; its row tile is {tile})", rows)
            worst = max(worst, _worst(rows))
        mod, make_inputs = conv()
        rows = ratios(mod, make_inputs, [1, 2, 3, 7], arch)
        print_ratios(f"{name} conv2d 3x3 32->64 14x14 float32 +relu (symbolic batch)", rows)
        worst = max(worst, _worst(rows))
        for stride in (1, 2):
            mod, make_inputs = conv_width(stride=stride)
            rows = ratios(mod, make_inputs, [1, 2, 7, 8, 9, 97, 320], arch)
            print_ratios(f"{name} conv2d 3x3 16->32 32xW stride {stride} float32 +relu (symbolic width)", rows)
            worst = max(worst, _worst(rows))
        mod, make_inputs = conv_square()
        rows = ratios(mod, make_inputs, [1, 7, 8, 9, 31, 56, 112], arch)
        print_ratios(f"{name} conv2d 3x3 16->32 NxN float32 +relu (symbolic height and width)", rows)
        worst = max(worst, _worst(rows))
        mod, make_inputs = depthwise_square()
        rows = ratios(mod, make_inputs, [1, 7, 8, 9, 31, 56, 112], arch)
        print_ratios(f"{name} depthwise 3x3 32 channels NxN float32 +relu (symbolic height and width)", rows)
        worst = max(worst, _worst(rows))
        for size, padding in ((2, 0), (3, 1)):
            mod, make_inputs = pool_width(size=size, padding=padding)
            rows = ratios(mod, make_inputs, [2, 3, 16, 17, 97, 320], arch)
            print_ratios(f"{name} max_pool2d {size}x{size}/2 padding {padding} 32 channels 16xW float32 "
                         "(symbolic width)", rows)
            worst = max(worst, _worst(rows))
        mod, make_inputs = pool_square()
        rows = ratios(mod, make_inputs, [2, 7, 8, 9, 31, 56, 112], arch)
        print_ratios(f"{name} max_pool2d 3x3/2 padding 1 64 channels NxN float32 (symbolic height and width)", rows)
        worst = max(worst, _worst(rows))
        for channels in (64, 512):
            mod, make_inputs = global_square(channels)
            rows = ratios(mod, make_inputs, [1, 7, 9, 14, 17, 28, 56], arch)
            print_ratios(f"{name} global average pool {channels} channels NxN float32 (symbolic height and width)",
                         rows)
            worst = max(worst, _worst(rows))
    print(f"worst symbolic/static ratio over everything: {worst:.3f} (goal <= 1.05)")
    print("compile time, symbolic model vs one static compile (best of 3, cgra-8x8):")
    for title, (mod, _), size in [("dense float32", dense("float32"), 97), ("dense int8", dense("int8"), 97),
                                  ("conv2d", conv(), 2), ("conv2d symbolic width", conv_width(), 97),
                                  ("conv2d symbolic size", conv_square(), 56),
                                  ("max pool symbolic size", pool_square(), 56),
                                  ("global pool symbolic size", global_square(), 7)]:
        dyn, stat = compile_seconds(mod, size, "cgra-8x8")
        print(f"  {title:<24} symbolic {dyn:6.2f} s  static {stat:6.2f} s  ratio {dyn / stat:5.2f}")


if __name__ == "__main__":
    main()
