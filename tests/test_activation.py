"""A relu or clip that no conv2d / matmul kernel fuses runs on its own on the vector unit's
EPILOGUE (kernels/elementwise/activation.py), e.g. after an elementwise add (a residual add the epilogue
cannot take); float32 and int32, rank 1..4, any preset. A clip after a relu becomes one clip
(normalise/clips.py), which the kernel before it fuses."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.tools.workloads import matmul_model, mismatch, run

RNG = np.random.default_rng(0)


def module(shape, dtype, body):
    bb = relax.BlockBuilder()
    a, b = relax.Var("a", relax.TensorType(shape, dtype)), relax.Var("b", relax.TensorType(shape, dtype))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, a, b))
        bb.emit_func_output(out)
    return bb.get()


@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=4).map(tuple),
       dtype=st.sampled_from(["float32", "int32"]), act=st.sampled_from(["relu", "clip"]),
       arch=st.sampled_from(npu_backend.preset_names()))
def test_an_activation_after_an_add_runs_on_the_npu(shape, dtype, act, arch):
    lo, hi = (-3, 700) if dtype == "int32" else (-0.5, 1.25)

    def body(bb, a, b):
        total = bb.emit(relax.op.add(a, b))
        return relax.op.nn.relu(total) if act == "relu" else relax.op.clip(total, lo, hi)

    mod = module(shape, dtype, body)
    assert [p.where for p in npu_backend.explain(mod, arch)] == ["npu", "npu"]
    a, b = ((RNG.integers(-1000, 1000, shape) if dtype == "int32" else RNG.standard_normal(shape)).astype(dtype)
            for _ in range(2))
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), [a, b])
    expected = np.maximum(a + b, 0) if act == "relu" else np.clip(a + b, lo, hi)
    assert mismatch(out, expected.astype(dtype), dtype) is None
    assert len(prof.kernels) == 2


def test_a_relu_then_a_clip_fuse_into_one_epilogue():
    mod, inputs, ref = matmul_model(24, 16, 32, residual=True, clip=(-1.0, 2.0))  # relu, then clip
    placements = npu_backend.explain(mod, "cgra-8x8")
    assert {p.kernel.split()[0] for p in placements} == {"cgra.matmul_bias_residual_clip"}  # clip(x, 0, 2)
    assert mismatch(run(npu_backend.compile(mod, "cgra-8x8"), inputs), ref, "float32") is None


def test_a_clip_after_an_eltwise_max_runs_on_its_own():
    mod = module((3, 50), "float32", lambda bb, a, b: relax.op.clip(bb.emit(relax.op.maximum(a, b)), -1.0, 0.5))
    assert [(p.op, p.kernel.split()[0]) for p in npu_backend.explain(mod, "cgra-4x4")] == \
        [("maximum", "cgra.eltwise_maximum"), ("clip", "cgra.clip")]
