/*
 * Host operators the runtime carries out itself, so that TVM does not compile them per model.
 *
 * `cgra.host.concat(axis, in0, ..., inK-1, out)`: out = concatenate(in0, ..., inK-1) along
 * `axis`, in tvm-ffi's destination-passing style (the VM allocates `out`). The compiler calls it
 * for every concatenation left on the host (npu_backend/partition/host_ops.py). TVM would compile
 * each concatenation's loops into the executable's host code: DenseNet-121's 58 of them were
 * 0.45 s of its compile and 0.6 s of LLVM's JIT when the VM first loads the executable. Here each
 * input is, per index of the axes before `axis`, one contiguous run of bytes in the output, so a
 * concatenation is `outer` memcpy calls per input, for any dtype and any (also symbolic) shape.
 */
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace cgra {
namespace {

namespace ffi = tvm::ffi;

std::string ShapeText(const ffi::TensorView& tensor) {
  std::string text = "(";
  for (int i = 0; i < tensor.ndim(); ++i) text += (i ? ", " : "") + std::to_string(tensor.shape()[i]);
  return text + (tensor.ndim() == 1 ? ",)" : ")");
}

void CheckHostContiguous(const ffi::TensorView& tensor, const char* what, int index) {
  if (tensor.device().device_type != kDLCPU || !tensor.IsContiguous()) {
    TVM_FFI_THROW(ValueError) << "cgra.host.concat: " << what << " " << index
                              << " is not a contiguous host tensor";
  }
}

void Concat(ffi::PackedArgs args, ffi::Any* result) {
  if (args.size() < 3) {
    TVM_FFI_THROW(ValueError) << "cgra.host.concat takes (axis, inputs..., output): got " << args.size()
                              << " arguments";
  }
  int64_t axis = args[0].cast<int64_t>();
  ffi::TensorView out = args[args.size() - 1].cast<ffi::TensorView>();
  CheckHostContiguous(out, "output", 0);
  if (axis < 0 || axis >= out.ndim()) {
    TVM_FFI_THROW(ValueError) << "cgra.host.concat: axis " << axis << " of a rank-" << out.ndim() << " output";
  }
  size_t item = (out.dtype().bits * out.dtype().lanes + 7) / 8;
  int64_t outer = 1, inner = 1;  // elements before the axis, and per index of the axis after it
  for (int i = 0; i < axis; ++i) outer *= out.shape()[i];
  for (int i = axis + 1; i < out.ndim(); ++i) inner *= out.shape()[i];
  std::vector<ffi::TensorView> inputs;
  int64_t along = 0;
  for (int k = 1; k + 1 < args.size(); ++k) {
    ffi::TensorView in = args[k].cast<ffi::TensorView>();
    CheckHostContiguous(in, "input", k - 1);
    bool fits = in.ndim() == out.ndim() && in.dtype().code == out.dtype().code &&
                in.dtype().bits == out.dtype().bits && in.dtype().lanes == out.dtype().lanes;
    for (int i = 0; fits && i < out.ndim(); ++i) fits = i == axis || in.shape()[i] == out.shape()[i];
    if (!fits) {
      TVM_FFI_THROW(ValueError) << "cgra.host.concat: input " << k - 1 << " of shape " << ShapeText(in)
                                << " does not fit the output " << ShapeText(out) << " along axis " << axis;
    }
    along += in.shape()[axis];
    inputs.push_back(in);
  }
  if (along != out.shape()[axis]) {
    TVM_FFI_THROW(ValueError) << "cgra.host.concat: the inputs give " << along << " along axis " << axis
                              << ", the output " << ShapeText(out) << " has " << out.shape()[axis];
  }
  char* base = static_cast<char*>(out.data_ptr()) + out.byte_offset();
  size_t out_row = static_cast<size_t>(out.shape()[axis] * inner) * item;  // bytes per outer index
  size_t offset = 0;
  for (const ffi::TensorView& in : inputs) {
    const char* source = static_cast<const char*>(in.data_ptr()) + in.byte_offset();
    size_t run = static_cast<size_t>(in.shape()[axis] * inner) * item;
    for (int64_t o = 0; o < outer; ++o) std::memcpy(base + o * out_row + offset, source + o * run, run);
    offset += run;
  }
  *result = nullptr;
}

}  // namespace
}  // namespace cgra

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def_packed("cgra.host.concat", cgra::Concat);
}
