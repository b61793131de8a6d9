/*
 * The C entry points of docs/runtime-abi.md, called from LLVM-generated code.
 *
 * That code has no unwind information, so no C++ exception may leave these functions: each one
 * runs its body through SafeCall, which turns any exception into the tvm-ffi raised error
 * (kind and message kept) and returns -1. A failure marks the kernel failed; later calls on it
 * return -1 at once and keep the first error, and cgra_kernel_end frees it without submitting.
 */
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <memory>
#include <string>

#include "cgra_runtime.h"
#include "checks.h"
#include "device_backend.h"
#include "kernel_recorder.h"

struct CGRAKernel final : cgra::KernelRecorder {
  using cgra::KernelRecorder::KernelRecorder;
};

namespace {

/*! \brief Runs `body`; returns 0, or -1 with the exception it threw set as the FFI error. */
template <typename Body>
int32_t SafeCall(Body&& body) noexcept {
  try {
    TVM_FFI_SAFE_CALL_BEGIN();
    body();
    TVM_FFI_SAFE_CALL_END();
  } catch (...) {  // not a std::exception, or setting the error itself failed
    TVMFFIErrorSetRaisedFromCStr("InternalError", "unexpected C++ exception in the CGRA runtime");
    return -1;
  }
}

/*!
 * \brief A NULL kernel means cgra_kernel_begin failed: keep the error it raised if it is still
 * pending, so that the generated code's exit path (which ends the kernel) reports the cause.
 */
int32_t RaiseNullKernel(const char* function) noexcept {
  TVMFFIObjectHandle pending = nullptr;
  TVMFFIErrorMoveFromRaised(&pending);
  if (pending != nullptr) {
    TVMFFIErrorSetRaised(pending);
    TVMFFIObjectDecRef(pending);
  } else {
    std::string message = std::string(function) + " called with a NULL kernel";
    TVMFFIErrorSetRaisedFromCStr("ValueError", message.c_str());
  }
  return -1;
}

/*! \brief Runs one recording call on `k`, marking it failed if the call fails. */
template <typename Body>
int32_t RecordOn(CGRAKernel* k, const char* function, Body&& body) noexcept {
  if (k == nullptr) return RaiseNullKernel(function);
  if (k->failed()) return -1;
  int32_t status = SafeCall([&] { body(*k); });
  if (status != 0) k->MarkFailed();
  return status;
}

}  // namespace

