"""Builds and loads the CGRA runtime library (the C++ under runtime/) on first use.

Stage: runtime. In: the runtime's sources (CMakeLists.txt, runtime/include, runtime/src) and
cgra_sim/isa.py and cgra_sim/c_api.py (the runtime's generated sources come from them). Out: the path of
libcgra_runtime.so, built with CMake into `<cache>/runtime-<hash>/`, where the hash covers those
sources and the tvm-ffi version, and loaded with RTLD_GLOBAL so that code compiled later resolves
its `cgra_*` calls against it.

The sources are the copy that setup.py packs into a wheel (npu_backend/_runtime_src/), else the
repository checkout this package lives in: an editable install has no copy, so it builds from
the live sources and an edit triggers a rebuild.

The cache directory is ~/.cache/npu_backend unless the CGRA_RUNTIME_CACHE environment variable
names another. A build happens in a private temporary directory and is published by one atomic
rename, so processes building at the same time never see a half-written library. Each use marks
its build as recent; after a build, all but the KEEP_BUILDS most recently used are removed (a
process that has one loaded keeps its mapping), so edits and upgrades do not pile up builds.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from .. import env
from ..errors import CGRAError

#: The npu_backend package directory (this module is npu_backend/device/runtime_lib.py).
PACKAGE_DIR = Path(__file__).resolve().parent.parent
#: The checkout this package lives in when it is not installed from a wheel.
REPO_ROOT = PACKAGE_DIR.parent
#: The copy of the runtime's sources that setup.py puts into a wheel (setup.PACKAGED_SOURCES).
PACKAGED_SOURCES = PACKAGE_DIR / "_runtime_src"
LIBRARY_NAME = "libcgra_runtime.so"
KEEP_BUILDS = 4  # runtime builds kept in the cache, most recently used first
BUILD_MESSAGE = "building the CGRA runtime (first use, ~15 s)..."

_load_lock = threading.Lock()
_loaded_path: str | None = None
_loaded_library: ctypes.CDLL | None = None  # kept referenced for the life of the process


class RuntimeBuildError(CGRAError, RuntimeError):
    """The CGRA runtime library could not be built: a missing tool or source, or a compile error."""


def load_runtime() -> str:
    """Builds the runtime if needed, loads it process-wide and returns its path.

    Idempotent: after the first call it returns the same path without hashing or building.
    """
    global _loaded_path, _loaded_library
    if _loaded_path is not None:
        return _loaded_path
    with _load_lock:
        if _loaded_path is None:
            # The runtime links libtvm_ffi.so: load it through tvm_ffi first so that both share
            # one global function registry (where npu_backend registers the simulator backend).
            import tvm_ffi  # noqa: F401

            path = str(ensure_built())
            _loaded_library = ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
            _loaded_path = path
    return _loaded_path


def ensure_built(root: Path | None = None, cache: Path | None = None) -> Path:
    """The library built from the sources under `root` (default: `source_root()`), building it if
    the cache lacks it."""
    root = source_root() if root is None else Path(root)
    cache = default_cache_dir() if cache is None else Path(cache)
    target_dir = cache / f"runtime-{source_hash(root)}"
    if not (target_dir / LIBRARY_NAME).is_file():
        _build(root, target_dir)
        remove_old_builds(cache, keep=target_dir)
    else:
        _touch(target_dir)
    return target_dir / LIBRARY_NAME


def remove_old_builds(cache: Path, keep: Path | None = None, count: int = KEEP_BUILDS) -> list[Path]:
    """Removes the cache's runtime builds but the `count` most recently used (and `keep`);
    returns what it removed. Only `runtime-<16 hex digits>` folders are touched; one another
    process removes first, or cannot remove, is skipped."""
    builds = [p for p in Path(cache).glob("runtime-*") if p.is_dir() and _is_build_name(p.name)]
    builds.sort(key=_last_use, reverse=True)
    removed = []
    for build in builds[count:]:
        if keep is not None and build == keep:
            continue
        try:
            shutil.rmtree(build)
            removed.append(build)
        except OSError:
            pass
    return removed


def _is_build_name(name: str) -> bool:
    digits = name[len("runtime-"):]
    return len(digits) == 16 and all(c in "0123456789abcdef" for c in digits)


def _last_use(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass  # a read-only cache: nothing to mark


def default_cache_dir() -> Path:
    override = os.environ.get(env.CGRA_RUNTIME_CACHE)
    return Path(override) if override else Path.home() / ".cache" / "npu_backend"


def source_root() -> Path:
    """The directory holding CMakeLists.txt and runtime/: the packaged copy if there is one."""
    return PACKAGED_SOURCES if (PACKAGED_SOURCES / "CMakeLists.txt").is_file() else REPO_ROOT


#: The cgra_sim modules CMake generates the runtime's ISA header and command functions from.
GENERATOR_MODULES = ("isa.py", "c_api.py")


def generator_sources(root: Path) -> list[Path]:
    """The cgra_sim modules CMake runs when building from `root`: the checkout's
    simulator/cgra_sim if `root` has one, else the installed cgra_sim's (the same choice as
    CMakeLists.txt makes)."""
    package = Path(root) / "simulator" / "cgra_sim"
    if not (package / "isa.py").exists():
        import cgra_sim

        package = Path(cgra_sim.__file__).resolve().parent
    return [package / name for name in GENERATOR_MODULES]


def source_files(root: Path | None = None) -> list[Path]:
    """Every file the library is built from, in a stable order."""
    root = source_root() if root is None else Path(root)
    fixed = [root / "CMakeLists.txt", *generator_sources(root)]
    runtime = root / "runtime"
    for path in fixed + [runtime]:
        if not path.exists():
            raise RuntimeBuildError(
                f"the CGRA runtime sources are incomplete: {path} is missing. Reinstall "
                "npu_backend from a wheel built by its setup.py, or with `pip install -e .` from "
                "the repository")
    sources = sorted(p for p in runtime.rglob("*") if p.is_file() and p.suffix in (".h", ".cc"))
    return fixed + sources


def source_hash(root: Path | None = None) -> str:
    """Hash of the sources and the tvm-ffi version: the name of the library's cache folder."""
    import tvm_ffi

    root = source_root() if root is None else Path(root)
    digest = hashlib.sha256(f"tvm-ffi {tvm_ffi.__version__}\n".encode())
    for path in source_files(root):
        # Relative names (cgra_sim may lie outside `root`), so that moving a tree keeps its hash.
        digest.update(Path(os.path.relpath(path, root)).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _build(root: Path, target_dir: Path) -> None:
    """Builds into a temporary directory next to `target_dir`, then renames it into place."""
    cmake = _find_cmake()
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    print(BUILD_MESSAGE, file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix=f".{target_dir.name}-", dir=target_dir.parent) as tmp:
        library = _compile(cmake, root, Path(tmp) / "build")
        staged = Path(tmp) / "staged"
        staged.mkdir()
        shutil.copy2(library, staged / LIBRARY_NAME)
        try:
            os.rename(staged, target_dir)
        except OSError:
            if not (target_dir / LIBRARY_NAME).is_file():
                raise
            # Another process published the same sources first: use its library.


def _compile(cmake: str, root: Path, build_dir: Path) -> Path:
    """Configures and builds with CMake; returns the built library inside `build_dir`."""
    from tvm_ffi import libinfo

    configure = [cmake, "-S", str(root), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DPython3_EXECUTABLE={sys.executable}",
                 f"-Dtvm_ffi_ROOT={libinfo.find_cmake_path()}"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    _run(configure, "configuring")
    _run([cmake, "--build", str(build_dir), "--parallel"], "compiling")
    return build_dir / LIBRARY_NAME


def _run(command: list[str], step: str) -> None:
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode == 0:
        return
    cause = ""
    if not any(shutil.which(cxx) for cxx in ("c++", "g++", "clang++")):
        cause = (": no C++ compiler was found on PATH (looked for c++, g++, clang++). Install "
                 "one, e.g. `apt-get install g++` (Debian/Ubuntu) or Xcode's command line tools "
                 "(macOS)")
    tail = "\n".join(result.stdout.splitlines()[-40:])
    raise RuntimeBuildError(f"building the CGRA runtime failed while {step}{cause}\n"
                            f"$ {' '.join(command)}\n{tail}")


def _find_cmake() -> str:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeBuildError(
            "cmake was not found on PATH: the CGRA runtime (C++) is built with it on first use. "
            "Install it with `pip install cmake` or your system's package manager "
            "(e.g. `apt-get install cmake`).")
    return cmake
