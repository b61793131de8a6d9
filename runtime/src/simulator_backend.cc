/*
 * The simulator backend: forwards each launch to the tvm-ffi global function
 * `cgra.backend.simulator.submit`, which npu_backend registers in Python (docs/runtime-abi.md).
 * Arguments: (kernel_name, source_ops, arch_json, slots, commands, macs_per_output, macs_divisor),
 * slots and
 * commands as Bytes of little-endian int64 words. An exception raised in Python arrives here as tvm::ffi::Error and
 * propagates unchanged to the C entry point, which re-raises it through the C ABI.
 */
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <optional>

#include "checks.h"
#include "device_backend.h"

namespace cgra {
namespace {

// The stream is little-endian int64 words (isa.py); the host's words are copied as they are.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the command stream is little-endian");

constexpr const char* kSubmitFunction = "cgra.backend.simulator.submit";

tvm::ffi::Bytes WordsToBytes(const std::vector<int64_t>& words) {
  return tvm::ffi::Bytes(reinterpret_cast<const char*>(words.data()),
                         words.size() * sizeof(int64_t));
}

class SimulatorBackend final : public DeviceBackend {
 public:
  void Submit(const KernelLaunch& launch) override {
    // Looked up per launch: Python may re-register the function (tests, profilers).
    std::optional<tvm::ffi::Function> submit = tvm::ffi::Function::GetGlobal(kSubmitFunction);
    if (!submit.has_value()) {
      ThrowKernelError("RuntimeError", "cgra kernel '" + launch.kernel_name +
                                           "': the CGRA simulator backend is not registered: "
                                           "import npu_backend before running compiled code");
    }
    (*submit)(tvm::ffi::String(launch.kernel_name), tvm::ffi::String(launch.source_ops),
              tvm::ffi::String(launch.arch_json), WordsToBytes(launch.slots),
              WordsToBytes(launch.commands), launch.macs_per_output, launch.macs_divisor);
  }
};

}  // namespace

DeviceBackend& GetDeviceBackend() {
  static SimulatorBackend backend;
  return backend;
}

}  // namespace cgra
