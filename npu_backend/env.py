"""Environment variables npu_backend reads, declared in one place.

Each is read where it is used, through the name declared here; CGRA_RUNTIME_CACHE when the
runtime library is loaded, which `import npu_backend` does. (CMake, which builds the runtime,
still honours its own standard variables such as CXX.)
"""

#: Directory under which the CGRA runtime library is built and cached, one `runtime-<hash>/`
#: folder per version of its sources. Default: ~/.cache/npu_backend.
CGRA_RUNTIME_CACHE = "CGRA_RUNTIME_CACHE"
