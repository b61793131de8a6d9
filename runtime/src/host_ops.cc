/*
 * Host operators the runtime carries out itself, so that TVM does not compile them per model.
 * `cgra.host.split(axis, in, out0, ..., outK-1)` is concat's inverse (each output's extent along
 * `axis` is its slice), `cgra.host.permute_dims(in, axis0, ..., axisN-1, out)` transposes
 * (out's axis d is in's axis axis_d; elements of 1, 2, 4 or 8 bytes), both in tvm-ffi's
 * destination-passing style too.
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

void CheckHostContiguous(const ffi::TensorView& tensor, const char* op, const char* what, int index) {
  if (tensor.device().device_type != kDLCPU || !tensor.IsContiguous()) {
    TVM_FFI_THROW(ValueError) << op << ": " << what << " " << index << " is not a contiguous host tensor";
  }
}

/*!
 * \brief args[first, last) as the parts of `whole` along `axis` (concat's inputs, split's outputs):
 * each of the whole's rank and dtype, with its extents off the axis, and their extents along it
 * adding up to the whole's; otherwise a ValueError naming `op`, the part and the shapes.
 */
std::vector<ffi::TensorView> Parts(ffi::PackedArgs args, int first, int last, const ffi::TensorView& whole,
                                   int64_t axis, const char* op, const char* part, const char* whole_name) {
  std::vector<ffi::TensorView> parts;
  int64_t along = 0;
  for (int k = first; k < last; ++k) {
    ffi::TensorView tensor = args[k].cast<ffi::TensorView>();
    CheckHostContiguous(tensor, op, part, k - first);
    bool fits = tensor.ndim() == whole.ndim() && tensor.dtype().code == whole.dtype().code &&
                tensor.dtype().bits == whole.dtype().bits && tensor.dtype().lanes == whole.dtype().lanes;
    for (int i = 0; fits && i < whole.ndim(); ++i) fits = i == axis || tensor.shape()[i] == whole.shape()[i];
    if (!fits) {
      TVM_FFI_THROW(ValueError) << op << ": " << part << " " << k - first << " of shape " << ShapeText(tensor)
                                << " does not fit the " << whole_name << " " << ShapeText(whole) << " along axis "
                                << axis;
    }
    along += tensor.shape()[axis];
    parts.push_back(tensor);
  }
  if (along != whole.shape()[axis]) {
    TVM_FFI_THROW(ValueError) << op << ": the " << part << "s give " << along << " along axis " << axis << ", the "
                              << whole_name << " " << ShapeText(whole) << " has " << whole.shape()[axis];
  }
  return parts;
}

