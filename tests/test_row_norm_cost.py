"""A pre-norm before a GEMM of few rows and large weights runs as its own kernel when the fold's
whole-depth row tiles would reload the weights (kernels/gemm/row_norm_cost.py): Swin-T's and
ConvNeXt-T's stage-4 layer norm + fc1 (49 x 768 -> 3072) on cgra-8x8, 4,146,855 cycles fused
against 33,386 + 2,068,514 apart."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from cgra_sim.isa import FIELDS, Op
from cgra_sim.arch import load_arch
from npu_backend.errors import UnsupportedOperator
from npu_backend.kernels.gemm import gemm
from npu_backend.kernels.gemm.row_norm_cost import check_fold_pays, search_cycles
from test_normed_linears import _kernels, _normed_linear, _reference

_SLOT, _EXTENTS = FIELDS[Op.DMA_LOAD].index("slot"), [i for i, f in enumerate(FIELDS[Op.DMA_LOAD])
                                                      if f.startswith("extent")]


def _gelu_linear(rows: int, cols: int, n: int, seed: int):
    """main(x) = gelu(layer_norm(x) @ W^T + b), x (rows, cols): a transformer's norm + fc1."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, cols)) / math.sqrt(cols)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    x = relax.Var("x", relax.TensorType((rows, cols), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            norm = bb.emit(relax.op.nn.layer_norm(x, relax.const(np.ones(cols, np.float32)),
                                                  relax.const(np.zeros(cols, np.float32)), axes=[-1], epsilon=1e-5))
            y = bb.emit(relax.op.add(relax.op.matmul(norm, relax.op.permute_dims(relax.const(w))), relax.const(b)))
            out = bb.emit_output(relax.op.nn.gelu(y))
        bb.emit_func_output(out)
    return bb.get(), w, b


def _gelu_reference(x, w, b):
    y = _reference(x, 1e-5, 1.0, 0.0, w, b, kind="layer_norm")
    return 0.5 * y * (1.0 + np.vectorize(math.erf)(y / math.sqrt(2.0)))


def _run(mod, x, arch="cgra-8x8"):
    vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    with npu_backend.profile(keep_timelines=True) as prof:
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    return got, prof


def _loaded_per_slot(launch) -> dict:
    """Slot -> float32 bytes its DMA loads move, every box counted (a reloaded tile each time)."""
    loaded = {}
    for record in launch.commands:
        if Op(int(record[0])) == Op.DMA_LOAD:
            slot = int(record[_SLOT])
            loaded[slot] = loaded.get(slot, 0) + 4 * math.prod(int(record[i]) for i in _EXTENTS)
    return loaded


def test_few_rows_and_large_weights_load_the_weights_once():
    """40 x 384 -> 1536 (2.4 MB of weights) on cgra-8x8: fused, its whole-depth row tiles of 8
    reloaded the weights 5 times (456,871 cycles); apart, the norm's kernel and a GEMM of one
    40-row tile that loads each weight tile once (389,718), within 1.1 x the roofline."""
    rows, cols, n = 40, 384, 1536
    mod, w, b = _gelu_linear(rows, cols, n, 0)
    assert {"cgra.layer_norm_plain", "cgra.linear_epilogue"} <= _kernels(mod), _kernels(mod)
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    got, prof = _run(mod, x)
    ref = _gelu_reference(x, w, b)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    (linear,) = [t for t in prof.timelines if "matmul" in t.name]
    assert n * cols * 4 in _loaded_per_slot(linear).values()  # the weights' slot: each element once
    assert prof.total_cycles <= 1.1 * sum(k.roofline_cycles for k in prof.kernels)


def test_the_check_refuses_only_a_dearer_fold():
    """At the search's level: the 49 x 768 -> 3072 fold is refused (its tiling estimated dearer
    than the GEMM's own and the norm's kernel); a ViT-sized 17 x 256 -> 1024 fold, whose tiling is
    the GEMM's own, and a 64 x 64 -> 128 one are kept."""
    arch = load_arch("cgra-8x8")
    for (rows, cols, n), refused in (((49, 768, 3072), True), ((17, 256, 1024), False), ((64, 64, 128), False)):
        spec = _normed_spec(rows, cols, n, arch)
        tiling = _fold_tiling(spec, arch)
        if refused:
            with pytest.raises(UnsupportedOperator, match="reload the weights"):
                check_fold_pays(spec, tiling, arch, gemm.choose_gemm_tiling)
        else:
            check_fold_pays(spec, tiling, arch, gemm.choose_gemm_tiling)
            assert search_cycles(spec, tiling, arch) > 0


def _normed_spec(rows, cols, n, arch):
    """The normed linear's KernelSpec as partition builds it (the first cgra.linear_layer_norm
    composite's), found through explain's plan."""
    mod, _ = _normed_linear(rows, cols, n, 1e-5, True, 0, lead=False, gamma=False, kind="layer_norm")
    specs = []
    original = gemm.check_row_norm

    def spy(spec, tiling, arch_):
        specs.append(spec)
        return original(spec, tiling, arch_)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gemm, "check_row_norm", spy)
        mp.setattr(gemm, "check_fold_pays", lambda *args: None)
        npu_backend.explain(mod, arch.name)
    return next(s for s in specs if s.row_norm is not None)


def _fold_tiling(spec, arch):
    """The tile search's choice for the fold (without the check under test)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gemm, "check_fold_pays", lambda *args: None)
        return gemm.choose_gemm_tiling(spec, arch)


@settings(max_examples=4, deadline=None)  # one compile each: a few seconds
@given(rows=st.integers(1, 64), cols=st.sampled_from([64, 256, 384]), n=st.sampled_from([256, 1024, 1536]),
       seed=st.integers(0, 99), offset=st.sampled_from([0.0, 20.0]))
@example(rows=49, cols=384, n=1536, seed=0, offset=0.0)  # refused: a 56-row GEMM apart
@example(rows=17, cols=256, n=1024, seed=1, offset=20.0)  # kept: one kernel
def test_either_way_the_result_is_numpys(rows, cols, n, seed, offset):
    """Whichever way the check decides, layer_norm + linear + GELU is float64 numpy's within
    1e-5 of the largest output (rows whose mean is 20 standard deviations too)."""
    mod, w, b = _gelu_linear(rows, cols, n, seed)
    x = (np.random.default_rng(seed).standard_normal((rows, cols)) + offset).astype(np.float32)
    got, _ = _run(mod, x)
    ref = _gelu_reference(x, w, b)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
