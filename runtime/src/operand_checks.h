/*
 * The building blocks of the recording-time checks (docs/runtime-abi.md, "Checks made while
 * recording"): one operand at a time, a scratchpad region or window, a dtype code, flag bits, a
 * value. checks.h composes them into one check per opcode.
 *
 * In: operand values. Out: nothing, or CheckFailure naming the offending range. Pure functions.
 * Address arithmetic is overflow-checked: the operands come from generated code and a wrapped
 * product would turn an overflow into an "in range" answer.
 */
#ifndef CGRA_RUNTIME_OPERAND_CHECKS_H_
#define CGRA_RUNTIME_OPERAND_CHECKS_H_

#include <array>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cgra_isa.h"

namespace cgra {

/*! \brief A command or tensor breaks the runtime contract. what() names the offending range. */
class CheckFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/*! \brief Throws CheckFailure with the parts streamed into one message. */
template <typename... Parts>
[[noreturn]] void Fail(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw CheckFailure(os.str());
}

/*! \brief a + b and a * b; throw CheckFailure when the result overflows int64. */
int64_t Add(int64_t a, int64_t b);
int64_t Mul(int64_t a, int64_t b);

/*! \brief "int8", "int32", "float32", "bfloat16", "float16" or "unknown", for messages. */
const char* DTypeName(int32_t dtype);

/*! \brief Bytes per element of an isa dtype code; throws for an unknown code. */
int64_t ItemSize(int32_t dtype);
/*! \brief Whether `dtype` is a 16-bit float (bfloat16, float16). */
bool IsHalfFloat(int32_t dtype);
/*! \brief ItemSize of a dtype the vector unit computes in (not a 16-bit float), else Fail. */
int64_t VectorItemSize(int32_t dtype);

/*! \brief The accumulator dtype of a GEMM input dtype; throws if the PE array has none. */
int32_t AccumulatorDType(int32_t input_dtype);

/*! \brief Checks an epilogue's dtypes: an accumulator dtype, and the output in that same dtype (or a
 * float32 accumulator rounded to bfloat16 / float16). */
void CheckEpilogueDTypes(int32_t acc_dtype, int32_t out_dtype);

/*! \brief Checks an ELTWISE func code (CGRA_ELTWISE_ADD .. CGRA_ELTWISE_MINIMUM). */
void CheckEltwiseFunc(int32_t func);

/*! \brief Checks that a fill value fits its dtype (for float32: a 32-bit pattern, either sign). */
void CheckFillValue(int32_t dtype, int64_t value_bits);

/*! \brief Throws if `flags` has bits outside `allowed`. */
void CheckFlags(int32_t flags, int32_t allowed);

/*! \brief Checks that bytes [begin, end) lie in [0, spad_bytes); `operand` prefixes messages. */
void CheckSpadBytes(const char* operand, int64_t begin, int64_t end, int64_t spad_bytes);

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

}  // namespace cgra

#endif  // CGRA_RUNTIME_OPERAND_CHECKS_H_
