"""Your own kernel for a pattern, written in TVMScript against the NPU (docs/own-kernels.md; seed
001: "we only have a schedule, no compute").

Every int8 matmul the compiler offloads (pattern cgra.matmul: int8 x int8 -> int32, no epilogue)
is built by `weights_resident_gemm` below instead of the built-in compute and schedule: the whole
weight matrix is loaded into the scratchpad once, then row tiles of the input stream through one
GEMM command each. The function gets the kernel's spec (its shapes) and the chip, and returns a
PrimFunc whose parameters are the pattern's operands and output; the compiler lowers it as
written (its copies become DMA) and the simulator times it. Checked against numpy, cycles beside
the built-in kernel's.

    python examples/own_kernel.py [--arch cgra-8x8]
"""

from __future__ import annotations

import argparse

import numpy as np
from tvm.script import tirx as T

import npu_backend
from npu_backend import schedules
from npu_backend.tools.workloads import matmul_model, run

PATTERN = "cgra.matmul"


def weights_resident_gemm(spec, arch):
    """C[m, n] = A[m, k] @ B[k, n] (int8 -> int32): B loaded once, A and C in tiles of `rows`."""
    (m, k), (_, n) = spec.lhs_shape, spec.rhs_shape
    rows = next(r for r in (4 * arch.rows, 2 * arch.rows, arch.rows, 1) if m % r == 0)

    @T.prim_func
    def kernel(A: T.Buffer((m, k), "int8"), B: T.Buffer((k, n), "int8"), C: T.Buffer((m, n), "int32")):
        B_s = T.alloc_buffer((k, n), "int8", scope="global.cgra_spad")
        for r, j in T.grid(k, n):
            B_s[r, j] = B[r, j]
        for tile in range(m // rows):
            A_s = T.alloc_buffer((rows, k), "int8", scope="global.cgra_spad")
            C_s = T.alloc_buffer((rows, n), "int32", scope="global.cgra_spad")
            for i, r in T.grid(rows, k):
                A_s[i, r] = A[tile * rows + i, r]
            # cgra_gemm(flags, dtype, m, n, k, A, offset, row stride, B ..., C ...): flags 0
            # overwrites C_s, dtype 1 is int8 (docs/runtime-abi.md).
            T.evaluate(T.call_extern("int32", "cgra_gemm", 0, 1, rows, n, k, A_s.data, 0, k, B_s.data, 0, n,
                                     C_s.data, 0, n))
            for i, j in T.grid(rows, n):
                C[tile * rows + i, j] = C_s[i, j]

    return kernel


def cycles(arch: str) -> int:
    mod, inputs, reference = matmul_model(128, 48, 96, "int8", bias=False, relu=False, seed=0)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    np.testing.assert_array_equal(out, reference)
    return prof.total_cycles


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cgra-8x8", help="preset name or JSON file (default cgra-8x8)")
    arch = parser.parse_args(argv).arch
    built_in = cycles(arch)
    schedules.register_kernel(PATTERN, weights_resident_gemm)
    try:
        own = cycles(arch)
    finally:
        schedules.register_kernel(PATTERN, None)  # back to the built-in kernel
    print(f"int8 matmul (128 x 96) @ (96 x 48) on {arch}: matches numpy with both kernels")
    print(f"  built-in kernel:  {built_in:>8,} cycles")
    print(f"  your kernel:      {own:>8,} cycles ({own / built_in:.3f}x)")
    return {"built_in": built_in, "own": own}


if __name__ == "__main__":
    main()
