/*
 * The weights of a model's NPU kernels, held by the runtime instead of the VM executable.
 *
 * Relax keeps a weight as a constant of `main`, and TVM's VM code generation deduplicates the
 * executable's constants by hashing every one of their bytes, twice (45 ms per 100 MB: most of a
 * warm compile of VGG-19). The compiler therefore takes the constants of every call to an NPU
 * kernel out of `main` (npu_backend/device/weights.py) and hands them to this module, which
 * imports the kernels' module: the call `main` keeps names a binding, and the binding's function
 * puts the weights back at their places in the argument list before calling the kernel. The
 * tensors are the constants' own (no copy).
 *
 * The module is binary serializable: `export_library` packs its weights into the exported
 * library, and `load_module` reads them back through `ffi.Module.load_from_bytes.cgra_weights`
 * (registered when `import npu_backend` loads the runtime). docs/runtime-abi.md has the format.
 */
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "held_constants.h"

namespace cgra {
namespace {

namespace ffi = tvm::ffi;

constexpr const char* kKind = "cgra_weights";
constexpr char kMagic[8] = {'C', 'G', 'R', 'A', 'W', 'T', 'S', '1'};
constexpr size_t kAlignment = 64;  // TVM's own tensor alignment

/*! \brief One call site's kernel and the weights it takes, at their argument positions (ascending). */
struct Binding {
  std::string symbol;
  std::vector<int64_t> positions;
  std::vector<ffi::Tensor> tensors;
};

struct AlignedAlloc {
  void AllocData(DLTensor* tensor) {
    size_t size = (ffi::GetDataSize(*tensor) + kAlignment - 1) / kAlignment * kAlignment;
    tensor->data = std::aligned_alloc(kAlignment, size == 0 ? kAlignment : size);
    if (tensor->data == nullptr) TVM_FFI_THROW(RuntimeError) << "cgra weights: out of memory";
  }
  void FreeData(DLTensor* tensor) { std::free(tensor->data); }
};

class Writer {
 public:
  template <typename T>
  void Put(T value) { Raw(&value, sizeof(T)); }
  void Text(const std::string& text) {
    Put<uint64_t>(text.size());
    Raw(text.data(), text.size());
  }
  void Raw(const void* data, size_t size) { bytes_.append(static_cast<const char*>(data), size); }
  std::string& bytes() { return bytes_; }

 private:
  std::string bytes_;
};

class Reader {
 public:
  explicit Reader(const ffi::Bytes& bytes) : data_(bytes.data()), size_(bytes.size()) {}
  template <typename T>
  T Get() {
    T value;
    std::memcpy(&value, Take(sizeof(T)), sizeof(T));
    return value;
  }
  std::string Text() {
    uint64_t size = Get<uint64_t>();
    const char* data = Take(size);
    return std::string(data, size);
  }
  const char* Take(uint64_t size) {
    if (size > size_ - offset_) {
      TVM_FFI_THROW(ValueError) << "cgra weights: the library's weights end early (" << size_
                                << " bytes): a damaged or mismatched artifact; compile and export the model again";
    }
    const char* data = data_ + offset_;
    offset_ += size;
    return data;
  }

 private:
  const char* data_;
  uint64_t size_;
  uint64_t offset_{0};
};

class WeightsModuleObj : public ffi::ModuleObj {
 public:
  explicit WeightsModuleObj(std::map<std::string, Binding> bindings) : bindings_(std::move(bindings)) {
    ForEachRange(RegisterHeldConstant);  // the weights' bytes are fixed while this module lives
  }
  ~WeightsModuleObj() { ForEachRange(UnregisterHeldConstant); }

  const char* kind() const final { return kKind; }

  int GetPropertyMask() const final { return ffi::Module::kBinarySerializable | ffi::Module::kRunnable; }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    auto found = bindings_.find(std::string(name));
    if (found == bindings_.end()) return FromImports(name);  // a kernel that takes no weight
    const Binding& binding = found->second;
    ffi::Optional<ffi::Function> kernel = FromImports(binding.symbol);
    if (!kernel.has_value()) {
      TVM_FFI_THROW(RuntimeError) << "cgra weights: the kernel " << binding.symbol << " of " << std::string(name)
                                  << " is not in the library (a damaged or mismatched artifact: compile the "
                                  << "model again)";
    }
    return ffi::Function::FromPacked([kernel = *kernel, binding](ffi::PackedArgs args, ffi::Any* result) {
      size_t total = static_cast<size_t>(args.size()) + binding.tensors.size();
      std::vector<ffi::AnyView> full(total);
      size_t weight = 0, arg = 0;
      for (size_t i = 0; i < total; ++i) {
        if (weight < binding.positions.size() && binding.positions[weight] == static_cast<int64_t>(i)) {
          full[i] = binding.tensors[weight++];
        } else {
          full[i] = args[arg++];
        }
      }
      kernel.CallPacked(full.data(), static_cast<int32_t>(total), result);
    });
  }

  ffi::Bytes SaveToBytes() const final {
    Writer out;
    out.Raw(kMagic, sizeof(kMagic));
    out.Put<uint64_t>(bindings_.size());
    for (const auto& [name, binding] : bindings_) {
      out.Text(name);
      out.Text(binding.symbol);
      out.Put<uint64_t>(binding.tensors.size());
      for (size_t i = 0; i < binding.tensors.size(); ++i) {
        out.Put<int64_t>(binding.positions[i]);
        SaveTensor(binding.tensors[i], &out);
      }
    }
    return ffi::Bytes(std::move(out.bytes()));
  }

