/*
 * The check of a kernel's tensor arguments (docs/runtime-abi.md), apart from cgra_runtime.h so
 * that it builds on its own: it needs tvm-ffi's C API and DLPack only, no generated header.
 */
#ifndef CGRA_ARG_CHECKS_H_
#define CGRA_ARG_CHECKS_H_

#include <dlpack/dlpack.h>
#include <stdint.h>

#if defined(_WIN32)
#define CGRA_RUNTIME_API __declspec(dllexport)
#else
#define CGRA_RUNTIME_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Checks argument `position` of a kernel's packed tvm-ffi call (`args`: its TVMFFIAny array)
 * against the parameter the kernel declares, and returns its DLTensor* (inside an ffi Tensor
 * object, or the raw DLTensor* passed). The checks, in order: a tensor (else TypeError), dtype
 * `dtype_code` / `dtype_bits` / `dtype_lanes` (named `dtype_name` in the message), `ndim`
 * dimensions, every extent of `shape` that is not -1 (-1: a symbolic extent, which the kernel
 * checks itself; `shape_text` is the declared shape for the message, e.g. "(1, 64, n, 56)"),
 * NULL or compact row-major strides (a dimension of extent 1 takes any stride), a CPU device
 * (each a ValueError). Messages start "cgra kernel '<kernel_name>': argument <position>
 * ('<param_name>'): ". Returns NULL with the FFI error set on failure. (ABI v6.) */
CGRA_RUNTIME_API DLTensor* cgra_check_tensor_arg(const void* args, int32_t position,
                                                 const char* kernel_name, const char* param_name,
                                                 const char* dtype_name, int32_t dtype_code,
                                                 int32_t dtype_bits, int32_t dtype_lanes,
                                                 int32_t ndim, const int64_t* shape,
                                                 const char* shape_text);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* CGRA_ARG_CHECKS_H_ */
