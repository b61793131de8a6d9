"""Tests of cgra_codegen: golden LLVM IR, and compiled kernels run against a mock runtime.

The mock runtime is a small C library implementing the C API of docs/runtime-abi.md that logs
every call; kernels are compiled by `cgra_codegen.build`, linked with it into one shared library
and called from Python with ffi Tensors through `tvm.runtime.load_module`.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.script import tirx as T

import cgra_codegen
from cgra_codegen import CodegenError, ScratchpadOverflow, UnsupportedNode
from cgra_codegen.llvm_types import RUNTIME_ABI_VERSION
from cgra_sim import load_arch

ARCH = load_arch("cgra-4x4")
RUNTIME = Path(__file__).resolve().parent.parent / "runtime"
ZERO_BOX = [0] * 12  # origin, pad_lo, pad_hi


def box(*loops):
    """28 DMA box words: zero origin and halo, then (extent, tdim, tstep, sstride) x 4."""
    words = list(ZERO_BOX)
    for loop in loops:
        words += list(loop)
    words += [1, 0, 0, 0] * (4 - len(loops))
    return words


ROWS_BOX = box((4, 0, 1, 8), (8, 1, 1, 1))


# Helpers ------------------------------------------------------------------------------------

def lower(func, name: str):
    """The s_tir -> flat TIR lowering the plugin runs before codegen."""
    mod = tvm.IRModule({name: func})
    passes = [s_tir.transform.LowerInitBlock(),
              s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
              s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation(),
              s_tir.transform.LowerMatchBuffer(), s_tir.transform.LowerOpaqueBlock(),
              tirx.transform.FlattenBuffer(), tirx.transform.StmtSimplify(),
              tirx.transform.RemoveNoOp()]
    for apply in passes:
        mod = apply(mod)
    return mod[name]


def assert_lines_in_order(ir_text: str, expected: list[str]) -> None:
    """Each expected line matches a whole IR line, in this order (like llvmlite's
    check_func_body, with two wildcards): `<*>` matches anything; `[[NAME]]` matches an LLVM
    name the first time and the same name at every later use."""
    lines = [line.strip() for line in ir_text.splitlines()]
    names: dict[str, str] = {}
    position = 0
    for want in expected:
        pattern = _line_pattern(want, names)
        while position < len(lines) and not pattern.match(lines[position]):
            position += 1
        assert position < len(lines), f"line not found (in order): {want}\n{ir_text}"
        for name, value in pattern.match(lines[position]).groupdict().items():
            names.setdefault(name, value)
        position += 1


def _line_pattern(want: str, names: dict) -> re.Pattern:
    parts = re.split(r"(<\*>|\[\[\w+\]\])", want)
    regex = ""
    for part in parts:
        if part == "<*>":
            regex += ".*?"
        elif part.startswith("[[") and part[2:-2] in names:
            regex += re.escape(names[part[2:-2]])
        elif part.startswith("[["):
            regex += rf"(?P<{part[2:-2]}>[\w.]+)" if f"(?P<{part[2:-2]}>" not in regex \
                else rf"(?P={part[2:-2]})"
        else:
            regex += re.escape(part)
    return re.compile(regex + r"\Z")


MOCK_RUNTIME_C = r"""
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* message);
typedef struct { uint8_t code, bits; uint16_t lanes; } DType;
typedef struct { void* data; int32_t device_type, device_id; int32_t ndim; DType dtype;
                 int64_t* shape; int64_t* strides; uint64_t byte_offset; } Tensor;
