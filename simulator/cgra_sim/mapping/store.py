"""Where mappings persist: the presets' mappings shipped in the package, and the on-disk cache.

Stage: mapping (mapper.map_graph's caches). In: a (graph, fabric) fingerprint pair and the
mapper's cache tag (solver.cache_tag). Out: the JSON data of a mapping (or of its absence:
{"error": ...}), which mapper.py turns back into a `Mapping`; no tvm, no mapping of its own.

Shipped mappings: cgra_sim/presets/mappings/<preset>.json holds, for the graphs the compiler asks
for on that preset for the activations models use (the bodies ship.py lists, at every lane count
body.program tries) and for every GEMM (the PE array's systolic cell), what the mapper computes
for each, so the first compile of such a model on a preset maps nothing (another chain maps once
and goes to the disk cache). `python -m cgra_sim.mapping.ship` writes them; a file is used only when
it was written by this mapper's sources (VERSION), so a stale file costs time, never a different
mapping; tests/test_shipped_mappings.py checks they are current. A mapping the heuristic found at
MII is the same whatever $CGRA_MAPPER says (`any`); else the file holds the heuristic's (for
`heuristic`, and `auto` without ortools) and the fallback's for the OR-Tools version it was made
with (`ortools<version>`: another version maps such a graph itself).

The disk cache ($CGRA_MAPPING_CACHE, "off" for none, else ~/.cache/cgra_sim/mappings): one small
JSON file per (graph, fabric, mapper sources, mapper mode), written atomically; a file that does
not read back is mapped again. It holds what a user's own chip maps, across processes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

#: The sources whose change can change a mapping: their hash keys the disk cache and the shipped files.
SOURCES = ("mapper.py", "mrrg.py", "dfg.py", "solver.py", "solver_model.py", "solver_tiles.py", "../fabric.py")
VERSION = hashlib.sha256(b"".join((Path(__file__).parent / name).read_bytes() for name in SOURCES)).hexdigest()[:12]
SHIPPED = Path(__file__).parent.parent / "presets" / "mappings"

_shipping = {"on": True}  # ship.py turns the shipped mappings off while it makes them anew


@contextlib.contextmanager
def without_shipped():
    """Every mapping computed (or read from the disk cache), none from the shipped files."""
    _shipping["on"] = False
    try:
        yield
    finally:
        _shipping["on"] = True


def variants(tag: str) -> tuple[str, ...]:
    """The keys of a shipped graph's entries that serve a mapper with cache tag `tag`."""
    _, _, ortools = tag.partition("-ortools")
    return ("any", f"ortools{ortools}") if ortools else ("any", "heuristic")


def shipped_ortools() -> str | None:
    """The OR-Tools version the shipped fallback mappings are for (None without shipped files)."""
    return next((data.get("ortools") for data in _shipped_files().values()), None)


def shipped(graph_fingerprint: str, fabric_fingerprint: str, tag: str) -> dict | None:
    """The shipped data of the graph's mapping on the fabric for a mapper with `tag`, or None."""
    if not _shipping["on"]:
        return None
    entries = _shipped_files().get(fabric_fingerprint, {}).get("mappings", {}).get(graph_fingerprint)
    if entries is None:
        return None
    return next((entries[key] for key in variants(tag) if key in entries), None)


@functools.cache
def _shipped_files() -> dict[str, dict]:
    """fabric fingerprint -> its file's data ({"mappings": {graph fingerprint: {variant: data}},
    "ortools": ...}), from the files this mapper wrote."""
    found = {}
    for path in sorted(SHIPPED.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("version") == VERSION:
            found[data["fabric"]] = data
    return found


def cache_file(graph_fingerprint: str, fabric_fingerprint: str, tag: str) -> Path | None:
    """The disk cache's file for the mapping, or None when $CGRA_MAPPING_CACHE is off."""
    where = os.environ.get("CGRA_MAPPING_CACHE", "")
    if where.lower() == "off":
        return None
    root = Path(where) if where else Path.home() / ".cache" / "cgra_sim" / "mappings"
    return root / f"{VERSION}-{tag}-{graph_fingerprint}-{fabric_fingerprint}.json"


def read(path: Path | None) -> dict | None:
    """The data stored at `path`, or None (no file, or one that does not read back)."""
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write(path: Path | None, data: dict) -> None:
    """Stores `data` at `path` atomically; a read-only or full disk stores nothing."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as out:
            json.dump(data, out)
        os.replace(out.name, path)
    except OSError:
        pass  # the mapping is still cached in this process
