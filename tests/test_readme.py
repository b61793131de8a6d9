"""The README's Python example runs as written (from a file in a scratch directory: TVMScript
reads its source back, and the example writes model.so)."""

from __future__ import annotations

import pathlib
import re
import runpy

README = pathlib.Path(__file__).parent.parent / "README.md"


def test_the_readme_python_example_runs_as_written(tmp_path, monkeypatch, capsys):
    example = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    script = tmp_path / "readme_example.py"
    script.write_text(example)
    monkeypatch.chdir(tmp_path)
    names = runpy.run_path(str(script), run_name="readme")
    assert (tmp_path / "model.so").is_file()
    assert "fused_relax_matmul" in capsys.readouterr().out  # prof.table() printed the kernel
    _the_remote_example_runs(names)


def _the_remote_example_runs(names):
    """The README's RPC example, on the first example's model.so and inputs, through a local
    server standing in for the board."""
    import numpy as np
    import pytest

    pytest.importorskip("psutil")  # the remote extra
    from npu_backend.tools.remote import start_server

    (example,) = [block for block in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
                  if "RemoteModel" in block]
    server = start_server(port=9501, port_end=9599)
    try:
        scope = {"inputs": names["inputs"]}
        exec(example.replace('"board", 9091', f'"127.0.0.1", {server.port}'), scope)
    finally:
        server.terminate()
    np.testing.assert_array_equal(scope["outputs"][0], names["out"].numpy())
    assert scope["report"]["total_cycles"] == names["prof"].total_cycles


def test_the_readme_pytorch_example_runs_as_written(tmp_path, monkeypatch, capsys):
    import pytest

    pytest.importorskip("torch")  # the optional extra
    (example,) = [block for block in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
                  if "torch.export" in block]
    script = tmp_path / "readme_torch.py"
    script.write_text(example)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="readme")
    assert "nn.conv2d" in capsys.readouterr().out  # the conv ran on the NPU


def test_the_package_and_the_command_say_their_version(capsys):
    import pytest

    import npu_backend
    from npu_backend.tools.cli import main

    with pytest.raises(SystemExit):
        main(["--version"])
    assert npu_backend.__version__ in capsys.readouterr().out
