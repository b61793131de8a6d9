/*
 * Recording-time checks: operands in, CheckFailure naming the offending range out.
 * Address arithmetic is overflow-checked: the operands come from generated code and a wrapped
 * product would turn an overflow into an "in range" answer.
 */
#include "checks.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>

namespace cgra {
namespace {

// The DMA box is the record's words 4..31; these give a field's position inside it.
constexpr int kBoxFirstWord = CGRA_DMA_LOAD_ORIGIN0;
constexpr int kLoopWords = CGRA_DMA_LOAD_EXTENT1 - CGRA_DMA_LOAD_EXTENT0;
static_assert(CGRA_DMA_LOAD_SPAD_ADDR + 1 == kBoxFirstWord, "the box follows spad_addr");
static_assert(CGRA_RECORD_WORDS - kBoxFirstWord == 28, "the C API passes a 28-word box");
static_assert(CGRA_DMA_STORE_ORIGIN0 == CGRA_DMA_LOAD_ORIGIN0 &&
                  CGRA_DMA_STORE_SSTRIDE3 == CGRA_DMA_LOAD_SSTRIDE3,
              "DMA_LOAD and DMA_STORE share one layout");

int64_t Origin(const int64_t* box, int d) { return box[CGRA_DMA_LOAD_ORIGIN0 - kBoxFirstWord + d]; }
int64_t PadLo(const int64_t* box, int d) { return box[CGRA_DMA_LOAD_PAD_LO0 - kBoxFirstWord + d]; }
int64_t PadHi(const int64_t* box, int d) { return box[CGRA_DMA_LOAD_PAD_HI0 - kBoxFirstWord + d]; }
int64_t LoopWord(const int64_t* box, int loop, int field0) {
  return box[field0 - kBoxFirstWord + loop * kLoopWords];
}

template <typename... Parts>
[[noreturn]] void Fail(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw CheckFailure(os.str());
}

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
    default: return "unknown";
  }
}

int32_t DTypeFromDL(DLDataType t) {
  if (t.lanes == 1 && t.code == kDLInt && t.bits == 8) return CGRA_DTYPE_INT8;
  if (t.lanes == 1 && t.code == kDLInt && t.bits == 32) return CGRA_DTYPE_INT32;
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 32) return CGRA_DTYPE_FLOAT32;
  Fail("dtype (code ", int(t.code), ", bits ", int(t.bits), ", lanes ", t.lanes,
       ") is not supported: the NPU moves int8, int32 and float32 tensors");
}

void CheckSpadBytes(const char* operand, int64_t begin, int64_t end, int64_t spad_bytes) {
  if (begin >= 0 && end <= spad_bytes) return;
  std::string prefix = *operand ? std::string(operand) + ": " : "";
  if (begin < 0) Fail(prefix, "scratchpad bytes [", begin, ", ", end, ") start below address 0");
  Fail(prefix, "scratchpad bytes [", begin, ", ", end, ") exceed the ", spad_bytes,
       "-byte scratchpad");
}

}  // namespace

void ThrowKernelError(const char* kind, const std::string& message) {
  throw tvm::ffi::Error(kind, message, "");
}

const char* OpName(int32_t op) {
  switch (op) {
    case CGRA_OP_DMA_LOAD: return "DMA_LOAD";
    case CGRA_OP_DMA_STORE: return "DMA_STORE";
    case CGRA_OP_GEMM: return "GEMM";
    case CGRA_OP_FILL: return "FILL";
    case CGRA_OP_EPILOGUE: return "EPILOGUE";
    case CGRA_OP_DEPTHWISE: return "DEPTHWISE";
    case CGRA_OP_POOL: return "POOL";
    case CGRA_OP_ELTWISE: return "ELTWISE";
    default: return "UNKNOWN";
  }
}

int64_t ItemSize(int32_t dtype) {
  switch (dtype) {
    case CGRA_DTYPE_INT8: return CGRA_DTYPE_INT8_BYTES;
    case CGRA_DTYPE_INT32: return CGRA_DTYPE_INT32_BYTES;
    case CGRA_DTYPE_FLOAT32: return CGRA_DTYPE_FLOAT32_BYTES;
    default:
      Fail("unknown dtype code ", dtype, " (known: ", CGRA_DTYPE_INT8, " int8, ", CGRA_DTYPE_INT32,
           " int32, ", CGRA_DTYPE_FLOAT32, " float32)");
  }
}

