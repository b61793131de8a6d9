"""Loading compiled libraries: a damaged file is refused with an error, never a crash.

Stage: runtime (Python side). `tvm.runtime.load_module` dlopens a shared library; a truncated or
overwritten ELF file makes the dynamic loader touch pages past the end of the file, and the
process dies of SIGBUS before any Python error can be raised, and a single flipped bit in a
relocation or a dynamic entry can crash it with SIGSEGV. `import npu_backend` therefore wraps
`Executable.export_library` (one export at a time: TVM's LLVM modules crash writing themselves
from two threads), which seals every ELF library it writes with a SHA-256 digest of its bytes (a
45-byte trailer after the ELF's last byte, which the dynamic loader never reads), and
`load_module`, which checks an ELF library against its own headers (the ELF header, the program
headers and every loaded segment, the section header table all lie inside the file) and, when
it is sealed, against its digest, before TVM dlopens it; other files go to TVM's loader unchanged.
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
import threading

import tvm

from ..errors import CGRAError


class DamagedArtifact(CGRAError, ValueError):
    """A compiled library on disk is not whole (truncated, overwritten, not the file written)."""


_ELF_MAGIC = b"\x7fELF"
_EXPORTING = threading.Lock()
_PT_LOAD = 1


#: The seal export_library appends: this marker, then the SHA-256 of every byte before it.
_SEAL = b"\0CGRA-SHA256\0"
_SEAL_BYTES = len(_SEAL) + 32


def seal_shared_library(path: str) -> None:
    """Append the digest trailer to the ELF library at `path` (once)."""
    with open(path, "rb") as file:
        data = file.read()
    if data[:4] != _ELF_MAGIC or _sealed(data):
        return
    with open(path, "ab") as file:
        file.write(_SEAL + hashlib.sha256(data).digest())


def _sealed(data: bytes) -> bool:
    """Whether `data` ends with a seal; a marker with a byte or two flipped still counts (so a flip
    there is a damaged seal, not an unsealed file)."""
    if len(data) < _SEAL_BYTES:
        return False
    marker = data[-_SEAL_BYTES:-32]
    return sum(a != b for a, b in zip(marker, _SEAL)) <= 2


def check_shared_library(path: str) -> None:
    """Raise `DamagedArtifact` if the ELF file at `path` is cut short or inconsistent, or if it
    is sealed and its bytes are not the ones export_library wrote."""
    size = os.path.getsize(path)
    with open(path, "rb") as file:
        data = file.read()
    if data[:4] == _ELF_MAGIC and _sealed(data):
        body, digest = data[:-_SEAL_BYTES], data[-32:]
        if data[-_SEAL_BYTES:-32] != _SEAL or hashlib.sha256(body).digest() != digest:
            _refuse(path, "its bytes differ from those export_library wrote (the SHA-256 digest it recorded "
                    "does not match)")
    size = size - _SEAL_BYTES if data[:4] == _ELF_MAGIC and _sealed(data) else size
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
    """Seal the ELF libraries `Executable.export_library` writes, and check ELF libraries in
    `tvm.runtime.load_module` before TVM dlopens them (idempotent)."""
    executable = tvm.runtime.Executable
    if not getattr(executable.export_library, "_cgra_sealing", False):
        export = executable.export_library

        @functools.wraps(export)
        def export_library(self, file_name, *args, **kwargs):
            with _EXPORTING:
                result = export(self, file_name, *args, **kwargs)
            if isinstance(file_name, (str, os.PathLike)) and os.path.isfile(file_name):
                seal_shared_library(os.fspath(file_name))
            return result

        export_library._cgra_sealing = True
        executable.export_library = export_library
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
