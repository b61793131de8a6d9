/*
 * The CGRA NPU runtime's C API: what compiled kernels call to drive the NPU.
 *
 * The contract (checks, error reporting, the hand-off to the device backend) is
 * docs/runtime-abi.md. Every function is safe to call from code without unwind information:
 * no C++ exception escapes, errors are reported as -1 (or NULL) with the tvm-ffi error set.
 */
#ifndef CGRA_RUNTIME_H_
#define CGRA_RUNTIME_H_

#include <dlpack/dlpack.h>
#include <stdint.h>

#define CGRA_RUNTIME_ABI_VERSION 2

#if defined(_WIN32)
#define CGRA_RUNTIME_API __declspec(dllexport)
#else
#define CGRA_RUNTIME_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CGRAKernel CGRAKernel; /* opaque: one kernel launch being recorded */

/* Starts recording one kernel launch with `num_slots` host tensors.
 * kernel_name: the kernel's symbol; source_ops: comma-separated model ops it came from;
 * arch_json: the canonical JSON of the hardware description the code was compiled for;
 * spad_bytes: that description's scratchpad size (used by the bounds checks);
 * abi_version: CGRA_RUNTIME_ABI_VERSION the code was compiled against (a mismatch is refused).
 * Returns NULL with the FFI error set on failure. */
CGRA_RUNTIME_API CGRAKernel* cgra_kernel_begin(const char* kernel_name, const char* source_ops,
                                               const char* arch_json, int64_t spad_bytes,
                                               int32_t abi_version, int32_t num_slots);

/* Binds host tensor `slot` (0 <= slot < num_slots): a compact CPU DLTensor of rank <= 4. */
CGRA_RUNTIME_API int32_t cgra_kernel_bind(CGRAKernel* k, int32_t slot, DLTensor* tensor);

/* DMA between host tensor `slot` and the scratchpad. `box` points to 28 int64 words laid out as
 * the DMA record's words 4..31 (isa.py: origin[4], pad_lo[4], pad_hi[4], then for each of the
 * 4 loops: extent, tdim, tstep, sstride). The element type is the tensor's. */
CGRA_RUNTIME_API int32_t cgra_dma_load(CGRAKernel* k, int32_t slot, int64_t spad_addr,
                                       const int64_t* box);
CGRA_RUNTIME_API int32_t cgra_dma_store(CGRAKernel* k, int32_t slot, int64_t spad_addr,
                                        const int64_t* box);

/* PE array: acc[i,j] (+)= sum_k A[i,k] * B[k,j], i < m, j < n. dtype is the input dtype code;
 * the accumulator is int32 for int8, float32 for float32. Strides are in elements. */
CGRA_RUNTIME_API int32_t cgra_gemm(CGRAKernel* k, int32_t flags, int32_t dtype, int64_t m,
                                   int64_t n, int64_t kdim, int64_t a_addr, int64_t a_stride,
                                   int64_t b_addr, int64_t b_stride, int64_t acc_addr,
                                   int64_t acc_stride);

/* PE array, one output element per PE (a depthwise conv2d tile):
 * acc[y,x,c] (+)= sum_{ry<kh, rx<kw} A[y*a_y + x*a_x + ry*a_ry + rx*a_rx + c] * B[ry*b_ry + rx*b_rx + c]
 * for y < oh, x < ow, c < n (addresses in elements past a_addr, b_addr; acc's element at
 * y*acc_y + x*acc_x + c). dtype and flags as for cgra_gemm. */
CGRA_RUNTIME_API int32_t cgra_depthwise(CGRAKernel* k, int32_t flags, int32_t dtype, int64_t oh, int64_t ow,
                                        int64_t n, int64_t kh, int64_t kw, int64_t a_addr, int64_t a_y,
                                        int64_t a_x, int64_t a_ry, int64_t a_rx, int64_t b_addr, int64_t b_ry,
                                        int64_t b_rx, int64_t acc_addr, int64_t acc_y, int64_t acc_x);

