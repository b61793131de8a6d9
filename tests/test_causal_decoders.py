"""HF's decoders given an attention_mask (tests/transformer_models.py, 32 tokens): their causal &
padding mask reaches every attention as the kernel's causal triangle and a padding row
(normalise/causal_rows.py, kernels/attention/rows.py), no s x s mask built by an add kernel.

Optional: skipped without torch and transformers.
"""

from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tvm.relax.frontend.torch import from_exported_program  # noqa: E402

import npu_backend  # noqa: E402
from transformer_models import build  # noqa: E402


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_decoders_attention_takes_the_triangle_and_the_row(name):
    model, inputs = build(name, tokens=32)
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, inputs))
    kernels = collections.defaultdict(list)
    for placement in npu_backend.explain(mod, "cgra-8x8"):
        if placement.where == "npu":
            kernels[(placement.kernel, placement.site)].append(placement)
    attentions = [kernel for kernel, _ in kernels if "attention" in kernel]
    assert len(attentions) == 2 and all("_causal_row" in kernel for kernel in attentions), attentions
    square_adds = [ops[0].output for ops in kernels.values()
                   if [p.op for p in ops] == ["add"] and "32, 32)" in ops[0].output]
    assert not square_adds, square_adds  # the 32 x 32 mask (572 cycles in Llama) is not built
