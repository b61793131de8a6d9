"""The presets' mappings, made to ship in the package: `python -m cgra_sim.mapping.ship [--check]`.

Stage: mapping, run by hand when the mapper, the bodies or the presets change (the test
tests/test_shipped_mappings.py says when). In: every preset, the FABRIC bodies the compiler emits
(BODIES: the smooth activations' passes, PReLU's, and the chains the ONNX importers write for
the activations the vector unit lacks) and the PE array's systolic cell. Out:
cgra_sim/presets/mappings/<preset>.json (store.py reads them): every graph body.program and
pe_array.program map on the way, at each lane count they try, with what the mapper computes for
it: the heuristic's (every mode's, where it reaches MII) and the fallback's with this OR-Tools.

`--check` writes nothing: exit 1 when a file is missing or was made from other inputs (the
mapper's sources, body.py, the bodies, the preset). Another OR-Tools version needs no new files:
theirs are the fallback's mappings for the version they name, and another maps those graphs itself.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from .. import load_arch, preset_names
from ..fabric import Fabric
from . import body as bodies
from . import mapper, pe_array, solver, store
from . import gelu_erf
from .exp import passes as exp_passes
from .sigmoid import exp_base, gelu_argument, logistic, square

#: (name, body, dtype) of every FABRIC body a compile may ask for on a preset, beyond the cell.
BODIES = (
    ("gelu-argument", gelu_argument(), "float32"),  # GELU's tanh form (sigmoid.py)
    ("exp-base", exp_base(), "float32"),  # sigmoid, SiLU, GELU
    ("square", square(), "float32"),
    ("logistic", logistic(), "float32"),
    ("prelu", (("max", "a", 0.0), ("min", "a", 0.0), ("mul", "n1", "b"), ("add", "n0", "n2")), "float32"),
    # the ONNX importer's LeakyRelu (darknet's 0.1, PyTorch's 0.01, 0.2), HardSwish, HardSigmoid
    # (PyTorch's alpha 1/6, ONNX's default 0.2), as tests/zoo_models.py's networks have them
    ("hard-swish", (("add", "a", 3.0), ("max", "n0", 0.0), ("min", "n1", 6.0), ("mul", "n2", 0.1666666716337204),
                    ("mul", "a", "n3")), "float32"),
    ("hard-sigmoid", (("mul", "a", 0.1666666716337204), ("add", "n0", 0.5), ("max", "n1", 0.0), ("min", "n2", 1.0)),
     "float32"),
    ("hard-sigmoid-0.2", (("mul", "a", 0.20000000298023224), ("add", "n0", 0.5), ("max", "n1", 0.0),
                          ("min", "n2", 1.0)), "float32"),
    ("leaky-relu-0.1", (("mul", "a", 0.10000000149011612), ("max", "a", "n0")), "float32"),
    ("leaky-relu-0.01", (("mul", "a", 0.009999999776482582), ("max", "a", "n0")), "float32"),
    ("leaky-relu-0.2", (("mul", "a", 0.20000000298023224), ("max", "a", "n0")), "float32"),
) + tuple(
    # the attention's exps on the fabric (exp.py; kernels/attention/fabric_exps.py): unscaled, and
    # with the softmax scale 1 / sqrt(d) folded in where it is a power of two (d = 4, 16, 64, 256)
    (f"exp-{step}-{scale or 1}", nodes, dtype)
    for scale in (None, 0.5, 0.25, 0.125, 0.0625)
    for step, (nodes, dtype) in zip(("round", "polynomial"), exp_passes(scale))) + (
    ("exp-scale", exp_passes()[2][0], "int32"),
    # GELU's erf form on the fabric (gelu_erf.py; kernels/gemm/fabric_gelu.py), with the unscaled exp's passes
    ("gelu-erf-high", gelu_erf.high(), "float32"),
    ("gelu-erf-low", gelu_erf.low(), "float32"),
    ("gelu-erf-logistic", gelu_erf.logistic(), "float32"),
    ("bias-add", gelu_erf.bias_add(), "float32"))
#: The PE array's cell dtypes (pe_array.program: float32, and int8 accumulating in int32).
CELL_DTYPES = ("float32", "int8")
HERE = Path(__file__).parent


def inputs_hash(preset: str) -> str:
    """What a preset's file is made from: the mapper's sources, the lane choice (body.py), the
    cell (pe_array.py, intrinsics.py), the bodies, the preset's fabric. (Not OR-Tools' version:
    the file names the one its fallback mappings are for, and serves no other.)"""
    sources = b"".join((HERE / name).read_bytes() for name in ("body.py", "pe_array.py", "intrinsics.py"))
    text = json.dumps([store.VERSION, hashlib.sha256(sources).hexdigest(), [list(b) for b in BODIES],
                       list(CELL_DTYPES), Fabric.of(load_arch(preset)).fingerprint])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _clear_caches() -> None:
    mapper._CACHE.clear()
    bodies._program.cache_clear()
    pe_array._PROGRAMS.clear()


@contextlib.contextmanager
def _mode(chosen: str, cache: Path):
    """The mapper in mode `chosen`, its disk cache `cache`, nothing read from shipped files."""
    saved = {key: os.environ.get(key) for key in ("CGRA_MAPPER", "CGRA_MAPPING_CACHE")}
    os.environ["CGRA_MAPPER"], os.environ["CGRA_MAPPING_CACHE"] = chosen, str(cache)
    _clear_caches()
    try:
        with store.without_shipped():
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value
        _clear_caches()


def _map_everything(preset: str) -> None:
    arch = load_arch(preset)
    fabric = Fabric.of(arch)
    for _, nodes, dtype in BODIES:
        try:
            bodies.program(nodes, dtype, fabric)
        except mapper.MappingError:
            pass  # the failure is shipped too: the compiler then runs the op on the host
    for dtype in CELL_DTYPES:
        try:
            pe_array.program(arch, dtype)
        except pe_array.PeArrayError:
            pass


def _mapped(cache: Path) -> dict[str, dict]:
    """graph fingerprint -> the data of its mapping, from a disk cache's files."""
    found = {}
    for path in cache.glob("*.json"):
        data = json.loads(path.read_text())
        if "error" not in data:
            data["seconds"] = 0.0  # read, not mapped (and the file the same each time it is made)
        found[path.stem.rsplit("-", 2)[1]] = data
    return found