/* Vector unit, a pooling window (max_pool2d, avg_pool2d, mean):
 * out[y,x,c] = max, or with CGRA_POOL_AVERAGE sum / count, over the taps (ry < kh, rx < kw) at
 * window position (py, px) = (y*stride_y + ry*dilation_y, x*stride_x + rx*dilation_x) that lie in
 * the valid rectangle [valid_y_lo, valid_y_hi) x [valid_x_lo, valid_x_hi), tap element
 * A[py*a_row + px*a_col + c] past a_addr; count = taps inside the count rectangle (count_*: all 0
 * without CGRA_POOL_AVERAGE). y < oh, x < ow, c < n; out's element at y*out_y + x*out_x + c.
 * dtype: int8, int32 or float32 for max, float32 for an average; out has the input dtype. */
CGRA_RUNTIME_API int32_t cgra_pool(CGRAKernel* k, int32_t flags, int32_t dtype, int64_t oh, int64_t ow,
                                   int64_t n, int64_t kh, int64_t kw, int64_t a_addr, int64_t a_row,
                                   int64_t a_col, int64_t stride_y, int64_t stride_x, int64_t dilation_y,
                                   int64_t dilation_x, int64_t out_addr, int64_t out_y, int64_t out_x,
                                   int64_t valid_y_lo, int64_t valid_y_hi, int64_t valid_x_lo,
                                   int64_t valid_x_hi, int64_t count_y_lo, int64_t count_y_hi,
                                   int64_t count_x_lo, int64_t count_x_hi);

/* Vector unit: region[i,j] = value (value_bits: the int64 value, or the float32 bit pattern). */
CGRA_RUNTIME_API int32_t cgra_fill(CGRAKernel* k, int32_t dtype, int64_t addr, int64_t rows,
                                   int64_t cols, int64_t stride, int64_t value_bits);

/* Vector unit: out[i,j] = requant(clip(relu(acc[i,j] + bias[j] + residual[i,j]))), each step
 * enabled by its flag: CGRA_EPILOGUE_BIAS, _RESIDUAL (an m x n tile, acc dtype, own stride), _RELU,
 * _CLIP (clip_lo/hi_bits: acc-dtype value bits as for cgra_fill, lo <= hi), _REQUANTISE (int32 acc
 * -> int8 out: rne(clamp(float(x) * scale[j], -128 - zp, 127 - zp)) + zp, scale a row of n float32
 * at scale_addr, zp = out_zero_point). A disabled operand's arguments must be 0. (ABI v2 added
 * the last six arguments.) */
CGRA_RUNTIME_API int32_t cgra_epilogue(CGRAKernel* k, int32_t flags, int32_t acc_dtype,
                                       int32_t out_dtype, int64_t m, int64_t n, int64_t acc_addr,
                                       int64_t acc_stride, int64_t bias_addr, int64_t out_addr,
                                       int64_t out_stride, int64_t residual_addr,
                                       int64_t residual_stride, int64_t clip_lo_bits,
                                       int64_t clip_hi_bits, int64_t scale_addr,
                                       int64_t out_zero_point);

/* Vector unit: out[i,j] = func(A[i*a_row + j*a_col], B[i*b_row + j*b_col]) for i < rows, j < cols
 * (addresses in elements past a_addr, b_addr; out's element at i*out_stride + j). func is a
 * CGRA_ELTWISE_* code (ADD, SUBTRACT, MULTIPLY, MAXIMUM, MINIMUM); a, b and out share `dtype`
 * (int8, int32 or float32; integers wrap). A stride of 0 broadcasts an operand along that axis. */
CGRA_RUNTIME_API int32_t cgra_eltwise(CGRAKernel* k, int32_t func, int32_t dtype, int64_t rows,
                                      int64_t cols, int64_t a_addr, int64_t a_row, int64_t a_col,
                                      int64_t b_addr, int64_t b_row, int64_t b_col,
                                      int64_t out_addr, int64_t out_stride);

/* Submits the stream, waits for the device, frees k. Returns 0, or -1 with the FFI error set.
 * If an earlier call on k failed, it returns -1 and keeps that first error. Always frees k. */
CGRA_RUNTIME_API int32_t cgra_kernel_end(CGRAKernel* k);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* CGRA_RUNTIME_H_ */
