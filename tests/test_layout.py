"""The architecture's import rules: plugin -> codegen -> hardware description; the simulator
never imports tvm (it is usable on its own, like VTA's simulator)."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(done.stdout.split())


def test_simulator_does_not_import_tvm():
    modules = _modules_after("import cgra_sim, cgra_sim.simulate, cgra_sim.timing, cgra_sim.functional")
    assert not {m for m in modules if m == "tvm" or m.startswith(("tvm.", "tvm_ffi"))}


def test_codegen_does_not_import_the_plugin():
    modules = _modules_after("import cgra_codegen")
    assert "npu_backend" not in modules and "cgra_sim.arch" in modules
