"""The persistent kernel cache: each compiled kernel's LLVM module on disk, shared by every process.

Stage: codegen (the target hook, target/relax_ext.py), and partition for its plans. A kernel
compiled once (by this process or any other, with the same compiler) is not scheduled, lowered
or emitted again: its LLVM bitcode is read back and linked with the others. In: a key made by
`kernel_key` from everything the kernel's code depends on: the compiler's version
(`compiler_version`: a hash of its own sources and of the tvm, tvm-ffi and llvmlite versions),
the kernel's spec, the hardware description, the compile options, and the kernel's exported
name and attributes (they are inside its code). Out: the bitcode, or None.

Entries live in `<cache>/kernels/` (CGRA_KERNEL_CACHE, else the runtime's cache folder,
`~/.cache/npu_backend`), one file per kernel (`.kernel`) and one per set of kernels a module
linked (`.linked`: the object and the shared library, keyed by the kernels' keys), one per module
partitioned (`.plan`: the patterns that made its groups, partition/plans.py): a magic line,
the payload's SHA-256 and the payload. Two processes may use the folder at once: a file is
written under a temporary name and renamed into place (atomic), a file that disappears or fails
its checksum is a miss (and a damaged one is removed). When the folder grows past
CGRA_KERNEL_CACHE_MB (default 1024), the least recently used entries go until it is under three
quarters of that.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import tempfile
import time
from pathlib import Path

from ..env import CGRA_KERNEL_CACHE, CGRA_KERNEL_CACHE_MB

MAGIC = b"cgra-kernel-cache 1\n"
DIGEST_BYTES = 32
DEFAULT_LIMIT_MB = 1024
SUFFIX = ".kernel"
#: A set of kernels linked into one object and shared library (relax_ext.linked_key).
LINKED_SUFFIX = ".linked"
#: The patterns that made a module's groups (partition/plans.py).
PLAN_SUFFIX = ".plan"
SUFFIXES = (SUFFIX, LINKED_SUFFIX, PLAN_SUFFIX)
#: A temporary file older than this was left by a process that died while writing it.
STALE_TEMPORARY_S = 3600.0


class KernelCache:
    """A folder of kernels' bitcode, by key; at most `max_bytes` after `evict()`."""

    def __init__(self, directory: os.PathLike | str, max_bytes: int):
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.hits = self.misses = 0
        self.written = 0  # entries this object stored since its last eviction walk

    def _path(self, key: str, suffix: str = SUFFIX) -> Path:
        return self.directory / f"{key}{suffix}"

    def get(self, key: str, suffix: str = SUFFIX) -> bytes | None:
        path = self._path(key, suffix)
        try:
            data = path.read_bytes()
        except OSError:  # absent, or evicted by another process in between
            self.misses += 1
            return None
        payload = data[len(MAGIC) + DIGEST_BYTES:]
        if not data.startswith(MAGIC) or data[len(MAGIC):len(MAGIC) + DIGEST_BYTES] != hashlib.sha256(payload).digest():
            _remove(path)  # damaged: compile it again
            self.misses += 1
            return None
        _touch(path)  # most recently used
        self.hits += 1
        return payload

    def put(self, key: str, payload: bytes, suffix: str = SUFFIX) -> None:
        """Store `payload` under `key` (atomically; a full disk only costs the next compile)."""
        temporary = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=SUFFIX)
            with os.fdopen(handle, "wb") as out:
                out.write(MAGIC + hashlib.sha256(payload).digest() + payload)
            os.replace(temporary, self._path(key, suffix))
            self.written += 1
        except OSError:
            if temporary is not None:
                _remove(Path(temporary))

    def evict(self) -> list[Path]:
        """Remove the least recently used entries while the folder holds more than `max_bytes`
        (down to three quarters of it), and temporary files a dead process left. Only after this
        object stored an entry: the walk stats every entry (50,000 of them at the default limit),
        and a compile that only read the cache did not make the folder grow (a process that
        wrote to it walks it)."""
        if not self.written:
            return []
        self.written = 0
        entries, total, now = [], 0, time.time()
        try:
            listing = list(os.scandir(self.directory))
        except OSError:
            return []
        for entry in listing:
            if not entry.name.endswith(SUFFIXES):
                continue
            try:
                stat = entry.stat()
            except OSError:
                continue
            if entry.name.startswith(".tmp-"):
                if now - stat.st_mtime > STALE_TEMPORARY_S:
                    _remove(Path(entry.path))
                continue
            entries.append((stat.st_mtime, stat.st_size, entry.path))
            total += stat.st_size
        removed = []
        if total > self.max_bytes:
            for _, size, path in sorted(entries):
                if total <= self.max_bytes * 3 // 4:
                    break
                _remove(Path(path))
                total -= size
                removed.append(Path(path))
        return removed

    def clear(self) -> None:
        for suffix in SUFFIXES:
            for path in self.directory.glob(f"*{suffix}") if self.directory.is_dir() else ():
                _remove(path)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def default_kernel_cache() -> KernelCache | None:
    """The cache the compiler uses: CGRA_KERNEL_CACHE's folder ("off" turns it off), else
    `<runtime cache>/kernels`; at most CGRA_KERNEL_CACHE_MB megabytes."""
    from ..device.runtime_lib import default_cache_dir

    setting = os.environ.get(CGRA_KERNEL_CACHE, "")
    if setting.lower() in ("off", "0", "no", "false"):
        return None
    directory = Path(setting) if setting else default_cache_dir() / "kernels"
    limit = os.environ.get(CGRA_KERNEL_CACHE_MB, "")
    try:
        megabytes = float(limit) if limit else DEFAULT_LIMIT_MB
    except ValueError:
        raise ValueError(f"{CGRA_KERNEL_CACHE_MB}={limit!r} is not a number of megabytes "
                         f"(unset it for the default {DEFAULT_LIMIT_MB})") from None
    return _cache_at(str(directory), int(megabytes * (1 << 20)))


@functools.cache
def _cache_at(directory: str, max_bytes: int) -> KernelCache:
    return KernelCache(directory, max_bytes)  # one per folder and limit: its hit counters add up


def kernel_key(**parts) -> str:
    """The cache key of a kernel: a hash of the compiler's version and `parts` (strings)."""
    text = json.dumps({"compiler": compiler_version(), **parts}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@functools.cache
def compiler_version() -> str:
    """A hash of the compiler's own Python sources (npu_backend, cgra_codegen, cgra_sim) and of
    the versions of the libraries it builds with: any change to either makes every key new."""
    import cgra_codegen
    import cgra_sim

    from .. import __file__ as plugin_init

    digest = hashlib.sha256()
    for distribution in ("apache-tvm", "apache-tvm-ffi", "llvmlite"):
        try:
            digest.update(f"{distribution}={importlib.metadata.version(distribution)};".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{distribution}=?;".encode())
    for package in (Path(plugin_init).parent, Path(cgra_codegen.__file__).parent, Path(cgra_sim.__file__).parent):
        for source in sorted(package.rglob("*.py")):
            digest.update(str(source.relative_to(package.parent)).encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()
