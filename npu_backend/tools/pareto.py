"""The chips worth building: a sweep's chips summed over its models, and those no other chip beats.

Stage: tools (after `cgra-sim sweep`). In: the sweep's rows (sweep.py). Out: one summary per chip
(area, and cycles and energy summed over the models; a chip with a failed point is left out), the
Pareto frontier over (cycles, energy, area), all three smaller-is-better, and pareto.png: cycles
against energy, area as colour, the frontier ringed and named. matplotlib is the `plots` extra.
"""

from __future__ import annotations

OBJECTIVES = ("cycles", "energy_pj", "area_mm2")
#: A row's figures of its model, which a chip's summary sums (or leaves out), not copies.
_PER_MODEL = ("model", "cycles", "time_us", "energy_pj", "npu_mac_fraction", "macs", "compile_s", "simulate_s",
              "error")


def chip_summaries(rows: list[dict]) -> list[dict]:
    """Per chip, in the rows' order: its fields, area, total cycles and energy over the models,
    the mean share of MACs on the NPU. Chips with a failed or missing point are left out."""
    models = {row["model"] for row in rows if "model" in row}
    chips: dict[str, list[dict]] = {}
    for row in rows:
        chips.setdefault(row["chip"], []).append(row)
    summaries = []
    for name, points in chips.items():
        if any(point.get("error") for point in points) or {p.get("model") for p in points} != models:
            continue
        first = points[0]
        summary = {key: value for key, value in first.items() if key not in _PER_MODEL}
        summary["cycles"] = sum(point["cycles"] for point in points)
        summary["energy_pj"] = sum(point["energy_pj"] for point in points)
        summary["npu_mac_fraction"] = sum(point["npu_mac_fraction"] for point in points) / len(points)
        summaries.append(summary)
    return summaries



def frontier(summaries: list[dict]) -> list[dict]:
    """The summaries no other one dominates (at most as large in every objective, smaller in one)."""
    def dominates(a, b):
        return all(a[k] <= b[k] for k in OBJECTIVES) and any(a[k] < b[k] for k in OBJECTIVES)

    return [s for s in summaries if not any(dominates(other, s) for other in summaries)]


def short_name(chip: str) -> str:
    """A chip's name without its base: the fields the sweep changed."""
    return chip.partition(",")[2] or chip


_ABBREVIATIONS = {"spad_bytes": "spad", "dma_bytes_per_cycle": "dma", "bank_width_bytes": "bank",
                  "spad_banks": "banks", "vector_lanes": "lanes", "dma_latency": "lat", "config_load_cycles": "cfg",
                  "clock_mhz": "MHz", "function_unit.lanes": "fu"}


def label(chip: str) -> str:
    """A few characters for a chip on a picture: rows x cols, then each other changed field."""
    fields = dict(part.split("=", 1) for part in short_name(chip).split(",") if "=" in part)
    if not fields:
        return chip
    parts = [f"{fields.pop('rows', '-')}x{fields.pop('cols', '-')}"] if {"rows", "cols"} & set(fields) else []
    for field, value in fields.items():
        number = int(value) if value.isdigit() else None
        shown = f"{number >> 10}K" if number and field == "spad_bytes" and number % 1024 == 0 else value
        parts.append(f"{_ABBREVIATIONS.get(field, field.replace('macs_per_pe.', ''))}={shown}")
    return " ".join(parts)


def plot_pareto(summaries: list[dict], path: str, title: str = "") -> str:
    """pareto.png: every chip's total cycles against its total energy, coloured by area; the
    frontier ringed and labelled."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("the Pareto picture needs matplotlib: pip install 'npu-backend[plots]'") from None
    best = {s["chip"] for s in frontier(summaries)}
    figure, axes = plt.subplots(figsize=(8, 6))
    points = axes.scatter([s["cycles"] for s in summaries], [s["energy_pj"] / 1e6 for s in summaries],
                          c=[s["area_mm2"] for s in summaries], cmap="viridis", s=40, zorder=2)
    figure.colorbar(points, ax=axes, label="area (mm²)")
    names = []
    for number, s in enumerate(sorted((s for s in summaries if s["chip"] in best), key=lambda s: s["cycles"]), 1):
        axes.scatter([s["cycles"]], [s["energy_pj"] / 1e6], s=140, facecolors="none", edgecolors="red",
                     linewidths=1.5, zorder=3)
        axes.annotate(str(number), (s["cycles"], s["energy_pj"] / 1e6), fontsize=8, color="red",
                      xytext=(6, 6), textcoords="offset points")
        names.append(f"{number}: {label(s['chip'])}")
    axes.text(0.99, 0.99, "frontier\n" + "\n".join(names), transform=axes.transAxes, fontsize=7, va="top",
              ha="right", family="monospace", bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.7"})
    axes.set_xscale("log")
    axes.set_xlabel("cycles (sum over the models)")
    axes.set_ylabel("energy (µJ, sum over the models)")
    axes.set_title(title or "chips: cycles vs energy vs area (red: Pareto frontier)")
    axes.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
