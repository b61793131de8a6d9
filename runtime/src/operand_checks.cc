/*
 * The building blocks of the recording-time checks: one operand in, CheckFailure naming the
 * offending range out.
 */
#include "operand_checks.h"

#include <limits>
#include <string>

namespace cgra {

int64_t Add(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) Fail("address arithmetic overflows int64");
  return out;
}

int64_t Mul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) Fail("address arithmetic overflows int64");
  return out;
}

const char* DTypeName(int32_t dtype) {
  switch (dtype) {
    case CGRA_DTYPE_INT8: return "int8";
    case CGRA_DTYPE_INT32: return "int32";
    case CGRA_DTYPE_FLOAT32: return "float32";
    case CGRA_DTYPE_BFLOAT16: return "bfloat16";
    case CGRA_DTYPE_FLOAT16: return "float16";
    case CGRA_DTYPE_INT16: return "int16";
    case CGRA_DTYPE_INT64: return "int64";
    default: return "unknown";
  }
}

void CheckSpadBytes(const char* operand, int64_t begin, int64_t end, int64_t spad_bytes) {
  if (begin >= 0 && end <= spad_bytes) return;
  std::string prefix = *operand ? std::string(operand) + ": " : "";
  if (begin < 0) Fail(prefix, "scratchpad bytes [", begin, ", ", end, ") start below address 0");
  Fail(prefix, "scratchpad bytes [", begin, ", ", end, ") exceed the ", spad_bytes,
       "-byte scratchpad");
}

int64_t ItemSize(int32_t dtype) {
  switch (dtype) {
    case CGRA_DTYPE_INT8: return CGRA_DTYPE_INT8_BYTES;
    case CGRA_DTYPE_INT32: return CGRA_DTYPE_INT32_BYTES;
    case CGRA_DTYPE_FLOAT32: return CGRA_DTYPE_FLOAT32_BYTES;
    case CGRA_DTYPE_BFLOAT16: return CGRA_DTYPE_BFLOAT16_BYTES;
    case CGRA_DTYPE_FLOAT16: return CGRA_DTYPE_FLOAT16_BYTES;
    case CGRA_DTYPE_INT16: return CGRA_DTYPE_INT16_BYTES;
    case CGRA_DTYPE_INT64: return CGRA_DTYPE_INT64_BYTES;
    default:
      Fail("unknown dtype code ", dtype, " (known: ", CGRA_DTYPE_INT8, " int8, ", CGRA_DTYPE_INT32,
           " int32, ", CGRA_DTYPE_FLOAT32, " float32, ", CGRA_DTYPE_BFLOAT16, " bfloat16, ",
           CGRA_DTYPE_FLOAT16, " float16, ", CGRA_DTYPE_INT16, " int16, ", CGRA_DTYPE_INT64, " int64)");
  }
}

bool IsHalfFloat(int32_t dtype) { return dtype == CGRA_DTYPE_BFLOAT16 || dtype == CGRA_DTYPE_FLOAT16; }

int64_t VectorItemSize(int32_t dtype) {
  int64_t size = ItemSize(dtype);  // rejects unknown codes first, with the list of known ones
  if (IsHalfFloat(dtype)) {
    Fail("the vector unit computes int8, int32 and float32, not ", DTypeName(dtype),
         " (16-bit floats are PE-array inputs, EPILOGUE outputs and ELTWISE operands only)");
  }
  if (dtype == CGRA_DTYPE_INT16 || dtype == CGRA_DTYPE_INT64) {
    Fail("the vector unit computes int8, int32 and float32, not ", DTypeName(dtype),
         " (int16 is a GEMM input and a requantising EPILOGUE's output, int64 its accumulator)");
  }
  return size;
}

int32_t AccumulatorDType(int32_t input_dtype) {
  ItemSize(input_dtype);  // rejects unknown codes first, with the list of known ones
  if (input_dtype == CGRA_DTYPE_INT8) return CGRA_DTYPE_INT32;
  if (input_dtype == CGRA_DTYPE_INT16) return CGRA_DTYPE_INT64;  // int16 x int8 (16x8)
  if (input_dtype == CGRA_DTYPE_FLOAT32 || IsHalfFloat(input_dtype)) return CGRA_DTYPE_FLOAT32;
  Fail("the PE array has no ", DTypeName(input_dtype),
       " inputs (int8 accumulates in int32, int16 x int8 in int64; float32, bfloat16 and float16 in "
       "float32)");
}

