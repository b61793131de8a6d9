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
    ("stages", []),  # every folder's stage.py: see _layer
    ("pipeline", ["pipeline"]),
    ("target", ["target"]),
    ("tools", ["tools"]),
    ("api", ["__init__", "schedules"]),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    """The index in LAYERS of `module`'s layer. A folder's stage.py, the body of its stage that
    pipeline.py lists, comes just before the pipeline: it runs at its place in the flow but joins
    its folder's pieces with any earlier folder's (partition's asks the kernels which matches they
    can build); the rest of its folder keeps the folder's place."""
    rest = module.split(".")[1:] or ["__init__"]
    if len(rest) == 2 and rest[1] == "stage":
        return [name for name, _ in LAYERS].index("stages")
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


def test_the_pipeline_is_a_map_on_one_screen():
    """pipeline.py lists the flow and holds no stage's body: at most 200 lines, every top-level
    function only returns a list, and every stage has a comment saying why it is there."""
    source = (PACKAGE / "pipeline.py").read_text()
    assert len(source.splitlines()) <= 200
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            body = node.body[1:] if ast.get_docstring(node) else node.body
            assert isinstance(node, ast.FunctionDef) and len(body) == 1 and isinstance(body[0], ast.Return) \
                and isinstance(body[0].value, ast.List), f"pipeline.py: {node.name} is more than a list"
    lines = source.splitlines()
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("STAGES", "KERNEL_STAGES"):
            for entry in node.value.elts:
                assert lines[entry.lineno - 2].strip().startswith("#"), \
                    f"pipeline.py:{entry.lineno}: the stage has no line saying why it is there"
