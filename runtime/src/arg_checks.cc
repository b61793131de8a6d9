/*
 * cgra_check_tensor_arg (runtime/include/cgra_arg_checks.h): the checks every kernel's entry ran
 * as inline LLVM IR until ABI v6, where they were half of each kernel's code and of its compile
 * time. One function now, called once per tensor argument; the messages are those the inline
 * checks printed. Depends on tvm-ffi's C API only, so that the code generator's tests can link it
 * beside their mock runtime.
 */
#include "cgra_arg_checks.h"

#include <tvm/ffi/c_api.h>

#include <string>

namespace {

const char* TypeCodeName(uint8_t code) {
  switch (code) {
    case kDLInt: return "int";
    case kDLUInt: return "uint";
    case kDLFloat: return "float";
    case kDLOpaqueHandle: return "handle";
    case kDLBfloat: return "bfloat";
    case kDLBool: return "bool";
    default: return "(unknown type code)";
  }
}

/*! \brief "(a, b, c)" */
std::string Tuple(const int64_t* values, int32_t count) {
  std::string text = "(";
  for (int32_t i = 0; i < count; ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + ")";
}

/*! \brief Sets the FFI error `kind` with the argument's message prefix; returns NULL. */
DLTensor* Fail(const char* kind, const std::string& where, const std::string& what) {
  std::string message = where + what;
  TVMFFIErrorSetRaisedFromCStr(kind, message.c_str());
  return nullptr;
}

DLTensor* Check(const TVMFFIAny* arg, const std::string& where, const char* dtype_name,
                int32_t dtype_code, int32_t dtype_bits, int32_t dtype_lanes, int32_t ndim,
                const int64_t* shape, const char* shape_text) {
  DLTensor* tensor = nullptr;
  if (arg->type_index == kTVMFFITensor) {
    tensor = TVMFFITensorGetDLTensorPtr(arg->v_obj);
  } else if (arg->type_index == kTVMFFIDLTensorPtr) {
    tensor = static_cast<DLTensor*>(arg->v_ptr);
  } else {
    return Fail("TypeError", where,
                "expected a tensor, got an FFI value of type index " + std::to_string(arg->type_index));
  }
  const DLDataType dtype = tensor->dtype;
  if (dtype.code != dtype_code || dtype.bits != dtype_bits || dtype.lanes != dtype_lanes) {
    std::string got = std::string(TypeCodeName(dtype.code)) + std::to_string(dtype.bits);
    if (dtype.lanes != 1) got += "x" + std::to_string(dtype.lanes);
    return Fail("ValueError", where, std::string("expected dtype ") + dtype_name + ", got " + got);
  }
  if (tensor->ndim != ndim) {
    return Fail("ValueError", where, "expected " + std::to_string(ndim) + " dimensions, got " +
                                         std::to_string(tensor->ndim));
  }
  for (int32_t d = 0; d < ndim; ++d) {
    if (shape[d] != -1 && tensor->shape[d] != shape[d]) {
      return Fail("ValueError", where, std::string("expected shape ") + shape_text + ", got " +
                                           Tuple(tensor->shape, ndim));
    }
  }
  if (tensor->strides != nullptr && ndim > 0) {
    int64_t expected = 1;
    for (int32_t d = ndim - 1; d >= 0; --d) {
      if (tensor->strides[d] != expected && tensor->shape[d] != 1) {
        return Fail("ValueError", where, "expected a compact row-major tensor, got strides " +
                                             Tuple(tensor->strides, ndim));
      }
      expected *= tensor->shape[d];
    }
  }
  if (tensor->device.device_type != kDLCPU) {
    return Fail("ValueError", where, "expected a CPU tensor, got device type " +
                                         std::to_string(tensor->device.device_type));
  }
  return tensor;
}

}  // namespace

extern "C" DLTensor* cgra_check_tensor_arg(const void* args, int32_t position, const char* kernel_name,
                                           const char* param_name, const char* dtype_name,
                                           int32_t dtype_code, int32_t dtype_bits,
                                           int32_t dtype_lanes, int32_t ndim, const int64_t* shape,
                                           const char* shape_text) {
  try {  // called from code without unwind information: nothing may escape
    std::string where = std::string("cgra kernel '") + kernel_name + "': argument " +
                        std::to_string(position) + " ('" + param_name + "'): ";
    return Check(static_cast<const TVMFFIAny*>(args) + position, where, dtype_name, dtype_code,
                 dtype_bits, dtype_lanes, ndim, shape, shape_text);
  } catch (...) {
    TVMFFIErrorSetRaisedFromCStr("InternalError", "unexpected C++ exception in the CGRA runtime");
    return nullptr;
  }
}
