/*
 * Recording-time checks, one per opcode: a command's record in, CheckFailure naming the
 * offending range out. The operands are read from the record by the generated word indices.
 */
#include "checks.h"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <string>
#include <utility>

namespace cgra {
namespace {

// DMA_LOAD and DMA_STORE share one layout: the DMA_LOAD word indices serve both.
static_assert(CGRA_DMA_STORE_SLOT == CGRA_DMA_LOAD_SLOT &&
                  CGRA_DMA_STORE_SPAD_ADDR == CGRA_DMA_LOAD_SPAD_ADDR &&
                  CGRA_DMA_STORE_ORIGIN0 == CGRA_DMA_LOAD_ORIGIN0 &&
                  CGRA_DMA_STORE_SSTRIDE3 == CGRA_DMA_LOAD_SSTRIDE3,
              "DMA_LOAD and DMA_STORE share one layout");
constexpr int kLoopWords = CGRA_DMA_LOAD_EXTENT1 - CGRA_DMA_LOAD_EXTENT0;

int64_t Origin(const int64_t* w, int d) { return w[CGRA_DMA_LOAD_ORIGIN0 + d]; }
int64_t PadLo(const int64_t* w, int d) { return w[CGRA_DMA_LOAD_PAD_LO0 + d]; }
int64_t PadHi(const int64_t* w, int d) { return w[CGRA_DMA_LOAD_PAD_HI0 + d]; }
int64_t LoopWord(const int64_t* w, int loop, int field0) { return w[field0 + loop * kLoopWords]; }

/*! \brief A code word (flags, dtype, func): the int32_t its command function took. */
int32_t Code(int64_t word) { return static_cast<int32_t>(word); }

int32_t DTypeFromDL(DLDataType t) {
  if (t.lanes == 1 && t.code == kDLInt && t.bits == 8) return CGRA_DTYPE_INT8;
  if (t.lanes == 1 && t.code == kDLInt && t.bits == 32) return CGRA_DTYPE_INT32;
  if (t.lanes == 1 && t.code == kDLInt && t.bits == 16) return CGRA_DTYPE_INT16;
  if (t.lanes == 1 && t.code == kDLInt && t.bits == 64) return CGRA_DTYPE_INT64;
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 32) return CGRA_DTYPE_FLOAT32;
  if (t.lanes == 1 && t.code == kDLBfloat && t.bits == 16) return CGRA_DTYPE_BFLOAT16;
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 16) return CGRA_DTYPE_FLOAT16;
  Fail("dtype (code ", int(t.code), ", bits ", int(t.bits), ", lanes ", t.lanes,
       ") is not supported: the NPU moves int8, int16, int32, int64, float32, bfloat16 and float16 "
       "tensors");
}

/*! \brief The box's halo words are non-negative, and dims past the tensor's rank have neither
 * an origin nor a halo. */
void CheckDmaHalo(const int64_t* w, const Slot& slot, int32_t slot_index) {
  for (int d = 0; d < CGRA_BOX_DIMS; ++d) {
    if (PadLo(w, d) < 0 || PadHi(w, d) < 0) {
      Fail("dim ", d, " has a negative halo (pad_lo ", PadLo(w, d), ", pad_hi ", PadHi(w, d), ")");
    }
    if (d >= slot.ndim && (Origin(w, d) != 0 || PadLo(w, d) != 0 || PadHi(w, d) != 0)) {
      Fail("dim ", d, " is beyond the rank ", slot.ndim, " of slot ", slot_index,
           " but has a non-zero origin or halo");
    }
  }
}

void CheckDma(const int64_t* w, const CheckContext& context) {
  int32_t slot_index = Code(w[CGRA_DMA_LOAD_SLOT]);
  if (slot_index < 0 || slot_index >= static_cast<int32_t>(context.slots.size())) {
    Fail("slot ", slot_index, " out of range [0, ", context.slots.size(), ")");
  }
  const Slot& slot = context.slots[slot_index];
  if (!slot.bound) Fail("slot ", slot_index, " is not bound");
  CheckDmaHalo(w, slot, slot_index);
  int64_t coord_lo[CGRA_BOX_DIMS], coord_hi[CGRA_BOX_DIMS];  // inclusive, per tensor dim
  for (int d = 0; d < CGRA_BOX_DIMS; ++d) coord_lo[d] = coord_hi[d] = Origin(w, d);
  int64_t last_element = 0;  // scratchpad element offset of the box's last element
  for (int l = 0; l < CGRA_BOX_DIMS; ++l) {
    int64_t extent = LoopWord(w, l, CGRA_DMA_LOAD_EXTENT0);
    int64_t tdim = LoopWord(w, l, CGRA_DMA_LOAD_TDIM0);
    int64_t tstep = LoopWord(w, l, CGRA_DMA_LOAD_TSTEP0);
    int64_t sstride = LoopWord(w, l, CGRA_DMA_LOAD_SSTRIDE0);
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
    int64_t lo = -PadLo(w, d), hi = Add(slot.shape[d], PadHi(w, d));
    if (coord_lo[d] < lo || coord_hi[d] >= hi) {
      Fail("slot ", slot_index, " dim ", d, ": coordinates [", coord_lo[d], ", ",
           Add(coord_hi[d], 1), ") leave [", lo, ", ", hi, ") (extent ", slot.shape[d],
           " with halo pad_lo ", PadLo(w, d), ", pad_hi ", PadHi(w, d), ")");
    }
  }
  int64_t spad_addr = w[CGRA_DMA_LOAD_SPAD_ADDR];
  int64_t end = Add(spad_addr, Mul(Add(last_element, 1), ItemSize(slot.dtype)));
  CheckSpadBytes("", spad_addr, end, context.spad_bytes);
}

