/*
 * Recording-time checks of the CGRA runtime (docs/runtime-abi.md, "Checks made while recording"):
 * one per opcode, and the check of a tensor given to bind.
 *
 * In: one command's record (CGRA_RECORD_WORDS words in the layout of simulator/cgra_sim/isa.py;
 * a check reads its operands by the generated CGRA_<OP>_<FIELD> word indices) and the launch's
 * slots. Out: nothing, or CheckFailure naming the offending range; the caller (KernelRecorder)
 * adds the kernel and command context. Each opcode's generated command function passes its
 * Check<Op> (CheckDmaLoad for DMA_LOAD) to KernelRecorder::Record, so a new opcode needs its check
 * declared here. Pure functions: nothing here knows about kernels or the device backend.
 */
#ifndef CGRA_RUNTIME_CHECKS_H_
#define CGRA_RUNTIME_CHECKS_H_

#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cgra_isa.h"
#include "operand_checks.h"

namespace cgra {

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
  int64_t flags = 0;  // CGRA_SLOT_FLAG_* (kernel_recorder.cc sets them)
};

/*! \brief The isa name of an opcode ("DMA_LOAD"), for messages; "UNKNOWN" for other codes. */
const char* OpName(int32_t op);

/*! \brief Checks a tensor given to bind (CPU, compact, rank 1..4, known dtype); describes it. */
Slot DescribeTensor(const DLTensor* tensor);

/*! \brief What a command's check sees besides its record. */
struct CheckContext {
  const std::vector<Slot>& slots;  // the launch's host tensor slots, bound or not
  int64_t spad_bytes;              // the scratchpad size the kernel was compiled for
};

/*! \brief The check of one opcode's record. */
using CommandCheck = void (*)(const int64_t* record, const CheckContext& context);

/*!
 * \brief DMA_LOAD / DMA_STORE: the slot is in range and bound; the box (words origin0 ..
 * sstride3) has every tensor coordinate in [-pad_lo, shape + pad_hi), every loop's tdim below the
 * tensor's rank, no origin or halo in dimensions past it, positive extents, sstride >= 0, and
 * every scratchpad byte in [0, spad_bytes).
 */
void CheckDmaLoad(const int64_t* record, const CheckContext& context);
void CheckDmaStore(const int64_t* record, const CheckContext& context);

/*! \brief GEMM: flags, an input dtype with an accumulator, A (m x k) and B (k x n) read, acc
 * (m x n, accumulator dtype) written, all inside the scratchpad. */
void CheckGemm(const int64_t* record, const CheckContext& context);

/*! \brief FILL: the rows x cols region written inside the scratchpad, the value fits the dtype. */
void CheckFill(const int64_t* record, const CheckContext& context);

/*!
 * \brief EPILOGUE: flags; dtypes (the accumulator's, or int32 -> int8 with REQUANTISE: its n
 * float32 scales in the scratchpad, the zero point in [-128, 127]); acc read, bias (with BIAS)
 * and residual (with RESIDUAL) read, out written; clip bounds (with CLIP) fit the accumulator
 * dtype, int32 bounds ordered. A disabled operand's words are 0.
 */
void CheckEpilogue(const int64_t* record, const CheckContext& context);

/*! \brief DEPTHWISE: flags and dtype as for GEMM; the A, B and acc windows inside the
 * scratchpad with non-negative strides; acc's elements apart. */
void CheckDepthwise(const int64_t* record, const CheckContext& context);

/*!
 * \brief POOL: flags, dtype (an average pools float32 only), strides and dilations >= 1, the
 * window and the output inside the scratchpad, output elements apart, each rectangle
 * 0 <= lo <= hi, the count words 0 without CGRA_POOL_AVERAGE.
 */
void CheckPool(const int64_t* record, const CheckContext& context);

/*! \brief ELTWISE: a known func and dtype; A and B windows (strides >= 0, 0 broadcasts) and the
 * written out region inside the scratchpad. */
void CheckEltwise(const int64_t* record, const CheckContext& context);

/*! \brief FABRIC: flags, an int32 or float32 dtype, 1..CGRA_BODY_MAX_NODES well-formed body nodes
 * (known ops, operands reading inputs, earlier nodes or the immediate, B only with
 * CGRA_FABRIC_INPUT_B and then read), node words past `nodes` 0; the A (and B) windows and the
 * written out region inside the scratchpad. Whether the body maps onto the fabric is the
 * device's check (the simulator's decoder). */
void CheckFabric(const int64_t* record, const CheckContext& context);

/*! \brief REDUCE: no flags, a known func, float32; the A window (strides >= 0) and the written
 * out column (rows x 1) inside the scratchpad. (ABI v8.) */
void CheckReduce(const int64_t* record, const CheckContext& context);

/*! \brief VFUNC: flags CGRA_VFUNC_SCALE / _OFFSET (their value words 0 without them), a known
 * func, float32; the A window (strides >= 0) and the written out region inside the scratchpad.
 * (ABI v8.) */
void CheckVfunc(const int64_t* record, const CheckContext& context);

/*! \brief UNPACK4: flags (zero-point words 0 without CGRA_UNPACK4_ZERO_POINTS), positive sizes,
 * the packed bytes, scales and zero points read and the rows x cols float32 tile written inside
 * the scratchpad, column strides covering a column. */
void CheckUnpack4(const int64_t* record, const CheckContext& context);

/*! \brief LOOKUP: positive sizes, the int8 tile A and the 256-byte table read and the int8 tile out
 * written inside the scratchpad. (ABI v10.) */
void CheckLookup(const int64_t* record, const CheckContext& context);

}  // namespace cgra

#endif  // CGRA_RUNTIME_CHECKS_H_
