/*
 * Recording-time checks of the CGRA runtime (docs/runtime-abi.md, "Checks made while recording").
 *
 * Each check takes one command's operands and throws CheckFailure with the offending range when
 * they break the contract; the caller (KernelRecorder) adds the kernel and command context.
 * Pure functions: nothing here knows about kernels or the device backend.
 */
#ifndef CGRA_RUNTIME_CHECKS_H_
#define CGRA_RUNTIME_CHECKS_H_

#include <dlpack/dlpack.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cgra_isa.h"

namespace cgra {

/*! \brief A command or tensor breaks the runtime contract. what() names the offending range. */
class CheckFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/*!
 * \brief Throws tvm::ffi::Error(kind, message) without a C++ backtrace. Used for errors about the
 * kernel or the setup (failed checks, ABI mismatch, no backend), whose message says everything:
 * a backtrace would only add runtime frames, and collecting the first one costs ~0.4 s and ~35 MB.
 */
[[noreturn]] void ThrowKernelError(const char* kind, const std::string& message);

/*! \brief One host tensor slot of a kernel launch: what bind recorded. */
struct Slot {
  bool bound = false;
  int64_t data_addr = 0;  // data + byte_offset
  int32_t dtype = 0;      // isa DType code
  int32_t ndim = 0;
  int64_t shape[CGRA_BOX_DIMS] = {0, 0, 0, 0};  // dims >= ndim stay 0
};

/*! \brief The isa name of an opcode ("DMA_LOAD"), for messages. */
const char* OpName(int32_t op);

/*! \brief Bytes per element of an isa dtype code; throws for an unknown code. */
int64_t ItemSize(int32_t dtype);

/*! \brief The accumulator dtype of a GEMM input dtype; throws if the PE array has none. */
int32_t AccumulatorDType(int32_t input_dtype);

/*! \brief Checks an epilogue's dtypes: an accumulator dtype, and the output in that same dtype. */
void CheckEpilogueDTypes(int32_t acc_dtype, int32_t out_dtype);

/*! \brief The EPILOGUE operands stream version 2 added: a residual tile, clip bounds and a
 * requantisation to int8 (scale row, zero point). */
struct EpilogueExtras {
  int64_t residual_addr = 0;
  int64_t residual_stride = 0;
  int64_t clip_lo_bits = 0;
  int64_t clip_hi_bits = 0;
  int64_t scale_addr = 0;
  int64_t out_zero_point = 0;
};

/*!
 * \brief Checks a requantising epilogue (CGRA_EPILOGUE_REQUANTISE): int32 accumulator, int8
 * output, the row of n float32 scales in the scratchpad, the zero point in [-128, 127]. Without
 * the flag, checks the dtypes as CheckEpilogueDTypes does and that scale_addr and the zero point
 * are 0.
 */
void CheckEpilogueRequantise(int32_t flags, int32_t acc_dtype, int32_t out_dtype, int64_t n,
                             const EpilogueExtras& extras, int64_t spad_bytes);

/*!
 * \brief Checks an epilogue's residual and clip: with CGRA_EPILOGUE_RESIDUAL the m x n residual
 * region (acc dtype) lies in the scratchpad; with CGRA_EPILOGUE_CLIP both bounds fit the acc
 * dtype (int32 bounds ordered); a disabled operand's words are 0.
 */
void CheckEpilogueExtras(int32_t flags, int32_t acc_dtype, int64_t m, int64_t n,
                         const EpilogueExtras& extras, int64_t spad_bytes);

/*! \brief Checks an ELTWISE func code (CGRA_ELTWISE_ADD .. CGRA_ELTWISE_MINIMUM). */
void CheckEltwiseFunc(int32_t func);

/*! \brief Checks that a fill value fits its dtype (for float32: a 32-bit pattern, either sign). */
void CheckFillValue(int32_t dtype, int64_t value_bits);

/*! \brief Checks a tensor given to bind (CPU, compact, rank 1..4, known dtype); describes it. */
Slot DescribeTensor(const DLTensor* tensor);

/*! \brief Throws if `flags` has bits outside `allowed`. */
void CheckFlags(int32_t flags, int32_t allowed);

/*! \brief Whether a command reads or writes a region (rows it writes must not overlap). */
enum class Access { kRead, kWrite };

/*!
 * \brief Checks a 2-D scratchpad region of rows x cols elements whose rows are `stride` elements
 * apart. It covers bytes [addr, addr + ((rows - 1) * stride + cols) * itemsize), which must lie in
 * [0, spad_bytes). `operand` names the region in messages ("A", "acc"), or is empty.
 */
void CheckRegion(const char* operand, Access access, int64_t addr, int64_t rows, int64_t cols,
                 int64_t stride, int64_t itemsize, int64_t spad_bytes);

/*!
 * \brief Checks an N-d scratchpad window (up to 5 dims, unused dims extent 1) whose element i is
 * at addr + sum(i_d * strides[d]) elements: extents positive, strides non-negative, every byte
 * in [0, spad_bytes). Windows may overlap themselves (a depthwise input); only reads do that.
 */
void CheckWindow(const char* operand, int64_t addr, const std::array<int64_t, 5>& extents,
                 const std::array<int64_t, 5>& strides, int64_t itemsize, int64_t spad_bytes);

/*! \brief The POOL words oh .. count_x_hi, in isa.py's order. */
constexpr int kPoolWords = CGRA_POOL_COUNT_X_HI - CGRA_POOL_OH + 1;
using PoolWords = std::array<int64_t, kPoolWords>;

/*!
 * \brief Checks a POOL command: flags, dtype (an average pools float32 only), strides and
 * dilations >= 1, the window and the output inside the scratchpad, output elements apart, each
 * rectangle 0 <= lo <= hi, the count words 0 without CGRA_POOL_AVERAGE.
 */
void CheckPool(int32_t flags, int32_t dtype, const PoolWords& words, int64_t spad_bytes);

/*!
 * \brief Checks one DMA: `box` is the record's words 4..31 (origin, halo, loops) and `slot` the
 * tensor it moves to or from. Every tensor coordinate must lie in [-pad_lo, shape + pad_hi) and
 * every scratchpad byte in [0, spad_bytes).
 */
void CheckDma(const Slot& slot, int32_t slot_index, int64_t spad_addr, const int64_t* box,
              int64_t spad_bytes);

}  // namespace cgra

#endif  // CGRA_RUNTIME_CHECKS_H_
