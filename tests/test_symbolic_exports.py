"""Models exported with a symbolic sequence length compile once and run at any length
(normalise/bounded_shapes.py): Hugging Face decoders given `input_ids` alone (their packed-sequence
check slices to `min(1, s)` and with axis -1), encoders whose position ids are sliced to the
length (DistilBERT, ALBERT, DeBERTa-v2), on the NPU and on target "llvm" (the normalised module);
and a slice whose shape the bounds cannot decide is refused with what to pass instead.

The first tests build Relax by hand (no torch); the rest need torch and transformers.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import npu_backend
from npu_backend.normalise.bounded_shapes import resolve_bounded_shapes
from npu_backend.relax_info import shape_dims

ARCH = "cgra-8x8"


def _sliced_positions(bounds: dict | None):
    """x (1, s, 8) plus a (1, 512, 8) table sliced to s: DistilBERT's position ids, in small."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((1, s, 8), "float32"))
    table = relax.const(np.arange(512 * 8, dtype="float32").reshape(1, 512, 8))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs=bounds or {}):
        with bb.dataflow():
            rows = bb.emit(relax.op.strided_slice(table, [1], [0], [s]))
            out = bb.emit_output(relax.op.add(x, rows))
        bb.emit_func_output(out)
    return bb.get()


def test_a_slice_to_the_length_takes_its_bounds_and_runs_on_llvm():
    mod = _sliced_positions({"tir_var_lower_bound": {"s": 2}, "tir_var_upper_bound": {"s": 256}})
    assert shape_dims(mod["main"].body.body) is None  # Relax cannot tell min(s, 512) is s
    resolved = resolve_bounded_shapes(mod)
    assert str(shape_dims(resolved["main"].body.body)) == "[1, s, 8]"
    vm = relax.VirtualMachine(tvm.compile(resolved, "llvm"), tvm.cpu())
    for n in (3, 40):
        x = np.random.default_rng(n).standard_normal((1, n, 8)).astype("float32")
        expected = x + np.arange(512 * 8, dtype="float32").reshape(1, 512, 8)[:, :n]
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), expected)


def test_compile_shape_bounds_decide_the_slice_too():
    resolved = resolve_bounded_shapes(_sliced_positions(None), {"s": 512})
    assert str(shape_dims(resolved["main"].body.body)) == "[1, s, 8]"


@pytest.mark.parametrize("bounds", [None, {"tir_var_upper_bound": {"s": 1024}}])
def test_a_length_the_bounds_do_not_decide_is_refused_saying_what_to_pass(bounds):
    with pytest.raises(npu_backend.UnsupportedOperator, match=r"add in main: .*\(1, s, 8\) and \(1, min\(s, 512\), 8\)"
                       r".*torch.export.Dim.*shape_bounds.*attention_mask"):
        npu_backend.compile(_sliced_positions(bounds), ARCH)


def test_a_slice_with_a_symbolic_end_counts_its_axis_from_zero():
    """TVM lowers strided_slice(x, axes=[-1], ..., end=[s]) taking axis -1 as written:
    "Check failed: axis < src_tensor_dim (-1 vs. 2)" (HF's torch.diff(position_ids, dim=-1))."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((1, s), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_lower_bound": {"s": 2}, "tir_var_upper_bound": {"s": 64}}):
        with bb.dataflow():
            ahead = bb.emit(relax.op.strided_slice(x, [-1], [1], [s]))
            behind = bb.emit(relax.op.strided_slice(x, [-1], [0], [s - 1]))
            out = bb.emit_output(relax.op.subtract(ahead, behind))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(resolve_bounded_shapes(bb.get()), "llvm"), tvm.cpu())
    x = np.array([[3, 5, 6, 10, 11]], dtype="int64")
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), np.diff(x))


def test_slices_to_the_end_and_from_the_end_keep_their_shape_through_a_concat():
    """MobileBERT's trigram embedding: x[:, 1:] (an end of 2**63 - 1) and x[:, :-1], each padded
    back to s rows, concatenated with x. Their extents were min / max arithmetic, the concat had no
    shape and no target built it ("CodeGenVM cannot emit"); numpy's result on the NPU."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((1, s, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_lower_bound": {"s": 3}, "tir_var_upper_bound": {"s": 64}}):
        with bb.dataflow():
            ahead = bb.emit(relax.op.strided_slice(x, [1], [1], [2**63 - 1]))
            behind = bb.emit(relax.op.strided_slice(x, [1], [0], [-1]))
            ahead = bb.emit(relax.op.nn.pad(ahead, [0, 0, 0, 1, 0, 0]))
            behind = bb.emit(relax.op.nn.pad(behind, [0, 0, 1, 0, 0, 0]))
            out = bb.emit_output(relax.op.concat([ahead, x, behind], axis=2))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(npu_backend.compile(bb.get(), ARCH), tvm.cpu())
    for n in (3, 20):
        a = np.random.default_rng(n).standard_normal((1, n, 8)).astype("float32")
        zero = np.zeros((1, 1, 8), "float32")
        expected = np.concatenate([np.concatenate([a[:, 1:], zero], 1), a, np.concatenate([zero, a[:, :-1]], 1)], 2)
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(a)).numpy(), expected)