void CheckEpilogueDTypes(int32_t acc_dtype, int32_t out_dtype) {
  ItemSize(acc_dtype);  // rejects unknown codes first, with the list of known ones
  ItemSize(out_dtype);
  if (IsHalfFloat(acc_dtype) && out_dtype == CGRA_DTYPE_FLOAT32) return;  // widened exactly (a cast)
  if (acc_dtype != CGRA_DTYPE_INT32 && acc_dtype != CGRA_DTYPE_INT64 && acc_dtype != CGRA_DTYPE_FLOAT32) {
    Fail(DTypeName(acc_dtype), " is not an accumulator dtype (int32, int64, float32; bfloat16 or float16 only "
         "widened to float32)");
  }
  if (acc_dtype == CGRA_DTYPE_FLOAT32 && IsHalfFloat(out_dtype)) return;  // rounded to nearest even
  if (out_dtype != acc_dtype) {
    Fail("a ", DTypeName(acc_dtype), " accumulator cannot produce ", DTypeName(out_dtype),
         ": the epilogue writes its accumulator's dtype (a float32 one also bfloat16 or float16)");
  }
}

void CheckEltwiseFunc(int32_t func) {
  switch (func) {
    case CGRA_ELTWISE_ADD:
    case CGRA_ELTWISE_SUBTRACT:
    case CGRA_ELTWISE_MULTIPLY:
    case CGRA_ELTWISE_MAXIMUM:
    case CGRA_ELTWISE_MINIMUM:
      return;
    default:
      Fail("func ", func, " is not an elementwise function (", CGRA_ELTWISE_ADD, " add, ",
           CGRA_ELTWISE_SUBTRACT, " subtract, ", CGRA_ELTWISE_MULTIPLY, " multiply, ",
           CGRA_ELTWISE_MAXIMUM, " maximum, ", CGRA_ELTWISE_MINIMUM, " minimum)");
  }
}

void CheckFillValue(int32_t dtype, int64_t value_bits) {
  int64_t lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  if (dtype == CGRA_DTYPE_INT8) {
    lo = std::numeric_limits<int8_t>::min();
    hi = std::numeric_limits<int8_t>::max();
  } else if (dtype == CGRA_DTYPE_FLOAT32) {
    hi = std::numeric_limits<uint32_t>::max();  // the bit pattern, zero- or sign-extended
  }
  if (value_bits < lo || value_bits > hi) {
    Fail("value ", value_bits, " does not fit ", DTypeName(dtype), " [", lo, ", ", hi, "]");
  }
}

void CheckFlags(int32_t flags, int32_t allowed) {
  if ((flags & ~allowed) != 0) {
    Fail("unknown flag bits 0x", std::hex, (flags & ~allowed), " (allowed: 0x", allowed, ")");
  }
}

void CheckRegion(const char* operand, Access access, int64_t addr, int64_t rows, int64_t cols,
                 int64_t stride, int64_t itemsize, int64_t spad_bytes) {
  std::string prefix = *operand ? std::string(operand) + ": " : "";
  if (rows < 1 || cols < 1) Fail(prefix, rows, " x ", cols, " region is empty");
  if (stride < 0) Fail(prefix, "row stride ", stride, " is negative");
  if (access == Access::kWrite && rows > 1 && stride < cols) {
    Fail(prefix, "row stride ", stride, " is smaller than the ", cols,
         " columns: the rows it writes would overlap");
  }
  int64_t end = Add(addr, Mul(Add(Mul(rows - 1, stride), cols), itemsize));
  CheckSpadBytes(operand, addr, end, spad_bytes);
}

void CheckWindow(const char* operand, int64_t addr, const std::array<int64_t, 5>& extents,
                 const std::array<int64_t, 5>& strides, int64_t itemsize, int64_t spad_bytes) {
  std::string prefix = std::string(operand) + ": ";
  int64_t last = 0;  // element offset of the window's last element
  for (size_t d = 0; d < extents.size(); ++d) {
    if (extents[d] < 1) Fail(prefix, "extent ", extents[d], " of dim ", d, " is not positive");
    if (strides[d] < 0) Fail(prefix, "stride ", strides[d], " of dim ", d, " is negative");
    last = Add(last, Mul(extents[d] - 1, strides[d]));
  }
  CheckSpadBytes(operand, addr, Add(addr, Mul(Add(last, 1), itemsize)), spad_bytes);
}

}  // namespace cgra