extern "C" {

CGRAKernel* cgra_kernel_begin(const char* kernel_name, const char* source_ops,
                              const char* arch_json, int64_t spad_bytes, int32_t abi_version,
                              int32_t num_slots) {
  CGRAKernel* kernel = nullptr;
  SafeCall([&] {
    if (abi_version != CGRA_RUNTIME_ABI_VERSION) {
      cgra::ThrowKernelError(
          "RuntimeError", std::string("cgra kernel '") + (kernel_name ? kernel_name : "<null>") +
                              "' was compiled for runtime ABI v" + std::to_string(abi_version) +
                              " but this runtime is v" + std::to_string(CGRA_RUNTIME_ABI_VERSION) +
                              ": recompile the model");
    }
    kernel = new CGRAKernel(kernel_name, source_ops, arch_json, spad_bytes, num_slots);
  });
  return kernel;
}

int32_t cgra_kernel_bind(CGRAKernel* k, int32_t slot, DLTensor* tensor) {
  return RecordOn(k, "cgra_kernel_bind", [&](CGRAKernel& kernel) { kernel.Bind(slot, tensor); });
}

int32_t cgra_dma_load(CGRAKernel* k, int32_t slot, int64_t spad_addr, const int64_t* box) {
  return RecordOn(k, "cgra_dma_load", [&](CGRAKernel& kernel) {
    kernel.Dma(CGRA_OP_DMA_LOAD, slot, spad_addr, box);
  });
}

int32_t cgra_dma_store(CGRAKernel* k, int32_t slot, int64_t spad_addr, const int64_t* box) {
  return RecordOn(k, "cgra_dma_store", [&](CGRAKernel& kernel) {
    kernel.Dma(CGRA_OP_DMA_STORE, slot, spad_addr, box);
  });
}

int32_t cgra_gemm(CGRAKernel* k, int32_t flags, int32_t dtype, int64_t m, int64_t n, int64_t kdim,
                  int64_t a_addr, int64_t a_stride, int64_t b_addr, int64_t b_stride,
                  int64_t acc_addr, int64_t acc_stride) {
  return RecordOn(k, "cgra_gemm", [&](CGRAKernel& kernel) {
    kernel.Gemm(flags, dtype, m, n, kdim, a_addr, a_stride, b_addr, b_stride, acc_addr,
                acc_stride);
  });
}

int32_t cgra_depthwise(CGRAKernel* k, int32_t flags, int32_t dtype, int64_t oh, int64_t ow,
                       int64_t n, int64_t kh, int64_t kw, int64_t a_addr, int64_t a_y,
                       int64_t a_x, int64_t a_ry, int64_t a_rx, int64_t b_addr, int64_t b_ry,
                       int64_t b_rx, int64_t acc_addr, int64_t acc_y, int64_t acc_x) {
  return RecordOn(k, "cgra_depthwise", [&](CGRAKernel& kernel) {
    kernel.Depthwise(flags, dtype, {oh, ow, n, kh, kw},
                     {a_addr, a_y, a_x, a_ry, a_rx, b_addr, b_ry, b_rx, acc_addr, acc_y, acc_x});
  });
}

int32_t cgra_pool(CGRAKernel* k, int32_t flags, int32_t dtype, int64_t oh, int64_t ow, int64_t n,
                  int64_t kh, int64_t kw, int64_t a_addr, int64_t a_row, int64_t a_col,
                  int64_t stride_y, int64_t stride_x, int64_t dilation_y, int64_t dilation_x,
                  int64_t out_addr, int64_t out_y, int64_t out_x, int64_t valid_y_lo,
                  int64_t valid_y_hi, int64_t valid_x_lo, int64_t valid_x_hi, int64_t count_y_lo,
                  int64_t count_y_hi, int64_t count_x_lo, int64_t count_x_hi) {
  return RecordOn(k, "cgra_pool", [&](CGRAKernel& kernel) {
    kernel.Pool(flags, dtype, {oh, ow, n, kh, kw, a_addr, a_row, a_col, stride_y, stride_x,
                               dilation_y, dilation_x, out_addr, out_y, out_x, valid_y_lo,
                               valid_y_hi, valid_x_lo, valid_x_hi, count_y_lo, count_y_hi,
                               count_x_lo, count_x_hi});
  });
}

int32_t cgra_fill(CGRAKernel* k, int32_t dtype, int64_t addr, int64_t rows, int64_t cols,
                  int64_t stride, int64_t value_bits) {
  return RecordOn(k, "cgra_fill", [&](CGRAKernel& kernel) {
    kernel.Fill(dtype, addr, rows, cols, stride, value_bits);
  });
}

int32_t cgra_epilogue(CGRAKernel* k, int32_t flags, int32_t acc_dtype, int32_t out_dtype,
                      int64_t m, int64_t n, int64_t acc_addr, int64_t acc_stride,
                      int64_t bias_addr, int64_t out_addr, int64_t out_stride,
                      int64_t residual_addr, int64_t residual_stride, int64_t clip_lo_bits,
                      int64_t clip_hi_bits, int64_t scale_addr, int64_t out_zero_point) {
  return RecordOn(k, "cgra_epilogue", [&](CGRAKernel& kernel) {
    kernel.Epilogue(flags, acc_dtype, out_dtype, m, n, acc_addr, acc_stride, bias_addr, out_addr,
                    out_stride, {residual_addr, residual_stride, clip_lo_bits, clip_hi_bits,
                                 scale_addr, out_zero_point});
  });
}

int32_t cgra_eltwise(CGRAKernel* k, int32_t func, int32_t dtype, int64_t rows, int64_t cols,
                     int64_t a_addr, int64_t a_row, int64_t a_col, int64_t b_addr, int64_t b_row,
                     int64_t b_col, int64_t out_addr, int64_t out_stride) {
  return RecordOn(k, "cgra_eltwise", [&](CGRAKernel& kernel) {
    kernel.Eltwise(func, dtype, rows, cols,
                   {a_addr, a_row, a_col, b_addr, b_row, b_col, out_addr, out_stride});
  });
}

int32_t cgra_kernel_end(CGRAKernel* k) {
  if (k == nullptr) return RaiseNullKernel("cgra_kernel_end");
  std::unique_ptr<CGRAKernel> owner(k);  // freed on every path
  if (k->failed()) return -1;
  return SafeCall([&] { cgra::GetDeviceBackend().Submit(k->Launch()); });
}

}  // extern "C"
