/*
 * The CGRA NPU runtime's C API: what compiled kernels call to drive the NPU.
 *
 * The contract (checks, error reporting, the hand-off to the device backend) is
 * docs/runtime-abi.md. This header declares the kernel lifecycle (begin, bind, end) and includes
 * the command functions' prototypes, generated at build time. Every function is safe to call from
 * code without unwind information: no C++ exception escapes, errors are reported as -1 (or NULL)
 * with the tvm-ffi error set.
 */
#ifndef CGRA_RUNTIME_H_
#define CGRA_RUNTIME_H_

#include <dlpack/dlpack.h>
#include <stdint.h>

#include "cgra_arg_checks.h" /* cgra_check_tensor_arg, and CGRA_RUNTIME_API */

#define CGRA_RUNTIME_ABI_VERSION 10

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CGRAKernel CGRAKernel; /* opaque: one kernel launch being recorded */

/* Starts recording one kernel launch with `num_slots` host tensors.
 * kernel_name: the kernel's symbol; source_ops: comma-separated model ops it came from;
 * arch_json: the canonical JSON of the hardware description the code was compiled for;
 * spad_bytes: that description's scratchpad size (used by the bounds checks);
 * abi_version: CGRA_RUNTIME_ABI_VERSION the code was compiled against (a mismatch is refused);
 * macs_per_output, macs_divisor: the model operator's multiply-accumulates per element of the
 * output (the last slot), without the padding the PE array computes, as the fraction
 * macs_per_output / macs_divisor (a fused depthwise + 1x1 conv2d: C (9 + F) / F); -1 when the
 * kernel does not know them. (ABI v7 added the divisor.)
 * Returns NULL with the FFI error set on failure. */
CGRA_RUNTIME_API CGRAKernel* cgra_kernel_begin(const char* kernel_name, const char* source_ops,
                                               const char* arch_json, int64_t spad_bytes,
                                               int32_t abi_version, int32_t num_slots,
                                               int64_t macs_per_output, int64_t macs_divisor);

/* Binds host tensor `slot` (0 <= slot < num_slots): a compact CPU DLTensor of rank <= 4. */
CGRA_RUNTIME_API int32_t cgra_kernel_bind(CGRAKernel* k, int32_t slot, DLTensor* tensor);

/* The command functions, one per opcode (cgra_dma_load, cgra_gemm, ...): each records one command
 * of the stream and returns 0, or -1 with the FFI error set. Their prototypes are generated at
 * build time from simulator/cgra_sim/isa.py (COMMAND_FUNCTIONS) into the build's
 * gen/cgra_commands.h. */
#include "cgra_commands.h"

/* Submits the stream, waits for the device, frees k. Returns 0, or -1 with the FFI error set.
 * If an earlier call on k failed, it returns -1 and keeps that first error. Always frees k. */
CGRA_RUNTIME_API int32_t cgra_kernel_end(CGRAKernel* k);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* CGRA_RUNTIME_H_ */
