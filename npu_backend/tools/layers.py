"""The per-layer report of a model run: every kernel launch and every host operator, in the
model's order, with the model nodes (ONNX node names) each came from.

Stage: report (after the run). Input: `explain`'s placements of the model (one per operator,
those of one kernel call sharing a `site`) and the profile's `KernelStats` in launch order.
Output: one dict per layer (`model_layers`, what `cgra-sim run --json` prints under "layers"),
a table a person can read (`format_layers`) and a CSV file for spreadsheets (`write_layers_csv`).
"""

from __future__ import annotations

import collections
import csv
import itertools


def model_layers(placements, kernels) -> list[dict]:
    """One dict per kernel call or host operator: nodes, Relax ops, output, where it ran, and for
    a kernel its symbol and launch statistics (a launch is matched to its call by symbol, in
    order; launches no call accounts for are listed at the end with what they report)."""
    launches = collections.defaultdict(collections.deque)
    for stats in kernels:
        launches[stats.name].append(stats)
    layers = []
    for _, group in itertools.groupby(placements, key=lambda p: p.site):
        group = list(group)
        layer = {"nodes": _unique(n for p in group for n in p.nodes.split("+")),
                 "ops": [p.op for p in group], "output": group[-1].output, "where": group[0].where,
                 "kernel": group[0].symbol}
        queue = launches.get(group[0].symbol) if group[0].where == "npu" else None
        layers.append({**layer, **_launch(queue.popleft() if queue else None)})
    for stats in itertools.chain.from_iterable(launches.values()):
        layers.append({"nodes": list(stats.model_nodes), "ops": list(stats.source_ops), "output": "",
                       "where": "npu", "kernel": stats.name, **_launch(stats)})
    return layers


def _launch(stats) -> dict:
    if stats is None:
        return {"cycles": None, "macs": None, "padded_macs": None, "utilisation": None, "dma_bytes": None,
                "energy_pj": None}
    return {"cycles": stats.cycles, "macs": stats.macs, "padded_macs": stats.padded_macs,
            "utilisation": stats.utilisation, "energy_pj": stats.energy_pj,
            "dma_bytes": stats.dma_load_bytes + stats.dma_store_bytes}


def _unique(names) -> list[str]:
    return list(dict.fromkeys(n for n in names if n))


_NODES_WIDTH = 48  # longer node lists are cut (the JSON report has them whole)


def format_layers(layers: list[dict]) -> str:
    """The layers as a table: model nodes, ops, output, npu/host, cycles, utilisation, DMA bytes,
    energy (nJ)."""
    nodes = [",".join(layer["nodes"]) or "-" for layer in layers]
    width = min(_NODES_WIDTH, max([len("model nodes")] + [len(n) for n in nodes]))
    lines = [f"{'model nodes':<{width}}  {'ops':<26} {'output':<26} {'on':<4} {'cycles':>10} "
             f"{'util':>6} {'DMA bytes':>10} {'nJ':>9}"]
    for name, layer in zip(nodes, layers):
        name = name if len(name) <= width else name[:width - 3] + "..."
        ops = ",".join(layer["ops"])
        if layer["cycles"] is None:
            numbers = f"{'-':>10} {'-':>6} {'-':>10} {'-':>9}"
        else:
            numbers = (f"{layer['cycles']:>10} {layer['utilisation']:>6.1%} {layer['dma_bytes']:>10} "
                       f"{layer['energy_pj'] / 1000:>9.1f}")
        lines.append(f"{name:<{width}}  {ops[:26]:<26} {layer['output'][:26]:<26} {layer['where']:<4} {numbers}")
    total = sum(layer["cycles"] or 0 for layer in layers)
    energy = sum(layer["energy_pj"] or 0 for layer in layers)
    launches = sum(1 for layer in layers if layer["cycles"] is not None)
    lines.append(f"{'total':<{width}}  {f'{launches} kernel launches':<26} {'':<26} {'':<4} {total:>10} "
                 f"{'':>6} {'':>10} {energy / 1000:>9.1f}")
    return "\n".join(lines)


#: The CSV columns, in order: the layer's fields, lists joined (nodes with "+", ops with ",").
CSV_COLUMNS = ("layer", "nodes", "ops", "output", "where", "kernel", "cycles", "macs", "padded_macs",
               "utilisation", "dma_bytes", "energy_pj")


def write_layers_csv(layers: list[dict], path) -> None:
    """The layers as CSV, one row per layer in model order (`CSV_COLUMNS`; a host layer's
    numbers are empty), as Vela writes its per-layer report."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for index, layer in enumerate(layers):
            row = {**layer, "layer": index, "nodes": "+".join(layer["nodes"]), "ops": ",".join(layer["ops"])}
            writer.writerow(["" if row.get(column) is None else row[column] for column in CSV_COLUMNS])
