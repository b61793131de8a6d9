"""A gated linear unit (SwiGLU, GeGLU) as one GEMM kernel: normalise/gated_linears.py writes the
gate and up projections of one input as one linear over their interleaved weights, and
kernels/gemm/gated.py runs act(even columns) * odd columns in its epilogue.

End to end against float64 numpy for the forms the decoders write (two linears: Llama, Qwen2,
Mistral, Gemma; the halves of one fused linear: Phi-3), each activation, and the inputs that must
not fuse (two different inputs)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tvm import relax

import npu_backend
from models import run

ACTS = {
    "silu": (lambda bb, y: bb.emit(relax.op.multiply(y, bb.emit(relax.op.sigmoid(y)))), lambda g: g / (1 + np.exp(-g))),
    "gelu_tanh": (lambda bb, y: bb.emit(relax.op.nn.gelu_tanh(y)),
                  lambda g: 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))),
    "gelu": (lambda bb, y: bb.emit(relax.op.nn.gelu(y)),
             lambda g: 0.5 * g * (1 + np.vectorize(math.erf)(g / math.sqrt(2)))),
}


def gated_model(form: str, act: str, s: int = 32, k: int = 64, n: int = 96, seed: int = 0):
    """main(x[, x2]): act(x Wgᵀ) * (x Wuᵀ) as torch.export writes a decoder's MLP (`form`
    "two": two linears, "fused": one over [Wg; Wu] sliced in halves, "two_inputs": the up
    projection of another input). Returns (module, inputs, float64 reference)."""
    rng = np.random.default_rng(seed)
    x, x2 = (rng.standard_normal((1, s, k)).astype("float32") for _ in range(2))
    wg, wu = ((rng.standard_normal((n, k)) / np.sqrt(k)).astype("float32") for _ in range(2))
    bb = relax.BlockBuilder()
    params = [relax.Var("x", relax.TensorType(x.shape, "float32"))]
    params += [relax.Var("x2", relax.TensorType(x.shape, "float32"))] if form == "two_inputs" else []

    def linear(source, w):
        flat = bb.emit(relax.op.reshape(source, (s, k)))
        y = bb.emit(relax.op.matmul(flat, bb.emit(relax.op.permute_dims(relax.const(w)))))
        return bb.emit(relax.op.reshape(y, (1, s, w.shape[0])))

    with bb.function("main", params):
        with bb.dataflow():
            if form == "fused":
                both = linear(params[0], np.concatenate([wg, wu]))
                gate, up = (bb.emit(relax.op.strided_slice(both, [2], [b], [b + n])) for b in (0, n))
            else:
                gate, up = linear(params[0], wg), linear(params[-1], wu)
            out = bb.emit_output(bb.emit(relax.op.multiply(up, ACTS[act][0](bb, gate))))
        bb.emit_func_output(out)
    g = x.reshape(s, k).astype(np.float64) @ wg.T.astype(np.float64)
    u = (x2 if form == "two_inputs" else x).reshape(s, k).astype(np.float64) @ wu.T.astype(np.float64)
    return bb.get(), [x] + ([x2] if form == "two_inputs" else []), (ACTS[act][1](g) * u).reshape(1, s, n)


@pytest.mark.parametrize("form, act", [("two", "silu"), ("fused", "silu"), ("two", "gelu_tanh"), ("two", "gelu")])
def test_a_gated_unit_is_one_kernel_and_matches_float64(form, act):
    mod, inputs, ref = gated_model(form, act)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), inputs)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    (kernel,) = prof.kernels
    assert "strided_slice" in kernel.source_ops and kernel.dma_store_bytes == out.nbytes


def test_projections_of_two_inputs_are_not_fused():
    mod, inputs, ref = gated_model("two_inputs", "silu")
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), inputs)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    assert len(prof.kernels) == 2 and all("strided_slice" not in k.source_ops for k in prof.kernels)


def test_odd_sizes_pad_their_tiles():
    """17 tokens and 20 outputs: the tiles are padded (24 rows, 48 accumulator columns)."""
    mod, inputs, ref = gated_model("two", "silu", s=17, k=24, n=20, seed=3)
    out = run(npu_backend.compile(mod, "cgra-16x16"), inputs)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
