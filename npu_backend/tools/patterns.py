"""Every name a schedule or kernel can be registered for, with the Relax ops each pattern fuses.

Stage: tools (reads the op families' pattern table, kernels/registry.py). Out: one row per
pattern name, in the order partition tries them (`pattern_rows`), and the op names, as
`cgra-sim patterns [--json]` prints them and as docs/patterns.md holds them
(`python -m npu_backend.tools.patterns > docs/patterns.md`; a test keeps the page equal to it).
Most names are composed (`epilogue.chain_pattern_graphs`: a root, then a bias, a residual, an
activation, a requantisation or an elementwise chain), so the source holds them nowhere whole:
this table is where a reader greps one.

A pattern's ops are the calls of a match in data-flow order, operands first: `a | b` where a
match calls either, `[a]` where it may leave `a` out, `link` for one link of an elementwise chain
(LINK_OPS, chains.level_pattern). Relax op names lose their "relax." prefix.
"""

from __future__ import annotations

import dataclasses

from tvm.relax import dpl

from ..kernels import registry
from ..kernels.registry import pattern_table


@dataclasses.dataclass(frozen=True)
class PatternRow:
    """One pattern name: its family and its ops in data-flow order."""

    name: str  # "cgra.conv2d_bias_residual_relu"
    family: str  # "conv2d"
    ops: tuple  # ("nn.conv2d", "add", "add", "nn.relu")


#: How many alternatives a step may list before it is a `link` of an elementwise chain.
_LISTED = 3


def pattern_rows() -> tuple[PatternRow, ...]:
    """One row per pattern name (a mirrored residual add shares its name: its first pattern)."""
    rows, seen = [], set()
    for entry in pattern_table():
        if entry.name not in seen:
            seen.add(entry.name)
            rows.append(PatternRow(entry.name, entry.family.name, tuple(_texts(entry.pattern))))
    return tuple(rows)


def op_names() -> list[tuple[str, str]]:
    """(op, family) of every spec op: a schedule registered for an op covers all its kernels."""
    return [(op, family.name) for family in registry.FAMILIES for op in family.ops]


def link_ops() -> list[str]:
    """The ops one link of an elementwise chain may be (what `link` stands for)."""
    for row in pattern_rows():
        for op in row.ops:
            if op.startswith("link:"):
                return op.removeprefix("link:").split(" | ")
    return []


def _texts(pattern) -> list[str]:
    """The ops of a match of `pattern`, a link of an elementwise chain marked "link:"."""
    texts = [text for _, text in _steps(pattern, {})]
    shown = []
    for text in texts:
        alternatives = text.split(" | ")
        shown.append(f"link:{text}" if len(alternatives) > _LISTED and not text.startswith(("[", "(")) else text)
    return shown


def _steps(pattern, memo: dict) -> list:
    """[(node keys, text)] of the calls a match of `pattern` makes, operands first; a node's key
    is its object's hash, so a node shared by several operands is listed once."""
    key = pattern.__hash__()
    if key not in memo:
        memo[key] = _steps_here(pattern, key, memo)
    return memo[key]


def _steps_here(pattern, key, memo: dict) -> list:
    """`_steps` of one node: a call after its operands' calls, an alternative's merged sides."""
    if isinstance(pattern, dpl.CallPattern):
        every = [step for arg in pattern.args for step in _steps(arg, memo)]
        required = frozenset().union(*(keys for keys, text in every if not text.startswith("[")))
        steps = []
        for keys, text in every:  # an optional operand that another operand calls anyway is no option
            if not (text.startswith("[") and keys <= required) and not any(keys & k for k, _ in steps):
                steps.append((keys, text))
        op = pattern.op.expr.name if isinstance(pattern.op, dpl.ExprPattern) else str(pattern.op)
        return steps + [(frozenset([key]), op.removeprefix("relax."))]
    if isinstance(pattern, dpl.OrPattern):
        return _either(_steps(pattern.left, memo), _steps(pattern.right, memo))
    if isinstance(pattern, dpl.AttrPattern):  # a call with its attributes tested: the call
        return _steps(pattern.pattern, memo)
    return []  # a wildcard, a constant: an operand, no call