/*! \brief The dtype an EPILOGUE reads its bias and residual in: a 16-bit float output's (widened
 * exactly to the float32 accumulator's), else the accumulator's. */
int32_t EpilogueOperandDType(const int64_t* w) {
  int32_t out_dtype = Code(w[CGRA_EPILOGUE_OUT_DTYPE]);
  return IsHalfFloat(out_dtype) ? out_dtype : Code(w[CGRA_EPILOGUE_ACC_DTYPE]);
}

/*! \brief With CGRA_EPILOGUE_REQUANTISE: int32 or float32 -> int8 or int64 -> int16 (with _DEQUANTISE int32 ->
 * int8 -> float32, a scale row of 2n), the scale row and the zero point;
 * without it: the dtypes as CheckEpilogueDTypes says and scale_addr, out_zero_point 0. */
void CheckEpilogueRequantise(const int64_t* w, int64_t spad_bytes) {
  int32_t acc_dtype = Code(w[CGRA_EPILOGUE_ACC_DTYPE]), out_dtype = Code(w[CGRA_EPILOGUE_OUT_DTYPE]);
  int64_t scale_addr = w[CGRA_EPILOGUE_SCALE_ADDR], zero_point = w[CGRA_EPILOGUE_OUT_ZERO_POINT];
  if (w[CGRA_EPILOGUE_FLAGS] & CGRA_EPILOGUE_DEQUANTISE && !(w[CGRA_EPILOGUE_FLAGS] & CGRA_EPILOGUE_REQUANTISE)) {
    Fail("CGRA_EPILOGUE_DEQUANTISE dequantises a requantised result: it needs CGRA_EPILOGUE_REQUANTISE");
  }
  if (!(w[CGRA_EPILOGUE_FLAGS] & CGRA_EPILOGUE_REQUANTISE)) {
    CheckEpilogueDTypes(acc_dtype, out_dtype);
    if (IsHalfFloat(acc_dtype) && w[CGRA_EPILOGUE_FLAGS] != 0) {
      Fail("a ", DTypeName(acc_dtype), " accumulator is only widened to float32 (a cast): flags must be 0, got ",
           w[CGRA_EPILOGUE_FLAGS]);
    }
    if (scale_addr != 0 || zero_point != 0) {
      Fail("scale_addr ", scale_addr, " / out_zero_point ", zero_point,
           " given without CGRA_EPILOGUE_REQUANTISE: a disabled operand's arguments must be 0");
    }
    return;
  }
  ItemSize(acc_dtype);  // rejects unknown codes first, with the list of known ones
  ItemSize(out_dtype);
  int64_t n = w[CGRA_EPILOGUE_N];
  if (w[CGRA_EPILOGUE_FLAGS] & CGRA_EPILOGUE_DEQUANTISE) {
    // int32 -> int8 q -> float32(q - zp) * scale[2j + 1] (stream v13): the scale row holds n pairs.
    if (acc_dtype != CGRA_DTYPE_INT32 || out_dtype != CGRA_DTYPE_FLOAT32) {
      Fail("CGRA_EPILOGUE_DEQUANTISE takes an int32 accumulator to a float32 output, not ", DTypeName(acc_dtype),
           " to ", DTypeName(out_dtype));
    }
    if (zero_point < -128 || zero_point > 127) Fail("out_zero_point ", zero_point, " does not fit int8 [-128, 127]");
    CheckRegion("scale", Access::kRead, scale_addr, 1, 2 * n, 2 * n, CGRA_DTYPE_FLOAT32_BYTES, spad_bytes);
    return;
  }
  bool wide = acc_dtype == CGRA_DTYPE_INT64 && out_dtype == CGRA_DTYPE_INT16;
  // A float32 accumulator quantises to int8 (x / scale, onnxruntime's QuantizeLinear; stream v12).
  bool to_int8 = (acc_dtype == CGRA_DTYPE_INT32 || acc_dtype == CGRA_DTYPE_FLOAT32) && out_dtype == CGRA_DTYPE_INT8;
  if (!wide && !to_int8) {
    Fail("requantisation takes an int32 or float32 accumulator to int8 or an int64 one to int16, not ",
         DTypeName(acc_dtype), " to ", DTypeName(out_dtype));
  }
  int64_t lowest = wide ? -32768 : -128, highest = wide ? 32767 : 127;
  if (zero_point < lowest || zero_point > highest) {
    Fail("out_zero_point ", zero_point, " does not fit ", DTypeName(out_dtype), " [", lowest, ", ", highest, "]");
  }
  CheckRegion("scale", Access::kRead, scale_addr, 1, n, n, CGRA_DTYPE_FLOAT32_BYTES, spad_bytes);
}

