/*
 * KernelRecorder: binds a launch's tensors, checks each command's record and appends it to the
 * stream.
 */
#include "kernel_recorder.h"

#include <algorithm>
#include <string>

#include "held_constants.h"

namespace cgra {

KernelRecorder::KernelRecorder(const char* kernel_name, const char* source_ops,
                               const char* arch_json, int64_t spad_bytes, int32_t num_slots,
                               int64_t macs_per_output, int64_t macs_divisor)
    : kernel_name_(kernel_name ? kernel_name : "<null>"),
      source_ops_(source_ops ? source_ops : ""),
      arch_json_(arch_json ? arch_json : ""),
      spad_bytes_(spad_bytes),
      macs_per_output_(macs_per_output),
      macs_divisor_(macs_divisor) {
  if (kernel_name == nullptr || source_ops == nullptr || arch_json == nullptr) {
    Raise("begin", "kernel_name, source_ops and arch_json must not be NULL");
  }
  if (spad_bytes <= 0) {
    Raise("begin", "spad_bytes " + std::to_string(spad_bytes) + " is not positive");
  }
  if (num_slots < 0) Raise("begin", "num_slots " + std::to_string(num_slots) + " is negative");
  if (macs_per_output < -1) {
    Raise("begin", "macs_per_output " + std::to_string(macs_per_output) + " is below -1");
  }
  if (macs_divisor < 1) {
    Raise("begin", "macs_divisor " + std::to_string(macs_divisor) + " is not positive");
  }
  slots_.resize(num_slots);
  commands_.reserve(64 * CGRA_RECORD_WORDS);
}

void KernelRecorder::Raise(const std::string& where, const std::string& detail) const {
  ThrowKernelError("ValueError", "cgra kernel '" + kernel_name_ + "': " + where + ": " + detail);
}

void KernelRecorder::RaiseCommandError(int32_t op, const std::string& detail) const {
  Raise("command " + std::to_string(num_commands()) + " (" + OpName(op) + ")", detail);
}

void KernelRecorder::Record(const int64_t* record, CommandCheck check) {
  try {
    check(record, CheckContext{slots_, spad_bytes_});
  } catch (const CheckFailure& failure) {
    RaiseCommandError(static_cast<int32_t>(record[0]), failure.what());
  }
  commands_.insert(commands_.end(), record, record + CGRA_RECORD_WORDS);
}

void KernelRecorder::Bind(int32_t slot, const DLTensor* tensor) {
  std::string where = "bind slot " + std::to_string(slot);
  if (slot < 0 || slot >= static_cast<int32_t>(slots_.size())) {
    Raise(where, "slot out of range [0, " + std::to_string(slots_.size()) + ")");
  }
  if (slots_[slot].bound) Raise(where, "slot is already bound");
  try {
    slots_[slot] = DescribeTensor(tensor);
  } catch (const CheckFailure& failure) {
    Raise(where, failure.what());
  }
  // A weight the runtime holds (held_constants.h): the device may load it before the launch.
  uint64_t bytes = (tensor->dtype.bits * tensor->dtype.lanes + 7) / 8;
  for (int d = 0; d < tensor->ndim; ++d) bytes *= static_cast<uint64_t>(tensor->shape[d]);
  uintptr_t start = static_cast<uintptr_t>(slots_[slot].data_addr);
  if (IsHeldConstant(start, start + bytes)) slots_[slot].flags |= CGRA_SLOT_FLAG_CONSTANT;
}

KernelLaunch KernelRecorder::Launch() const {
  KernelLaunch launch{kernel_name_, source_ops_, arch_json_, macs_per_output_, macs_divisor_, {},
                      commands_};
  launch.slots.assign(slots_.size() * CGRA_SLOT_WORDS, 0);
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& slot = slots_[i];
    if (!slot.bound) continue;
    int64_t* w = launch.slots.data() + i * CGRA_SLOT_WORDS;
    w[CGRA_SLOT_DATA_ADDR] = slot.data_addr;
    w[CGRA_SLOT_DTYPE] = slot.dtype;
    w[CGRA_SLOT_NDIM] = slot.ndim;
    std::copy(slot.shape, slot.shape + CGRA_BOX_DIMS, w + CGRA_SLOT_SHAPE0);
    w[CGRA_SLOT_FLAGS] = slot.flags;
  }
  return launch;
}

}  // namespace cgra
