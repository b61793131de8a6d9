/*
 * The device backend: where a recorded kernel launch goes to run.
 *
 * The runtime records and checks a launch (KernelRecorder) and hands it, complete, to the one
 * backend it was built with. Here that is the simulator (simulator_backend.cc); on silicon it
 * would be a driver implementing the same interface.
 */
#ifndef CGRA_RUNTIME_DEVICE_BACKEND_H_
#define CGRA_RUNTIME_DEVICE_BACKEND_H_

#include <cstdint>
#include <string>
#include <vector>

namespace cgra {

/*! \brief One checked kernel launch, in the word layouts of simulator/cgra_sim/isa.py. */
struct KernelLaunch {
  std::string kernel_name;
  std::string source_ops;  // comma-separated model ops the kernel came from
  std::string arch_json;   // canonical JSON of the hardware description it was compiled for
  int64_t macs_per_output;  // the model's MACs per output element, -1 if the kernel did not say,
  int64_t macs_divisor;     // ... over this divisor (a fused kernel's are a fraction)
  std::vector<int64_t> slots;     // CGRA_SLOT_WORDS per slot, all zero for an unbound slot
  std::vector<int64_t> commands;  // CGRA_RECORD_WORDS per command
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  /*! \brief Runs the launch to completion. Throws tvm::ffi::Error on failure. */
  virtual void Submit(const KernelLaunch& launch) = 0;
};

/*! \brief The backend this runtime was built with. */
DeviceBackend& GetDeviceBackend();

}  // namespace cgra

#endif  // CGRA_RUNTIME_DEVICE_BACKEND_H_
