"""Sigmoid, SiLU and GELU's tanh form on the PE fabric (cgra_sim/mapping/sigmoid.py,
npu_backend/kernels/elementwise/sigmoid.py): the arithmetic's accuracy against float64, its bodies mapped on
every preset, and whole kernels bit-exact to the numpy model and within tolerance of TVM's llvm build."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.script import relax as R

import npu_backend
from cgra_sim import load_arch, preset_names
from cgra_sim.fabric import Fabric
from cgra_sim.mapping import body as bodies
from cgra_sim.mapping import sigmoid as smooth
from cgra_sim.mapping.sigmoid import passes as kernel_bodies


def _exact_sigmoid(x):
    return 1 / (1 + np.exp(-np.asarray(x, np.float64)))


def test_the_fabric_sigmoid_is_within_3e_5_of_float64_everywhere_float32_is_normal():
    x = np.concatenate([np.linspace(-110, 110, 2_000_001), np.random.default_rng(0).standard_normal(50_000) * 8])
    x = x.astype("float32")
    exact = _exact_sigmoid(x)
    normal = exact > np.finfo(np.float32).tiny
    relative = np.abs(smooth.sigmoid(x) - exact) / np.where(normal, exact, 1)
    assert relative[normal].max() < 3.1e-5
    assert relative[np.abs(x) < 10].max() < 1.1e-5 and relative[x > 0].max() < 3.5e-6


def test_special_values_keep_their_meaning():
    x = np.array([0, -0.0, 1e-30, -1e-30, np.inf, -np.inf, 200, -200, 88.5, -88.5], np.float32)
    got = smooth.sigmoid(x)
    np.testing.assert_allclose(got[:4], 0.5, rtol=1e-7)
    assert list(got[4:8]) == [1, 0, 1, 0]
    assert 0 < got[9] < 1e-38  # a denormal, like float32's own
    assert np.isnan(smooth.sigmoid(np.array([np.nan], np.float32)))[0]


def test_silu_and_gelu_tanh_are_x_times_the_sigmoid():
    x = np.linspace(-8, 8, 4001, dtype=np.float32)
    wide = x.astype(np.float64)
    np.testing.assert_allclose(smooth.silu(x), wide * _exact_sigmoid(wide), rtol=2e-5, atol=1e-12)
    gelu = 0.5 * wide * (1 + np.tanh(math.sqrt(2 / math.pi) * (wide + 0.044715 * wide ** 3)))
    np.testing.assert_allclose(smooth.gelu_tanh(x), gelu, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("arch", preset_names())
def test_every_body_fits_a_record_and_maps_on_every_preset(arch):
    for nodes in kernel_bodies("gelu_tanh"):
        bodies.check_body(nodes, "float32")
        program = bodies.program(nodes, "float32", Fabric.of(load_arch(arch)))
        assert program.ii >= 1 and program.lanes >= 1


def _module(kind: str, shape: tuple):
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            if kind == "silu-onnx":
                value = builder.emit(relax.op.multiply(x, builder.emit(relax.op.sigmoid(x))))
            else:
                value = builder.emit({"sigmoid": relax.op.sigmoid, "silu": relax.op.nn.silu,
                                      "gelu_tanh": relax.op.nn.gelu_tanh}[kind](x))
            out = builder.emit_output(value)
        builder.emit_func_output(out)
    return builder.get()


_MODEL = {"sigmoid": smooth.sigmoid, "silu": smooth.silu, "silu-onnx": smooth.silu, "gelu_tanh": smooth.gelu_tanh}


@settings(max_examples=8, deadline=None)
@given(kind=st.sampled_from(sorted(_MODEL)), shape=st.lists(st.integers(1, 40), min_size=1, max_size=4),
       arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]), scale=st.sampled_from([1.0, 6.0, 40.0]))
def test_kernels_are_bit_exact_to_the_model_and_close_to_llvm(kind, shape, arch, scale):
    mod = _module(kind, tuple(shape))
    placements = npu_backend.explain(mod, load_arch(arch))
    assert all(p.where == "npu" for p in placements), placements
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * scale).astype("float32")
    got = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, _MODEL[kind](x))
    reference = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    reference = reference.numpy()
    assert np.abs(got - reference).max() <= 1e-4 * max(np.abs(reference).max(), 1e-30)


def test_gelu_erf_runs_on_the_vector_unit_and_a_float16_sigmoid_in_float32_between_two_casts():
    """The smooth family computes float32 only; a float16 sigmoid is widened, computed and rounded
    back by two NPU casts (normalise/half_casts.py, kernels/elementwise/cast.py), no longer left on
    the host."""
    @tvm.script.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((4, 16), "float32"), y: R.Tensor((4, 16), "float16")):
            with R.dataflow():
                a = R.nn.gelu(x)
                b = R.sigmoid(y)
                R.output(a, b)
            return (a, b)

    placed = npu_backend.explain(Module, load_arch("cgra-4x4"))
    placements = {p.op: p for p in placed}
    assert placements["nn.gelu"].where == "npu" and placements["nn.gelu"].kernel.startswith("cgra.gelu")
    assert placements["sigmoid"].where == "npu" and placements["sigmoid"].kernel.startswith("cgra.smooth.sigmoid")
    casts = [p for p in placed if p.op == "astype"]
    assert len(casts) == 2 and all(p.where == "npu" and p.kernel.startswith("cgra.cast") for p in casts)


def test_a_kernel_reports_its_fabric_passes_and_source_ops():
    mod = _module("silu-onnx", (2, 8, 12, 12))
    x = np.random.default_rng(0).standard_normal((2, 8, 12, 12)).astype("float32")
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    with npu_backend.profile() as prof:
        vm["main"](tvm.runtime.tensor(x))
    (kernel,) = prof.kernels
    assert kernel.source_ops == ("sigmoid", "multiply")
    tiles = kernel.op_counts["DMA_LOAD"]
    assert kernel.op_counts["FABRIC"] == 3 * tiles and kernel.op_counts["ELTWISE"] == tiles
    assert kernel.cycles > 0
