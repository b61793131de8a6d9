"""Every ```python snippet of the README runs as written (from a file in a scratch directory:
TVMScript reads its source back, and the first example writes model.so), and the figures the
README quotes are what the commands it names print."""

from __future__ import annotations

import json
import pathlib
import re
import runpy

import pytest

README = pathlib.Path(__file__).parent.parent / "README.md"


def _python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _skip_reason(snippet: str) -> str | None:
    """Why a snippet cannot run here as written, or None. One that imports an optional extra
    (torch) skips through pytest.importorskip, whose words CI's .ci/extras_tests.py looks for to
    run it again with every extra installed."""
    if "rpc.connect(" in snippet:
        return ("needs a network peer (a board serving on port 9091); the snippet runs against a local server "
                "after the first example (_the_remote_example_runs)")
    if re.search(r"^import torch", snippet, re.M):
        pytest.importorskip("torch")  # the torch extra
    return None


@pytest.mark.parametrize("index", range(len(_python_snippets())),
                         ids=[f"snippet{i + 1}" for i in range(len(_python_snippets()))])
def test_every_python_snippet_of_the_readme_runs_as_written(index, tmp_path, monkeypatch, capsys):
    snippet = _python_snippets()[index]
    reason = _skip_reason(snippet)
    if reason is not None:
        pytest.skip(reason)
    script = tmp_path / f"readme_snippet{index + 1}.py"
    script.write_text(snippet)
    monkeypatch.chdir(tmp_path)
    names = runpy.run_path(str(script), run_name="readme")
    out = capsys.readouterr().out
    if "export_library" in snippet:  # the first example
        assert (tmp_path / "model.so").is_file()
        assert "fused_relax_matmul" in out  # prof.table() printed the kernel
        _the_remote_example_runs(names)
    if "torch.export" in snippet:
        assert "nn.conv2d" in out  # the conv ran on the NPU
    if "explain(" in snippet:  # the output the snippet shows in its comments is what it prints
        shown = [line[2:] for line in snippet.splitlines() if line.startswith("# ")]
        printed = out.splitlines()
        assert len(shown) == len(printed)
        for expected, line in zip(shown, printed):
            assert line.startswith(expected.removesuffix("...").rstrip()), (expected, line)
    assert names["__name__"] == "readme"


def _the_remote_example_runs(names):
    """The README's RPC example, on the first example's model.so and inputs, through a local
    server standing in for the board."""
    import numpy as np

    pytest.importorskip("psutil")  # the remote extra
    from npu_backend.tools.remote import start_server

    (example,) = [block for block in _python_snippets() if "RemoteModel" in block]
    server = start_server(port=9501, port_end=9599)
    try:
        scope = {"inputs": names["inputs"]}
        exec(example.replace('"board", 9091', f'"127.0.0.1", {server.port}'), scope)
    finally:
        server.terminate()
    np.testing.assert_array_equal(scope["outputs"][0], names["out"].numpy())
    assert scope["report"]["total_cycles"] == names["prof"].total_cycles


def test_the_readme_conv_layout_figures_are_what_verify_prints(capsys):
    """The README quotes ResNet-18 conv2_x int8 on cgra-8x8 in NCHW and NHWC: its cycles and x ideal
    (cycles over the MAC bound) are what the command it names prints for each layout."""
    from npu_backend.tools.cli import main

    text = " ".join(README.read_text().split())
    quoted = re.search(r"`cgra-sim verify (--op conv2d [^`]*--layout) NCHW` or `NHWC`: ([\d,]+) cycles NCHW, "
                       r"([\d,]+) NHWC, ([\d.]+) and ([\d.]+) x ideal", text)
    assert quoted is not None, "the README's conv2d layout sentence changed: update this test"
    command = quoted.group(1).split()
    for layout, cycles, ideal in (("NCHW", quoted.group(2), quoted.group(4)),
                                  ("NHWC", quoted.group(3), quoted.group(5))):
        assert main(["verify", *command, layout, "--arch", "cgra-8x8", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["cycles"] == int(cycles.replace(",", "")), layout
        assert f"{report['cycles'] / report['mac_bound_cycles']:.3f}" == ideal, layout


def test_the_package_and_the_command_say_their_version(capsys):
    import npu_backend
    from npu_backend.tools.cli import main

    with pytest.raises(SystemExit):
        main(["--version"])
    assert npu_backend.__version__ in capsys.readouterr().out
