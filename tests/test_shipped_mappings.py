"""The presets' mappings ship in the package (cgra_sim/mapping/ship.py, store.py): they are
current, they are what the mapper computes, and the first compile of a model on a preset maps
nothing."""

from __future__ import annotations

import sys

import pytest

from cgra_sim import load_arch, preset_names
from cgra_sim.fabric import Fabric
from cgra_sim.mapping import body as bodies
from cgra_sim.mapping import mapper, pe_array, ship, solver, store
from cgra_sim.mapping.intrinsics import mac
from cgra_sim.mapping.sigmoid import square


@pytest.fixture
def fresh(monkeypatch):
    """No disk cache, empty in-process caches (before and after)."""
    monkeypatch.setenv("CGRA_MAPPING_CACHE", "off")
    monkeypatch.setattr(mapper, "_CACHE", {})
    ship._clear_caches()
    yield
    ship._clear_caches()


def served(mode: str) -> str:
    """`mode` if the shipped files serve it here, else "heuristic" (whose mappings they always
    hold): the fallback's mappings are for the OR-Tools version they were made with."""
    return mode if solver.version() in (None, store.shipped_ortools()) else "heuristic"


@pytest.fixture
def no_mapper(fresh, monkeypatch):
    """Mapping anything fails the test."""
    monkeypatch.setattr(mapper, "_map", lambda graph, fabric, *_: pytest.fail(f"mapped {graph.fingerprint} on "
                                                                             f"{fabric.rows}x{fabric.cols}"))


@pytest.mark.parametrize("preset", preset_names())
def test_the_shipped_mappings_are_current(preset):
    """A change to the mapper, the bodies or a preset needs `python -m cgra_sim.mapping.ship` (a
    stale file is never read: store.VERSION)."""
    assert ship.stale(preset) is None, f"{ship.stale(preset)}: run python -m cgra_sim.mapping.ship"


@pytest.mark.parametrize("mode", ["auto", "heuristic", "auto without ortools"])
def test_every_shipped_body_and_cell_maps_nothing_on_a_preset(no_mapper, monkeypatch, mode):
    if mode == "auto without ortools":  # the solver extra not installed: the heuristic's mappings serve
        monkeypatch.setitem(sys.modules, "ortools", None)
        assert solver.version() is None
    monkeypatch.setenv("CGRA_MAPPER", served(mode.split()[0]))
    for preset in preset_names():
        arch = load_arch(preset)
        for _, nodes, dtype in ship.BODIES:
            try:
                bodies.program(nodes, dtype, Fabric.of(arch))
            except mapper.MappingError:
                pass
        for dtype in ship.CELL_DTYPES:
            pe_array.program(arch, dtype)


@pytest.mark.parametrize("preset", preset_names())
@pytest.mark.parametrize("mode", ["auto", "heuristic"])
def test_a_shipped_mapping_is_what_the_mapper_computes(fresh, monkeypatch, preset, mode):
    """The cells and the sigmoid's squarings (at the lanes the chip runs): read against mapped anew."""
    monkeypatch.setenv("CGRA_MAPPER", served(mode))
    fabric = Fabric.of(load_arch(preset))
    lanes = bodies.program(square(), "float32", fabric).lanes
    for graph in (mac("float32"), mac("int32"), bodies.graph(square(), "float32", lanes)):
        mapper._CACHE.clear()
        shipped = mapper.map_graph(graph, fabric)
        assert shipped.seconds == 0.0  # read from the package, not mapped
        computed = mapper._map(graph, fabric, solver.mode() != "heuristic" and solver.version() is not None)
        assert (shipped.ii, shipped.length, shipped.config_bytes, shipped.placement, shipped.routes, shipped.fabric,
                shipped.mapper, shipped.infeasible, shipped.mii) == (
            computed.ii, computed.length, computed.config_bytes, computed.placement, computed.routes,
            computed.fabric, computed.mapper, computed.infeasible, computed.mii)


def test_a_stale_shipped_file_is_not_read(fresh, monkeypatch):
    """Another mapper's file (another VERSION) would give another mapping: it is mapped instead."""
    assert store.shipped(mac("float32").fingerprint, Fabric.of(load_arch("cgra-8x8")).fingerprint, "heuristic")
    monkeypatch.setattr(store, "VERSION", "another")
    store._shipped_files.cache_clear()
    try:
        assert store.shipped(mac("float32").fingerprint, Fabric.of(load_arch("cgra-8x8")).fingerprint, "heuristic") is None
    finally:
        monkeypatch.undo()
        store._shipped_files.cache_clear()


def test_the_fallbacks_mappings_serve_only_their_ortools_version():
    """Where the heuristic misses MII, CP-SAT's mapping depends on OR-Tools' version: another
    version maps the graph itself; the heuristic's serves CGRA_MAPPER=heuristic (and auto without
    OR-Tools) whatever the version."""
    for fabric, data in store._shipped_files().items():
        version = f"ortools{data['ortools']}"
        for graph, entries in data["mappings"].items():
            if "any" not in entries and version in entries and "heuristic" in entries:
                assert store.shipped(graph, fabric, f"auto-{version}") is entries[version]
                assert store.shipped(graph, fabric, f"solver-{version}") is entries[version]
                assert store.shipped(graph, fabric, "auto-ortools0.0") is None
                assert store.shipped(graph, fabric, "heuristic") is entries["heuristic"]
                assert store.shipped(graph, fabric, "auto") is entries["heuristic"]
                return
    pytest.skip("every shipped mapping is the heuristic's at MII: no fallback mapping to check")


@pytest.mark.parametrize("preset", preset_names())
def test_the_zoo_models_fabric_bodies_are_shipped(no_mapper, monkeypatch, preset):
    """Partitioning the zoo's networks with fabric bodies (hard-swish and hard-sigmoid, leaky
    relu, SiLU) and the PE array's cell maps nothing on a preset: their bodies are ship.BODIES'."""
    monkeypatch.setenv("CGRA_MAPPER", served("auto"))
    import npu_backend
    import zoo_models

    for build in (zoo_models.mobilenet_v3_small, zoo_models.tiny_yolo_v3, zoo_models.yolo_v8n):
        placements = npu_backend.explain(npu_backend.from_onnx(build(32)), preset)
        activations = [p for p in placements if p.op in ("sigmoid", "multiply", "nn.leakyrelu", "clip", "add")]
        assert activations and all(p.where == "npu" for p in activations)
