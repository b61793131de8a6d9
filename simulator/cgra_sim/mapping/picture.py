"""`cgra-sim map --png`: a mapping drawn as one grid of PEs per time slot.

Stage: entry (pictures). In: a `Mapping`; out: a PNG with II panels: each PE a square holding the
operation it issues in that slot (and the cycle within the iteration), memory-port PEs shaded,
arrows for the values moving over links in that slot. matplotlib is the `plots` extra.
"""

from __future__ import annotations


def draw_mapping(mapping, path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--png needs matplotlib: pip install 'npu-backend[plots]'") from None
    fabric, ii = mapping.fabric, mapping.ii
    figure, axes = plt.subplots(1, ii, figsize=(2.2 + 1.1 * fabric.cols * ii, 1.2 + 1.1 * fabric.rows), squeeze=False)
    for slot, ax in enumerate(axes[0]):
        _panel(ax, mapping, slot)
    figure.suptitle(f"{mapping.graph.name} on {fabric.rows}x{fabric.cols} {fabric.topology}: II {ii} "
                    f"(MII {mapping.mii}), latency {mapping.length}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _panel(ax, mapping, slot: int) -> None:
    fabric = mapping.fabric
    ops = {pe: f"{name}\n@{t}" for name, (pe, t) in mapping.placement.items() if t % mapping.ii == slot}
    for pe in range(fabric.num_pes):
        row, col = fabric.position(pe)
        shade = "#dde8f5" if fabric.can_run(pe, "mem") else "white"
        ax.add_patch(_square(col, row, "#f6c26b" if pe in ops else shade))
        if pe in ops:
            ax.text(col, row, ops[pe], ha="center", va="center", fontsize=7)
    for (reader, index), chain in mapping.routes.items():
        for (a, t), (b, _) in zip(chain, chain[1:]):
            if a != b and t % mapping.ii == slot:
                (r0, c0), (r1, c1) = fabric.position(a), fabric.position(b)
                ax.annotate("", xy=(c1, r1), xytext=(c0, r0),
                            arrowprops={"arrowstyle": "->", "color": "tab:red", "lw": 1.2, "shrinkA": 14, "shrinkB": 14})
    ax.set_xlim(-0.6, fabric.cols - 0.4)
    ax.set_ylim(fabric.rows - 0.4, -0.6)
    ax.set_aspect("equal")
    ax.set_xticks(range(fabric.cols))
    ax.set_yticks(range(fabric.rows))
    ax.set_title(f"slot {slot}", fontsize=9)


def _square(col, row, colour):
    from matplotlib.patches import Rectangle

    return Rectangle((col - 0.45, row - 0.45), 0.9, 0.9, facecolor=colour, edgecolor="0.5")