  static ffi::Module LoadFromBytes(const ffi::Bytes& bytes) {
    Reader in(bytes);
    if (std::memcmp(in.Take(sizeof(kMagic)), kMagic, sizeof(kMagic)) != 0) {
      TVM_FFI_THROW(ValueError) << "cgra weights: not a weights block of this runtime's format (a damaged or "
                                << "mismatched artifact: compile and export the model again)";
    }
    std::map<std::string, Binding> bindings;
    uint64_t count = in.Get<uint64_t>();
    for (uint64_t b = 0; b < count; ++b) {
      std::string name = in.Text();
      Binding binding;
      binding.symbol = in.Text();
      uint64_t weights = in.Get<uint64_t>();
      for (uint64_t w = 0; w < weights; ++w) {
        binding.positions.push_back(in.Get<int64_t>());
        binding.tensors.push_back(LoadTensor(&in));
      }
      bindings.emplace(std::move(name), std::move(binding));
    }
    return ffi::Module(ffi::make_object<WeightsModuleObj>(std::move(bindings)));
  }

 private:
  template <typename F>
  void ForEachRange(F f) const {
    for (const auto& [name, binding] : bindings_) {
      for (const ffi::Tensor& tensor : binding.tensors) {
        const DLTensor* view = tensor.GetDLTensorPtr();
        uintptr_t start = reinterpret_cast<uintptr_t>(view->data) + view->byte_offset;
        f(start, start + ffi::GetDataSize(*view));
      }
    }
  }

  ffi::Optional<ffi::Function> FromImports(const ffi::String& name) {
    for (const ffi::Any& imported : imports_) {
      ffi::Optional<ffi::Function> function = imported.cast<ffi::Module>()->GetFunction(name, true);
      if (function.has_value()) return function;
    }
    return std::nullopt;
  }

  static void SaveTensor(const ffi::Tensor& tensor, Writer* out) {
    const DLTensor* view = tensor.GetDLTensorPtr();
    if (view->device.device_type != kDLCPU || !tensor.IsContiguous()) {
      TVM_FFI_THROW(RuntimeError) << "cgra weights: a weight is not a contiguous host tensor";
    }
    out->Put<uint8_t>(view->dtype.code);
    out->Put<uint8_t>(view->dtype.bits);
    out->Put<uint16_t>(view->dtype.lanes);
    out->Put<int32_t>(view->ndim);
    for (int i = 0; i < view->ndim; ++i) out->Put<int64_t>(view->shape[i]);
    size_t size = ffi::GetDataSize(*view);
    out->Put<uint64_t>(size);
    out->Raw(static_cast<const char*>(view->data) + view->byte_offset, size);
  }

  static ffi::Tensor LoadTensor(Reader* in) {
    DLDataType dtype;
    dtype.code = in->Get<uint8_t>();
    dtype.bits = in->Get<uint8_t>();
    dtype.lanes = in->Get<uint16_t>();
    int32_t ndim = in->Get<int32_t>();
    if (ndim < 0 || ndim > 16) TVM_FFI_THROW(ValueError) << "cgra weights: a weight of rank " << ndim << " (damaged)";
    std::vector<int64_t> shape(ndim);
    for (auto& extent : shape) {
      extent = in->Get<int64_t>();
      if (extent < 0) TVM_FFI_THROW(ValueError) << "cgra weights: a weight of negative extent (damaged)";
    }
    uint64_t size = in->Get<uint64_t>();
    const char* data = in->Take(size);
    ffi::Tensor tensor = ffi::Tensor::FromNDAlloc(AlignedAlloc(), ffi::ShapeView(shape.data(), shape.size()), dtype,
                                                  DLDevice{kDLCPU, 0});
    if (ffi::GetDataSize(*tensor.GetDLTensorPtr()) != size) {
      TVM_FFI_THROW(ValueError) << "cgra weights: a weight's byte count does not match its shape (damaged)";
    }
    std::memcpy(tensor.data_ptr(), data, size);
    return tensor;
  }

  std::map<std::string, Binding> bindings_;
};

/*! \brief `kernels` with the weights of the calls named `names` (one entry each in the other arrays). */
ffi::Module Create(const ffi::Module& kernels, const ffi::Array<ffi::String>& names,
                   const ffi::Array<ffi::String>& symbols, const ffi::Array<ffi::Array<int64_t>>& positions,
                   const ffi::Array<ffi::Array<ffi::Tensor>>& tensors) {
  if (symbols.size() != names.size() || positions.size() != names.size() || tensors.size() != names.size()) {
    TVM_FFI_THROW(ValueError) << "cgra.WeightsModule: names, symbols, positions and tensors differ in length";
  }
  std::map<std::string, Binding> bindings;
  for (size_t i = 0; i < names.size(); ++i) {
    Binding binding;
    binding.symbol = std::string(symbols[i]);
    if (positions[i].size() != tensors[i].size()) {
      TVM_FFI_THROW(ValueError) << "cgra.WeightsModule: " << std::string(names[i]) << " has "
                                << positions[i].size() << " positions for " << tensors[i].size() << " weights";
    }
    for (size_t w = 0; w < tensors[i].size(); ++w) {
      if (w > 0 && positions[i][w] <= positions[i][w - 1]) {
        TVM_FFI_THROW(ValueError) << "cgra.WeightsModule: " << std::string(names[i])
                                  << "'s positions are not ascending";
      }
      binding.positions.push_back(positions[i][w]);
      binding.tensors.push_back(tensors[i][w]);
    }
    bindings.emplace(std::string(names[i]), std::move(binding));
  }
  ffi::Module module(ffi::make_object<WeightsModuleObj>(std::move(bindings)));
  module->ImportModule(kernels);
  return module;
}

}  // namespace
}  // namespace cgra

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def("cgra.WeightsModule", cgra::Create)
      .def("ffi.Module.load_from_bytes.cgra_weights", cgra::WeightsModuleObj::LoadFromBytes);
}