/*! \brief The residual region (with CGRA_EPILOGUE_RESIDUAL) and the clip bounds (with
 * CGRA_EPILOGUE_CLIP); a disabled operand's words must be 0. */
void CheckEpilogueResidualAndClip(const int64_t* w, int64_t spad_bytes) {
  int64_t flags = w[CGRA_EPILOGUE_FLAGS];
  int32_t acc_dtype = Code(w[CGRA_EPILOGUE_ACC_DTYPE]);
  int64_t residual_addr = w[CGRA_EPILOGUE_RESIDUAL_ADDR];
  int64_t residual_stride = w[CGRA_EPILOGUE_RESIDUAL_STRIDE];
  if (flags & CGRA_EPILOGUE_RESIDUAL) {
    CheckRegion("residual", Access::kRead, residual_addr, w[CGRA_EPILOGUE_M], w[CGRA_EPILOGUE_N],
                residual_stride, ItemSize(EpilogueOperandDType(w)), spad_bytes);
  } else if (residual_addr != 0 || residual_stride != 0) {
    Fail("residual_addr ", residual_addr, " / residual_stride ", residual_stride,
         " given without CGRA_EPILOGUE_RESIDUAL: a disabled operand's arguments must be 0");
  }
  int64_t lo = w[CGRA_EPILOGUE_CLIP_LO_BITS], hi = w[CGRA_EPILOGUE_CLIP_HI_BITS];
  if (flags & CGRA_EPILOGUE_CLIP) {
    CheckFillValue(acc_dtype, lo);
    CheckFillValue(acc_dtype, hi);
    if (acc_dtype == CGRA_DTYPE_INT32 && lo > hi) {
      Fail("clip bounds [", lo, ", ", hi, "] are not ordered");
    }
  } else if (lo != 0 || hi != 0) {
    Fail("clip bounds given without CGRA_EPILOGUE_CLIP: a disabled operand's arguments must be 0");
  }
}

}  // namespace

void ThrowKernelError(const char* kind, const std::string& message) {
  throw tvm::ffi::Error(kind, message, "");
}

