"""Tests of the C++ runtime (runtime/) through its C API, and of how npu_backend builds it.

Stage: runtime. The library is built once per version of its sources (about 15 s the first time,
cached afterwards). The tests call the C API with ctypes the way compiled kernels do, inside a
tvm-ffi function, so that a -1 surfaces as the Python exception a user would see. A Python stand-in
for the simulator backend records what the runtime submits.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import tvm_ffi
from tvm_ffi import libinfo

from cgra_sim import HardwareDescription, c_api, isa, load_arch
from cgra_codegen.llvm_types import RUNTIME_ABI_VERSION
from cgra_sim.isa import DType, Op
from npu_backend.device import runtime_lib

SUBMIT = "cgra.backend.simulator.submit"
ARCH = load_arch("cgra-8x8")
SPAD = ARCH.spad_bytes
BOX_WORDS = isa.RECORD_WORDS - isa.word(Op.DMA_LOAD, "origin0")
F32, I8, I32 = int(DType.FLOAT32), int(DType.INT8), int(DType.INT32)
# CGRA_RUNTIME_ABI_VERSION, the code generator's (the header must say the same: below). v2 gave
# cgra_epilogue its residual and clip arguments,
# v3 cgra_kernel_begin its macs_per_output, v4 cgra_dma_load its flags, v5 added cgra_fabric,
# v6 cgra_check_tensor_arg (the kernels' argument checks), v7 cgra_kernel_begin its macs_divisor, v8 cgra_reduce and cgra_vfunc
ABI = RUNTIME_ABI_VERSION


# ---------------------------------------------------------------------------------------------
# ctypes view of the C API


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def dltensor(array: np.ndarray, device_type: int = 1, strides=None) -> DLTensor:
    """A DLTensor over `array` (which the caller keeps alive); strides in elements or None."""
    code = {"i": 0, "u": 1, "f": 2}[array.dtype.kind]
    shape = (ctypes.c_int64 * array.ndim)(*array.shape)
    tensor = DLTensor(array.ctypes.data, DLDevice(device_type, 0), array.ndim,
                      DLDataType(code, array.dtype.itemsize * 8, 1), shape, None, 0)
    tensor.keep = [shape]
    if strides is not None:
        strides = (ctypes.c_int64 * array.ndim)(*strides)
        tensor.strides = strides
        tensor.keep.append(strides)
    return tensor


I64, I32C, P = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
SIGNATURES = {
    "cgra_kernel_begin": (P, [ctypes.c_char_p] * 3 + [I64, I32C, I32C, I64, I64]),
    "cgra_kernel_bind": (I32C, [P, I32C, ctypes.POINTER(DLTensor)]),
    "cgra_dma_load": (I32C, [P, I32C, I32C, I64, ctypes.POINTER(I64)]),
    "cgra_dma_store": (I32C, [P, I32C, I64, ctypes.POINTER(I64)]),
    "cgra_gemm": (I32C, [P, I32C, I32C] + [I64] * 9),
    "cgra_depthwise": (I32C, [P, I32C, I32C] + [I64] * 16),
    "cgra_fill": (I32C, [P, I32C] + [I64] * 5),
    "cgra_epilogue": (I32C, [P, I32C, I32C, I32C] + [I64] * 13),
    "cgra_eltwise": (I32C, [P, I32C, I32C] + [I64] * 10),
    "cgra_pool": (I32C, [P, I32C, I32C] + [I64] * 23),
    "cgra_reduce": (I32C, [P, I32C, I32C] + [I64] * 7),
    "cgra_vfunc": (I32C, [P, I32C, I32C, I32C] + [I64] * 9),
    "cgra_kernel_end": (I32C, [P]),
}


@pytest.fixture(scope="module")
def lib():
    library = ctypes.CDLL(runtime_lib.load_runtime())
    for name, (restype, argtypes) in SIGNATURES.items():
        getattr(library, name).restype = restype
        getattr(library, name).argtypes = argtypes
    return library


class TVMFFIByteArray(ctypes.Structure):
    _fields_ = [("data", ctypes.c_char_p), ("size", ctypes.c_size_t)]


_SAFE_CALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                              ctypes.c_void_p)


@pytest.fixture(scope="module")
def on_device(lib):
    """run(body): calls `body()` inside a tvm-ffi function, as compiled kernels are called.

    `body` makes ctypes calls into the runtime and returns 0 or -1; on -1 tvm-ffi raises the
    error the runtime set, converted to its Python exception class.
    """
    ffi = ctypes.CDLL(libinfo.find_libtvm_ffi())
    state = {}

    @_SAFE_CALL
    def safe_call(_self, _args, _num_args, result):
        ctypes.memset(result, 0, 16)  # returns None
        try:
            return state["body"]()
        except BaseException as err:  # a bug in the test itself: re-raised below
            state["bug"] = err
            return 0

    handle = ctypes.c_void_p()
    assert ffi.TVMFFIFunctionCreate(None, safe_call, None, ctypes.byref(handle)) == 0
    name = b"testing.cgra_runtime.on_device"
    name_bytes = TVMFFIByteArray(name, len(name))
    assert ffi.TVMFFIFunctionSetGlobal(ctypes.byref(name_bytes), handle, 1) == 0
    ffi.TVMFFIObjectDecRef(handle)
    function = tvm_ffi.get_global_func(name.decode())

    def run(body):
        state["body"] = body
        function()
        if "bug" in state:
            raise state.pop("bug")

    yield run
    tvm_ffi.remove_global_func(name.decode())


# ---------------------------------------------------------------------------------------------
# A stand-in simulator backend, and launches written the way generated code makes them


class Launch:
    def __init__(self, name, source_ops, arch_json, slots: bytes, commands: bytes, macs_per_output: int,
                 macs_divisor: int):
        self.name, self.source_ops, self.arch_json = name, source_ops, arch_json
        self.macs_per_output, self.macs_divisor = macs_per_output, macs_divisor
        self.slots = np.frombuffer(slots, "<i8").reshape(-1, isa.SLOT_WORDS).tolist()
        self.commands = np.frombuffer(commands, "<i8").reshape(-1, isa.RECORD_WORDS).tolist()


def _swap_submit(function):
    """Registers `function` (or removes the registration if None); returns what was there."""
    previous = tvm_ffi.get_global_func(SUBMIT, allow_missing=True)
    if function is not None:
        tvm_ffi.register_global_func(SUBMIT, function, override=True)
    elif previous is not None:
        tvm_ffi.remove_global_func(SUBMIT)
    return previous


@pytest.fixture
def submitted():
    """The launches the runtime submits while the test runs."""
    launches = []
    previous = _swap_submit(lambda *args: launches.append(Launch(*args)))
    yield launches
    _swap_submit(previous)


def box(loops, origin=(0, 0, 0, 0), pad_lo=(0, 0, 0, 0), pad_hi=(0, 0, 0, 0)) -> list[int]:
    """The 28 box words; `loops` lists (extent, tdim, tstep, sstride); unused loops: 1, 0, 0, 0."""
    loops = list(loops) + [(1, 0, 0, 0)] * (isa.BOX_DIMS - len(loops))
    return list(origin) + list(pad_lo) + list(pad_hi) + [w for loop in loops for w in loop]


def rows_box(rows, cols, row_stride, **halo) -> list[int]:
    """A box copying a (rows, cols) block of a rank-2 tensor to rows `row_stride` elements apart."""
    return box([(rows, 0, 1, row_stride), (cols, 1, 1, 1)], **halo)


def launch(lib, commands, tensors=(), num_slots=None, name=b"k", abi=ABI, spad=SPAD, record=None,
           macs_per_output=7, macs_divisor=3):
    """One launch as generated code runs it: begin, bind, commands until one fails, end.

    commands: (function name, args after the kernel); DMA boxes as lists of 28 ints.
    `record` (a list), if given, receives every call's status and every call is made even after a
    failure, to show that a failed kernel refuses further work.
    """
    kernel = lib.cgra_kernel_begin(name, b"matmul,add", ARCH.to_json().encode(), spad, abi,
                                   len(tensors) if num_slots is None else num_slots, macs_per_output,
                                   macs_divisor)
    if not kernel:
        return -1 if lib.cgra_kernel_end(None) else 0
    status = 0
    calls = [("cgra_kernel_bind", slot, ctypes.byref(t)) for slot, t in enumerate(tensors)]
    for function, *args in calls + list(commands):
        args = [(I64 * BOX_WORDS)(*a) if isinstance(a, list) else a for a in args]
        if status == 0 or record is not None:
            result = getattr(lib, function)(kernel, *args)
            status = status or result
            if record is not None:
                record.append(result)
    return -1 if lib.cgra_kernel_end(kernel) or status else 0


# ---------------------------------------------------------------------------------------------
# The recorded stream


def test_header_declares_the_documented_api():
    def prototypes(text):
        found = re.findall(r"([\w ]+\*?)\s*\b(cgra_\w+)\(([^)]*)\);", text)
        return {name: " ".join(f"{ret} {name}({args})".replace("CGRA_RUNTIME_API", "").split())
                for ret, name, args in found}

    root = runtime_lib.REPO_ROOT
    doc = (root / "docs" / "runtime-abi.md").read_text()
    # The header includes the command functions' prototypes, generated from isa.py at build time.
    header = "".join((root / "runtime" / "include" / name).read_text()
                     for name in ("cgra_runtime.h", "cgra_arg_checks.h")) + c_api.c_prototypes()
    assert prototypes(header) == prototypes(doc)
    assert {command.name for command in isa.COMMAND_FUNCTIONS.values()} <= set(prototypes(doc))
    assert f"#define CGRA_RUNTIME_ABI_VERSION {ABI}" in header


FULL_EPILOGUE = isa.EPILOGUE_BIAS | isa.EPILOGUE_RESIDUAL | isa.EPILOGUE_RELU | isa.EPILOGUE_CLIP
REQUANTISING = isa.EPILOGUE_BIAS | isa.EPILOGUE_RELU | isa.EPILOGUE_REQUANTISE


def test_records_match_isa_encode(lib, on_device, submitted):
    a = np.zeros((8, 16), np.float32)
    b = np.zeros((16, 4), np.float32)
    bias = np.zeros(4, np.float32)
    out = np.zeros((8, 4), np.float32)
    q = np.zeros((2, 3, 4, 5), np.int8)
    tensors = [dltensor(x) for x in (a, b, bias, out, q)]
    load_a = rows_box(8, 16, 16)
    load_q = box([(3, 1, 1, 20), (4, 2, 1, 5), (5, 3, 1, 1)], origin=(1, 0, 0, 0))
    halo = rows_box(9, 16, 16, origin=(-1, 0, 0, 0), pad_lo=(1, 0, 0, 0))
    commands = [
        ("cgra_dma_load", 0, 0, 0, load_a),
        ("cgra_dma_load", 0, 1, 512, rows_box(16, 4, 4)),
        ("cgra_fill", F32, 1024, 8, 4, 4, 0x3F800000),
        ("cgra_gemm", isa.GEMM_ACCUMULATE, F32, 8, 4, 16, 0, 16, 512, 4, 1024, 4),
        ("cgra_dma_load", 0, 2, 1152, box([(4, 0, 1, 1)])),
        ("cgra_epilogue", isa.EPILOGUE_BIAS | isa.EPILOGUE_RELU, F32, F32, 8, 4, 1024, 4, 1152,
         2048, 4, 0, 0, 0, 0, 0, 0),
        ("cgra_dma_store", 3, 2048, rows_box(8, 4, 4)),
        ("cgra_dma_load", 0, 4, 4096, load_q),
        ("cgra_dma_load", isa.DMA_FILL_LOWEST, 0, 8192, halo),
        ("cgra_depthwise", 0, I8, 2, 3, 4, 3, 3, 4096, 20, 4, 20, 4, 4200, 12, 4, 4400, 12, 4),
        ("cgra_epilogue", FULL_EPILOGUE, F32, F32, 8, 4, 1024, 4, 1152, 3072, 4, 2048, 6, 0,
         0x40C00000, 0, 0),
        ("cgra_epilogue", REQUANTISING, I32, I8, 8, 4, 1024, 4, 1152, 3072, 4, 0, 0, 0, 0, 4096, -3),
        # stream v13: requantised, then dequantised to float32 (a scale row of 2n: (multiplier, scale) pairs)
        ("cgra_epilogue", REQUANTISING | isa.EPILOGUE_DEQUANTISE, I32, F32, 8, 4, 1024, 4, 1152, 3072, 4, 0, 0, 0, 0,
         4096, -3),
        ("cgra_eltwise", int(isa.EltwiseFunc.MAXIMUM), F32, 8, 4, 1024, 4, 1, 1152, 0, 1, 3072, 4),
        ("cgra_pool", isa.POOL_AVERAGE, F32, 2, 3, 4, 3, 3, 4096, 28, 4, 2, 2, 1, 1, 6000, 12, 4,
         1, 6, 1, 7, 0, 7, 0, 8),
        ("cgra_reduce", int(isa.ReduceFunc.SUM_SQUARES), F32, 8, 4, 1024, 4, 1, 3072, 1),
        ("cgra_vfunc", isa.VFUNC_SCALE | isa.VFUNC_OFFSET, int(isa.VFunc.RSQRT), F32, 8, 1, 3072, 1, 0, 3072, 1,
         0x3E800000, 0x3727C5AC),
    ]
    on_device(lambda: launch(lib, commands, tensors, name=b"fused_matmul"))

    def dma(op, slot, spad_addr, words, flags=0):
        return isa.encode(op, flags=flags, slot=slot, spad_addr=spad_addr,
                          **dict(zip(isa.FIELDS[op][isa.word(op, "origin0"):], words)))

    expected = [
        dma(Op.DMA_LOAD, 0, 0, load_a),
        dma(Op.DMA_LOAD, 1, 512, rows_box(16, 4, 4)),
        isa.encode(Op.FILL, dtype=F32, addr=1024, rows=8, cols=4, stride=4, value_bits=0x3F800000),
        isa.encode(Op.GEMM, flags=isa.GEMM_ACCUMULATE, dtype=F32, m=8, n=4, k=16, a_addr=0,
                   a_stride=16, b_addr=512, b_stride=4, acc_addr=1024, acc_stride=4),
        dma(Op.DMA_LOAD, 2, 1152, box([(4, 0, 1, 1)])),
        isa.encode(Op.EPILOGUE, flags=isa.EPILOGUE_BIAS | isa.EPILOGUE_RELU, acc_dtype=F32,
                   out_dtype=F32, m=8, n=4, acc_addr=1024, acc_stride=4, bias_addr=1152,
                   out_addr=2048, out_stride=4),
        dma(Op.DMA_STORE, 3, 2048, rows_box(8, 4, 4)),
        dma(Op.DMA_LOAD, 4, 4096, load_q),
        dma(Op.DMA_LOAD, 0, 8192, halo, flags=isa.DMA_FILL_LOWEST),
        isa.encode(Op.DEPTHWISE, dtype=I8, oh=2, ow=3, n=4, kh=3, kw=3, a_addr=4096, a_y_stride=20,
                   a_x_stride=4, a_ry_stride=20, a_rx_stride=4, b_addr=4200, b_ry_stride=12,
                   b_rx_stride=4, acc_addr=4400, acc_y_stride=12, acc_x_stride=4),
        isa.encode(Op.EPILOGUE, flags=FULL_EPILOGUE, acc_dtype=F32, out_dtype=F32, m=8, n=4,
                   acc_addr=1024, acc_stride=4, bias_addr=1152, out_addr=3072, out_stride=4,
                   residual_addr=2048, residual_stride=6, clip_lo_bits=0, clip_hi_bits=0x40C00000),
        isa.encode(Op.EPILOGUE, flags=REQUANTISING, acc_dtype=I32, out_dtype=I8, m=8, n=4,
                   acc_addr=1024, acc_stride=4, bias_addr=1152, out_addr=3072, out_stride=4,
                   scale_addr=4096, out_zero_point=-3),
        isa.encode(Op.EPILOGUE, flags=REQUANTISING | isa.EPILOGUE_DEQUANTISE, acc_dtype=I32, out_dtype=F32, m=8,
                   n=4, acc_addr=1024, acc_stride=4, bias_addr=1152, out_addr=3072, out_stride=4,
                   scale_addr=4096, out_zero_point=-3),
        isa.encode(Op.ELTWISE, func=isa.EltwiseFunc.MAXIMUM, dtype=F32, rows=8, cols=4, a_addr=1024,
                   a_row_stride=4, a_col_stride=1, b_addr=1152, b_row_stride=0, b_col_stride=1,
                   out_addr=3072, out_stride=4),
        isa.encode(Op.POOL, flags=isa.POOL_AVERAGE, dtype=F32, oh=2, ow=3, n=4, kh=3, kw=3, a_addr=4096,
                   a_row_stride=28, a_col_stride=4, stride_y=2, stride_x=2, dilation_y=1, dilation_x=1,
                   out_addr=6000, out_y_stride=12, out_x_stride=4, valid_y_lo=1, valid_y_hi=6,
                   valid_x_lo=1, valid_x_hi=7, count_y_lo=0, count_y_hi=7, count_x_lo=0, count_x_hi=8),
        isa.encode(Op.REDUCE, func=isa.ReduceFunc.SUM_SQUARES, dtype=F32, rows=8, cols=4, a_addr=1024,
                   a_row_stride=4, a_col_stride=1, out_addr=3072, out_stride=1),
        isa.encode(Op.VFUNC, flags=isa.VFUNC_SCALE | isa.VFUNC_OFFSET, func=isa.VFunc.RSQRT, dtype=F32, rows=8,
                   cols=1, a_addr=3072, a_row_stride=1, a_col_stride=0, out_addr=3072, out_stride=1,
                   scale_bits=0x3E800000, offset_bits=0x3727C5AC),
    ]
    (sent,) = submitted
    assert (sent.name, sent.source_ops, sent.arch_json, sent.macs_per_output, sent.macs_divisor) == (
        "fused_matmul", "matmul,add", ARCH.to_json(), 7, 3)
    assert sent.commands == expected
    assert sent.slots == [
        [x.ctypes.data, int(DType.from_name(x.dtype.name)), x.ndim, *x.shape, *[0] * (4 - x.ndim), 0]
        for x in (a, b, bias, out, q)]


def test_stream_runs_on_the_simulator(lib, on_device):
    """The runtime's records and slot table mean to cgra_sim what they mean to the runtime."""
    from cgra_sim import simulate

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 16), np.float32), rng.standard_normal((16, 4), np.float32)
    bias, out = rng.standard_normal(4, np.float32), np.zeros((8, 4), np.float32)
    arrays = (a, b, bias, out)
    commands = [
        ("cgra_dma_load", 0, 0, 0, rows_box(8, 16, 16)),
        ("cgra_dma_load", 0, 1, 512, rows_box(16, 4, 4)),
        ("cgra_gemm", 0, F32, 8, 4, 16, 0, 16, 512, 4, 1024, 4),
        ("cgra_dma_load", 0, 2, 1152, box([(4, 0, 1, 1)])),
        ("cgra_epilogue", isa.EPILOGUE_BIAS | isa.EPILOGUE_RELU, F32, F32, 8, 4, 1024, 4, 1152,
         2048, 4, 0, 0, 0, 0, 0, 0),
        ("cgra_dma_store", 3, 2048, rows_box(8, 4, 4)),
    ]

    def submit(name, source_ops, arch_json, slots, stream, macs_per_output, macs_divisor):
        table = np.frombuffer(slots, "<i8").reshape(-1, isa.SLOT_WORDS)
        assert table[:, 0].tolist() == [x.ctypes.data for x in arrays]
        stats.append(simulate(HardwareDescription.from_json(arch_json), stream, list(arrays), name=name,
                              macs_per_output=macs_per_output, macs_divisor=macs_divisor))

    stats = []
    previous = _swap_submit(submit)
    try:
        on_device(lambda: launch(lib, commands, [dltensor(x) for x in arrays]))
    finally:
        _swap_submit(previous)
    np.testing.assert_allclose(out, np.maximum(a @ b + bias, 0), rtol=1e-5, atol=1e-5)
    # The model's MACs are the kernel's per output element (7 / 3 here) times the output's size.
    assert (stats[0].macs, stats[0].padded_macs) == (7 * out.size // 3, 8 * 4 * 16)


def test_bind_records_byte_offset_and_accepts_size_one_strides(lib, on_device, submitted):
    x = np.zeros((4, 1, 8), np.int32)
    tensor = dltensor(x, strides=(8, 12345, 1))  # a size-1 dim's stride is never used
    tensor.byte_offset = 16
    on_device(lambda: launch(lib, [], [tensor], num_slots=2))
    assert submitted[0].slots == [[x.ctypes.data + 16, I32, 3, 4, 1, 8, 0, 0], [0] * isa.SLOT_WORDS]
    assert submitted[0].commands == []


# ---------------------------------------------------------------------------------------------
# Checks: each violation is a ValueError naming the kernel, the command and the range


def _x():
    return np.zeros((8, 4), np.float32)


VIOLATIONS = {
    "gemm acc beyond the scratchpad": (
        [("cgra_gemm", 0, F32, 8, 8, 8, 0, 8, 256, 8, SPAD - 100, 8)],
        f"command 0 (GEMM): acc: scratchpad bytes [{SPAD - 100}, {SPAD + 156}) exceed the "
        f"{SPAD}-byte scratchpad"),
    "depthwise window beyond the scratchpad": (
        [("cgra_depthwise", 0, I8, 4, 4, 8, 3, 3, SPAD - 100, 48, 8, 48, 8, 0, 24, 8, 512, 32, 8)],
        f"command 0 (DEPTHWISE): A: scratchpad bytes [{SPAD - 100}, {SPAD - 100 + 5 * 48 + 5 * 8 + 8}) "
        f"exceed the {SPAD}-byte scratchpad"),
    "depthwise negative stride": (
        [("cgra_depthwise", 0, I8, 4, 4, 8, 3, 3, 0, 48, 8, -48, 8, 0, 24, 8, 512, 32, 8)],
        "command 0 (DEPTHWISE): A: stride -48 of dim 2 is negative"),
    "depthwise accumulator rows overlap": (
        [("cgra_depthwise", 0, I8, 4, 4, 8, 3, 3, 0, 48, 8, 48, 8, 0, 24, 8, 512, 16, 8)],
        "command 0 (DEPTHWISE): acc: strides (y 16, x 8) overlap its elements"),
    "pool window beyond the scratchpad": (
        [("cgra_pool", 0, F32, 2, 2, 4, 2, 2, SPAD - 16, 12, 4, 1, 1, 1, 1, 0, 8, 4, 0, 3, 0, 3, 0, 0, 0, 0)],
        f"command 0 (POOL): A: scratchpad bytes [{SPAD - 16}, {SPAD - 16 + 4 * (2 * 12 + 2 * 4 + 4)}) "
        f"exceed the {SPAD}-byte scratchpad"),
    "pool zero stride": (
        [("cgra_pool", 0, F32, 2, 2, 4, 2, 2, 0, 12, 4, 0, 1, 1, 1, 512, 8, 4, 0, 3, 0, 3, 0, 0, 0, 0)],
        "command 0 (POOL): stride_y 0 is not positive"),
    "pool average of int8": (
        [("cgra_pool", isa.POOL_AVERAGE, I8, 2, 2, 4, 2, 2, 0, 12, 4, 1, 1, 1, 1, 512, 8, 4, 0, 3, 0, 3,
          0, 3, 0, 3)],
        "command 0 (POOL): an average pools float32, not int8"),
    "pool inverted rectangle": (
        [("cgra_pool", 0, F32, 2, 2, 4, 2, 2, 0, 12, 4, 1, 1, 1, 1, 512, 8, 4, 2, 1, 0, 3, 0, 0, 0, 0)],
        "command 0 (POOL): valid rectangle y range [2, 1) is not 0 <= lo <= hi"),
    "pool count words of a max": (
        [("cgra_pool", 0, F32, 2, 2, 4, 2, 2, 0, 12, 4, 1, 1, 1, 1, 512, 8, 4, 0, 3, 0, 3, 0, 3, 0, 3)],
        "command 0 (POOL): count words are set but POOL_AVERAGE is off"),
    "pool output overlaps": (
        [("cgra_pool", 0, F32, 2, 2, 4, 2, 2, 0, 12, 4, 1, 1, 1, 1, 512, 4, 4, 0, 3, 0, 3, 0, 0, 0, 0)],
        "command 0 (POOL): out: strides (y 4, x 4) overlap its elements"),
    "eltwise unknown func": (
        [("cgra_eltwise", 9, F32, 2, 4, 0, 4, 1, 64, 4, 1, 128, 4)],
        "command 0 (ELTWISE): func 9 is not an elementwise function"),
    "eltwise operand beyond the scratchpad": (
        [("cgra_eltwise", 1, I32, 2, 4, 0, 4, 1, SPAD - 16, 0, 2, 128, 4)],
        f"command 0 (ELTWISE): B: scratchpad bytes [{SPAD - 16}, {SPAD + 12}) exceed"),
    "eltwise negative stride": (
        [("cgra_eltwise", 1, I32, 2, 4, 0, 4, -1, 64, 0, 1, 128, 4)],
        "command 0 (ELTWISE): A: stride -1 of dim 1 is negative"),
    "eltwise output rows overlap": (
        [("cgra_eltwise", 3, I8, 2, 4, 0, 4, 1, 64, 0, 0, 128, 2)],
        "command 0 (ELTWISE): out: row stride 2 is smaller than the 4 columns"),
    "eltwise unknown dtype": (
        [("cgra_eltwise", 1, 9, 2, 4, 0, 4, 1, 64, 0, 0, 128, 4)],
        "command 0 (ELTWISE): unknown dtype code 9"),
    "fill below address 0": (
        [("cgra_fill", I8, -4, 1, 8, 8, 0)],
        "command 0 (FILL): scratchpad bytes [-4, 4) start below address 0"),
    "dma beyond the halo": (
        [("cgra_dma_load", 0, 0, 0, rows_box(8, 4, 4, origin=(-2, 0, 0, 0), pad_lo=(1, 0, 0, 0)))],
        r"command 0 (DMA_LOAD): slot 0 dim 0: coordinates [-2, 6) leave [-1, 8)"),
    "dma store beyond the tensor": (
        [("cgra_fill", F32, 0, 9, 4, 4, 0), ("cgra_dma_store", 0, 0, rows_box(9, 4, 4))],
        "command 1 (DMA_STORE): slot 0 dim 0: coordinates [0, 9) leave [0, 8)"),
    "negative tstep walks below the tensor": (
        [("cgra_dma_load", 0, 0, 0, box([(8, 0, -1, 4), (4, 1, 1, 1)], origin=(3, 0, 0, 0)))],
        "command 0 (DMA_LOAD): slot 0 dim 0: coordinates [-4, 4) leave [0, 8)"),
    "null box": (
        [("cgra_dma_load", 0, 0, 0, None)], "command 0 (DMA_LOAD): box is NULL"),
    "unknown dma flag": (
        [("cgra_dma_load", 2, 0, 0, rows_box(8, 4, 4))], "command 0 (DMA_LOAD): unknown flag bits 0x2"),
    "unbound slot": (
        [("cgra_dma_load", 0, 1, 0, rows_box(8, 4, 4))], "command 0 (DMA_LOAD): slot 1 is not bound"),
    "slot out of range": (
        [("cgra_dma_store", 5, 0, rows_box(8, 4, 4))],
        "command 0 (DMA_STORE): slot 5 out of range [0, 2)"),
    "unknown dtype": (
        [("cgra_gemm", 0, 9, 8, 8, 8, 0, 8, 256, 8, 512, 8)],
        "command 0 (GEMM): unknown dtype code 9"),
    "gemm on int32": (
        [("cgra_gemm", 0, I32, 8, 8, 8, 0, 8, 256, 8, 512, 8)],
        "command 0 (GEMM): the PE array has no int32 inputs"),
    "epilogue dtypes disagree": (
        [("cgra_epilogue", 0, F32, I8, 8, 8, 0, 8, 0, 512, 8, 0, 0, 0, 0, 0, 0)],
        "command 0 (EPILOGUE): a float32 accumulator cannot produce int8"),
    "epilogue residual beyond the scratchpad": (
        [("cgra_epilogue", isa.EPILOGUE_RESIDUAL, I32, I32, 2, 4, 0, 4, 0, 64, 4, SPAD - 16, 4, 0, 0, 0, 0)],
        f"command 0 (EPILOGUE): residual: scratchpad bytes [{SPAD - 16}, {SPAD + 16}) exceed"),
    "epilogue residual without its flag": (
        [("cgra_epilogue", 0, I32, I32, 2, 4, 0, 4, 0, 64, 4, 128, 4, 0, 0, 0, 0)],
        "command 0 (EPILOGUE): residual_addr 128 / residual_stride 4 given without "
        "CGRA_EPILOGUE_RESIDUAL"),
    "epilogue clip bounds unordered": (
        [("cgra_epilogue", isa.EPILOGUE_CLIP, I32, I32, 2, 4, 0, 4, 0, 64, 4, 0, 0, 6, 0, 0, 0)],
        "command 0 (EPILOGUE): clip bounds [6, 0] are not ordered"),
    "epilogue clip bound beyond int32": (
        [("cgra_epilogue", isa.EPILOGUE_CLIP, I32, I32, 2, 4, 0, 4, 0, 64, 4, 0, 0, 0, 2**31, 0, 0)],
        "command 0 (EPILOGUE): value 2147483648 does not fit int32"),
    "epilogue clip without its flag": (
        [("cgra_epilogue", isa.EPILOGUE_RELU, F32, F32, 2, 4, 0, 4, 0, 64, 4, 0, 0, 0, 0x40C00000, 0, 0)],
        "command 0 (EPILOGUE): clip bounds given without CGRA_EPILOGUE_CLIP"),
    "requantisation to int32": (
        [("cgra_epilogue", isa.EPILOGUE_REQUANTISE, I32, I32, 2, 4, 0, 4, 0, 64, 4, 0, 0, 0, 0, 128, 0)],
        "command 0 (EPILOGUE): requantisation takes an int32 or float32 accumulator to int8 or an int64 one to "
        "int16, not int32 to int32"),
    "requantisation zero point beyond int8": (
        [("cgra_epilogue", isa.EPILOGUE_REQUANTISE, I32, I8, 2, 4, 0, 4, 0, 64, 4, 0, 0, 0, 0, 128, -129)],
        "command 0 (EPILOGUE): out_zero_point -129 does not fit int8 [-128, 127]"),
    "requantisation scale beyond the scratchpad": (
        [("cgra_epilogue", isa.EPILOGUE_REQUANTISE, I32, I8, 2, 4, 0, 4, 0, 64, 4, 0, 0, 0, 0, SPAD - 8, 0)],
        f"command 0 (EPILOGUE): scale: scratchpad bytes [{SPAD - 8}, {SPAD + 8}) exceed"),
    "dequantisation without requantisation": (
        [("cgra_epilogue", isa.EPILOGUE_DEQUANTISE, I32, F32, 2, 4, 0, 4, 0, 64, 4, 0, 0, 0, 0, 128, 0)],
        "command 0 (EPILOGUE): CGRA_EPILOGUE_DEQUANTISE dequantises a requantised result"),
    "dequantisation to int8": (
        [("cgra_epilogue", isa.EPILOGUE_REQUANTISE | isa.EPILOGUE_DEQUANTISE, I32, I8, 2, 4, 0, 4, 0, 64, 4, 0, 0, 0,
          0, 128, 0)],
        "command 0 (EPILOGUE): CGRA_EPILOGUE_DEQUANTISE takes an int32 accumulator to a float32 output, not int32 "
        "to int8"),
    "dequantisation scales beyond the scratchpad": (  # a row of 2n: the requantisation's n would fit
        [("cgra_epilogue", isa.EPILOGUE_REQUANTISE | isa.EPILOGUE_DEQUANTISE, I32, F32, 2, 4, 0, 4, 0, 64, 4, 0, 0, 0,
          0, SPAD - 16, 0)],
        f"command 0 (EPILOGUE): scale: scratchpad bytes [{SPAD - 16}, {SPAD + 16}) exceed"),
    "scale without the requantise flag": (
        [("cgra_epilogue", 0, I32, I32, 2, 4, 0, 4, 0, 64, 4, 0, 0, 0, 0, 128, 0)],
        "command 0 (EPILOGUE): scale_addr 128 / out_zero_point 0 given without CGRA_EPILOGUE_REQUANTISE"),
    "negative scratchpad stride": (
        [("cgra_dma_load", 0, 0, 64, box([(8, 0, 1, -4), (4, 1, 1, 1)]))],
        "command 0 (DMA_LOAD): loop 0 has a negative scratchpad stride -4"),
    "zero extent": (
        [("cgra_dma_load", 0, 0, 0, box([(0, 0, 1, 4)]))],
        "command 0 (DMA_LOAD): loop 0 has extent 0"),
    "loop on a dimension the tensor lacks": (
        [("cgra_dma_load", 0, 0, 0, box([(2, 2, 1, 4)]))],
        "command 0 (DMA_LOAD): loop 0 walks tensor dim 2 but slot 0 has rank 2"),
    "fill value beyond int8": (
        [("cgra_fill", I8, 0, 1, 4, 4, 300)],
        r"command 0 (FILL): value 300 does not fit int8 [-128, 127]"),
    "unknown gemm flag": (
        [("cgra_gemm", 4, F32, 8, 8, 8, 0, 8, 256, 8, 512, 8)],
        "command 0 (GEMM): unknown flag bits 0x4"),
    "written rows overlap": (
        [("cgra_fill", F32, 0, 4, 8, 4, 0)],
        "command 0 (FILL): row stride 4 is smaller than the 8 columns"),
    "address arithmetic overflow": (
        [("cgra_fill", F32, 0, 2, 1, 2**62, 0)],
        "command 0 (FILL): address arithmetic overflows int64"),
    "reduce unknown func": (
        [("cgra_reduce", 4, F32, 2, 4, 0, 4, 1, 64, 1)],
        "command 0 (REDUCE): func 4 is not a reduction"),
    "reduce on int32": (
        [("cgra_reduce", int(isa.ReduceFunc.SUM), I32, 2, 4, 0, 4, 1, 64, 1)],
        "command 0 (REDUCE): dtype code 2 is not float32"),
    "reduce column beyond the scratchpad": (
        [("cgra_reduce", int(isa.ReduceFunc.MAX), F32, 2, 4, 0, 4, 1, SPAD - 4, 1)],
        f"command 0 (REDUCE): out: scratchpad bytes [{SPAD - 4}, {SPAD + 4}) exceed"),
    "vfunc unknown func": (
        [("cgra_vfunc", 0, 11, F32, 2, 4, 0, 4, 1, 64, 4, 0, 0)],
        "command 0 (VFUNC): func 11 is not a special function"),
    "vfunc offset without its flag": (
        [("cgra_vfunc", 0, int(isa.VFunc.EXP), F32, 2, 4, 0, 4, 1, 64, 4, 0, 0x3F800000)],
        "command 0 (VFUNC): offset_bits are set but CGRA_VFUNC_OFFSET is off"),
}


@pytest.mark.parametrize("commands, message", VIOLATIONS.values(), ids=VIOLATIONS.keys())
def test_violation_is_a_value_error_naming_command_and_range(lib, on_device, submitted, commands,
                                                            message):
    tensors = [dltensor(_x())]
    with pytest.raises(ValueError, match=re.escape(f"cgra kernel 'k': {message}")):
        on_device(lambda: launch(lib, commands, tensors, num_slots=2))
    assert submitted == []


def test_message_of_the_documented_example(lib, on_device, submitted):
    x = np.zeros((64, 64), np.float32)
    commands = [("cgra_fill", F32, 0, 1, 8, 8, 0)] * 12
    commands.append(("cgra_dma_load", 0, 0, 260096, rows_box(24, 64, 64)))
    with pytest.raises(ValueError) as info:
        on_device(lambda: launch(lib, commands, [dltensor(x)], name=b"fused_matmul"))
    assert str(info.value) == ("cgra kernel 'fused_matmul': command 12 (DMA_LOAD): scratchpad "
                               "bytes [260096, 266240) exceed the 262144-byte scratchpad")


BIND_VIOLATIONS = {
    "not on the CPU": (lambda: dltensor(_x(), device_type=2), "tensor is on device type 2"),
    "not compact": (lambda: dltensor(_x(), strides=(8, 1)), "tensor is not compact: dim 0 has "
                                                            "stride 8"),
    "rank 5": (lambda: dltensor(np.zeros((1, 2, 1, 2, 2), np.float32)), "tensor has rank 5"),
    "float64": (lambda: dltensor(np.zeros(4, np.float64)), "dtype (code 2, bits 64, lanes 1) is "
                                                           "not supported"),
    "uint8": (lambda: dltensor(np.zeros(4, np.uint8)), "dtype (code 1, bits 8, lanes 1)"),
}


@pytest.mark.parametrize("make_tensor, message", BIND_VIOLATIONS.values(),
                         ids=BIND_VIOLATIONS.keys())
def test_bind_refuses_tensors_the_npu_cannot_move(lib, on_device, submitted, make_tensor, message):
    tensor = make_tensor()
    with pytest.raises(ValueError, match=re.escape(f"cgra kernel 'k': bind slot 0: {message}")):
        on_device(lambda: launch(lib, [], [tensor]))
    assert submitted == []


def test_bind_refuses_bad_slots(lib, on_device):
    t = dltensor(_x())

    def bind_twice():
        kernel = lib.cgra_kernel_begin(b"k", b"", b"{}", SPAD, ABI, 1, -1, 1)
        first = lib.cgra_kernel_bind(kernel, 0, ctypes.byref(t))
        second = lib.cgra_kernel_bind(kernel, 0, ctypes.byref(t))
        end = lib.cgra_kernel_end(kernel)
        assert (first, second, end) == (0, -1, -1)
        return -1

    with pytest.raises(ValueError, match=re.escape("bind slot 0: slot is already bound")):
        on_device(bind_twice)
    with pytest.raises(ValueError, match=re.escape("bind slot 3: slot out of range [0, 1)")):
        on_device(lambda: launch(lib, [("cgra_kernel_bind", 3, ctypes.byref(t))], [], 1))


def test_begin_refuses_a_negative_mac_count(lib, on_device):
    with pytest.raises(ValueError, match=re.escape("begin: macs_per_output -2 is below -1")):
        on_device(lambda: launch(lib, [], [], macs_per_output=-2))
    with pytest.raises(ValueError, match=re.escape("begin: macs_divisor 0 is not positive")):
        on_device(lambda: launch(lib, [], [], macs_divisor=0))


def test_failed_kernel_records_nothing_more_and_keeps_the_first_error(lib, on_device, submitted):
    statuses = []
    good = ("cgra_fill", F32, 0, 1, 4, 4, 0)
    bad = ("cgra_fill", F32, SPAD, 1, 4, 4, 0)
    also_bad = ("cgra_gemm", 0, 9, 1, 1, 1, 0, 1, 0, 1, 0, 1)
    with pytest.raises(ValueError, match=re.escape("command 1 (FILL)")) as info:
        on_device(lambda: launch(lib, [good, bad, good, also_bad], [], record=statuses))
    assert statuses == [0, -1, -1, -1]
    assert "GEMM" not in str(info.value)
    assert submitted == []


def test_wrong_abi_version_is_refused(lib, on_device, submitted):
    kernels = []

    def begin_v2():
        kernel = lib.cgra_kernel_begin(b"old_kernel", b"", b"{}", SPAD, ABI - 1, 0, -1, 1)
        kernels.append(kernel)
        return -1 if lib.cgra_kernel_end(kernel) else 0  # generated code's exit path, on NULL

    with pytest.raises(RuntimeError, match=re.escape(
            f"cgra kernel 'old_kernel' was compiled for runtime ABI v{ABI - 1} but this runtime is v{ABI}: "
            "recompile the model")):
        on_device(begin_v2)
    assert kernels == [None] and submitted == []


def test_ending_a_null_kernel_without_a_pending_error_says_so(lib, on_device):
    with pytest.raises(ValueError, match="cgra_kernel_end called with a NULL kernel"):
        on_device(lambda: lib.cgra_kernel_end(None))


# ---------------------------------------------------------------------------------------------
# The backend hand-off


def test_missing_backend_says_to_import_npu_backend(lib, on_device):
    previous = _swap_submit(None)
    try:
        with pytest.raises(RuntimeError, match=re.escape(
                "cgra kernel 'k': the CGRA simulator backend is not registered: import "
                "npu_backend before running compiled code")):
            on_device(lambda: launch(lib, [("cgra_fill", F32, 0, 1, 4, 4, 0)]))
    finally:
        _swap_submit(previous)


class SimulatedFault(ValueError):
    """A ValueError subclass tvm-ffi does not know (like cgra_sim's CommandError)."""


@pytest.mark.parametrize("raised, seen", [
    (ValueError("command 0 (FILL): the simulator refused it"), ValueError),
    (RuntimeError("the simulator crashed"), RuntimeError),
    (SimulatedFault("command 3 (GEMM): a subclass"), RuntimeError),  # unregistered: by name
])
def test_backend_error_propagates_with_its_kind_and_message(lib, on_device, raised, seen):
    def submit(*_):
        raise raised

    previous = _swap_submit(submit)
    try:
        with pytest.raises(seen, match=re.escape(str(raised))) as info:
            on_device(lambda: launch(lib, [("cgra_fill", F32, 0, 1, 4, 4, 0)]))
        assert type(info.value) is seen
    finally:
        _swap_submit(previous)


def test_repeated_launches_free_every_kernel(lib, on_device):
    def rss_kib():
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") // 1024

    launches = []
    previous = _swap_submit(lambda name, *_: launches.append(name))
    good = [("cgra_fill", F32, 0, 4, 4, 4, 0)] * 64  # a 16 KiB stream
    bad = good + [("cgra_fill", F32, SPAD, 4, 4, 4, 0)]
    try:
        for _ in range(50):  # warm up allocators before measuring
            on_device(lambda: launch(lib, good))
        before = rss_kib()
        for i in range(1000):
            if i % 2:
                with pytest.raises(ValueError):
                    on_device(lambda: launch(lib, bad))
            else:
                on_device(lambda: launch(lib, good))
    finally:
        _swap_submit(previous)
    assert len(launches) == 50 + 500
    # Each leaked kernel would keep its 16 KiB stream: 500 leaks would add 8 MiB.
    assert rss_kib() - before < 4096


# ---------------------------------------------------------------------------------------------
# Building and loading the library


def test_load_runtime_is_idempotent_and_exports_the_c_api_globally():
    path = runtime_lib.load_runtime()
    assert runtime_lib.load_runtime() == path
    assert Path(path).name == runtime_lib.LIBRARY_NAME
    process = ctypes.CDLL(None)  # what code compiled later links against
    for name in SIGNATURES:
        assert hasattr(process, name)


@pytest.fixture
def source_copy(tmp_path):
    """A copy of the files the runtime is built from."""
    root = runtime_lib.REPO_ROOT
    copy = tmp_path / "repo"
    shutil.copytree(root / "runtime", copy / "runtime")
    (copy / "simulator" / "cgra_sim").mkdir(parents=True)
    for module in runtime_lib.GENERATOR_MODULES:
        shutil.copy(root / "simulator" / "cgra_sim" / module, copy / "simulator" / "cgra_sim")
    shutil.copy(root / "CMakeLists.txt", copy)
    return copy


@pytest.fixture
def fake_compile(monkeypatch):
    """Replaces CMake with a stub that writes a dummy library; lists the roots it built."""
    built = []

    def compile_stub(cmake, root, build_dir):
        built.append(root)
        build_dir.mkdir(parents=True)
        (build_dir / runtime_lib.LIBRARY_NAME).write_text(f"built from {root}")
        return build_dir / runtime_lib.LIBRARY_NAME

    monkeypatch.setattr(runtime_lib, "_compile", compile_stub)
    return built


def test_build_is_cached_by_source_hash(source_copy, tmp_path, fake_compile, capsys):
    cache = tmp_path / "cache"
    first = runtime_lib.ensure_built(source_copy, cache)
    assert runtime_lib.ensure_built(source_copy, cache) == first
    assert len(fake_compile) == 1
    assert capsys.readouterr().err.count(runtime_lib.BUILD_MESSAGE) == 1

    with open(source_copy / "runtime" / "src" / "checks.cc", "a") as source:
        source.write("// changed\n")
    second = runtime_lib.ensure_built(source_copy, cache)
    assert second != first and second.is_file() and first.is_file()
    assert len(fake_compile) == 2
    assert sorted(p.name for p in cache.iterdir()) == sorted([first.parent.name,
                                                              second.parent.name])


def test_old_builds_are_removed_keeping_the_most_recently_used(source_copy, tmp_path, fake_compile):
    """Six edits of the sources: the cache keeps KEEP_BUILDS builds, the ones used last (a use
    marks its build), and leaves folders that are not builds alone."""
    import time

    cache = tmp_path / "cache"
    (cache / "runtime-notes").mkdir(parents=True)  # not a build's name: stays
    builds = []
    for edit in range(6):
        with open(source_copy / "runtime" / "src" / "checks.cc", "a") as source:
            source.write(f"// edit {edit}\n")
        builds.append(runtime_lib.ensure_built(source_copy, cache).parent)
        time.sleep(0.01)
        os.utime(builds[0], (time.time(), time.time()))  # the first build is used again and again
        time.sleep(0.01)
    kept = {p for p in cache.iterdir() if p.name != "runtime-notes"}
    assert len(kept) == runtime_lib.KEEP_BUILDS and builds[0] in kept and builds[-1] in kept
    assert (cache / "runtime-notes").is_dir()
    assert runtime_lib.remove_old_builds(cache, count=1) and {p.name for p in cache.iterdir()} == \
        {"runtime-notes", builds[0].name}


@pytest.mark.parametrize("change", ["isa.py", "c_api.py", "new header", "tvm-ffi version"])
def test_source_hash_covers_every_input(source_copy, monkeypatch, change):
    before = runtime_lib.source_hash(source_copy)
    if change.endswith(".py"):
        with open(source_copy / "simulator" / "cgra_sim" / change, "a") as generator:
            generator.write("# changed\n")
    elif change == "new header":
        (source_copy / "runtime" / "src" / "extra.h").write_text("")
    else:
        monkeypatch.setattr(tvm_ffi, "__version__", "0.0.0")
    assert runtime_lib.source_hash(source_copy) != before


def test_losing_a_build_race_uses_the_winners_library(source_copy, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    target = cache / f"runtime-{runtime_lib.source_hash(source_copy)}"

    def compile_while_another_process_publishes(cmake, root, build_dir):
        target.mkdir(parents=True)
        (target / runtime_lib.LIBRARY_NAME).write_text("the winner's")
        build_dir.mkdir(parents=True)
        (build_dir / runtime_lib.LIBRARY_NAME).write_text("ours")
        return build_dir / runtime_lib.LIBRARY_NAME

    monkeypatch.setattr(runtime_lib, "_compile", compile_while_another_process_publishes)
    path = runtime_lib.ensure_built(source_copy, cache)
    assert path.read_text() == "the winner's"
    assert [p.name for p in cache.iterdir()] == [target.name]  # the temporary build is gone


def test_cache_directory_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CGRA_RUNTIME_CACHE", str(tmp_path))
    assert runtime_lib.default_cache_dir() == tmp_path
    monkeypatch.delenv("CGRA_RUNTIME_CACHE")
    assert runtime_lib.default_cache_dir() == Path.home() / ".cache" / "npu_backend"


def test_missing_cmake_is_named_with_the_fix(source_copy, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(runtime_lib.RuntimeBuildError, match="cmake was not found on PATH.*"
                                                              "pip install cmake"):
        runtime_lib.ensure_built(source_copy, tmp_path / "cache")


def test_missing_compiler_is_named_with_the_fix(source_copy, tmp_path, monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: real_which(name) if name == "cmake" else None)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(runtime_lib.RuntimeBuildError, match=re.escape(
            "failed while configuring: no C++ compiler was found on PATH (looked for c++, g++, "
            "clang++). Install one, e.g. `apt-get install g++`")):
        runtime_lib.ensure_built(source_copy, tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
