"""Loading compiled libraries: a damaged file is refused with an error, never a crash.

Stage: runtime (Python side). `tvm.runtime.load_module` dlopens a shared library; a truncated or
overwritten ELF file makes the dynamic loader touch pages past the end of the file, and the
process dies of SIGBUS before any Python error can be raised. `import npu_backend` wraps
`load_module` so that every ELF shared object is first checked against its own headers (the ELF
header, the program headers and every loaded segment, the section header table all lie inside
the file); other files go to TVM's loader unchanged.
"""

from __future__ import annotations

import functools
import os
import struct

import tvm

from ..errors import CGRAError


class DamagedArtifact(CGRAError, ValueError):
    """A compiled library on disk is not whole (truncated, overwritten, not the file written)."""


_ELF_MAGIC = b"\x7fELF"
_PT_LOAD = 1


def check_shared_library(path: str) -> None:
    """Raise `DamagedArtifact` if the ELF file at `path` is cut short or inconsistent."""
    size = os.path.getsize(path)
    with open(path, "rb") as file:
        header = file.read(64)
        if header[:4] != _ELF_MAGIC:
            return  # not ELF: TVM's loader decides
        if len(header) < 64 or header[4] != 2 or header[5] != 1:
            _refuse(path, "its ELF header is not that of a 64-bit little-endian library")
        phoff, shoff = struct.unpack_from("<QQ", header, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 54)
        _inside(path, size, phoff, phentsize * phnum, "the program headers")
        _inside(path, size, shoff, shentsize * shnum, "the section headers")
        file.seek(phoff)
        table = file.read(phentsize * phnum)
    for index in range(phnum):
        kind, _, offset = struct.unpack_from("<IIQ", table, index * phentsize)
        filesz = struct.unpack_from("<Q", table, index * phentsize + 32)[0]
        if kind == _PT_LOAD:
            _inside(path, size, offset, filesz, f"loadable segment {index}")


def _inside(path, size, offset, length, what):
    if offset + length > size:
        _refuse(path, f"{what} end at byte {offset + length}, but the file has {size} bytes "
                "(it was truncated or overwritten)")


def _refuse(path, reason):
    raise DamagedArtifact(f"cannot load '{path}': {reason}; rebuild it with export_library")


def install_load_check() -> None:
    """Check ELF libraries in `tvm.runtime.load_module` before TVM dlopens them (idempotent)."""
    original = tvm.runtime.load_module
    if getattr(original, "_cgra_checked", False):
        return

    @functools.wraps(original)
    def load_module(path, *args, **kwargs):
        if isinstance(path, (str, os.PathLike)) and os.path.isfile(path):
            check_shared_library(os.fspath(path))
        return original(path, *args, **kwargs)

    load_module._cgra_checked = True
    tvm.runtime.load_module = load_module
    if getattr(tvm.runtime.module, "load_module", None) is original:
        tvm.runtime.module.load_module = load_module