static char log_text[1 << 16];
static size_t log_len;
static int fail_at = -1, commands;
static void record(const char* fmt, ...) {
  va_list ap; va_start(ap, fmt);
  log_len += vsnprintf(log_text + log_len, sizeof(log_text) - log_len, fmt, ap);
  va_end(ap);
  log_len += snprintf(log_text + log_len, sizeof(log_text) - log_len, "\n");
}
const char* mock_log(void) { return log_text; }
void mock_reset(int fail_command) { log_len = 0; log_text[0] = 0; fail_at = fail_command; commands = 0; }
static int32_t command(void) {
  if (commands++ != fail_at) return 0;
  TVMFFIErrorSetRaisedFromCStr("ValueError", "mock runtime: command failed");
  return -1;
}
typedef long long ll;
void* cgra_kernel_begin(const char* name, const char* ops, const char* arch, int64_t spad,
                        int32_t abi, int32_t slots, int64_t macs_per_output, int64_t macs_divisor) {
  record("begin %s ops=%s spad=%lld abi=%d slots=%d macs=%lld/%lld arch=%s", name, ops, (ll)spad, abi, slots,
         (ll)macs_per_output, (ll)macs_divisor, arch);
  return malloc(1);
}
int32_t cgra_kernel_bind(void* k, int32_t slot, Tensor* t) {
  char dims[128] = ""; size_t n = 0;
  for (int i = 0; i < t->ndim; ++i) n += snprintf(dims + n, sizeof dims - n, i ? ",%lld" : "%lld", (ll)t->shape[i]);
  record("bind %d shape=%s dtype=%d:%d", slot, dims, t->dtype.code, t->dtype.bits);
  return 0;
}
static void dma(const char* kind, int32_t slot, int64_t addr, const int64_t* box) {
  char words[512]; size_t n = 0;
  for (int i = 0; i < 28; ++i) n += snprintf(words + n, sizeof words - n, i ? ",%lld" : "%lld", (ll)box[i]);
  record("%s slot=%d addr=%lld box=%s", kind, slot, (ll)addr, words);
}
int32_t cgra_dma_load(void* k, int32_t flags, int32_t slot, int64_t addr, const int64_t* box) {
  dma(flags ? "dma_load_fill_lowest" : "dma_load", slot, addr, box); return command();
}
int32_t cgra_dma_store(void* k, int32_t slot, int64_t addr, const int64_t* box) { dma("dma_store", slot, addr, box); return command(); }
int32_t cgra_gemm(void* k, int32_t flags, int32_t dtype, int64_t m, int64_t n, int64_t kd, int64_t a,
                  int64_t as, int64_t b, int64_t bs, int64_t acc, int64_t accs) {
  record("gemm flags=%d dtype=%d m=%lld n=%lld k=%lld a=%lld/%lld b=%lld/%lld acc=%lld/%lld", flags,
         dtype, (ll)m, (ll)n, (ll)kd, (ll)a, (ll)as, (ll)b, (ll)bs, (ll)acc, (ll)accs);
  return command();
}
int32_t cgra_fill(void* k, int32_t dtype, int64_t addr, int64_t rows, int64_t cols, int64_t stride, int64_t bits) {
  record("fill dtype=%d addr=%lld rows=%lld cols=%lld stride=%lld value=%lld", dtype, (ll)addr,
         (ll)rows, (ll)cols, (ll)stride, (ll)bits);
  return command();
}
int32_t cgra_epilogue(void* k, int32_t flags, int32_t adt, int32_t odt, int64_t m, int64_t n, int64_t acc,
                      int64_t accs, int64_t bias, int64_t out, int64_t outs, int64_t res, int64_t ress,
                      int64_t lo, int64_t hi, int64_t scale, int64_t zp) {
  record("epilogue flags=%d acc_dtype=%d out_dtype=%d m=%lld n=%lld acc=%lld/%lld bias=%lld out=%lld/%lld"
         " residual=%lld/%lld clip=%lld,%lld scale=%lld zp=%lld", flags, adt, odt, (ll)m, (ll)n, (ll)acc,
         (ll)accs, (ll)bias, (ll)out, (ll)outs, (ll)res, (ll)ress, (ll)lo, (ll)hi, (ll)scale, (ll)zp);
  return command();
}
int32_t cgra_kernel_end(void* k) {
  record("end");
  free(k);
  return fail_at >= 0 && commands > fail_at ? -1 : 0;
}
"""


_LINKED = {}  # the ctypes handle of the library compile_kernels built last


@pytest.fixture
def mock_runtime():
    """The mock runtime linked into the last compiled kernels (reset; optionally failing)."""
    def calls(fail_command: int = -1):
        runtime = _LINKED["runtime"]
        runtime.mock_reset(fail_command)
        return runtime

    return calls


def compile_kernels(funcs, tmp_path, arch=ARCH):
    """build() -> object, linked with the mock runtime into one .so -> loaded module.

    -Bsymbolic binds the kernels' cgra_* calls to the mock inside the same library: once an
    earlier test has imported npu_backend, the real runtime is loaded RTLD_GLOBAL and would
    otherwise win the symbol lookup. (The VM's own route, TVM's LLVM module of the linked IR and
    export_library, is exercised by test_end_to_end and test_export.)"""
    compiled = cgra_codegen.build(funcs, arch)
    obj, source, shared = tmp_path / "kernels.o", tmp_path / "mock_runtime.c", tmp_path / "kernels.so"
    obj.write_bytes(compiled.object_bytes)
    source.write_text(MOCK_RUNTIME_C)
    ffi = os.path.dirname(tvm_ffi.__file__)
    # The argument checks are the real runtime's (runtime/src/arg_checks.cc), not the mock's.
    checks = tmp_path / "arg_checks.o"
    subprocess.run(["g++", "-c", "-fPIC", "-O1", str(RUNTIME / "src" / "arg_checks.cc"), "-o", str(checks),
                    f"-I{RUNTIME / 'include'}", f"-I{os.path.join(ffi, 'include')}"], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", str(obj), str(source), str(checks), "-o", str(shared),
                    "-Wl,-Bsymbolic", f"-L{os.path.join(ffi, 'lib')}", "-ltvm_ffi", "-lstdc++",
                    f"-Wl,-rpath,{os.path.join(ffi, 'lib')}"], check=True)
    module = tvm.runtime.load_module(str(shared))
    runtime = ctypes.CDLL(str(shared))
    runtime.mock_log.restype = ctypes.c_char_p
    runtime.mock_reset.argtypes = [ctypes.c_int]
    _LINKED["runtime"] = runtime
    return module


def log_lines(runtime) -> list[str]:
    return runtime.mock_log().decode().splitlines()


def tensor(shape, dtype):
    return tvm.runtime.tensor(np.zeros(shape, dtype))


# Kernels ------------------------------------------------------------------------------------

@T.prim_func(s_tir=True)
def matmul_rows(A: T.Buffer((4, 8), "int8"), W: T.Buffer((8, 8), "int8"),
                C: T.Buffer((4, 8), "int32")):
    T.func_attr({"global_symbol": "matmul_rows", "cgra.source_ops": "matmul"})
    SA = T.alloc_buffer((32,), "int8", scope="global.cgra_spad")
    SW = T.alloc_buffer((64,), "int8", scope="global.cgra_spad")
    Acc = T.alloc_buffer((32,), "int32", scope="global.cgra_spad")
    with T.sblock("load"):
        T.reads(A[0:4, 0:8], W[0:8, 0:8])
        T.writes(SA[0:32], SW[0:64])
        T.evaluate(T.call_extern("int32", "cgra_dma_load", 0, A.data, SA.data, 0, *ROWS_BOX))
        T.evaluate(T.call_extern("int32", "cgra_dma_load", 0, W.data, SW.data, T.int64(0),
                                 *box((8, 0, 1, 8), (8, 1, 1, 1))))
    for i in range(4):
        with T.sblock("gemm"):
            T.reads(SA[0:32], SW[0:64])
            T.writes(Acc[0:32])
            T.evaluate(T.call_extern("int32", "cgra_gemm", 0, 1, T.int64(1), 8, 8, SA.data,
                                     i * 8, 8, SW.data, 0, 8, Acc.data, i * 8, 8))
    with T.sblock("store"):
        T.reads(Acc[0:32])
        T.writes(C[0:4, 0:8])
        T.evaluate(T.call_extern("int32", "cgra_dma_store", C.data, Acc.data, 0, *ROWS_BOX))


@T.prim_func(s_tir=True)
def tiny(A: T.Buffer((8,), "float32")):
    T.func_attr({"global_symbol": "tiny"})
    S = T.alloc_buffer((8,), "float32", scope="global.cgra_spad")
    for i in T.serial(T.int64(2)):
        with T.sblock("fill"):
            T.reads()
            T.writes(S[i * 4:i * 4 + 4])
            T.evaluate(T.call_extern("int32", "cgra_fill", 3, S.data, i * 4, 1, 4, 4,
                                     T.float32(1.5)))
    with T.sblock("store"):
        T.reads(S[0:8])
        T.writes(A[0:8])
        T.evaluate(T.call_extern("int32", "cgra_dma_store", A.data, S.data, 0,
                                 *box((8, 0, 1, 1))))


@T.prim_func(s_tir=True)
def rows_dynamic(a: T.handle, c: T.handle):
    T.func_attr({"global_symbol": "rows_dynamic"})
    n = T.int64()
    A = T.match_buffer(a, (n, 8), "int8")
    C = T.match_buffer(c, (n, 8), "int32")
    SA = T.alloc_buffer((32,), "int8", scope="global.cgra_spad")
    Acc = T.alloc_buffer((32,), "int32", scope="global.cgra_spad")
    for t in range((n + T.int64(3)) // T.int64(4)):
        with T.sblock("tile"):
            T.reads(A[0:n, 0:8], SA[0:32])
            T.writes(C[0:n, 0:8], Acc[0:32])
            rows: T.int64 = T.min(n - t * T.int64(4), T.int64(4))
            T.evaluate(T.call_extern("int32", "cgra_dma_load", 0, A.data, SA.data, 0,
                                     t * 4, 0, 0, 0, *ZERO_BOX[4:],  # origin, halo
                                     rows, 0, 1, 8, 8, 1, 1, 1, 1, 2, 0, 0, 1, 3, 0, 0))
            T.evaluate(T.call_extern("int32", "cgra_gemm", 0, 1, rows, 8, 8, SA.data, 0, 8,
                                     SA.data, 0, 8, Acc.data, 0, 8))


@T.prim_func(s_tir=True)
def index_math(A: T.Buffer((1,), "int8")):
    T.func_attr({"global_symbol": "index_math"})
    S = T.alloc_buffer((64,), "int8", scope="global.cgra_spad")
    for i in T.serial(-7, 7):
        with T.sblock("fill"):
            T.reads()
            T.writes(S[0:64])
            T.evaluate(T.call_extern("int32", "cgra_fill", 1, S.data, 0, T.floordiv(i, 3),
                                     T.floormod(i, 3), T.truncdiv(i, 3), T.truncmod(i, 3)))
            T.evaluate(T.call_extern("int32", "cgra_fill", 1, S.data, 0, T.min(i, 2),
                                     T.max(i, -1), T.Select(i < 0, 100, 200),
                                     T.Cast("int64", i) * T.int64(-3)))


@T.prim_func(s_tir=True)
def epilogue_bias(Bias: T.Buffer((8,), "int32"), O: T.Buffer((8,), "int8")):
    T.func_attr({"global_symbol": "epilogue_bias"})
    Acc = T.alloc_buffer((8,), "int32", scope="global.cgra_spad")
    SB = T.alloc_buffer((8,), "int32", scope="global.cgra_spad")
    SO = T.alloc_buffer((8,), "int8", scope="global.cgra_spad")
    for i in range(2):
        with T.sblock("epilogue"):
            T.reads(Acc[0:8], SB[0:8])
            T.writes(SO[0:8])
            T.evaluate(T.call_extern("int32", "cgra_epilogue", i + 2, 2, 1, 1, 8, Acc.data, 0,
                                     8, SB.data, 2, SO.data, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0))
    with T.sblock("relu_only"):
        T.reads(Acc[0:8])
        T.writes(SO[0:8])
        T.evaluate(T.call_extern("int32", "cgra_epilogue", 2, 2, 1, 1, 8, Acc.data, 0, 8, 0, 0,
                                 SO.data, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0))


@T.prim_func(s_tir=True)
def epilogue_residual_clip(O: T.Buffer((8,), "float32")):
    T.func_attr({"global_symbol": "epilogue_residual_clip"})
    Acc = T.alloc_buffer((8,), "float32", scope="global.cgra_spad")
    SR = T.alloc_buffer((8,), "float32", scope="global.cgra_spad")
    SO = T.alloc_buffer((8,), "float32", scope="global.cgra_spad")
    for i in range(2):
        with T.sblock("epilogue"):
            T.reads(Acc[0:8], SR[0:8])
            T.writes(SO[0:8])
            T.evaluate(T.call_extern("int32", "cgra_epilogue", i * 4 + 8, 3, 3, 1, 8, Acc.data, 0,
                                     8, 0, 0, SO.data, 0, 8, SR.data, 1, 8, T.float32(-1.5),
                                     T.float32(6), 0, 0, 0))


@T.prim_func(s_tir=True)
def epilogue_requantise(O: T.Buffer((8,), "int8")):
    T.func_attr({"global_symbol": "epilogue_requantise"})
    Acc = T.alloc_buffer((8,), "int32", scope="global.cgra_spad")
    SB = T.alloc_buffer((8,), "int32", scope="global.cgra_spad")
    SS = T.alloc_buffer((8,), "float32", scope="global.cgra_spad")
    SO = T.alloc_buffer((8,), "int8", scope="global.cgra_spad")
    for i in range(2):
        with T.sblock("epilogue"):
            T.reads(Acc[0:8], SB[0:8], SS[0:8])
            T.writes(SO[0:8])
            T.evaluate(T.call_extern("int32", "cgra_epilogue", i * 16 + 1, 2, 2 - i, 1, 8, Acc.data,
                                     0, 8, SB.data, 0, SO.data, 0, 8, 0, 0, 0, 0, 0, SS.data, 2,
                                     i * -7))


# Golden IR ----------------------------------------------------------------------------------

def test_golden_ir_of_a_tiny_kernel():
    compiled = cgra_codegen.build([lower(tiny, "tiny")], ARCH, opt_level=0)
    assert compiled.symbols == ["tiny"]
    assert compiled.object_bytes[:4] == b"\x7fELF"
    assert_lines_in_order(compiled.llvm_ir, [
        "define i32 @__tvm_ffi_tiny(ptr %self, ptr %args, i32 %num_args, ptr %result) {",
        "%error.message = alloca [512 x i8], align 1",
        "br i1 <*>, label %runtime.missing, label %runtime.present",  # a weak symbol left NULL
        "runtime.missing:<*>",
        "call void @TVMFFIErrorSetRaisedFromCStr(ptr @<*>, ptr @<*>)",
        "ret i32 -1",
        "<*> = icmp ne i32 %num_args, 1",
        # the runtime checks the tensor: argument 0, float32 (code 2, 32 bits, 1 lane), rank 1
        "%dltensor = call ptr @cgra_check_tensor_arg(ptr %args, i32 0, ptr @<*>, ptr @<*>, ptr @<*>, "
        "i32 2, i32 32, i32 1, i32 1, ptr @<*>, ptr @<*>)",
        "<*> = icmp eq ptr %dltensor, null",
        "ret i32 -1",
        f"%k = call ptr @cgra_kernel_begin(ptr @<*>, ptr @<*>, ptr @<*>, i64 65536, i32 {RUNTIME_ABI_VERSION}, i32 1, "
        "i64 -1, i64 1)",
        "%bind.status = call i32 @cgra_kernel_bind(ptr %k, i32 0, ptr %dltensor)",
        "launch.failed:<*>",  # the error exit: frees the launch, returns -1
        "<*> = call i32 @cgra_kernel_end(ptr %k)",
        "ret i32 -1",
        "%i = phi i64 [ 0, <*> ], [ %loop.next, <*> ]",
        "<*> = icmp slt i64 %i, 2",
        "%[[OFFSET]] = mul i64 %i, 4",  # element offset
        "%[[ADDR]] = mul i64 %[[OFFSET]], 4",  # bytes (float32); base 0
        "%cgra_fill.status = call i32 @cgra_fill(ptr %k, i32 3, i64 %[[ADDR]], i64 1, i64 4, "
        "i64 4, i64 1069547520)",  # 1.5f as bits
        "br i1 <*>, label %launch.failed, label %ok<*>",
        "%loop.next = add i64 %i, 1",
        "br label %for.header",
        "for.end:<*>",
        # a box whose words are all constants is a module constant (word 12: extent 8)
        "%cgra_dma_store.status = call i32 @cgra_dma_store(ptr %k, i32 0, i64 0, ptr @.i64s.1)",
        "%end.status = call i32 @cgra_kernel_end(ptr %k)",
        "store i32 0, ptr %result, align 4",
        "ret i32 0",
        "declare extern_weak i32 @cgra_fill(ptr, i32, i64, i64, i64, i64, i64)",
        "declare extern_weak i32 @cgra_dma_store(ptr, i32, i64, ptr)",
    ])
    assert "@.i64s.1 = private unnamed_addr constant [28 x i64] [" + ", ".join(
        f"i64 {word}" for word in [0] * 12 + [8, 0, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]) + "]" in compiled.llvm_ir
    llvm.parse_assembly(compiled.llvm_ir).verify()


# End to end with the mock runtime -----------------------------------------------------------

def test_matmul_kernel_drives_the_runtime(mock_runtime, tmp_path):
    module = compile_kernels([lower(matmul_rows, "matmul_rows")], tmp_path)
    runtime = mock_runtime()
    assert module["matmul_rows"](tensor((4, 8), "int8"), tensor((8, 8), "int8"),
                                 tensor((4, 8), "int32")) is None
    words = ",".join(map(str, ROWS_BOX))
    assert log_lines(runtime) == [
        f"begin matmul_rows ops=matmul spad=65536 abi={RUNTIME_ABI_VERSION} slots=3 macs=-1/1 arch={ARCH.to_json()}",
        "bind 0 shape=4,8 dtype=0:8",
        "bind 1 shape=8,8 dtype=0:8",
        "bind 2 shape=4,8 dtype=0:32",
        f"dma_load slot=0 addr=0 box={words}",
        f"dma_load slot=1 addr=64 box={','.join(map(str, box((8, 0, 1, 8), (8, 1, 1, 1))))}",
        *[f"gemm flags=0 dtype=1 m=1 n=8 k=8 a={i * 8}/8 b=64/8 acc={128 + i * 32}/8"
          for i in range(4)],
        f"dma_store slot=2 addr=128 box={words}",
        "end",
    ]


def test_failed_command_ends_the_launch_and_raises(mock_runtime, tmp_path):
    module = compile_kernels([lower(matmul_rows, "matmul_rows")], tmp_path)
    runtime = mock_runtime(fail_command=3)  # the second gemm
    with pytest.raises(ValueError, match="mock runtime: command failed"):
        module["matmul_rows"](tensor((4, 8), "int8"), tensor((8, 8), "int8"),
                              tensor((4, 8), "int32"))
    lines = log_lines(runtime)
    assert [line.split()[0] for line in lines] == [
        "begin", "bind", "bind", "bind", "dma_load", "dma_load", "gemm", "gemm", "end"]


def test_index_arithmetic_semantics(mock_runtime, tmp_path):
    module = compile_kernels([lower(index_math, "index_math")], tmp_path)
    runtime = mock_runtime()
    module["index_math"](tensor((1,), "int8"))
    expected = []
    for i in range(-7, 7):
        trunc_div = int(i / 3)
        expected.append(f"fill dtype=1 addr=0 rows={i // 3} cols={i % 3} stride={trunc_div} "
                        f"value={i - 3 * trunc_div}")
        expected.append(f"fill dtype=1 addr=0 rows={min(i, 2)} cols={max(i, -1)} "
                        f"stride={100 if i < 0 else 200} value={-3 * i}")
    assert log_lines(runtime)[2:-1] == expected


def test_epilogue_passes_bias_only_with_the_bias_flag(mock_runtime, tmp_path):
    module = compile_kernels([lower(epilogue_bias, "epilogue_bias")], tmp_path)
    runtime = mock_runtime()
    module["epilogue_bias"](tensor((8,), "int32"), tensor((8,), "int8"))
    assert log_lines(runtime)[3:-1] == [
        "epilogue flags=2 acc_dtype=2 out_dtype=1 m=1 n=8 acc=0/8 bias=0 out=128/8 residual=0/0 clip=0,0 scale=0 zp=0",
        "epilogue flags=3 acc_dtype=2 out_dtype=1 m=1 n=8 acc=0/8 bias=72 out=128/8 residual=0/0 clip=0,0 scale=0 zp=0",
        "epilogue flags=2 acc_dtype=2 out_dtype=1 m=1 n=8 acc=0/8 bias=0 out=128/8 residual=0/0 clip=0,0 scale=0 zp=0",
    ]


def test_epilogue_passes_the_residual_with_its_flag_and_clip_bounds_as_bits(mock_runtime, tmp_path):
    module = compile_kernels([lower(epilogue_residual_clip, "epilogue_residual_clip")], tmp_path)
    runtime = mock_runtime()
    module["epilogue_residual_clip"](tensor((8,), "float32"))
    bits = "3217031168,1086324736"  # -1.5f and 6.0f as float32 bit patterns
    assert log_lines(runtime)[2:-1] == [
        f"epilogue flags=8 acc_dtype=3 out_dtype=3 m=1 n=8 acc=0/8 bias=0 out=128/8 residual=0/8 clip={bits} scale=0 zp=0",
        f"epilogue flags=12 acc_dtype=3 out_dtype=3 m=1 n=8 acc=0/8 bias=0 out=128/8 residual=68/8 clip={bits} scale=0 zp=0",
    ]


def test_epilogue_passes_the_scale_row_with_the_requantise_flag(mock_runtime, tmp_path):
    module = compile_kernels([lower(epilogue_requantise, "epilogue_requantise")], tmp_path)
    runtime = mock_runtime()
    module["epilogue_requantise"](tensor((8,), "int8"))
    lines = log_lines(runtime)[2:-1]
    assert lines[0].endswith("clip=0,0 scale=0 zp=0") and lines[0].startswith("epilogue flags=1 ")
    # the scale row's byte address: element 2 of the third 64-byte-aligned scratchpad buffer
    assert lines[1].startswith("epilogue flags=17 acc_dtype=2 out_dtype=1 ")
    assert lines[1].endswith(f"clip=0,0 scale={int(lines[1].split('scale=')[1].split()[0])} zp=-7")
    assert int(lines[1].split("scale=")[1].split()[0]) % 64 == 8


def test_symbolic_dimension_takes_the_tensor_extent(mock_runtime, tmp_path):
    module = compile_kernels([lower(rows_dynamic, "rows_dynamic")], tmp_path)
    for n, tiles in ((6, [4, 2]), (8, [4, 4])):
        runtime = mock_runtime()
        module["rows_dynamic"](tensor((n, 8), "int8"), tensor((n, 8), "int32"))
        lines = log_lines(runtime)
        assert lines[1:3] == [f"bind 0 shape={n},8 dtype=0:8", f"bind 1 shape={n},8 dtype=0:32"]
        gemms = [line for line in lines if line.startswith("gemm")]
        assert [int(re.search(r" m=(\d+)", line).group(1)) for line in gemms] == tiles
        loads = [line.split("box=")[1].split(",") for line in lines if "dma_load" in line]
        assert [(int(w[0]), int(w[12])) for w in loads] == [(4 * t, m) for t, m in
                                                            enumerate(tiles)]
    with pytest.raises(ValueError, match=r"argument 1 \('C'\) dimension 0: expected 6 "
                                         r"\(the value of 'n' from argument 0 \('A'\)"):
        module["rows_dynamic"](tensor((6, 8), "int8"), tensor((5, 8), "int32"))


# Argument checks ----------------------------------------------------------------------------

@pytest.mark.parametrize("args, error, message", [
    (lambda: (tensor((4, 8), "int8"), tensor((8, 8), "int8")), TypeError,
     r"expected 3 arguments \('A', 'W', 'C'\), got 2"),
    (lambda: (tensor((4, 8), "int8"), tensor((8, 8), "float32"), tensor((4, 8), "int32")),
     ValueError, r"argument 1 \('W'\): expected dtype int8, got float32"),
    (lambda: (tensor((4, 8, 1), "int8"), tensor((8, 8), "int8"), tensor((4, 8), "int32")),
     ValueError, r"argument 0 \('A'\): expected 2 dimensions, got 3"),
    (lambda: (tensor((4, 8), "int8"), tensor((8, 8), "int8"), tensor((4, 7), "int32")),
     ValueError, r"argument 2 \('C'\): expected shape \(4, 8\), got \(4, 7\)"),
    (lambda: (tensor((4, 8), "int8"), 3, tensor((4, 8), "int32")), TypeError,
     r"argument 1 \('W'\): expected a tensor"),
])
def test_argument_checks_name_the_argument(mock_runtime, tmp_path, args, error, message):
    module = compile_kernels([lower(matmul_rows, "matmul_rows")], tmp_path)
    runtime = mock_runtime()
    with pytest.raises(error, match=r"cgra kernel 'matmul_rows': " + message):
        module["matmul_rows"](*args())
    assert log_lines(runtime) == []  # rejected before the launch began


def test_non_compact_strides_are_rejected(mock_runtime, tmp_path):
    module = compile_kernels([lower(matmul_rows, "matmul_rows")], tmp_path)
    mock_runtime()
    strided = tvm_ffi.from_dlpack(np.zeros((4, 16), "int8")[:, ::2])
    with pytest.raises(ValueError, match=r"argument 0 \('A'\): expected a compact row-major"):
        module["matmul_rows"](strided, tensor((8, 8), "int8"), tensor((4, 8), "int32"))


# Compile-time errors ------------------------------------------------------------------------

@T.prim_func(s_tir=True)
def two_big_buffers(A: T.Buffer((16,), "int8")):
    T.func_attr({"global_symbol": "two_big_buffers"})
    Big = T.alloc_buffer((40000,), "int8", scope="global.cgra_spad")
    Bigger = T.alloc_buffer((8000,), "float32", scope="global.cgra_spad")
    T.evaluate(T.call_extern("int32", "cgra_fill", 1, Big.data, 0, 1, 16, 16, 0))
    T.evaluate(T.call_extern("int32", "cgra_fill", 3, Bigger.data, 0, 1, 16, 16, 0))


def test_scratchpad_overflow_names_the_buffers():
    with pytest.raises(ScratchpadOverflow) as caught:
        cgra_codegen.build([lower(two_big_buffers, "two_big_buffers")], ARCH)
    text = str(caught.value)
    for needle in ("two_big_buffers", "'Big' (40000 bytes)", "'Bigger' (32000 bytes)",
                   "72000 bytes", "65536 bytes", "smaller tiles"):
        assert needle in text
    assert isinstance(caught.value, CodegenError)


@T.prim_func(s_tir=True)
def sibling_scopes(A: T.Buffer((4,), "int8")):
    T.func_attr({"global_symbol": "sibling_scopes"})
    for i in range(2):
        with T.sblock("first"):
            T.reads()
            T.writes()
            X = T.alloc_buffer((64,), "int8", scope="global.cgra_spad")
            T.evaluate(T.call_extern("int32", "cgra_fill", 1, X.data, 0, 1, 64, 64, i))
    for j in range(2):
        with T.sblock("second"):
            T.reads()
            T.writes()
            Y = T.alloc_buffer((100,), "int32", scope="global.cgra_spad")
            T.evaluate(T.call_extern("int32", "cgra_fill", 2, Y.data, 0, 1, 64, 64, j))


def test_buffers_of_disjoint_scopes_share_the_scratchpad():
    plan = cgra_codegen.plan_scratchpad(lower(sibling_scopes, "sibling_scopes"), "s", ARCH)
    assert [(b.name, b.size, b.base) for b in plan.buffers] == [("X", 64, 0), ("Y", 400, 0)]
    plan = cgra_codegen.plan_scratchpad(lower(matmul_rows, "matmul_rows"), "m", ARCH)
    assert [b.base for b in plan.buffers] == [0, 64, 128]


@T.prim_func(s_tir=True)
def unknown_call(A: T.Buffer((4,), "int8")):
    T.func_attr({"global_symbol": "unknown_call"})
    T.evaluate(T.call_extern("int32", "cgra_teleport", A.data))


def test_unknown_call_extern_is_an_unsupported_node():
    with pytest.raises(UnsupportedNode, match=r"kernel 'unknown_call'.*call_extern\("
                                              r"cgra_teleport\).*'codegen'"):
        cgra_codegen.build([lower(unknown_call, "unknown_call")], ARCH)


def test_unknown_statement_is_an_unsupported_node():
    func = lower(unknown_call, "unknown_call")
    func = func.with_body(tirx.While(tirx.IntImm("bool", 0), func.body))
    with pytest.raises(UnsupportedNode) as caught:
        cgra_codegen.build([func], ARCH)
    assert caught.value.node_type == "While" and caught.value.stage == "codegen"
    assert "unknown_call" in str(caught.value)


def test_kernel_scheduled_for_another_arch_is_refused():
    func = lower(tiny, "tiny").with_attr("cgra.arch", load_arch("cgra-8x8").to_json())
    with pytest.raises(CodegenError, match="scheduled for architecture 'cgra-8x8'"):
        cgra_codegen.build([func], ARCH)
