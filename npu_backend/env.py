"""Environment variables npu_backend reads, declared in one place.

Each is read where it is used, through the name declared here; CGRA_RUNTIME_CACHE when the
runtime library is loaded, which `import npu_backend` does; the kernel cache's each time a model
is compiled. (CMake, which builds the runtime, still honours its own standard variables such as CXX.)
"""

#: Directory under which the CGRA runtime library is built and cached, one `runtime-<hash>/`
#: folder per version of its sources. Default: ~/.cache/npu_backend.
CGRA_RUNTIME_CACHE = "CGRA_RUNTIME_CACHE"

#: Folder of the persistent kernel cache (device/kernel_cache.py), or "off" to compile every
#: kernel. Default: `kernels/` in the runtime's cache folder.
CGRA_KERNEL_CACHE = "CGRA_KERNEL_CACHE"

#: Size limit of the kernel cache in megabytes (default 1024); least recently used entries go.
CGRA_KERNEL_CACHE_MB = "CGRA_KERNEL_CACHE_MB"

#: Worker processes that compile a model's kernels side by side (target/parallel.py). Default:
#: the cores this process may use; 1 compiles every kernel in the compiling process.
CGRA_COMPILE_JOBS = "CGRA_COMPILE_JOBS"
