"""Environment variables npu_backend reads, declared in one place.

Nothing reads them at import time; each is read where it is used, through the name declared here.
(CMake, which builds the runtime, still honours its own standard variables such as CXX.)
"""

#: Directory under which the CGRA runtime library is built and cached, one `runtime-<hash>/`
#: folder per version of its sources. Default: ~/.cache/npu_backend.
CGRA_RUNTIME_CACHE = "CGRA_RUNTIME_CACHE"
