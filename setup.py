"""Packaging: copies the C++ runtime's sources into npu_backend when a wheel is built.

The metadata is in setup.cfg. npu_backend builds its runtime with CMake on first use, so a wheel
must carry the sources: build_py copies CMakeLists.txt, runtime/include and runtime/src into
npu_backend/_runtime_src/, where npu_backend/runtime_lib.py looks first. An editable install
copies nothing: it keeps building from the checkout, so that editing the sources rebuilds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROJECT_ROOT = Path(__file__).resolve().parent
#: The runtime's sources, relative to the project root; the same layout is kept in the copy.
RUNTIME_SOURCES = ("CMakeLists.txt", "runtime/include", "runtime/src")
#: Where the copy goes inside the npu_backend package (runtime_lib.PACKAGED_SOURCES).
PACKAGED_SOURCES = "_runtime_src"


def runtime_source_files() -> list[str]:
    """The files to copy, relative to the project root, in a stable order."""
    files = []
    for name in RUNTIME_SOURCES:
        path = PROJECT_ROOT / name
        if not path.exists():
            raise FileNotFoundError(f"the CGRA runtime's sources are incomplete: {path} is missing")
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files += [p.relative_to(PROJECT_ROOT).as_posix() for p in found]
    return files


class BuildPyWithRuntimeSources(build_py):
    """build_py that also puts the runtime's sources into npu_backend (not in editable mode)."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib) / "npu_backend" / PACKAGED_SOURCES
        # build/lib outlives builds: start afresh so that a deleted source does not linger.
        shutil.rmtree(target, ignore_errors=True)
        for name in runtime_source_files():
            self.mkpath(str((target / name).parent))
            self.copy_file(str(PROJECT_ROOT / name), str(target / name))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outputs
        target = Path(self.build_lib) / "npu_backend" / PACKAGED_SOURCES
        return outputs + [str(target / name) for name in runtime_source_files()]

    def get_source_files(self) -> list[str]:
        # What an sdist must hold so that a wheel built from it has the runtime too.
        return super().get_source_files() + runtime_source_files()


setup(cmdclass={"build_py": BuildPyWithRuntimeSources})
