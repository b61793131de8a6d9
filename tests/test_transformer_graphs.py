"""Transformer graphs from torch.export after the normalise rewrites (normalise/rms_norms.py,
gelus.py, softmaxes.py, negative_indices.py and the folded causal mask): small random
Hugging Face models in the GPT-2, Llama (RMSNorm, SwiGLU, RoPE, grouped-query attention), Bloom
(ALiBi, its own tanh GELU) and Falcon (multi-query attention) styles arrive with each norm, GELU
and softmax as one Relax op and no mask plumbing, and give PyTorch's outputs within 1e-5 on
target "llvm" (the normalised module) and on the NPU.

Optional: skipped without torch and transformers.
"""

from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.frontend.torch import from_exported_program  # noqa: E402

import npu_backend  # noqa: E402
from npu_backend.normalise.stage import normalise  # noqa: E402
from npu_backend.options import CompileOptions  # noqa: E402

hf_models = pytest.importorskip("hf_models", reason="transformers cannot build its models here")

ARCH = "cgra-8x8"
#: What no architecture keeps after normalise: the pieces of hand-written norms and GELUs, the
#: safe softmax's plumbing and the causal mask's computation (folded to a constant).
GONE = ("power", "rsqrt", "mean", "tanh", "erf", "equal", "logical_not", "full_like", "max", "where", "cumsum",
        "index_tensor", "bitwise_and", "less_equal", "arange")
#: architecture -> the ops it must have after normalise, with their counts (2 layers)
EXPECTED = {
    # its residual stream (token plus position rows) carried centred: RMSNorms (centred_streams.py)
    "gpt2": {"nn.gelu_tanh": 2, "nn.softmax": 2, "nn.layer_norm": 0, "nn.rms_norm": 5},
    "llama": {"nn.rms_norm": 5, "nn.softmax": 2},
    # (its embedding's layer norm is a lookup of the normalised table: normalise/table_norms.py)
    "bloom": {"nn.gelu_tanh": 2, "nn.softmax": 2, "nn.layer_norm": 5},
    # its residual stream carried centred: each layer's norm an RMSNorm copied into q/k/v and the
    # MLP (centred_streams.py, normed_linears.py), the final one an RMSNorm plus beta
    "falcon": {"nn.gelu": 2, "nn.softmax": 2, "nn.layer_norm": 0, "nn.rms_norm": 5},
}


def _ops(mod) -> collections.Counter:
    return collections.Counter(
        binding.value.op.name.replace("relax.", "") for func in mod.functions.values()
        if isinstance(func, relax.Function) for block in func.body.blocks for binding in block.bindings
        if isinstance(binding.value, relax.Call) and isinstance(binding.value.op, tvm.ir.Op))


def _relative_error(executable, inputs, expected) -> float:
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = hf_models.first_output(vm["main"](*[tvm.runtime.tensor(x.numpy()) for x in inputs])).numpy()
    assert out.shape == expected.shape
    return float(np.abs(out.astype(np.float64) - expected).max() / np.abs(expected).max())


@pytest.mark.parametrize("name", list(EXPECTED))
def test_transformer_arrives_as_single_ops_and_matches_pytorch(name):
    model, inputs = hf_models.build(name)
    with torch.no_grad():
        expected = hf_models.first_output(model(*inputs)).numpy()
        mod = from_exported_program(torch.export.export(model, inputs))
    normalised = normalise(mod, npu_backend.load_arch(ARCH), CompileOptions())
    ops = _ops(normalised)
    assert {op: ops[op] for op in GONE if ops[op]} == {}, ops
    assert {op: ops[op] for op in EXPECTED[name]} == EXPECTED[name], ops
    for take in _calls(normalised, "relax.take"):  # Falcon's qkv[..., [-2], :] counts from the end
        indices = take.args[1]
        assert not isinstance(indices, tvm.ir.GenericConst) or indices.value.numpy().min() >= 0
    assert _relative_error(tvm.compile(normalised, target="llvm"), inputs, expected) <= 1e-5
    assert _relative_error(npu_backend.compile(mod, ARCH), inputs, expected) <= 1e-5


def _calls(mod, op_name: str) -> list:
    return [binding.value for func in mod.functions.values() if isinstance(func, relax.Function)
            for block in func.body.blocks for binding in block.bindings
            if isinstance(binding.value, relax.Call) and getattr(binding.value.op, "name", "") == op_name]


class _WithMask(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def test_a_padding_mask_from_the_inputs_keeps_the_safe_softmax_guard_and_matches_pytorch():
    """With an attention_mask input the mask is known only at run time: each safe softmax becomes
    softmax and a select (normalise/softmaxes.py), which each layer's attention kernel takes whole
    with its guard (normalise/attentions.py: a greater per layer, inside the kernel, none on the
    host), and left padding gives PyTorch's numbers, no NaN, on the NPU."""
    model, (ids,) = hf_models.build("gpt2")
    mask = torch.ones(1, ids.shape[1], dtype=torch.int64)
    mask[0, :5] = 0  # five padded positions on the left
    wrapped = _WithMask(model).eval()
    with torch.no_grad():
        expected = wrapped(ids, mask).numpy()
        mod = from_exported_program(torch.export.export(wrapped, (ids, mask)))
    ops = _ops(normalise(mod, npu_backend.load_arch(ARCH), CompileOptions()))
    assert {op: ops[op] for op in ("nn.softmax", "greater", "equal", "logical_not", "full_like", "cumsum")} == \
        {"nn.softmax": 2, "greater": 2, "equal": 0, "logical_not": 0, "full_like": 0, "cumsum": 0}, ops
    placements = npu_backend.explain(mod, ARCH)
    assert not [p.op for p in placements if p.where == "host" and p.op in ("greater", "where", "nn.softmax")]
    assert _relative_error(npu_backend.compile(mod, ARCH), (ids, mask), expected) <= 1e-5