def test_a_static_module_is_left_as_it_is():
    x = relax.Var("x", relax.TensorType((1, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        out = bb.emit(relax.op.strided_slice(x, [-1], [0], [8]))
        bb.emit_func_output(out)
    mod = bb.get()
    assert resolve_bounded_shapes(mod).same_as(mod)


# --- Hugging Face models exported with input_ids alone and Dim("s", min=2, max=256) ---------------

#: Quick by default (3-5 s each); the other decoders behind the slow mark.
DEFAULT = ("llama", "gpt2", "distilbert")
OTHERS = ("qwen2", "mistral", "gemma", "phi3", "gpt_neox", "gptj", "falcon", "bloom", "albert")
LENGTHS = (5, 16, 33)


def _export(name: str, max_length: int = 256):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tvm.relax.frontend.torch import from_exported_program

    transformer_models = pytest.importorskip("transformer_models")
    model, inputs = transformer_models.build(name)
    model = getattr(model, "model", model)  # the decoders without WithMask's attention mask

    class IdsOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids).last_hidden_state

    ids_only = IdsOnly().eval()
    length = torch.export.Dim("s", min=2, max=max_length)
    exported = torch.export.export(ids_only, (inputs[0],), dynamic_shapes=({1: length},))
    return ids_only, from_exported_program(exported)


def _worst_error(executable, model) -> float:
    import torch

    vm = relax.VirtualMachine(executable, tvm.cpu())
    worst = 0.0
    for n in LENGTHS:
        ids = torch.randint(0, 100, (1, n), generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            expected = model(ids).numpy().astype(np.float64)
        out = vm["main"](tvm.runtime.tensor(ids.numpy()))
        out = (out[0] if not hasattr(out, "numpy") else out).numpy()
        assert out.shape == expected.shape
        worst = max(worst, float(np.abs(out - expected).max() / np.abs(expected).max()))
    return worst


@pytest.mark.parametrize("name", [*DEFAULT, *(pytest.param(name, marks=pytest.mark.slow) for name in OTHERS)])
def test_an_input_ids_export_compiles_once_and_matches_pytorch_at_every_length(name):
    from npu_backend.normalise.stage import normalise
    from npu_backend.options import CompileOptions

    model, mod = _export(name)
    with npu_backend.profile() as prof:
        assert _worst_error(npu_backend.compile(mod, ARCH), model) < 1e-5
    assert prof.kernels, "nothing ran on the NPU"
    normalised = normalise(mod, npu_backend.load_arch(ARCH), CompileOptions())
    assert _worst_error(tvm.compile(normalised, "llvm"), model) < 1e-5


def test_an_encoder_without_an_upper_bound_is_refused_saying_what_to_pass():
    """torch.export itself refuses a bound past DistilBERT's 512 positions; a module that carries
    none (as from ONNX, or a hand-built one) is refused naming the add, then takes compile's."""
    model, mod = _export("distilbert")
    mod = tvm.IRModule({"main": mod["main"].without_attr("tir_var_upper_bound")})
    with pytest.raises(npu_backend.UnsupportedOperator,
                       match=r"add in main: .*min\(s\d*, 512\).*no upper bound.*Dim.*shape_bounds"):
        npu_backend.compile(mod, ARCH)
    (length,) = relax.analysis.defined_symbolic_vars(mod["main"])
    assert _worst_error(npu_backend.compile(mod, ARCH, shape_bounds={length.name: 512}), model) < 1e-5


#: Encoders not in transformer_models.py whose length enters their embeddings (issue 36 item 2:
#: neither compiled with a symbolic length): DeBERTa-v2's relative positions; MobileBERT's trigram
#: embedding slices x[:, 1:] and x[:, :-1] ("CodeGenVM cannot emit", on llvm too; its export
#: needs s >= 3). name -> (config class, model class, config arguments, shortest length).
ENCODERS = {
    "deberta_v2": ("DebertaV2Config", "DebertaV2Model", dict(max_position_embeddings=512), 2),
    "mobilebert": ("MobileBertConfig", "MobileBertModel", dict(embedding_size=32, intra_bottleneck_size=32), 3),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_an_encoder_with_a_symbolic_length_compiles_once_and_matches_pytorch(name):
    torch = pytest.importorskip("torch")
    hf = pytest.importorskip("transformers")
    from tvm.relax.frontend.torch import from_exported_program

    config_class, model_class, extra, shortest = ENCODERS[name]
    torch.manual_seed(0)
    config = getattr(hf, config_class)(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=128, **extra)
    encoder = getattr(hf, model_class)(config).eval()

    class IdsOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = encoder

        def forward(self, input_ids):
            return self.model(input_ids=input_ids).last_hidden_state

    model = IdsOnly().eval()
    ids = torch.randint(0, 100, (1, 16))
    length = torch.export.Dim("s", min=shortest, max=256)
    exported = torch.export.export(model, (ids,), dynamic_shapes=({1: length},))
    with npu_backend.profile() as prof:
        assert _worst_error(npu_backend.compile(from_exported_program(exported), ARCH), model) < 1e-5
    assert prof.kernels, "nothing ran on the NPU"