def _either(left: list, right: list) -> list:
    """The steps of a match of `left | right`: their common calls, then what differs."""
    n = 0
    while n < min(len(left), len(right)) and left[n][1] == right[n][1] and left[n][0] & right[n][0]:
        n += 1
    a, b = left[n:], right[n:]
    keys = frozenset().union(*(k for k, _ in a + b))
    if [t for _, t in a] == [t for _, t in b]:  # the same calls (a commutative op's mirrored operands)
        return left[:n] + [(ka | kb, t) for (ka, t), (kb, _) in zip(a, b)]
    if not a or not b:
        return left[:n] + [(keys, "[" + " -> ".join(t for _, t in a or b) + "]")]
    alternatives = []
    for side in (a, b):
        for text in " -> ".join(t for _, t in side).split(" | "):
            if text not in alternatives:
                alternatives.append(text)
    joined = " | ".join(alternatives)
    return left[:n] + [(keys, joined if len(a) == len(b) == 1 else f"({joined})")]


def show_ops(ops) -> str:
    """A row's ops as one line: steps joined by " -> "."""
    return " -> ".join(_shown(op) for op in ops)


def _shown(op: str) -> str:
    """One step as the table shows it: "link", or alternatives in parentheses."""
    if op.startswith("link:"):
        return "link"
    return f"({op})" if " | " in op and not op.startswith(("(", "[")) else op


def patterns_json() -> dict:
    """What `cgra-sim patterns --json` prints."""
    return {"patterns": [{"name": row.name, "family": row.family, "ops": [_shown(op) for op in row.ops]}
                         for row in pattern_rows()],
            "ops": [{"name": op, "family": family} for op, family in op_names()],
            "link": link_ops()}


def patterns_text() -> str:
    """What `cgra-sim patterns` prints: one pattern a line, then the ops."""
    width = max(len(row.name) for row in pattern_rows())
    lines = [f"{row.name:<{width}}  {row.family:<17}  {show_ops(row.ops)}" for row in pattern_rows()]
    lines.append(f"ops (every kernel of the op): {', '.join(op for op, _ in op_names())}")
    lines.append(f"link: one of {', '.join(link_ops())}")
    return "\n".join(lines)


def patterns_markdown() -> str:
    """docs/patterns.md."""
    lines = [
        "# The names a schedule or kernel can be registered for",
        "",
        "Generated by `python -m npu_backend.tools.patterns > docs/patterns.md` (`cgra-sim patterns",
        "[--json]` prints the same); `tests/test_patterns_doc.py` keeps this page equal to it and",
        "registers a schedule for every name below. Register with",
        "`npu_backend.schedules.register_schedule(name, fn)` or `register_kernel(name, fn)`",
        "(docs/own-kernels.md): a pattern's name covers the kernels that pattern fuses, an op's name",
        "every kernel of the op, and a pattern's function wins over its op's. `npu_backend.explain(mod)`",
        "shows which pattern each kernel of a model came from.",
        "",
        "Patterns are listed in the order partition tries them: the fused blocks and pairs first, then",
        "the epilogue chains (most ops first), then the standalone patterns. Ops are the Relax calls of a",
        "match in data-flow order, operands first (`relax.` left out): `a | b` where a match calls either,",
        "`[a]` where it may leave `a` out, and `link` for one link of an elementwise chain, one of",
        ", ".join(f"`{op}`" for op in link_ops()) + ". The family is the one whose patterns these are: a",
        "conv2d pattern matching a depthwise conv2d becomes a `depthwise` kernel (op `depthwise`).",
        "",
        "## Ops",
        "",
        "| op | family |",
        "|---|---|",
        *(f"| `{op}` | {family} |" for op, family in op_names()),
        "",
        "## Patterns",
        "",
        "| pattern | family | ops |",
        "|---|---|---|",
        *(f"| `{row.name}` | {row.family} | {show_ops(row.ops).replace('|', '&#124;')} |" for row in pattern_rows()),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(patterns_markdown(), end="")
