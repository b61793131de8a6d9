/*
 * KernelRecorder: one kernel launch being recorded (the object behind the C API's CGRAKernel).
 *
 * In: the bound tensors, and one CGRA_RECORD_WORDS record per command in the layout of
 * simulator/cgra_sim/isa.py, packed by the generated command functions (cgra_commands.inc).
 * Out: the launch to submit. Each command is checked (checks.h) before it is appended. A failed
 * check throws tvm::ffi::Error (ValueError) naming the kernel, the command's index in the stream,
 * its kind and the offending range; the C entry points then mark the recorder failed so that
 * nothing more is recorded or submitted.
 */
#ifndef CGRA_RUNTIME_KERNEL_RECORDER_H_
#define CGRA_RUNTIME_KERNEL_RECORDER_H_

#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>
#include <vector>

#include "checks.h"
#include "device_backend.h"

namespace cgra {

class KernelRecorder {
 public:
  /*! \brief Throws ValueError for NULL names, spad_bytes <= 0, num_slots < 0 or
   * macs_per_output < -1 or macs_divisor < 1. */
  KernelRecorder(const char* kernel_name, const char* source_ops, const char* arch_json,
                 int64_t spad_bytes, int32_t num_slots, int64_t macs_per_output,
                 int64_t macs_divisor);

  void Bind(int32_t slot, const DLTensor* tensor);
  /*!
   * \brief Checks one command's record (CGRA_RECORD_WORDS words, word 0 the opcode) with its
   * opcode's `check` and appends it to the stream; throws ValueError if the check fails.
   */
  void Record(const int64_t* record, CommandCheck check);
  /*! \brief Throws ValueError "cgra kernel 'name': command <next index> (<op>): <detail>". */
  [[noreturn]] void RaiseCommandError(int32_t op, const std::string& detail) const;

  bool failed() const { return failed_; }
  void MarkFailed() { failed_ = true; }
  /*! \brief The launch to submit: the slot table and the command stream. */
  KernelLaunch Launch() const;

 private:
  /*! \brief Throws ValueError "cgra kernel 'name': <where>: <detail>". */
  [[noreturn]] void Raise(const std::string& where, const std::string& detail) const;
  int64_t num_commands() const { return commands_.size() / CGRA_RECORD_WORDS; }

  std::string kernel_name_;
  std::string source_ops_;
  std::string arch_json_;
  int64_t spad_bytes_;
  int64_t macs_per_output_;
  int64_t macs_divisor_;
  std::vector<Slot> slots_;
  std::vector<int64_t> commands_;
  bool failed_ = false;
};

}  // namespace cgra

#endif  // CGRA_RUNTIME_KERNEL_RECORDER_H_