void Concat(ffi::PackedArgs args, ffi::Any* result) {
  if (args.size() < 3) {
    TVM_FFI_THROW(ValueError) << "cgra.host.concat takes (axis, inputs..., output): got " << args.size()
                              << " arguments";
  }
  int64_t axis = args[0].cast<int64_t>();
  ffi::TensorView out = args[args.size() - 1].cast<ffi::TensorView>();
  CheckHostContiguous(out, "cgra.host.concat", "output", 0);
  if (axis < 0 || axis >= out.ndim()) {
    TVM_FFI_THROW(ValueError) << "cgra.host.concat: axis " << axis << " of a rank-" << out.ndim() << " output";
  }
  size_t item = (out.dtype().bits * out.dtype().lanes + 7) / 8;
  int64_t outer = 1, inner = 1;  // elements before the axis, and per index of the axis after it
  for (int i = 0; i < axis; ++i) outer *= out.shape()[i];
  for (int i = axis + 1; i < out.ndim(); ++i) inner *= out.shape()[i];
  std::vector<ffi::TensorView> inputs =
      Parts(args, 1, args.size() - 1, out, axis, "cgra.host.concat", "input", "output");
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

void Split(ffi::PackedArgs args, ffi::Any* result) {
  if (args.size() < 3) {
    TVM_FFI_THROW(ValueError) << "cgra.host.split takes (axis, input, outputs...): got " << args.size()
                              << " arguments";
  }
  int64_t axis = args[0].cast<int64_t>();
  ffi::TensorView in = args[1].cast<ffi::TensorView>();
  CheckHostContiguous(in, "cgra.host.split", "input", 0);
  if (axis < 0 || axis >= in.ndim()) {
    TVM_FFI_THROW(ValueError) << "cgra.host.split: axis " << axis << " of a rank-" << in.ndim() << " input";
  }
  size_t item = (in.dtype().bits * in.dtype().lanes + 7) / 8;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= in.shape()[i];
  for (int i = axis + 1; i < in.ndim(); ++i) inner *= in.shape()[i];
  std::vector<ffi::TensorView> outputs = Parts(args, 2, args.size(), in, axis, "cgra.host.split", "output", "input");
  const char* base = static_cast<const char*>(in.data_ptr()) + in.byte_offset();
  size_t in_row = static_cast<size_t>(in.shape()[axis] * inner) * item;
  size_t offset = 0;
  for (const ffi::TensorView& out : outputs) {
    char* target = static_cast<char*>(out.data_ptr()) + out.byte_offset();
    size_t run = static_cast<size_t>(out.shape()[axis] * inner) * item;
    for (int64_t o = 0; o < outer; ++o) std::memcpy(target + o * run, base + o * in_row + offset, run);
    offset += run;
  }
  *result = nullptr;
}

/*! \brief out[i] = in[j] where out's axis d is in's axis perm[d], for elements of `Item`. */
template <typename Item>
void PermuteItems(const void* input, void* output, const std::vector<int64_t>& out_shape,
                  const std::vector<int64_t>& in_strides_by_out_axis) {
  const Item* in = static_cast<const Item*>(input);
  Item* out = static_cast<Item*>(output);
  int rank = static_cast<int>(out_shape.size());
  int64_t total = 1;
  for (int64_t extent : out_shape) total *= extent;
  if (total == 0) return;
  std::vector<int64_t> index(rank, 0);
  int64_t last = out_shape[rank - 1], step = in_strides_by_out_axis[rank - 1];
  int64_t source = 0;  // in's element offset of out's current index (its last axis at 0)
  for (int64_t done = 0; done < total; done += last) {
    for (int64_t i = 0; i < last; ++i) *out++ = in[source + i * step];
    for (int d = rank - 2; d >= 0; --d) {  // the next row: carry through the outer axes
      source += in_strides_by_out_axis[d];
      if (++index[d] < out_shape[d]) break;
      source -= index[d] * in_strides_by_out_axis[d];
      index[d] = 0;
    }
  }
}

void PermuteDims(ffi::PackedArgs args, ffi::Any* result) {
  if (args.size() < 2) {
    TVM_FFI_THROW(ValueError) << "cgra.host.permute_dims takes (input, axes..., output): got " << args.size()
                              << " arguments";
  }
  ffi::TensorView in = args[0].cast<ffi::TensorView>();
  ffi::TensorView out = args[args.size() - 1].cast<ffi::TensorView>();
  CheckHostContiguous(in, "cgra.host.permute_dims", "input", 0);
  CheckHostContiguous(out, "cgra.host.permute_dims", "output", 0);
  int rank = in.ndim();
  bool fits = args.size() == rank + 2 && out.ndim() == rank && out.dtype().code == in.dtype().code &&
              out.dtype().bits == in.dtype().bits && out.dtype().lanes == in.dtype().lanes;
  std::vector<int64_t> perm(rank), in_strides(rank, 1), out_shape(rank), strides_by_out(rank);
  std::vector<bool> taken(rank, false);
  for (int d = 0; fits && d < rank; ++d) {
    perm[d] = args[d + 1].cast<int64_t>();
    fits = perm[d] >= 0 && perm[d] < rank && !taken[perm[d]] && out.shape()[d] == in.shape()[perm[d]];
    if (fits) taken[perm[d]] = true;
  }
  if (!fits) {
    TVM_FFI_THROW(ValueError) << "cgra.host.permute_dims: axes that are not a permutation of the input "
                              << ShapeText(in) << " giving the output " << ShapeText(out);
  }
  size_t item = (in.dtype().bits * in.dtype().lanes + 7) / 8;
  const char* source = static_cast<const char*>(in.data_ptr()) + in.byte_offset();
  char* target = static_cast<char*>(out.data_ptr()) + out.byte_offset();
  if (rank == 0) {
    std::memcpy(target, source, item);
    *result = nullptr;
    return;
  }
  for (int d = rank - 2; d >= 0; --d) in_strides[d] = in_strides[d + 1] * in.shape()[d + 1];
  for (int d = 0; d < rank; ++d) {
    out_shape[d] = out.shape()[d];
    strides_by_out[d] = in_strides[perm[d]];
  }
  switch (item) {
    case 1: PermuteItems<uint8_t>(source, target, out_shape, strides_by_out); break;
    case 2: PermuteItems<uint16_t>(source, target, out_shape, strides_by_out); break;
    case 4: PermuteItems<uint32_t>(source, target, out_shape, strides_by_out); break;
    case 8: PermuteItems<uint64_t>(source, target, out_shape, strides_by_out); break;
    default:
      TVM_FFI_THROW(ValueError) << "cgra.host.permute_dims: elements of " << in.dtype().bits * in.dtype().lanes
                                << " bits (1, 2, 4 or 8 bytes are taken)";
  }
  *result = nullptr;
}

}  // namespace
}  // namespace cgra

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed("cgra.host.concat", cgra::Concat)
      .def_packed("cgra.host.split", cgra::Split)
      .def_packed("cgra.host.permute_dims", cgra::PermuteDims);
}
