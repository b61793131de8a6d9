/*
 * KernelRecorder: checks each command of a launch and appends its record to the stream.
 */
#include "kernel_recorder.h"

#include <algorithm>
#include <string>

namespace cgra {

KernelRecorder::KernelRecorder(const char* kernel_name, const char* source_ops,
                               const char* arch_json, int64_t spad_bytes, int32_t num_slots)
    : kernel_name_(kernel_name ? kernel_name : "<null>"),
      source_ops_(source_ops ? source_ops : ""),
      arch_json_(arch_json ? arch_json : ""),
      spad_bytes_(spad_bytes) {
  if (kernel_name == nullptr || source_ops == nullptr || arch_json == nullptr) {
    Raise("begin", "kernel_name, source_ops and arch_json must not be NULL");
  }
  if (spad_bytes <= 0) {
    Raise("begin", "spad_bytes " + std::to_string(spad_bytes) + " is not positive");
  }
  if (num_slots < 0) Raise("begin", "num_slots " + std::to_string(num_slots) + " is negative");
  slots_.resize(num_slots);
  commands_.reserve(64 * CGRA_RECORD_WORDS);
}

void KernelRecorder::Raise(const std::string& where, const std::string& detail) const {
  ThrowKernelError("ValueError", "cgra kernel '" + kernel_name_ + "': " + where + ": " + detail);
}

template <typename CheckAndFill>
void KernelRecorder::Record(int32_t op, CheckAndFill check_and_fill) {
  int64_t record[CGRA_RECORD_WORDS] = {};
  record[0] = op;
  try {
    check_and_fill(record);
  } catch (const CheckFailure& failure) {
    Raise("command " + std::to_string(num_commands()) + " (" + OpName(op) + ")", failure.what());
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
}

void KernelRecorder::Dma(int32_t op, int32_t slot, int64_t spad_addr, const int64_t* box) {
  Record(op, [&](int64_t* w) {
    if (slot < 0 || slot >= static_cast<int32_t>(slots_.size())) {
      throw CheckFailure("slot " + std::to_string(slot) + " out of range [0, " +
                         std::to_string(slots_.size()) + ")");
    }
    CheckDma(slots_[slot], slot, spad_addr, box, spad_bytes_);
    w[CGRA_DMA_LOAD_SLOT] = slot;
    w[CGRA_DMA_LOAD_SPAD_ADDR] = spad_addr;
    std::copy(box, box + (CGRA_RECORD_WORDS - CGRA_DMA_LOAD_ORIGIN0), w + CGRA_DMA_LOAD_ORIGIN0);
  });
}

void KernelRecorder::Gemm(int32_t flags, int32_t dtype, int64_t m, int64_t n, int64_t kdim,
                          int64_t a_addr, int64_t a_stride, int64_t b_addr, int64_t b_stride,
                          int64_t acc_addr, int64_t acc_stride) {
  Record(CGRA_OP_GEMM, [&](int64_t* w) {
    CheckFlags(flags, CGRA_GEMM_ACCUMULATE);
    int32_t acc_dtype = AccumulatorDType(dtype);
    CheckRegion("A", Access::kRead, a_addr, m, kdim, a_stride, ItemSize(dtype), spad_bytes_);
    CheckRegion("B", Access::kRead, b_addr, kdim, n, b_stride, ItemSize(dtype), spad_bytes_);
    CheckRegion("acc", Access::kWrite, acc_addr, m, n, acc_stride, ItemSize(acc_dtype),
                spad_bytes_);
    w[CGRA_GEMM_FLAGS] = flags;
    w[CGRA_GEMM_DTYPE] = dtype;
    w[CGRA_GEMM_M] = m;
    w[CGRA_GEMM_N] = n;
    w[CGRA_GEMM_K] = kdim;
    w[CGRA_GEMM_A_ADDR] = a_addr;
    w[CGRA_GEMM_A_STRIDE] = a_stride;
    w[CGRA_GEMM_B_ADDR] = b_addr;
    w[CGRA_GEMM_B_STRIDE] = b_stride;
    w[CGRA_GEMM_ACC_ADDR] = acc_addr;
    w[CGRA_GEMM_ACC_STRIDE] = acc_stride;
  });
}

static_assert(CGRA_DEPTHWISE_KW == CGRA_DEPTHWISE_OH + 4 &&
                  CGRA_DEPTHWISE_A_ADDR == CGRA_DEPTHWISE_KW + 1 &&
                  CGRA_DEPTHWISE_ACC_X_STRIDE == CGRA_DEPTHWISE_A_ADDR + 10,
              "DEPTHWISE words: the five extents, then the eleven layout words, in order");

void KernelRecorder::Depthwise(int32_t flags, int32_t dtype, const std::array<int64_t, 5>& extents,
                               const std::array<int64_t, 11>& layout) {
  Record(CGRA_OP_DEPTHWISE, [&](int64_t* w) {
    CheckFlags(flags, CGRA_GEMM_ACCUMULATE);
    int32_t acc_dtype = AccumulatorDType(dtype);
    auto [oh, ow, n, kh, kw] = extents;
    auto [a_addr, a_y, a_x, a_ry, a_rx, b_addr, b_ry, b_rx, acc_addr, acc_y, acc_x] = layout;
    CheckWindow("A", a_addr, {oh, ow, kh, kw, n}, {a_y, a_x, a_ry, a_rx, 1}, ItemSize(dtype),
                spad_bytes_);
    CheckWindow("B", b_addr, {kh, kw, n, 1, 1}, {b_ry, b_rx, 1, 0, 0}, ItemSize(dtype), spad_bytes_);
    CheckWindow("acc", acc_addr, {oh, ow, n, 1, 1}, {acc_y, acc_x, 1, 0, 0}, ItemSize(acc_dtype),
                spad_bytes_);
    if ((oh > 1 && acc_y < ow * acc_x) || (ow > 1 && acc_x < n)) {
      throw CheckFailure("acc: strides (y " + std::to_string(acc_y) + ", x " +
                         std::to_string(acc_x) + ") overlap its elements");
    }
    w[CGRA_DEPTHWISE_FLAGS] = flags;
    w[CGRA_DEPTHWISE_DTYPE] = dtype;
    std::copy(extents.begin(), extents.end(), w + CGRA_DEPTHWISE_OH);
    std::copy(layout.begin(), layout.end(), w + CGRA_DEPTHWISE_A_ADDR);
  });
}

void KernelRecorder::Pool(int32_t flags, int32_t dtype, const PoolWords& words) {
  Record(CGRA_OP_POOL, [&](int64_t* w) {
    CheckPool(flags, dtype, words, spad_bytes_);
    w[CGRA_POOL_FLAGS] = flags;
    w[CGRA_POOL_DTYPE] = dtype;
    std::copy(words.begin(), words.end(), w + CGRA_POOL_OH);
  });
}

void KernelRecorder::Fill(int32_t dtype, int64_t addr, int64_t rows, int64_t cols,
                          int64_t stride, int64_t value_bits) {
  Record(CGRA_OP_FILL, [&](int64_t* w) {
    CheckRegion("", Access::kWrite, addr, rows, cols, stride, ItemSize(dtype), spad_bytes_);
    CheckFillValue(dtype, value_bits);
    w[CGRA_FILL_DTYPE] = dtype;
    w[CGRA_FILL_ADDR] = addr;
    w[CGRA_FILL_ROWS] = rows;
    w[CGRA_FILL_COLS] = cols;
    w[CGRA_FILL_STRIDE] = stride;
    w[CGRA_FILL_VALUE_BITS] = value_bits;
  });
}

void KernelRecorder::Epilogue(int32_t flags, int32_t acc_dtype, int32_t out_dtype, int64_t m,
                              int64_t n, int64_t acc_addr, int64_t acc_stride, int64_t bias_addr,
                              int64_t out_addr, int64_t out_stride, const EpilogueExtras& extras) {
  Record(CGRA_OP_EPILOGUE, [&](int64_t* w) {
    CheckFlags(flags, CGRA_EPILOGUE_BIAS | CGRA_EPILOGUE_RELU | CGRA_EPILOGUE_RESIDUAL |
                          CGRA_EPILOGUE_CLIP | CGRA_EPILOGUE_REQUANTISE);
    CheckEpilogueRequantise(flags, acc_dtype, out_dtype, n, extras, spad_bytes_);
    CheckRegion("acc", Access::kRead, acc_addr, m, n, acc_stride, ItemSize(acc_dtype),
                spad_bytes_);
    if (flags & CGRA_EPILOGUE_BIAS) {
      CheckRegion("bias", Access::kRead, bias_addr, 1, n, n, ItemSize(acc_dtype), spad_bytes_);
    }
    CheckEpilogueExtras(flags, acc_dtype, m, n, extras, spad_bytes_);
    CheckRegion("out", Access::kWrite, out_addr, m, n, out_stride, ItemSize(out_dtype),
                spad_bytes_);
    w[CGRA_EPILOGUE_FLAGS] = flags;
    w[CGRA_EPILOGUE_ACC_DTYPE] = acc_dtype;
    w[CGRA_EPILOGUE_OUT_DTYPE] = out_dtype;
    w[CGRA_EPILOGUE_M] = m;
    w[CGRA_EPILOGUE_N] = n;
    w[CGRA_EPILOGUE_ACC_ADDR] = acc_addr;
    w[CGRA_EPILOGUE_ACC_STRIDE] = acc_stride;
    w[CGRA_EPILOGUE_BIAS_ADDR] = bias_addr;
    w[CGRA_EPILOGUE_OUT_ADDR] = out_addr;
    w[CGRA_EPILOGUE_OUT_STRIDE] = out_stride;
    w[CGRA_EPILOGUE_RESIDUAL_ADDR] = extras.residual_addr;
    w[CGRA_EPILOGUE_RESIDUAL_STRIDE] = extras.residual_stride;
    w[CGRA_EPILOGUE_CLIP_LO_BITS] = extras.clip_lo_bits;
    w[CGRA_EPILOGUE_CLIP_HI_BITS] = extras.clip_hi_bits;
    w[CGRA_EPILOGUE_SCALE_ADDR] = extras.scale_addr;
    w[CGRA_EPILOGUE_OUT_ZERO_POINT] = extras.out_zero_point;
  });
}

static_assert(CGRA_ELTWISE_A_ADDR == CGRA_ELTWISE_COLS + 1 &&
                  CGRA_ELTWISE_OUT_STRIDE == CGRA_ELTWISE_A_ADDR + 7,
              "ELTWISE words: rows, cols, then the eight layout words, in order");

void KernelRecorder::Eltwise(int32_t func, int32_t dtype, int64_t rows, int64_t cols,
                             const std::array<int64_t, 8>& layout) {
  Record(CGRA_OP_ELTWISE, [&](int64_t* w) {
    CheckEltwiseFunc(func);
    int64_t itemsize = ItemSize(dtype);
    auto [a_addr, a_row, a_col, b_addr, b_row, b_col, out_addr, out_stride] = layout;
    CheckWindow("A", a_addr, {rows, cols, 1, 1, 1}, {a_row, a_col, 0, 0, 0}, itemsize, spad_bytes_);
    CheckWindow("B", b_addr, {rows, cols, 1, 1, 1}, {b_row, b_col, 0, 0, 0}, itemsize, spad_bytes_);
    CheckRegion("out", Access::kWrite, out_addr, rows, cols, out_stride, itemsize, spad_bytes_);
    w[CGRA_ELTWISE_FUNC] = func;
    w[CGRA_ELTWISE_DTYPE] = dtype;
    w[CGRA_ELTWISE_ROWS] = rows;
    w[CGRA_ELTWISE_COLS] = cols;
    std::copy(layout.begin(), layout.end(), w + CGRA_ELTWISE_A_ADDR);
  });
}

KernelLaunch KernelRecorder::Launch() const {
  KernelLaunch launch{kernel_name_, source_ops_, arch_json_, {}, commands_};
  launch.slots.assign(slots_.size() * CGRA_SLOT_WORDS, 0);
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& slot = slots_[i];
    if (!slot.bound) continue;
    int64_t* w = launch.slots.data() + i * CGRA_SLOT_WORDS;
    w[CGRA_SLOT_DATA_ADDR] = slot.data_addr;
    w[CGRA_SLOT_DTYPE] = slot.dtype;
    w[CGRA_SLOT_NDIM] = slot.ndim;
    std::copy(slot.shape, slot.shape + CGRA_BOX_DIMS, w + CGRA_SLOT_SHAPE0);
  }
  return launch;
}

}  // namespace cgra
