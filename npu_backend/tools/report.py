"""`cgra-sim run --report-dir DIR`: everything about one run in one folder, pictures included.

Stage: report (after the run). In: `run_onnx_model`'s report (layers, kernels, totals), the
profile's timelines and the chip. Out, in DIR: layers.txt (the table), layers.csv, report.json,
trace.json (Chrome trace), and with matplotlib (the `plots` extra) roofline.png, each NPU layer's
attained MACs per cycle against its arithmetic intensity under the chip's compute and DMA roofs,
and utilisation.png, the busy share of the PE array, the vector unit and the two DMA engines over
the run.
"""

from __future__ import annotations

import json
import os

import numpy as np

from cgra_sim.isa import Unit
from cgra_sim.trace import write_chrome_trace

from .layers import write_layers_csv

PLOTS_HINT = "pictures need matplotlib: pip install -e \".[plots]\""
_UNITS = (("PE array", Unit.COMPUTE), ("vector", Unit.VECTOR), ("DMA load", Unit.LOAD), ("DMA store", Unit.STORE))


def write_report(directory, report: dict, timelines, arch) -> list[str]:
    """Writes the report files; returns the names written (and a hint when pictures could not be)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "layers.txt"), "w", encoding="utf-8") as out:
        out.write(report["table"] + "\n")
    write_layers_csv(report["layers"], os.path.join(directory, "layers.csv"))
    write_chrome_trace(os.path.join(directory, "trace.json"), timelines)
    with open(os.path.join(directory, "report.json"), "w", encoding="utf-8") as out:
        json.dump(report, out)
    written = ["layers.txt", "layers.csv", "trace.json", "report.json"]
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        return written + [PLOTS_HINT]
    _roofline(pyplot, report["layers"], arch, os.path.join(directory, "roofline.png"))
    _utilisation(pyplot, timelines, os.path.join(directory, "utilisation.png"))
    return written + ["roofline.png", "utilisation.png"]


def roofline_points(layers) -> list[tuple[str, float, float]]:
    """(label, MACs per DMA byte, MACs per cycle) of every NPU layer that multiplies."""
    return [(",".join(layer["nodes"]) or layer["kernel"], layer["macs"] / layer["dma_bytes"],
             layer["macs"] / layer["cycles"])
            for layer in layers if layer["where"] == "npu" and layer["macs"] and layer["dma_bytes"] and layer["cycles"]]


def busy_share(timelines, bins: int = 200):
    """(bin edges in cycles, {unit name: busy share per bin}) over the launches, end to end."""
    total = sum(t.timeline.cycles for t in timelines)
    edges = np.linspace(0, max(total, 1), bins + 1)
    shares = {}
    for name, unit in _UNITS:
        starts, ends, base = [], [], 0
        for launch in timelines:
            line = launch.timeline
            at = line.units == int(unit)
            starts.append(base + line.starts[at])
            ends.append(base + line.starts[at] + line.occupancy[at])
            base += line.cycles
        start, end = (np.concatenate(v).astype(np.float64) if v else np.zeros(0) for v in (starts, ends))
        if not len(start):
            shares[name] = np.zeros(bins)
            continue
        order = np.argsort(start)
        start, end = start[order], end[order]
        busy_before = np.concatenate([[0.0], np.cumsum(end - start)])  # busy cycles of the first k commands

        def busy_until(t):  # busy cycles in [0, t): a unit runs one command at a time
            k = np.searchsorted(start, t, side="left")
            over = np.where(k > 0, np.maximum(end[np.maximum(k - 1, 0)] - t, 0.0), 0.0)
            return busy_before[k] - over

        busy = busy_until(edges)
        shares[name] = np.diff(busy) / np.diff(edges)
    return edges, shares


def _roofline(pyplot, layers, arch, path) -> None:
    points = roofline_points(layers)
    figure, axes = pyplot.subplots(figsize=(7, 5))
    intensities = [p[1] for p in points] or [1.0]
    x = np.logspace(np.log10(min(intensities) / 4), np.log10(max(intensities) * 4), 100)
    bandwidth = 2 * arch.dma_bytes_per_cycle  # load and store engines, each at full bandwidth
    for dtype in arch.dtypes:
        peak = arch.peak_macs_per_cycle(dtype)
        axes.plot(x, np.minimum(peak, bandwidth * x), label=f"roof, {dtype} ({peak} MACs/cycle, {bandwidth} B/cycle)")
    for label, intensity, attained in points:
        axes.scatter([intensity], [attained], s=14)
        axes.annotate(label[:24], (intensity, attained), fontsize=6)
    axes.set(xscale="log", yscale="log", xlabel="arithmetic intensity (model MACs / DMA byte)",
             ylabel="attained MACs / cycle", title=f"Roofline, {arch.name}")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)


def _utilisation(pyplot, timelines, path) -> None:
    edges, shares = busy_share(timelines)
    figure, axes = pyplot.subplots(figsize=(9, 4))
    middles = (edges[:-1] + edges[1:]) / 2
    for name, share in shares.items():
        axes.plot(middles, share, label=name, linewidth=0.8)
    axes.set(xlabel="cycle", ylabel="busy share", ylim=(0, 1.05), title="Utilisation over the run")
    axes.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)
