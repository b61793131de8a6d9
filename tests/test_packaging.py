"""Tests that a built wheel is self-contained: it holds exactly the four intended top-level
packages, the hardware presets and the C++ runtime's sources, and once installed it builds its
runtime from those sources, with no checkout around.

Stage: packaging. The wheel is built once for the module (about 3 s, without build isolation);
installing it and building its runtime takes about 15 s more.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from npu_backend.device import runtime_lib

REPO_ROOT = runtime_lib.REPO_ROOT
PACKAGES = {"npu_backend", "cgra_codegen", "cgra_sim", "cgra_cli"}
PACKAGED_SOURCES = "npu_backend/_runtime_src/"


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Runs `command`; on failure, the assertion shows its output."""
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **kwargs)
    assert result.returncode == 0, f"$ {' '.join(command)}\n{result.stdout}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel pip builds from (a copy of) this checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Built from a copy because pip builds in the source tree, and setuptools' build/ outlives a
    # build: a module deleted since the last one would linger in the wheel.
    source = tmp / "source"
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(
        ".*", "build", "dump", "*.egg-info", "__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
         "-w", str(tmp / "dist")], cwd=source)
    (built,) = (tmp / "dist").glob("*.whl")
    return built


@pytest.fixture(scope="module")
def wheel_files(wheel) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist() if not name.endswith("/")}


def test_wheel_holds_exactly_the_four_packages(wheel_files):
    top_level = {name.split("/")[0] for name in wheel_files}
    packages = {name for name in top_level if not name.endswith((".dist-info", ".data"))}
    assert packages == PACKAGES


def test_wheel_holds_the_presets(wheel_files):
    presets = sorted((REPO_ROOT / "simulator" / "cgra_sim" / "presets").glob("*.json"))
    assert presets
    for preset in presets:
        assert wheel_files[f"cgra_sim/presets/{preset.name}"] == preset.read_bytes()
    shipped = sorted((REPO_ROOT / "simulator" / "cgra_sim" / "presets" / "mappings").glob("*.json"))
    assert [path.stem for path in shipped] == [path.stem for path in presets]  # their mappings too
    for mappings in shipped:
        assert wheel_files[f"cgra_sim/presets/mappings/{mappings.name}"] == mappings.read_bytes()


def test_wheel_holds_the_runtime_sources(wheel_files):
    """Every file the runtime is built from, as in the checkout; its generator (isa.py,
    c_api.py) comes with cgra_sim."""
    checkout = runtime_lib.source_files(REPO_ROOT)
    simulator = REPO_ROOT / "simulator"
    generator = runtime_lib.generator_sources(REPO_ROOT)
    assert all(path in checkout for path in generator) and len(checkout) > 3
    for path in checkout:
        name = path.relative_to(simulator if path in generator else REPO_ROOT).as_posix()
        name = name if path in generator else PACKAGED_SOURCES + name
        assert wheel_files.get(name) == path.read_bytes(), name


INSPECT_INSTALLED = """
import json, npu_backend, cgra_codegen, cgra_sim, cgra_cli
from npu_backend.device import runtime_lib
print(json.dumps({
    "modules": [m.__file__ for m in (npu_backend, cgra_codegen, cgra_sim, cgra_cli)],
    "source_root": str(runtime_lib.source_root()),
    "sources": [str(p) for p in runtime_lib.source_files()],
    "library": runtime_lib.load_runtime(),
}))
"""


def test_installed_wheel_builds_its_runtime_from_the_packaged_sources(wheel, tmp_path):
    target, cache = tmp_path / "site", tmp_path / "cache"
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)])
    # Only the installed copy on the path, and run away from the checkout, so that neither the
    # repository nor an editable install of it can be what gets imported.
    env = dict(os.environ, PYTHONPATH=str(target), CGRA_RUNTIME_CACHE=str(cache))
    result = run([sys.executable, "-c", INSPECT_INSTALLED], cwd=tmp_path, env=env)
    report = json.loads(result.stdout.splitlines()[-1])

    for module, package in zip(report["modules"], ["npu_backend", "cgra_codegen", "cgra_sim", "cgra_cli"], strict=True):
        assert Path(module) == target / package / "__init__.py"
    packaged = target / PACKAGED_SOURCES
    assert Path(report["source_root"]) == packaged
    sources = [Path(p) for p in report["sources"]]
    assert sources[:3] == [packaged / "CMakeLists.txt", target / "cgra_sim" / "isa.py",
                           target / "cgra_sim" / "c_api.py"]
    assert all(p.is_relative_to(packaged) for p in sources[3:]) and len(sources) > 3
    library = Path(report["library"])
    assert library.is_file() and library.parent.parent == cache
    assert runtime_lib.BUILD_MESSAGE in result.stdout
