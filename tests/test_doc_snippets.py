"""The python blocks of docs/*.md run as written (README.md's: tests/test_readme.py), except the
ones listed in SKETCHES, which show a signature with names the reader supplies: those must still
parse, and name only functions that exist."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).parent.parent / "docs"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)

#: (document, index of the python block in it) -> why it is not run as written.
SKETCHES = {
    ("command-stream.md", 0): "an API outline: records, inputs and outputs come from a launch of the reader's",
    ("dynamic-shapes.md", 1): "two alternative one-liners on the reader's `mod`",
    ("simulator.md", 0): "signatures: arch, commands and tensors come from a kernel of the reader's",
}


def _blocks():
    for doc in sorted(DOCS.glob("*.md")):
        for index, code in enumerate(BLOCK.findall(doc.read_text())):
            yield pytest.param(doc.name, index, code, id=f"{doc.name}[{index}]")


@pytest.mark.parametrize("doc, index, code", list(_blocks()))
def test_a_docs_python_block_runs_as_written(doc, index, code, tmp_path, monkeypatch):
    tree = ast.parse(code)  # every block parses, sketches included
    if (doc, index) in SKETCHES:
        _names_exist(tree)
        return
    script = tmp_path / "snippet.py"  # TVMScript reads its source back: run from a file
    script.write_text(code)
    monkeypatch.chdir(tmp_path)
    import runpy

    runpy.run_path(str(script), run_name="docs")


def test_every_sketch_is_a_block_that_exists():
    blocks = {(doc, index) for doc, index, _ in (p.values for p in _blocks())}
    assert set(SKETCHES) <= blocks


def _names_exist(tree: ast.AST) -> None:
    """The functions a sketch imports exist where it imports them from."""
    import importlib

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{node.module}.{alias.name}"
