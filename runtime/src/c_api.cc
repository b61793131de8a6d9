/*
 * The C entry points of docs/runtime-abi.md, called from LLVM-generated code: the kernel
 * lifecycle here, the command functions from the generated cgra_commands.inc.
 *
 * That code has no unwind information, so no C++ exception may leave these functions: each one
 * runs its body through SafeCall, which turns any exception into the tvm-ffi raised error
 * (kind and message kept) and returns -1. A failure marks the kernel failed; later calls on it
 * return -1 at once and keep the first error, and cgra_kernel_end frees it without submitting.
 */
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <algorithm>
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
                              int32_t num_slots, int64_t macs_per_output,
                              int64_t macs_divisor) {
  CGRAKernel* kernel = nullptr;
  SafeCall([&] {
    if (abi_version != CGRA_RUNTIME_ABI_VERSION) {
      cgra::ThrowKernelError(
          "RuntimeError", std::string("cgra kernel '") + (kernel_name ? kernel_name : "<null>") +
                              "' was compiled for runtime ABI v" + std::to_string(abi_version) +
                              " but this runtime is v" + std::to_string(CGRA_RUNTIME_ABI_VERSION) +
                              ": recompile the model");
    }
    kernel = new CGRAKernel(kernel_name, source_ops, arch_json, spad_bytes, num_slots,
                            macs_per_output, macs_divisor);
  });
  return kernel;
}

int32_t cgra_kernel_bind(CGRAKernel* k, int32_t slot, DLTensor* tensor) {
  return RecordOn(k, "cgra_kernel_bind", [&](CGRAKernel& kernel) { kernel.Bind(slot, tensor); });
}

// The command functions (cgra_dma_load, cgra_gemm, ...), generated from cgra_sim/isa.py: each
// packs its parameters into a zeroed record and hands it to KernelRecorder::Record with its
// opcode's check, through RecordOn.
#include "cgra_commands.inc"

int32_t cgra_kernel_end(CGRAKernel* k) {
  if (k == nullptr) return RaiseNullKernel("cgra_kernel_end");
  std::unique_ptr<CGRAKernel> owner(k);  // freed on every path
  if (k->failed()) return -1;
  return SafeCall([&] { cgra::GetDeviceBackend().Submit(k->Launch()); });
}

}  // extern "C"