const char* OpName(int32_t op) {
  switch (op) {
#define CGRA_OP_NAME_CASE(name) case CGRA_OP_##name: return #name;
    CGRA_OPS(CGRA_OP_NAME_CASE)
#undef CGRA_OP_NAME_CASE
    default: return "UNKNOWN";
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

void CheckDmaLoad(const int64_t* record, const CheckContext& context) {
  CheckFlags(Code(record[CGRA_DMA_LOAD_FLAGS]), CGRA_DMA_FILL_LOWEST);
  CheckDma(record, context);
}

void CheckDmaStore(const int64_t* record, const CheckContext& context) { CheckDma(record, context); }

void CheckGemm(const int64_t* w, const CheckContext& context) {
  CheckFlags(Code(w[CGRA_GEMM_FLAGS]), CGRA_GEMM_ACCUMULATE);
  int32_t dtype = Code(w[CGRA_GEMM_DTYPE]);
  int32_t acc_dtype = AccumulatorDType(dtype);
  int64_t m = w[CGRA_GEMM_M], n = w[CGRA_GEMM_N], k = w[CGRA_GEMM_K];
  CheckRegion("A", Access::kRead, w[CGRA_GEMM_A_ADDR], m, k, w[CGRA_GEMM_A_STRIDE],
              ItemSize(dtype), context.spad_bytes);
  int32_t b_dtype = dtype == CGRA_DTYPE_INT16 ? CGRA_DTYPE_INT8 : dtype;  // 16x8: int8 weights
  CheckRegion("B", Access::kRead, w[CGRA_GEMM_B_ADDR], k, n, w[CGRA_GEMM_B_STRIDE],
              ItemSize(b_dtype), context.spad_bytes);
  CheckRegion("acc", Access::kWrite, w[CGRA_GEMM_ACC_ADDR], m, n, w[CGRA_GEMM_ACC_STRIDE],
              ItemSize(acc_dtype), context.spad_bytes);
}

void CheckFill(const int64_t* w, const CheckContext& context) {
  int32_t dtype = Code(w[CGRA_FILL_DTYPE]);
  CheckRegion("", Access::kWrite, w[CGRA_FILL_ADDR], w[CGRA_FILL_ROWS], w[CGRA_FILL_COLS],
              w[CGRA_FILL_STRIDE], VectorItemSize(dtype), context.spad_bytes);
  CheckFillValue(dtype, w[CGRA_FILL_VALUE_BITS]);
}

void CheckEpilogue(const int64_t* w, const CheckContext& context) {
  int32_t flags = Code(w[CGRA_EPILOGUE_FLAGS]);
  CheckFlags(flags, CGRA_EPILOGUE_BIAS | CGRA_EPILOGUE_RELU | CGRA_EPILOGUE_RESIDUAL |
                        CGRA_EPILOGUE_CLIP | CGRA_EPILOGUE_REQUANTISE | CGRA_EPILOGUE_DEQUANTISE);
  CheckEpilogueRequantise(w, context.spad_bytes);
  int64_t acc_size = ItemSize(Code(w[CGRA_EPILOGUE_ACC_DTYPE]));
  int64_t m = w[CGRA_EPILOGUE_M], n = w[CGRA_EPILOGUE_N];
  CheckRegion("acc", Access::kRead, w[CGRA_EPILOGUE_ACC_ADDR], m, n, w[CGRA_EPILOGUE_ACC_STRIDE],
              acc_size, context.spad_bytes);
  if (flags & CGRA_EPILOGUE_BIAS) {
    CheckRegion("bias", Access::kRead, w[CGRA_EPILOGUE_BIAS_ADDR], 1, n, n,
                ItemSize(EpilogueOperandDType(w)), context.spad_bytes);
  }
  CheckEpilogueResidualAndClip(w, context.spad_bytes);
  CheckRegion("out", Access::kWrite, w[CGRA_EPILOGUE_OUT_ADDR], m, n, w[CGRA_EPILOGUE_OUT_STRIDE],
              ItemSize(Code(w[CGRA_EPILOGUE_OUT_DTYPE])), context.spad_bytes);
}

void CheckDepthwise(const int64_t* w, const CheckContext& context) {
  CheckFlags(Code(w[CGRA_DEPTHWISE_FLAGS]), CGRA_GEMM_ACCUMULATE);
  int32_t dtype = Code(w[CGRA_DEPTHWISE_DTYPE]);
  int32_t acc_dtype = AccumulatorDType(dtype);
  if (dtype == CGRA_DTYPE_INT16) Fail("DEPTHWISE has no int16 mode (16x8 is a GEMM's)");
  int64_t oh = w[CGRA_DEPTHWISE_OH], ow = w[CGRA_DEPTHWISE_OW], n = w[CGRA_DEPTHWISE_N];
  int64_t kh = w[CGRA_DEPTHWISE_KH], kw = w[CGRA_DEPTHWISE_KW];
  int64_t acc_y = w[CGRA_DEPTHWISE_ACC_Y_STRIDE], acc_x = w[CGRA_DEPTHWISE_ACC_X_STRIDE];
  CheckWindow("A", w[CGRA_DEPTHWISE_A_ADDR], {oh, ow, kh, kw, n},
              {w[CGRA_DEPTHWISE_A_Y_STRIDE], w[CGRA_DEPTHWISE_A_X_STRIDE],
               w[CGRA_DEPTHWISE_A_RY_STRIDE], w[CGRA_DEPTHWISE_A_RX_STRIDE], 1},
              ItemSize(dtype), context.spad_bytes);
  CheckWindow("B", w[CGRA_DEPTHWISE_B_ADDR], {kh, kw, n, 1, 1},
              {w[CGRA_DEPTHWISE_B_RY_STRIDE], w[CGRA_DEPTHWISE_B_RX_STRIDE], 1, 0, 0},
              ItemSize(dtype), context.spad_bytes);
  CheckWindow("acc", w[CGRA_DEPTHWISE_ACC_ADDR], {oh, ow, n, 1, 1}, {acc_y, acc_x, 1, 0, 0},
              ItemSize(acc_dtype), context.spad_bytes);
  if ((oh > 1 && acc_y < ow * acc_x) || (ow > 1 && acc_x < n)) {
    Fail("acc: strides (y ", acc_y, ", x ", acc_x, ") overlap its elements");
  }
}

void CheckPool(const int64_t* w, const CheckContext& context) {
  int32_t flags = Code(w[CGRA_POOL_FLAGS]), dtype = Code(w[CGRA_POOL_DTYPE]);
  CheckFlags(flags, CGRA_POOL_AVERAGE);
  bool average = (flags & CGRA_POOL_AVERAGE) != 0;
  // A max pool also takes int16 (stream v11: the 16x8 mode's activations).
  int64_t itemsize = !average && dtype == CGRA_DTYPE_INT16 ? 2 : VectorItemSize(dtype);
  if (average && dtype != CGRA_DTYPE_FLOAT32) Fail("an average pools float32, not ", DTypeName(dtype));
  const std::pair<int, const char*> steps[] = {{CGRA_POOL_STRIDE_Y, "stride_y"}, {CGRA_POOL_STRIDE_X, "stride_x"},
                                               {CGRA_POOL_DILATION_Y, "dilation_y"},
                                               {CGRA_POOL_DILATION_X, "dilation_x"}};
  for (const auto& [field, name] : steps) {
    if (w[field] < 1) Fail(name, " ", w[field], " is not positive");
  }
  int64_t oh = w[CGRA_POOL_OH], ow = w[CGRA_POOL_OW], n = w[CGRA_POOL_N];
  int64_t row = w[CGRA_POOL_A_ROW_STRIDE], col = w[CGRA_POOL_A_COL_STRIDE];
  CheckWindow("A", w[CGRA_POOL_A_ADDR], {oh, ow, w[CGRA_POOL_KH], w[CGRA_POOL_KW], n},
              {Mul(w[CGRA_POOL_STRIDE_Y], row), Mul(w[CGRA_POOL_STRIDE_X], col),
               Mul(w[CGRA_POOL_DILATION_Y], row), Mul(w[CGRA_POOL_DILATION_X], col), 1},
              itemsize, context.spad_bytes);
  int64_t out_y = w[CGRA_POOL_OUT_Y_STRIDE], out_x = w[CGRA_POOL_OUT_X_STRIDE];
  CheckWindow("out", w[CGRA_POOL_OUT_ADDR], {oh, ow, n, 1, 1}, {out_y, out_x, 1, 0, 0}, itemsize,
              context.spad_bytes);
  if ((oh > 1 && out_y < Mul(ow, out_x)) || (ow > 1 && out_x < n)) {
    Fail("out: strides (y ", out_y, ", x ", out_x, ") overlap its elements");
  }
  for (int first : {CGRA_POOL_VALID_Y_LO, CGRA_POOL_VALID_X_LO, CGRA_POOL_COUNT_Y_LO, CGRA_POOL_COUNT_X_LO}) {
    int64_t lo = w[first], hi = w[first + 1];
    const char* name = first < CGRA_POOL_COUNT_Y_LO ? "valid" : "count";
    const char* axis = (first - CGRA_POOL_VALID_Y_LO) % 4 == 0 ? "y" : "x";
    if (lo < 0 || lo > hi) Fail(name, " rectangle ", axis, " range [", lo, ", ", hi, ") is not 0 <= lo <= hi");
    if (!average && first >= CGRA_POOL_COUNT_Y_LO && (lo != 0 || hi != 0)) {
      Fail("count words are set but POOL_AVERAGE is off: words of a disabled operand must be 0");
    }
  }
}

void CheckEltwise(const int64_t* w, const CheckContext& context) {
  CheckEltwiseFunc(Code(w[CGRA_ELTWISE_FUNC]));
  int64_t itemsize = ItemSize(Code(w[CGRA_ELTWISE_DTYPE]));  // 16-bit floats too, via float32
  int64_t rows = w[CGRA_ELTWISE_ROWS], cols = w[CGRA_ELTWISE_COLS];
  CheckWindow("A", w[CGRA_ELTWISE_A_ADDR], {rows, cols, 1, 1, 1},
              {w[CGRA_ELTWISE_A_ROW_STRIDE], w[CGRA_ELTWISE_A_COL_STRIDE], 0, 0, 0}, itemsize,
              context.spad_bytes);
  CheckWindow("B", w[CGRA_ELTWISE_B_ADDR], {rows, cols, 1, 1, 1},
              {w[CGRA_ELTWISE_B_ROW_STRIDE], w[CGRA_ELTWISE_B_COL_STRIDE], 0, 0, 0}, itemsize,
              context.spad_bytes);
  CheckRegion("out", Access::kWrite, w[CGRA_ELTWISE_OUT_ADDR], rows, cols,
              w[CGRA_ELTWISE_OUT_STRIDE], itemsize, context.spad_bytes);
}

namespace {

/*! \brief One FABRIC body node's word: a known op; operands A, B (only with FABRIC_INPUT_B), an
 * earlier node, or (second only) the immediate; immediate bits only where read; shifts int32 by
 * 0..31. Returns whether the node reads B. */
bool CheckBodyNode(int64_t word, int index, int32_t dtype, bool input_b) {
  uint64_t bits = static_cast<uint64_t>(word);
  int op = static_cast<int>(bits & 0xFF);
  int refs[2] = {static_cast<int>((bits >> 8) & 0xFF), static_cast<int>((bits >> 16) & 0xFF)};
  uint32_t imm = static_cast<uint32_t>(bits >> 32);
  if (op < CGRA_BODY_ADD || op > CGRA_BODY_SHL) {
    Fail("body node ", index, ": op code ", op, " is not one of ", CGRA_BODY_ADD, " add .. ", CGRA_BODY_SHL,
         " shl");
  }
  if (bits & 0xFF000000ULL) Fail("body node ", index, ": bits 24..31 are reserved and must be 0");
  bool reads_b = false;
  for (int k = 0; k < 2; ++k) {
    int ref = refs[k];
    if (ref == CGRA_BODY_IMMEDIATE && k == 1) continue;
    if (ref == CGRA_BODY_INPUT_B && input_b) {
      reads_b = true;
      continue;
    }
    if (ref == CGRA_BODY_INPUT_A || (ref >= CGRA_BODY_FIRST_NODE && ref < CGRA_BODY_FIRST_NODE + index)) continue;
    Fail("body node ", index, ": operand ", k, " reference ", ref, " is not input A (", CGRA_BODY_INPUT_A, ")",
         input_b ? ", input B (" + std::to_string(CGRA_BODY_INPUT_B) + ")" : std::string(),
         k == 1 ? ", the immediate (" + std::to_string(CGRA_BODY_IMMEDIATE) + ")" : std::string(),
         " or an earlier node (", CGRA_BODY_FIRST_NODE, " + node index)");
  }
  if (imm != 0 && refs[1] != CGRA_BODY_IMMEDIATE) {
    Fail("body node ", index, ": immediate bits are set but no operand reads the immediate");
  }
  if ((op == CGRA_BODY_SHR || op == CGRA_BODY_SHL) &&
      (dtype != CGRA_DTYPE_INT32 || refs[1] != CGRA_BODY_IMMEDIATE || imm > 31)) {
    Fail("body node ", index, ": shifts take an int32 and an immediate 0..31");
  }
  return reads_b;
}

}  // namespace

void CheckReduce(const int64_t* w, const CheckContext& context) {
  CheckFlags(Code(w[CGRA_REDUCE_FLAGS]), 0);
  int32_t func = Code(w[CGRA_REDUCE_FUNC]);
  if (func != CGRA_REDUCE_SUM && func != CGRA_REDUCE_MAX && func != CGRA_REDUCE_SUM_SQUARES) {
    Fail("func ", func, " is not a reduction (", CGRA_REDUCE_SUM, " sum, ", CGRA_REDUCE_MAX, " max, ",
         CGRA_REDUCE_SUM_SQUARES, " sum of squares)");
  }
  if (Code(w[CGRA_REDUCE_DTYPE]) != CGRA_DTYPE_FLOAT32) {
    Fail("dtype code ", w[CGRA_REDUCE_DTYPE], " is not float32 (", CGRA_DTYPE_FLOAT32, "): REDUCE folds float32");
  }
  int64_t rows = w[CGRA_REDUCE_ROWS], cols = w[CGRA_REDUCE_COLS];
  CheckWindow("A", w[CGRA_REDUCE_A_ADDR], {rows, cols, 1, 1, 1},
              {w[CGRA_REDUCE_A_ROW_STRIDE], w[CGRA_REDUCE_A_COL_STRIDE], 0, 0, 0}, CGRA_DTYPE_FLOAT32_BYTES,
              context.spad_bytes);
  CheckRegion("out", Access::kWrite, w[CGRA_REDUCE_OUT_ADDR], rows, 1, w[CGRA_REDUCE_OUT_STRIDE],
              CGRA_DTYPE_FLOAT32_BYTES, context.spad_bytes);
}

void CheckVfunc(const int64_t* w, const CheckContext& context) {
  int32_t flags = Code(w[CGRA_VFUNC_FLAGS]);
  CheckFlags(flags, CGRA_VFUNC_SCALE | CGRA_VFUNC_OFFSET | CGRA_VFUNC_FLOAT32_IN | CGRA_VFUNC_FLOAT32_OUT);
  int32_t func = Code(w[CGRA_VFUNC_FUNC]);
  if (func < CGRA_VFUNC_IDENTITY || func > CGRA_VFUNC_GELU_TANH) {
    Fail("func ", func, " is not a special function (", CGRA_VFUNC_IDENTITY, " identity .. ", CGRA_VFUNC_GELU_TANH,
         " gelu_tanh)");
  }
  int32_t dtype = Code(w[CGRA_VFUNC_DTYPE]);
  if (dtype != CGRA_DTYPE_FLOAT32 && !IsHalfFloat(dtype)) {
    Fail("dtype code ", w[CGRA_VFUNC_DTYPE], " is not float32 (", CGRA_DTYPE_FLOAT32, "), bfloat16 (",
         CGRA_DTYPE_BFLOAT16, ") or float16 (", CGRA_DTYPE_FLOAT16, "): VFUNC computes float32");
  }
  if (dtype == CGRA_DTYPE_FLOAT32 && (flags & (CGRA_VFUNC_FLOAT32_IN | CGRA_VFUNC_FLOAT32_OUT))) {
    Fail("CGRA_VFUNC_FLOAT32_IN / CGRA_VFUNC_FLOAT32_OUT keep an operand float32 beside a 16-bit float dtype: "
         "dtype float32 takes neither");
  }
  if (!(flags & CGRA_VFUNC_SCALE) && w[CGRA_VFUNC_SCALE_BITS] != 0) {
    Fail("scale_bits are set but CGRA_VFUNC_SCALE is off: a disabled operand's arguments must be 0");
  }
  if (!(flags & CGRA_VFUNC_OFFSET) && w[CGRA_VFUNC_OFFSET_BITS] != 0) {
    Fail("offset_bits are set but CGRA_VFUNC_OFFSET is off: a disabled operand's arguments must be 0");
  }
  int64_t a_size = (flags & CGRA_VFUNC_FLOAT32_IN) ? CGRA_DTYPE_FLOAT32_BYTES : ItemSize(dtype);
  int64_t out_size = (flags & CGRA_VFUNC_FLOAT32_OUT) ? CGRA_DTYPE_FLOAT32_BYTES : ItemSize(dtype);
  int64_t rows = w[CGRA_VFUNC_ROWS], cols = w[CGRA_VFUNC_COLS];
  CheckWindow("A", w[CGRA_VFUNC_A_ADDR], {rows, cols, 1, 1, 1},
              {w[CGRA_VFUNC_A_ROW_STRIDE], w[CGRA_VFUNC_A_COL_STRIDE], 0, 0, 0}, a_size, context.spad_bytes);
  CheckRegion("out", Access::kWrite, w[CGRA_VFUNC_OUT_ADDR], rows, cols, w[CGRA_VFUNC_OUT_STRIDE], out_size,
              context.spad_bytes);
}

void CheckUnpack4(const int64_t* w, const CheckContext& context) {
  int32_t flags = Code(w[CGRA_UNPACK4_FLAGS]);
  CheckFlags(flags, CGRA_UNPACK4_ZERO_POINTS | CGRA_UNPACK4_INT8);
  int64_t rows = w[CGRA_UNPACK4_ROWS], cols = w[CGRA_UNPACK4_COLS], group = w[CGRA_UNPACK4_GROUP];
  if (rows < 1 || cols < 1 || group < 1) Fail("rows ", rows, ", cols ", cols, " and group ", group, " must be >= 1");
  int64_t groups = (rows + group - 1) / group;
  auto columns = [&](const char* name, int64_t addr, int64_t per_col, int64_t stride, int64_t itemsize) {
    if (stride < per_col) Fail(name, " column stride ", stride, " is smaller than a column's ", per_col, " elements");
    CheckRegion(name, Access::kRead, addr, cols, per_col, stride, itemsize, context.spad_bytes);
  };
  columns("A", w[CGRA_UNPACK4_A_ADDR], (rows + 1) / 2, w[CGRA_UNPACK4_A_COL_STRIDE], 1);
  if (flags & CGRA_UNPACK4_INT8) {
    if ((flags & CGRA_UNPACK4_ZERO_POINTS) || w[CGRA_UNPACK4_ZERO_ADDR] || w[CGRA_UNPACK4_ZERO_COL_STRIDE]) {
      Fail("CGRA_UNPACK4_INT8 takes no zero points: CGRA_UNPACK4_ZERO_POINTS must be off and zero_addr, "
           "zero_col_stride 0 (the scale arguments are not read)");
    }
    CheckRegion("out", Access::kWrite, w[CGRA_UNPACK4_OUT_ADDR], rows, cols, w[CGRA_UNPACK4_OUT_STRIDE], 1,
                context.spad_bytes);
    return;
  }
  columns("scale", w[CGRA_UNPACK4_SCALE_ADDR], groups, w[CGRA_UNPACK4_SCALE_COL_STRIDE], CGRA_DTYPE_FLOAT32_BYTES);
  if (flags & CGRA_UNPACK4_ZERO_POINTS) {
    columns("zero", w[CGRA_UNPACK4_ZERO_ADDR], (groups + 1) / 2, w[CGRA_UNPACK4_ZERO_COL_STRIDE], 1);
  } else if (w[CGRA_UNPACK4_ZERO_ADDR] || w[CGRA_UNPACK4_ZERO_COL_STRIDE]) {
    Fail("zero_addr / zero_col_stride are set but CGRA_UNPACK4_ZERO_POINTS is off: a disabled operand's "
         "arguments must be 0");
  }
  CheckRegion("out", Access::kWrite, w[CGRA_UNPACK4_OUT_ADDR], rows, cols, w[CGRA_UNPACK4_OUT_STRIDE],
              CGRA_DTYPE_FLOAT32_BYTES, context.spad_bytes);
}

void CheckLookup(const int64_t* w, const CheckContext& context) {
  int64_t rows = w[CGRA_LOOKUP_ROWS], cols = w[CGRA_LOOKUP_COLS];
  if (rows < 1 || cols < 1) Fail("rows ", rows, " and cols ", cols, " must be >= 1");
  CheckRegion("A", Access::kRead, w[CGRA_LOOKUP_A_ADDR], rows, cols, w[CGRA_LOOKUP_A_STRIDE], 1, context.spad_bytes);
  CheckRegion("table", Access::kRead, w[CGRA_LOOKUP_TABLE_ADDR], 1, 256, 256, 1, context.spad_bytes);
  CheckRegion("out", Access::kWrite, w[CGRA_LOOKUP_OUT_ADDR], rows, cols, w[CGRA_LOOKUP_OUT_STRIDE], 1,
              context.spad_bytes);
}

void CheckFabric(const int64_t* w, const CheckContext& context) {
  int32_t flags = Code(w[CGRA_FABRIC_FLAGS]), dtype = Code(w[CGRA_FABRIC_DTYPE]);
  CheckFlags(flags, CGRA_FABRIC_INPUT_B | CGRA_FABRIC_INT8);
  if (dtype != CGRA_DTYPE_INT32 && dtype != CGRA_DTYPE_FLOAT32) {
    Fail("dtype code ", dtype, " is not one the fabric computes (", CGRA_DTYPE_INT32, " int32, ",
         CGRA_DTYPE_FLOAT32, " float32)");
  }
  bool int8 = flags & CGRA_FABRIC_INT8;  // A, B and out hold int8 around the body's dtype
  bool input_b = flags & CGRA_FABRIC_INPUT_B;
  int64_t nodes = w[CGRA_FABRIC_NODES];
  if (nodes < 1 || nodes > CGRA_BODY_MAX_NODES) Fail("nodes ", nodes, " is not 1..", CGRA_BODY_MAX_NODES);
  bool reads_b = false;
  for (int i = 0; i < CGRA_BODY_MAX_NODES; ++i) {
    int64_t word = w[CGRA_FABRIC_NODE0 + i];
    if (i >= nodes) {
      if (word != 0) Fail("node words past nodes = ", nodes, " must be 0");
      continue;
    }
    reads_b |= CheckBodyNode(word, i, dtype, input_b);
  }
  if (input_b && !reads_b) Fail("the command streams B (FABRIC_INPUT_B) but the body never reads it");
  int64_t itemsize = int8 ? ItemSize(CGRA_DTYPE_INT8) : ItemSize(dtype);
  int64_t rows = w[CGRA_FABRIC_ROWS], cols = w[CGRA_FABRIC_COLS];
  CheckWindow("A", w[CGRA_FABRIC_A_ADDR], {rows, cols, 1, 1, 1},
              {w[CGRA_FABRIC_A_ROW_STRIDE], w[CGRA_FABRIC_A_COL_STRIDE], 0, 0, 0}, itemsize, context.spad_bytes);
  if (input_b) {
    CheckWindow("B", w[CGRA_FABRIC_B_ADDR], {rows, cols, 1, 1, 1},
                {w[CGRA_FABRIC_B_ROW_STRIDE], w[CGRA_FABRIC_B_COL_STRIDE], 0, 0, 0}, itemsize, context.spad_bytes);
  } else if (w[CGRA_FABRIC_B_ADDR] || w[CGRA_FABRIC_B_ROW_STRIDE] || w[CGRA_FABRIC_B_COL_STRIDE]) {
    Fail("B's words are set but FABRIC_INPUT_B is off: words of a disabled operand must be 0");
  }
  CheckRegion("out", Access::kWrite, w[CGRA_FABRIC_OUT_ADDR], rows, cols, w[CGRA_FABRIC_OUT_STRIDE], itemsize,
              context.spad_bytes);
}

}  // namespace cgra
