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


# ---------------------------------------------------------------- the plugin's stage order

import ast  # noqa: E402
from pathlib import Path  # noqa: E402

import npu_backend  # noqa: E402

PACKAGE = Path(npu_backend.__file__).parent
#: The plugin's layers in the order the data flows; a module may import from its own layer and
#: the ones before it, never from a later one. "base" is what every stage shares.
LAYERS = [
    ("base", ["errors", "options", "env", "progress", "relax_info", "collector"]),
    ("frontend", ["frontend"]),
    ("normalise", ["normalise"]),
    ("partition", ["partition"]),
    ("kernels", ["kernels"]),
    ("lower", ["lower"]),
    ("device", ["device"]),
    ("pipeline", ["pipeline"]),
    ("target", ["target"]),
    ("tools", ["tools"]),
    ("api", ["__init__", "schedules"]),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    rest = module.split(".")[1:] or ["__init__"]
    for index, (_, prefixes) in enumerate(LAYERS):
        if rest[0] in prefixes:
            return index
    raise AssertionError(f"{module} is in no layer of tests/test_layout.py: add its folder to LAYERS")


def _imports(path: Path) -> set[str]:
    """npu_backend modules `path` imports anywhere (lazy imports inside functions included)."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("npu_backend")}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join((package[:len(package) - node.level + 1] if node.level else [])
                            + ([node.module] if node.module else []))
            if base.startswith("npu_backend"):
                found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    return {name for name in found if name in modules and name != module}


def _graph() -> dict:
    return {_module_name(path): _imports(path) for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_import_runs_with_the_flow():
    against = [f"{module} ({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
               for module, targets in _graph().items() for target in sorted(targets)
               if _layer(target) > _layer(module) and not module.startswith(target + ".")]
    assert not against, "imports against the flow:\n" + "\n".join(against)


def test_no_module_imports_itself_through_others():
    graph = _graph()
    for start in graph:
        if start == "npu_backend":
            continue
        seen, stack = set(), [t for t in graph[start] if not start.startswith(t + ".")]
        while stack:
            module = stack.pop()
            assert module != start, f"import cycle through {start}"
            if module not in seen and module != "npu_backend" and not start.startswith(module + "."):
                seen.add(module)
                stack += [t for t in graph[module] if not module.startswith(t + ".")]
