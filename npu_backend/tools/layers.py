"""The per-layer report of a model run: every kernel launch and every host operator, in the
model's order, with the model nodes (ONNX node names) each came from.

Stage: report (after the run). Input: `explain`'s placements of the model (one per operator,
those of one kernel call sharing a `site`), the profile's `KernelStats` in launch order and its
host calls (device/host_calls.py) in call order.
Output: one dict per layer (`model_layers`, what `cgra-sim run --json` prints under "layers"),
a table a person can read (`format_layers`) and a CSV file for spreadsheets (`write_layers_csv`).
"""

from __future__ import annotations

import collections
import csv
import itertools


def model_layers(placements, kernels, host_calls=()) -> list[dict]:
    """One dict per kernel call or host operator: nodes, Relax ops, output, where it ran, and for
    a kernel its symbol and launch statistics (a launch is matched to its call by symbol, in
    order; launches no call accounts for are listed at the end with what they report); for a host
    operator the host function that ran it, its modelled cycles and measured `seconds`
    (`HostMatcher`; calls no operator accounts for are listed at the end too)."""
    launches = collections.defaultdict(collections.deque)
    for stats in kernels:
        launches[stats.name].append(stats)
    host = HostMatcher(host_calls)
    layers = []
    for _, group in itertools.groupby(placements, key=lambda p: p.site):
        group = list(group)
        layer = {"nodes": _unique(n for p in group for n in p.nodes.split("+")),
                 "ops": [p.op for p in group], "output": group[-1].output, "where": group[0].where,
                 "kernel": group[0].symbol}
        if group[0].where == "npu":
            queue = launches.get(group[0].symbol)
            layers.append({**layer, **_launch(queue.popleft() if queue else None), "seconds": None})
        else:
            layers.append({**layer, **host.layer(group[0].op)})
    for stats in itertools.chain.from_iterable(launches.values()):
        layers.append({"nodes": list(stats.model_nodes), "ops": list(stats.source_ops), "output": "",
                       "where": "npu", "kernel": stats.name, **_launch(stats), "seconds": None})
    layers += [{"nodes": [], "ops": [], "output": "", "where": "host", **_host(call)} for call in host.unmatched()]
    return layers


#: Host operators whose host function has other names (LegalizeOps' or the runtime's copies').
_HOST_NAMES = {"astype": ("cast",), "full_like": ("full",), "zeros_like": ("zeros",), "ones_like": ("ones",),
               "permute_dims": ("permute_dims", "transpose")}


class HostMatcher:
    """Host calls to the host operators they ran, in order: an operator takes the next call whose
    function names it (TVM names a host function after its operators, `fused_` and their names
    for several), or the call it already matched when that one's name goes on to name it too (one
    fused function, counted on its first operator). An operator no call names (a view such as a
    reshape, or one TVM folded into another's function) has no host call of its own: 0 cycles. The
    host layers' cycles add up to the profile's `host_cycles`, the calls left over listed apart."""

    def __init__(self, calls):
        self.calls = list(calls)
        self.matched = set()  # indices of the calls an operator took
        self.next = 0  # the first call after the last one matched
        self.rest = ""  # what the last matched call's name has left after the operator it matched

    def layer(self, op: str) -> dict:
        base = op.split(" ")[-1].split(".")[-1]
        keys = _HOST_NAMES.get(base, (base,))
        key = next((k for k in keys if k and k in self.rest), None)
        if key is not None:
            self.rest = self.rest[self.rest.index(key) + len(key):]
            return {**_host(None), "cycles": 0, "kernel": self.calls[self.next - 1].name}
        for index in range(self.next, len(self.calls)):
            name = self.calls[index].name
            key = next((k for k in keys if k and k in name), None)
            if key is not None:
                self.matched.add(index)
                self.next, self.rest = index + 1, name[name.index(key) + len(key):]
                return _host(self.calls[index])
        return {**_host(None), "cycles": 0}

    def unmatched(self) -> list:
        """The calls no operator took, in call order."""
        return [call for index, call in enumerate(self.calls) if index not in self.matched]


def _host(call) -> dict:
    """A host layer's figures: its call's modelled cycles (at the NPU clock) and measured seconds."""
    return {"kernel": call.name if call else "", "cycles": call.cycles if call else None, "macs": None,
            "padded_macs": None, "utilisation": None, "dma_bytes": None, "energy_pj": None,
            "seconds": call.seconds if call else None}


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
    """The layers as a table: model nodes, ops, output, npu/host, cycles (a host layer's modelled,
    at the NPU's clock), utilisation, DMA bytes, energy (nJ); the total of the NPU's kernels, then
    the host's modelled cycles and the whole run's."""
    nodes = [",".join(layer["nodes"]) or "-" for layer in layers]
    width = min(_NODES_WIDTH, max([len("model nodes")] + [len(n) for n in nodes]))
    lines = [f"{'model nodes':<{width}}  {'ops':<26} {'output':<26} {'on':<4} {'cycles':>10} "
             f"{'util':>6} {'DMA bytes':>10} {'nJ':>9}"]
    for name, layer in zip(nodes, layers):
        name = name if len(name) <= width else name[:width - 3] + "..."
        ops = ",".join(layer["ops"])
        if layer["cycles"] is None:
            numbers = f"{'-':>10} {'-':>6} {'-':>10} {'-':>9}"
        elif layer["where"] == "host":
            numbers = f"{layer['cycles']:>10} {'-':>6} {'-':>10} {'-':>9}"
        else:
            numbers = (f"{layer['cycles']:>10} {layer['utilisation']:>6.1%} {layer['dma_bytes']:>10} "
                       f"{layer['energy_pj'] / 1000:>9.1f}")
        lines.append(f"{name:<{width}}  {ops[:26]:<26} {layer['output'][:26]:<26} {layer['where']:<4} {numbers}")
    npu = [layer for layer in layers if layer["where"] == "npu" and layer["cycles"] is not None]
    total = sum(layer["cycles"] for layer in npu)
    energy = sum(layer["energy_pj"] or 0 for layer in layers)
    lines.append(f"{'total':<{width}}  {f'{len(npu)} kernel launches':<26} {'':<26} {'':<4} {total:>10} "
                 f"{'':>6} {'':>10} {energy / 1000:>9.1f}")
    host = sum(layer["cycles"] or 0 for layer in layers if layer["where"] == "host")
    calls = sum(1 for layer in layers if layer["where"] == "host" and layer["cycles"])
    said = f"{calls} host call{'' if calls == 1 else 's'}, modelled"
    lines.append(f"{'host':<{width}}  {said:<26} {'':<26} {'':<4} {host:>10}")
    lines.append(f"{'whole run':<{width}}  {'':<26} {'':<26} {'':<4} {total + host:>10}")
    return "\n".join(lines)


#: The CSV columns, in order: the layer's fields, lists joined (nodes with "+", ops with ",").
CSV_COLUMNS = ("layer", "nodes", "ops", "output", "where", "kernel", "cycles", "macs", "padded_macs",
               "utilisation", "dma_bytes", "energy_pj", "seconds")


def write_layers_csv(layers: list[dict], path) -> None:
    """The layers as CSV, one row per layer in model order (`CSV_COLUMNS`; a host layer has its
    modelled cycles and measured seconds, its other numbers empty), as Vela writes its per-layer
    report."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for index, layer in enumerate(layers):
            row = {**layer, "layer": index, "nodes": "+".join(layer["nodes"]), "ops": ",".join(layer["ops"])}
            writer.writerow(["" if row.get(column) is None else row[column] for column in CSV_COLUMNS])