def _at_mii(data: dict) -> bool:
    """Whether the heuristic mapped it at MII: the solver never runs then, whatever the mode."""
    return "error" not in data and data["mapper"] == "heuristic" and data["ii"] == max(data["res_mii"], data["rec_mii"])


def make(preset: str) -> dict:
    """The preset's shipped file: every graph's mapping under the variants store.variants reads."""
    version = solver.version()
    if version is None:
        raise SystemExit(f"shipping mappings needs OR-Tools (the fallback's mappings ship too): {solver.INSTALL_HINT}")
    with tempfile.TemporaryDirectory(prefix="cgra-ship-") as root:
        results = {}
        for chosen in ("heuristic", "auto"):
            with _mode(chosen, Path(root) / chosen):
                _map_everything(preset)
            results[chosen] = _mapped(Path(root) / chosen)
    # The lanes body.program tries depend on what maps, so each mode asks for graphs of its own.
    mappings = {}
    for graph_fingerprint in sorted(results["heuristic"].keys() | results["auto"].keys()):
        found = {variant: results[chosen][graph_fingerprint] for variant, chosen in
                 (("heuristic", "heuristic"), (f"ortools{version}", "auto")) if graph_fingerprint in results[chosen]}
        everyone = next((data for data in found.values() if _at_mii(data)), None)
        mappings[graph_fingerprint] = {"any": everyone} if everyone is not None else found
    return {"version": store.VERSION, "inputs": inputs_hash(preset), "preset": preset, "ortools": version,
            "fabric": Fabric.of(load_arch(preset)).fingerprint, "mappings": mappings}


def stale(preset: str) -> str | None:
    """Why the preset's shipped file is not current (None when it is)."""
    path = store.SHIPPED / f"{preset}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"{path} is missing or does not read"
    if data.get("inputs") != inputs_hash(preset):
        return f"{path} was made from other inputs (the mapper's sources, body.py, the bodies or the preset changed)"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cgra_sim.mapping.ship", description=__doc__.splitlines()[0])
    parser.add_argument("presets", nargs="*", help="default: every preset")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is not current")
    args = parser.parse_args(argv)
    problems = 0
    for preset in args.presets or preset_names():
        if args.check:
            reason = stale(preset)
            print(f"{preset}: {reason or 'current'}")
            problems += reason is not None
            continue
        data = make(preset)
        store.SHIPPED.mkdir(parents=True, exist_ok=True)
        path = store.SHIPPED / f"{preset}.json"
        path.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
        print(f"{preset}: {len(data['mappings'])} graphs, {path.stat().st_size / 1024:.0f} KB -> {path}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
