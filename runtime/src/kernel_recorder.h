/*
 * KernelRecorder: one kernel launch being recorded (the object behind the C API's CGRAKernel).
 *
 * Each command is checked (checks.h) and appended as one CGRA_RECORD_WORDS record in the layout
 * of simulator/cgra_sim/isa.py. A failed check throws tvm::ffi::Error (ValueError) naming the
 * kernel, the command's index in the stream, its kind and the offending range; the C entry
 * points then mark the recorder failed so that nothing more is recorded or submitted.
 */
#ifndef CGRA_RUNTIME_KERNEL_RECORDER_H_
#define CGRA_RUNTIME_KERNEL_RECORDER_H_

#include <dlpack/dlpack.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "checks.h"
#include "device_backend.h"

namespace cgra {

class KernelRecorder {
 public:
  /*! \brief Throws ValueError for NULL names, spad_bytes <= 0 or num_slots < 0. */
  KernelRecorder(const char* kernel_name, const char* source_ops, const char* arch_json,
                 int64_t spad_bytes, int32_t num_slots);

  void Bind(int32_t slot, const DLTensor* tensor);
  /*! \brief `op` is CGRA_OP_DMA_LOAD or CGRA_OP_DMA_STORE. */
  void Dma(int32_t op, int32_t slot, int64_t spad_addr, const int64_t* box);
  void Gemm(int32_t flags, int32_t dtype, int64_t m, int64_t n, int64_t kdim, int64_t a_addr,
            int64_t a_stride, int64_t b_addr, int64_t b_stride, int64_t acc_addr,
            int64_t acc_stride);
  /*! \brief `extents`: oh, ow, n, kh, kw; `layout`: a_addr and its y, x, ry, rx strides, b_addr
   * and its ry, rx strides, acc_addr and its y, x strides (isa.py's DEPTHWISE words, in order). */
  void Depthwise(int32_t flags, int32_t dtype, const std::array<int64_t, 5>& extents,
                 const std::array<int64_t, 11>& layout);
  /*! \brief `words`: oh .. count_x_hi, isa.py's POOL words in order. */
  void Pool(int32_t flags, int32_t dtype, const PoolWords& words);
  void Fill(int32_t dtype, int64_t addr, int64_t rows, int64_t cols, int64_t stride,
            int64_t value_bits);
  void Epilogue(int32_t flags, int32_t acc_dtype, int32_t out_dtype, int64_t m, int64_t n,
                int64_t acc_addr, int64_t acc_stride, int64_t bias_addr, int64_t out_addr,
                int64_t out_stride, const EpilogueExtras& extras);

  /*! \brief `layout`: a_addr and its row, column strides, b_addr and its row, column strides,
   * out_addr and its row stride (isa.py's ELTWISE words, in order). */
  void Eltwise(int32_t func, int32_t dtype, int64_t rows, int64_t cols,
               const std::array<int64_t, 8>& layout);

  bool failed() const { return failed_; }
  void MarkFailed() { failed_ = true; }
  /*! \brief The launch to submit: the slot table and the command stream. */
  KernelLaunch Launch() const;

 private:
  /*! \brief Runs `check_and_fill` on a zeroed record of `op` and appends it if no check fails. */
  template <typename CheckAndFill>
  void Record(int32_t op, CheckAndFill check_and_fill);
  /*! \brief Throws ValueError "cgra kernel 'name': <where>: <detail>". */
  [[noreturn]] void Raise(const std::string& where, const std::string& detail) const;
  int64_t num_commands() const { return commands_.size() / CGRA_RECORD_WORDS; }

  std::string kernel_name_;
  std::string source_ops_;
  std::string arch_json_;
  int64_t spad_bytes_;
  std::vector<Slot> slots_;
  std::vector<int64_t> commands_;
  bool failed_ = false;
};

}  // namespace cgra

#endif  // CGRA_RUNTIME_KERNEL_RECORDER_H_
