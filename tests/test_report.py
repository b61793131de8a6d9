"""`cgra-sim run --report-dir`: the files, the roofline's points under the chip's roofs, and the
utilisation curve's busy cycles equal to the timelines' own."""

from __future__ import annotations

import json
import os

import pytest

import npu_backend
from cgra_cli.cli import main
from npu_backend.tools.report import PLOTS_HINT, busy_share, roofline_points

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "tiny_cnn.onnx")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    assert main(["run", EXAMPLE, "--json", "--report-dir", str(folder)]) == 0
    return folder


def test_the_report_folder_holds_the_table_csv_json_and_trace(run, capsys):
    names = set(os.listdir(run))
    assert {"layers.txt", "layers.csv", "report.json", "trace.json"} <= names
    report = json.loads((run / "report.json").read_text())
    assert report["total_cycles"] > 0 and len(report["layers"]) == 5
    assert (run / "layers.txt").read_text().startswith("model nodes")
    trace = json.loads((run / "trace.json").read_text())
    assert trace["traceEvents"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return  # the pictures are the plots extra's; the run said how to get them
    assert {"roofline.png", "utilisation.png"} <= names
    assert (run / "roofline.png").read_bytes()[:4] == b"\x89PNG"


def test_without_matplotlib_the_run_says_how_to_get_the_pictures(tmp_path, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert main(["run", EXAMPLE, "--report-dir", str(tmp_path)]) == 0
    assert PLOTS_HINT in capsys.readouterr().out
    assert "roofline.png" not in os.listdir(tmp_path)


def test_every_layer_sits_under_the_roofs_and_the_busy_curve_adds_up():
    from npu_backend.tools.workloads import conv2d_model, matmul_model, run

    arch = npu_backend.load_arch("cgra-4x4")
    layers, timelines = [], []
    for mod, inputs, _ in (conv2d_model(1, 16, 20, 20, 32, 3, 3, (1, 1), (1, 1, 1, 1)), matmul_model(1, 300, 200)):
        with npu_backend.profile(keep_timelines=True) as prof:
            run(npu_backend.compile(mod, arch), inputs)
        (kernel,) = prof.kernels
        layers.append({"where": "npu", "nodes": [], "kernel": kernel.name, "macs": kernel.macs,
                       "dma_bytes": kernel.dma_load_bytes + kernel.dma_store_bytes, "cycles": kernel.cycles})
        timelines += prof.timelines
    points = roofline_points(layers)
    assert len(points) == 2
    for _, intensity, attained in points:  # the simulator never beats the chip
        assert attained <= arch.peak_macs_per_cycle("float32")
        assert attained <= 2 * arch.dma_bytes_per_cycle * intensity
    assert points[1][1] < 1 < points[0][1]  # the 1-row dense layer is DMA bound, the conv is not
    edges, shares = busy_share(timelines)
    widths = edges[1:] - edges[:-1]
    from cgra_sim.isa import Unit
    for name, unit in (("PE array", Unit.COMPUTE), ("DMA load", Unit.LOAD), ("DMA store", Unit.STORE)):
        expected = sum(t.timeline.busy_cycles(unit) for t in timelines)
        assert (shares[name] * widths).sum() == pytest.approx(expected, rel=1e-9)
        assert shares[name].min() >= 0 and shares[name].max() <= 1 + 1e-9
