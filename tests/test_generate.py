"""examples/generate.py (issue 36): greedy generation from a random-weight Hugging Face Llama with
the prefill and the decode step each compiled once, the KV caches preallocated on the device,
the prompt's rows written by the prefill at once and each new row by a decode step, in place;
the tokens equal PyTorch's `model.generate(do_sample=False)` and no decode step has a host op or
a host/NPU crossing. Needs torch and transformers (CI's extras step)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "generate.py"


def _example():
    spec = importlib.util.spec_from_file_location("generate_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generation_on_the_npu_equals_pytorch_with_the_cache_on_the_device(capsys):
    assert _example().main(["--tokens", "6", "--prompt-length", "3", "--bound", "16"]) == 0
    out = capsys.readouterr().out
    assert "the same tokens" in out
    assert len([line for line in out.splitlines() if line.startswith("prefill of 3 tokens: ")]) == 1
    steps = [line for line in out.splitlines() if line.lstrip().startswith(("prefill pos", "decode pos"))]
    assert len(steps) == 5  # the prompt in one prefill, then the decode steps
    assert all(line.endswith("host 0 cycles, 0 crossings") for line in steps), steps


def test_a_generation_past_the_bound_names_it_and_the_option():
    generate = _example()
    with pytest.raises(ValueError, match="past the bound 16: pass --bound 20 or more"):
        generate.generate(None, None, [1] * 4, 16, 16)
