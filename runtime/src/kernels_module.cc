/*
 * The compiled kernels of one model as a runtime module: their object and, linked from it, a
 * shared library held in memory.
 *
 * The compiler links its kernels' object into a shared library (npu_backend/target/relax_ext.py)
 * and hands both to `cgra.KernelsModule`. The module loads the library at once, so the VM runs the
 * executable as it is (kRunnable: no export and reload of the whole executable before the first
 * call), and `export_library` links the object into the exported library like TVM's own host code
 * (kCompilationExportable), so a loaded library needs nothing from this module: a kernel is the
 * library's `__tvm_ffi_<name>`, in tvm-ffi's calling convention, whose `cgra_*` calls resolve to
 * this runtime (loaded RTLD_GLOBAL by `import npu_backend`; docs/runtime-abi.md).
 */
#include <dlfcn.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/string.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace cgra {
namespace {

namespace ffi = tvm::ffi;

constexpr const char* kKind = "cgra_kernels";

/*! \brief Writes `bytes` to a temporary file, dlopens it and removes the file (the mapping stays). */
void* LoadLibraryBytes(const std::string& bytes) {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir && *dir ? dir : "/tmp") + "/cgra_kernels_XXXXXX";
  int fd = mkstemp(path.data());
  if (fd < 0) {
    TVM_FFI_THROW(RuntimeError) << "cgra kernels: cannot create a temporary file in "
                                << (dir && *dir ? dir : "/tmp") << " to load the kernels from "
                                << "(set TMPDIR to a writable folder)";
  }
  size_t written = 0;
  while (written < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + written, bytes.size() - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  close(fd);
  if (written != bytes.size()) {
    unlink(path.c_str());
    TVM_FFI_THROW(RuntimeError) << "cgra kernels: could not write the kernels' library to " << path
                                << " (disk full?)";
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  unlink(path.c_str());
  if (handle == nullptr) {
    const char* reason = dlerror();
    TVM_FFI_THROW(RuntimeError) << "cgra kernels: the compiled kernels do not load: "
                                << (reason ? reason : "unknown dlopen error")
                                << " (a damaged or mismatched artifact: compile the model again)";
  }
  return handle;
}

class KernelsModuleObj : public ffi::ModuleObj {
 public:
  KernelsModuleObj(std::string object, const std::string& library) : object_(std::move(object)) {
    handle_ = LoadLibraryBytes(library);
  }
  // The library stays loaded for the life of the process: a kernel's function may outlive the
  // module (the VM keeps the functions it looked up).

  const char* kind() const final { return kKind; }

  int GetPropertyMask() const final {
    return ffi::Module::kRunnable | ffi::Module::kCompilationExportable;
  }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    std::string symbol = std::string(ffi::symbol::tvm_ffi_symbol_prefix) + std::string(name);
    void* address = dlsym(handle_, symbol.c_str());
    if (address == nullptr) return std::nullopt;
    return ffi::Function::FromExternC(nullptr, reinterpret_cast<TVMFFISafeCallType>(address), nullptr);
  }

  ffi::Array<ffi::String> GetWriteFormats() const final { return {"o"}; }

  void WriteToFile(const ffi::String& file_name, const ffi::String& format) const final {
    std::FILE* out = std::fopen(std::string(file_name).c_str(), "wb");
    bool written = out != nullptr && std::fwrite(object_.data(), 1, object_.size(), out) == object_.size();
    if (out != nullptr && std::fclose(out) != 0) written = false;
    if (!written) {
      TVM_FFI_THROW(RuntimeError) << "cgra kernels: could not write their object to "
                                  << std::string(file_name) << " (disk full, or a folder that is not writable?)";
    }
  }

 private:
  std::string object_;
  void* handle_{nullptr};
};

ffi::Module Create(const ffi::Bytes& object, const ffi::Bytes& library) {
  return ffi::Module(ffi::make_object<KernelsModuleObj>(std::string(object.data(), object.size()),
                                                        std::string(library.data(), library.size())));
}

}  // namespace
}  // namespace cgra

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def("cgra.KernelsModule", cgra::Create);
}
