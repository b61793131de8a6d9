"""docs/patterns.md and `cgra-sim patterns`: every name a schedule or kernel can be registered for,
generated from the pattern table, current, and accepted by register_schedule / register_kernel."""

from __future__ import annotations

import json
import pathlib
import re

from npu_backend import schedules
from npu_backend.kernels.registry import pattern_table
from npu_backend.tools.cli import main
from npu_backend.tools.patterns import pattern_rows, patterns_markdown, show_ops

ROOT = pathlib.Path(__file__).parent.parent
PAGE = ROOT / "docs" / "patterns.md"


def _names_on_page() -> list[str]:
    return re.findall(r"^\| `([^`]+)` \|", PAGE.read_text(), flags=re.M)


def test_page_is_current():
    assert PAGE.read_text() == patterns_markdown(), \
        "regenerate it: python -m npu_backend.tools.patterns > docs/patterns.md"


def test_every_registrable_name_is_on_the_page_and_registers():
    names = _names_on_page()
    assert set(names) >= {entry.name for entry in pattern_table()}
    for name in names:
        schedules.register_schedule(name, lambda sch, spec, tiling, arch: None)
        schedules.register_schedule(name, None)
        schedules.register_kernel(name, lambda spec, arch: None)
        schedules.register_kernel(name, None)


def test_composed_names_are_greppable_with_their_ops():
    """chain_pattern_graphs composes these names; the page is where a reader finds them."""
    ops = {row.name: show_ops(row.ops) for row in pattern_rows()}
    assert ops["cgra.conv2d_bias_residual_relu"] == "nn.conv2d -> add -> add -> nn.relu"
    assert ops["cgra.linear_bias_relu_requant"] == "permute_dims -> matmul -> add -> nn.relu -> astype -> multiply -> quantize"
    assert ops["cgra.conv2d_bias_chain2"] == "nn.conv2d -> add -> link -> link"
    assert ops["cgra.separable_relu"] == "nn.conv2d -> [add] -> [nn.relu | clip] -> nn.conv2d -> nn.relu"
    assert ops["cgra.smooth.silu"] == "sigmoid -> multiply"
    page = PAGE.read_text()
    assert "| `cgra.conv2d_bias_residual_relu` | conv2d | nn.conv2d -> add -> add -> nn.relu |" in page


def test_cli_lists_the_patterns(capsys):
    assert main(["patterns", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in listed["patterns"]] == [row.name for row in pattern_rows()]
    assert {"name": "conv2d", "family": "conv2d"} in listed["ops"]
    assert main(["patterns"]) == 0
    assert "cgra.conv2d_bias_residual_relu" in capsys.readouterr().out
