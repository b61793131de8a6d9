"""Cycles of the transformer ops on the vector unit: each op alone on a (rows, cols) float32
input, compiled for a preset and run on the simulator, with its cycles per element, its vector
unit's busy share and its measured error against float64 (docs/transformer-ops.md's table).

    python benchmarks/bench_row_ops.py [--arch cgra-8x8] [--shape 128 768]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import tvm
from tvm import relax

import npu_backend

_ERFC = np.vectorize(math.erfc)


def _ops(cols: int) -> dict:
    """name -> (Relax builder of x (and gamma, beta), float64 reference, input transform)."""
    ones = relax.const(np.linspace(0.5, 1.5, cols, dtype="float32"))
    zeros = relax.const(np.linspace(-0.1, 0.1, cols, dtype="float32"))

    def softmax64(d):
        e = np.exp(d - d.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def layer_norm64(d):
        c = d - d.mean(-1, keepdims=True)
        return c / np.sqrt((c ** 2).mean(-1, keepdims=True) + 1e-5) * np.linspace(0.5, 1.5, cols) \
            + np.linspace(-0.1, 0.1, cols)

    return {
        "softmax": (lambda x: relax.op.nn.softmax(x), softmax64, lambda x: x * 4),
        "layer_norm": (lambda x: relax.op.nn.layer_norm(x, ones, zeros, axes=[-1], epsilon=1e-5), layer_norm64,
                       lambda x: x + 3),
        "rms_norm": (lambda x: relax.op.nn.rms_norm(x, ones, axes=[-1], epsilon=1e-6),
                     lambda d: d / np.sqrt((d ** 2).mean(-1, keepdims=True) + 1e-6) * np.linspace(0.5, 1.5, cols),
                     lambda x: x),
        "gelu": (relax.op.nn.gelu, lambda d: d * 0.5 * _ERFC(-d / math.sqrt(2)), lambda x: x * 3),
        "exp": (relax.op.exp, np.exp, lambda x: x * 3),
        "tanh": (relax.op.tanh, np.tanh, lambda x: x * 2),
        "erf": (relax.op.erf, np.vectorize(math.erf), lambda x: x),
        "rsqrt": (relax.op.rsqrt, lambda d: 1 / np.sqrt(d), lambda x: np.abs(x) + 0.01),
        "sum": (lambda x: relax.op.sum(x, axis=[-1]), lambda d: d.sum(-1), lambda x: x),
        "mean": (lambda x: relax.op.mean(x, axis=[-1]), lambda d: d.mean(-1), lambda x: x),
        "max": (lambda x: relax.op.max(x, axis=[-1]), lambda d: d.max(-1), lambda x: x),
    }


def _module(shape, build):
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(build(x))
        builder.emit_func_output(out)
    return builder.get()


def main() -> None:
    """Compile, run and time each op alone; print one line per op."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cgra-8x8")
    parser.add_argument("--shape", type=int, nargs=2, default=(128, 768))
    args = parser.parse_args()
    shape = tuple(args.shape)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    print(f"{args.arch}, a {shape[0]} x {shape[1]} float32 input")
    print(f"{'op':<11} {'where':<5} {'cycles':>9} {'cyc/elem':>9} {'vector':>7} {'max rel err':>12}")
    for name, (build, exact, prepare) in _ops(shape[1]).items():
        mod = _module(shape, build)
        where = {p.where for p in npu_backend.explain(mod, args.arch)}
        data = prepare(x).astype(np.float32)
        vm = relax.VirtualMachine(npu_backend.compile(mod, args.arch), tvm.cpu())
        with npu_backend.profile() as prof:
            got = vm["main"](tvm.runtime.tensor(data)).numpy()
        ref = exact(data.astype(np.float64))
        error = np.abs(got - ref).max() / np.abs(ref).max()
        cycles = sum(k.cycles for k in prof.kernels)
        vector = sum(k.busy_cycles["vector"] for k in prof.kernels) / max(cycles, 1)
        print(f"{name:<11} {'/'.join(sorted(where)):<5} {cycles:>9} {cycles / data.size:>9.3f} {vector:>7.0%} "
              f"{error:>12.2e}")


if __name__ == "__main__":
    main()