int32_t AccumulatorDType(int32_t input_dtype) {
  ItemSize(input_dtype);  // rejects unknown codes first, with the list of known ones
  if (input_dtype == CGRA_DTYPE_INT8) return CGRA_DTYPE_INT32;
  if (input_dtype == CGRA_DTYPE_FLOAT32) return CGRA_DTYPE_FLOAT32;
  Fail("the PE array has no ", DTypeName(input_dtype),
       " inputs (int8 accumulates in int32, float32 in float32)");
}

void CheckEpilogueDTypes(int32_t acc_dtype, int32_t out_dtype) {
  ItemSize(acc_dtype);  // rejects unknown codes first, with the list of known ones
  ItemSize(out_dtype);
  if (acc_dtype != CGRA_DTYPE_INT32 && acc_dtype != CGRA_DTYPE_FLOAT32) {
    Fail(DTypeName(acc_dtype), " is not an accumulator dtype (int32, float32)");
  }
  if (out_dtype != acc_dtype) {
    Fail("a ", DTypeName(acc_dtype), " accumulator cannot produce ", DTypeName(out_dtype),
         ": the epilogue writes its accumulator's dtype");
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

void CheckEpilogueRequantise(int32_t flags, int32_t acc_dtype, int32_t out_dtype, int64_t n,
                             const EpilogueExtras& extras, int64_t spad_bytes) {
  if (!(flags & CGRA_EPILOGUE_REQUANTISE)) {
    CheckEpilogueDTypes(acc_dtype, out_dtype);
    if (extras.scale_addr != 0 || extras.out_zero_point != 0) {
      Fail("scale_addr ", extras.scale_addr, " / out_zero_point ", extras.out_zero_point,
           " given without CGRA_EPILOGUE_REQUANTISE: a disabled operand's arguments must be 0");
    }
    return;
  }
  ItemSize(acc_dtype);  // rejects unknown codes first, with the list of known ones
  ItemSize(out_dtype);
  if (acc_dtype != CGRA_DTYPE_INT32 || out_dtype != CGRA_DTYPE_INT8) {
    Fail("requantisation takes an int32 accumulator to int8, not ", DTypeName(acc_dtype), " to ",
         DTypeName(out_dtype));
  }
  if (extras.out_zero_point < -128 || extras.out_zero_point > 127) {
    Fail("out_zero_point ", extras.out_zero_point, " does not fit int8 [-128, 127]");
  }
  CheckRegion("scale", Access::kRead, extras.scale_addr, 1, n, n, CGRA_DTYPE_FLOAT32_BYTES,
              spad_bytes);
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

void CheckEpilogueExtras(int32_t flags, int32_t acc_dtype, int64_t m, int64_t n,
                         const EpilogueExtras& extras, int64_t spad_bytes) {
  if (flags & CGRA_EPILOGUE_RESIDUAL) {
    CheckRegion("residual", Access::kRead, extras.residual_addr, m, n, extras.residual_stride,
                ItemSize(acc_dtype), spad_bytes);
  } else if (extras.residual_addr != 0 || extras.residual_stride != 0) {
    Fail("residual_addr ", extras.residual_addr, " / residual_stride ", extras.residual_stride,
         " given without CGRA_EPILOGUE_RESIDUAL: a disabled operand's arguments must be 0");
  }
  if (flags & CGRA_EPILOGUE_CLIP) {
    CheckFillValue(acc_dtype, extras.clip_lo_bits);
    CheckFillValue(acc_dtype, extras.clip_hi_bits);
    if (acc_dtype == CGRA_DTYPE_INT32 && extras.clip_lo_bits > extras.clip_hi_bits) {
      Fail("clip bounds [", extras.clip_lo_bits, ", ", extras.clip_hi_bits, "] are not ordered");
    }
  } else if (extras.clip_lo_bits != 0 || extras.clip_hi_bits != 0) {
    Fail("clip bounds given without CGRA_EPILOGUE_CLIP: a disabled operand's arguments must be 0");
  }
}

Slot DescribeTensor(const DLTensor* tensor) {
  if (tensor == nullptr) Fail("tensor is NULL");
  if (tensor->device.device_type != kDLCPU) {
    Fail("tensor is on device type ", int(tensor->device.device_type),
         ", but the NPU's DMA reads host memory (CPU, device type 1)");
  }
  if (tensor->ndim < 1 || tensor->ndim > CGRA_BOX_DIMS) {
    Fail("tensor has rank ", tensor->ndim, ", the runtime takes rank 1..", CGRA_BOX_DIMS);
  }
  if (tensor->data == nullptr) Fail("tensor data is NULL");
  Slot slot;
  slot.bound = true;
  slot.dtype = DTypeFromDL(tensor->dtype);
  slot.ndim = tensor->ndim;
  slot.data_addr = Add(static_cast<int64_t>(reinterpret_cast<uintptr_t>(tensor->data)),
                       static_cast<int64_t>(tensor->byte_offset));
  int64_t expected_stride = 1;  // row-major compact strides, innermost dim first
  for (int d = tensor->ndim - 1; d >= 0; --d) {
    int64_t extent = tensor->shape[d];
    if (extent < 0) Fail("tensor dim ", d, " has negative extent ", extent);
    slot.shape[d] = extent;
    // A size-1 dim's stride is never used, and frameworks leave arbitrary values there.
    if (tensor->strides != nullptr && extent != 1 && tensor->strides[d] != expected_stride) {
      Fail("tensor is not compact: dim ", d, " has stride ", tensor->strides[d],
           " where a row-major compact tensor has ", expected_stride);
    }
    expected_stride = Mul(expected_stride, extent);
  }
  return slot;
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

void CheckPool(int32_t flags, int32_t dtype, const PoolWords& words, int64_t spad_bytes) {
  auto word = [&](int field) { return words[field - CGRA_POOL_OH]; };
  CheckFlags(flags, CGRA_POOL_AVERAGE);
  int64_t itemsize = ItemSize(dtype);
  bool average = (flags & CGRA_POOL_AVERAGE) != 0;
  if (average && dtype != CGRA_DTYPE_FLOAT32) Fail("an average pools float32, not ", DTypeName(dtype));
  const std::pair<int, const char*> steps[] = {{CGRA_POOL_STRIDE_Y, "stride_y"}, {CGRA_POOL_STRIDE_X, "stride_x"},
                                               {CGRA_POOL_DILATION_Y, "dilation_y"},
                                               {CGRA_POOL_DILATION_X, "dilation_x"}};
  for (const auto& [field, name] : steps) {
    if (word(field) < 1) Fail(name, " ", word(field), " is not positive");
  }
  int64_t oh = word(CGRA_POOL_OH), ow = word(CGRA_POOL_OW), n = word(CGRA_POOL_N);
  int64_t row = word(CGRA_POOL_A_ROW_STRIDE), col = word(CGRA_POOL_A_COL_STRIDE);
  CheckWindow("A", word(CGRA_POOL_A_ADDR), {oh, ow, word(CGRA_POOL_KH), word(CGRA_POOL_KW), n},
              {Mul(word(CGRA_POOL_STRIDE_Y), row), Mul(word(CGRA_POOL_STRIDE_X), col),
               Mul(word(CGRA_POOL_DILATION_Y), row), Mul(word(CGRA_POOL_DILATION_X), col), 1},
              itemsize, spad_bytes);
  int64_t out_y = word(CGRA_POOL_OUT_Y_STRIDE), out_x = word(CGRA_POOL_OUT_X_STRIDE);
  CheckWindow("out", word(CGRA_POOL_OUT_ADDR), {oh, ow, n, 1, 1}, {out_y, out_x, 1, 0, 0}, itemsize,
              spad_bytes);
  if ((oh > 1 && out_y < Mul(ow, out_x)) || (ow > 1 && out_x < n)) {
    Fail("out: strides (y ", out_y, ", x ", out_x, ") overlap its elements");
  }
  for (int first : {CGRA_POOL_VALID_Y_LO, CGRA_POOL_VALID_X_LO, CGRA_POOL_COUNT_Y_LO, CGRA_POOL_COUNT_X_LO}) {
    int64_t lo = word(first), hi = word(first + 1);
    const char* name = first < CGRA_POOL_COUNT_Y_LO ? "valid" : "count";
    const char* axis = (first - CGRA_POOL_VALID_Y_LO) % 4 == 0 ? "y" : "x";
    if (lo < 0 || lo > hi) Fail(name, " rectangle ", axis, " range [", lo, ", ", hi, ") is not 0 <= lo <= hi");
    if (!average && first >= CGRA_POOL_COUNT_Y_LO && (lo != 0 || hi != 0)) {
      Fail("count words are set but POOL_AVERAGE is off: words of a disabled operand must be 0");
    }
  }
}

void CheckDma(const Slot& slot, int32_t slot_index, int64_t spad_addr, const int64_t* box,
              int64_t spad_bytes) {
  if (box == nullptr) Fail("box is NULL");
  if (!slot.bound) Fail("slot ", slot_index, " is not bound");
  int64_t coord_lo[CGRA_BOX_DIMS], coord_hi[CGRA_BOX_DIMS];  // inclusive, per tensor dim
  for (int d = 0; d < CGRA_BOX_DIMS; ++d) {
    coord_lo[d] = coord_hi[d] = Origin(box, d);
    if (PadLo(box, d) < 0 || PadHi(box, d) < 0) {
      Fail("dim ", d, " has a negative halo (pad_lo ", PadLo(box, d), ", pad_hi ", PadHi(box, d),
           ")");
    }
    if (d >= slot.ndim && (Origin(box, d) != 0 || PadLo(box, d) != 0 || PadHi(box, d) != 0)) {
      Fail("dim ", d, " is beyond the rank ", slot.ndim, " of slot ", slot_index,
           " but has a non-zero origin or halo");
    }
  }
  int64_t last_element = 0;  // scratchpad element offset of the box's last element
  for (int l = 0; l < CGRA_BOX_DIMS; ++l) {
    int64_t extent = LoopWord(box, l, CGRA_DMA_LOAD_EXTENT0);
    int64_t tdim = LoopWord(box, l, CGRA_DMA_LOAD_TDIM0);
    int64_t tstep = LoopWord(box, l, CGRA_DMA_LOAD_TSTEP0);
    int64_t sstride = LoopWord(box, l, CGRA_DMA_LOAD_SSTRIDE0);
    if (extent < 1) Fail("loop ", l, " has extent ", extent, " (extents are positive)");
    if (tdim < 0 || tdim >= slot.ndim) {
      Fail("loop ", l, " walks tensor dim ", tdim, " but slot ", slot_index, " has rank ",
           slot.ndim);
    }
    if (sstride < 0) Fail("loop ", l, " has a negative scratchpad stride ", sstride);
    int64_t walk = Mul(extent - 1, tstep);
    coord_lo[tdim] = Add(coord_lo[tdim], std::min<int64_t>(walk, 0));
    coord_hi[tdim] = Add(coord_hi[tdim], std::max<int64_t>(walk, 0));
    last_element = Add(last_element, Mul(extent - 1, sstride));
  }
  for (int d = 0; d < slot.ndim; ++d) {
    int64_t lo = -PadLo(box, d), hi = Add(slot.shape[d], PadHi(box, d));
    if (coord_lo[d] < lo || coord_hi[d] >= hi) {
      Fail("slot ", slot_index, " dim ", d, ": coordinates [", coord_lo[d], ", ",
           Add(coord_hi[d], 1), ") leave [", lo, ", ", hi, ") (extent ", slot.shape[d],
           " with halo pad_lo ", PadLo(box, d), ", pad_hi ", PadHi(box, d), ")");
    }
  }
  int64_t end = Add(spad_addr, Mul(Add(last_element, 1), ItemSize(slot.dtype)));
  CheckSpadBytes("", spad_addr, end, spad_bytes);
}

}  // namespace cgra
