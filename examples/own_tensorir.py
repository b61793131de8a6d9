"""Your own TensorIR on the NPU, two ways (docs/own-kernels.md):

1. Plain TensorIR called from Relax with R.call_tir (seed 003's `tir_matmul` and `tir_relu`): the
   compiler finds the GEMM block and the elementwise block, tiles them to the PE array and the
   scratchpad and tensorizes them; nothing NPU-specific is written.
2. A kernel written for the NPU directly (`cgra.kernel`): your own scratchpad buffers, copies
   (they become DMA) and device calls; the compiler lowers it as written.

Both are checked against the host build of the same module and print their cycles.

    python examples/own_tensorir.py [--arch cgra-8x8]
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import npu_backend


@I.ir_module
class CallTir:
    @T.prim_func(s_tir=True)
    def tir_matmul(A: T.Buffer((128, 64), "float32"), B: T.Buffer((96, 64), "float32"),
                   C: T.Buffer((128, 96), "float32")):
        for i0, j0, k0 in T.grid(128, 96, 64):
            with T.sblock("C"):
                i, j, k = T.axis.remap("SSR", [i0, j0, k0])
                with T.init():
                    C[i, j] = T.float32(0)
                C[i, j] = C[i, j] + A[i, k] * B[j, k]

    @T.prim_func(s_tir=True)
    def tir_relu(A: T.Buffer((128, 96), "float32"), B: T.Buffer((128, 96), "float32")):
        for i, j in T.grid(128, 96):
            with T.sblock("B"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = T.max(A[vi, vj], T.float32(0))

    @R.function
    def main(x: R.Tensor((128, 64), "float32"), w: R.Tensor((96, 64), "float32")):
        cls = CallTir
        with R.dataflow():
            y = R.call_tir(cls.tir_matmul, (x, w), out_ty=R.Tensor((128, 96), "float32"))
            z = R.call_tir(cls.tir_relu, (y,), out_ty=R.Tensor((128, 96), "float32"))
            R.output(z)
        return z


@I.ir_module
class HandWritten:
    @T.prim_func
    def int8_gemm(A: T.Buffer((32, 64), "int8"), B: T.Buffer((64, 16), "int8"), C: T.Buffer((32, 16), "int32")):
        # Marked as written for the NPU: lowered as it is (copies -> DMA), not tiled.
        T.func_attr({"cgra.kernel": True})
        B_s = T.alloc_buffer((64, 16), "int8", scope="global.cgra_spad")
        for k, j in T.grid(64, 16):  # the weights stay in the scratchpad
            B_s[k, j] = B[k, j]
        for tile in range(2):  # 16 rows of A at a time
            A_s = T.alloc_buffer((16, 64), "int8", scope="global.cgra_spad")
            C_s = T.alloc_buffer((16, 16), "int32", scope="global.cgra_spad")
            for i, k in T.grid(16, 64):
                A_s[i, k] = A[tile * 16 + i, k]
            # cgra_gemm(flags, dtype, m, n, k, A, A offset, A row stride, B ..., C ...):
            # flags 0 overwrites C_s, dtype 1 is int8 (docs/runtime-abi.md).
            T.evaluate(T.call_extern("int32", "cgra_gemm", 0, 1, 16, 16, 64, A_s.data, 0, 64,
                                     B_s.data, 0, 16, C_s.data, 0, 16))
            for i, j in T.grid(16, 16):
                C[tile * 16 + i, j] = C_s[i, j]

    @R.function
    def main(a: R.Tensor((32, 64), "int8"), b: R.Tensor((64, 16), "int8")):
        cls = HandWritten
        with R.dataflow():
            c = R.call_tir(cls.int8_gemm, (a, b), out_ty=R.Tensor((32, 16), "int32"))
            R.output(c)
        return c


def run(mod, inputs, arch):
    """(NPU result, cycles per kernel)."""
    tensors = [tvm.runtime.tensor(x) for x in inputs]
    vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    with npu_backend.profile() as prof:
        out = vm["main"](*tensors).numpy()
    return out, {k.name: k.cycles for k in prof.kernels}


def run_on_host(mod, inputs):
    """The same module built for the CPU (target "llvm")."""
    tensors = [tvm.runtime.tensor(x) for x in inputs]
    return relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](*tensors).numpy()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="cgra-8x8", help="preset or JSON file (default: cgra-8x8)")
    arch = parser.parse_args(argv).arch
    rng = np.random.default_rng(0)

    print(npu_backend.format_placements(npu_backend.explain(CallTir, arch)))
    x, w = rng.standard_normal((128, 64), "float32"), rng.standard_normal((96, 64), "float32")
    out, cycles = run(CallTir, [x, w], arch)
    np.testing.assert_allclose(out, run_on_host(CallTir, [x, w]), rtol=1e-5, atol=1e-4)
    print(f"R.call_tir matmul + relu on {arch}: {cycles} (matches the host build)\n")

    a, b = rng.integers(-128, 128, (32, 64), dtype="int8"), rng.integers(-128, 128, (64, 16), dtype="int8")
    out, cycles = run(HandWritten, [a, b], arch)
    # (A kernel written for the NPU calls device functions: it has no host build to compare to.)
    np.testing.assert_array_equal(out, a.astype("int32") @ b.astype("int32"))
    print(f"hand-written int8 GEMM kernel on {arch}: {cycles} (matches numpy)")


if __name__ == "__main__":
    main()
