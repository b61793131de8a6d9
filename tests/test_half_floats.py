"""bfloat16 and float16 models end to end: matmul / dense and conv2d kernels on the PE array,
checked against numpy's model of the NPU (cgra_sim/half_floats.py) and against the exact result.

The error bound per op (half_floats.error_bound; p = 8 significand bits for bfloat16, 11 for
float16, u = 2 ** -24, gamma_K = K u / (1 - K u) over the K products plus the bias and residual):

    |npu - exact| <= 2 ** -p |exact| + s / 2 + (1 + 2 ** -p) gamma_K sum |terms|   one rounding after a float32 sum
    |npu - model| <= 2 ** (1 - p) |model| + s + 2 gamma_K sum |terms|          the same, in another order

(s the format's smallest subnormal: 2 ** -24 for float16, 2 ** -133 for bfloat16.)

Hypothesis draws shapes, the epilogue, and the PE array's size (the presets and others), so the
tile search picks different tiles and K splits into different steps. The other checks: a
16-bit float kernel takes fewer cycles and DMA bytes than float32 on the same chip, and what the
chip cannot do in these formats stays on the host with its reason.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from cgra_sim.half_floats import SIGNIFICAND_BITS, SMALLEST_SUBNORMAL, error_bound
from npu_backend.tools.workloads import (batch_matmul_model, conv2d_model, gemm_terms, half_mismatch, matmul_model, numpy_dtype,
                                         relax_module, run)

HALVES = ["bfloat16", "float16"]
PRESETS = npu_backend.preset_names()


@st.composite
def arrays(draw):
    """A preset, or a preset with another PE array (the tile search sizes tiles to it)."""
    arch = npu_backend.load_arch(draw(st.sampled_from(PRESETS)))
    if draw(st.booleans()):
        arch = dataclasses.replace(arch, name="half-test", rows=draw(st.sampled_from([2, 4, 8])),
                                   cols=draw(st.sampled_from([4, 8, 16])))
    return arch


def _check(out, ref, inputs, depth, dtype, op, bias, residual, **conv):
    terms = gemm_terms(inputs, op, bias, residual, **conv)
    bound = error_bound(ref.astype(np.float32), terms, depth + bias + residual, dtype)
    problem = half_mismatch(out, ref, bound)
    assert problem is None, problem
    return terms


@settings(max_examples=8)  # a compile each: about 4 s
@given(m=st.integers(1, 80), n=st.integers(1, 80), k=st.integers(1, 200), dtype=st.sampled_from(HALVES),
       arch=arrays(), bias=st.booleans(), relu=st.booleans(), residual=st.booleans(), transposed=st.booleans())
def test_matmul_lowering_property(m, n, k, dtype, arch, bias, relu, residual, transposed):
    mod, inputs, ref = matmul_model(m, n, k, dtype, bias=bias, relu=relu, residual=residual, transposed=transposed)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    assert out.dtype == numpy_dtype(dtype) and len(prof.kernels) == 1  # the whole chain on the NPU
    _check(out, ref, inputs, k, dtype, "matmul", bias, residual, transposed=transposed)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("rhs", [(3, 40, 24), (40, 24)], ids=["per-image", "shared"])
def test_a_batched_matmul(dtype, rhs):
    mod, inputs, ref = batch_matmul_model((3, 17, 40), rhs, dtype, bias=True, relu=True)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), inputs)
    assert len(prof.kernels) == 1
    x, w = (np.abs(a.astype(np.float64)) for a in inputs[:2])
    terms = np.matmul(x, w) + np.abs(inputs[2].astype(np.float64))
    problem = half_mismatch(out, ref, error_bound(ref.astype(np.float32), terms, 40 + 1, dtype))
    assert problem is None, problem


@settings(max_examples=8)
@given(batch=st.integers(1, 2), channels=st.integers(1, 20), size=st.integers(3, 14), filters=st.integers(1, 24),
       kernel=st.integers(1, 3), stride=st.integers(1, 2), pad=st.integers(0, 1), dtype=st.sampled_from(HALVES),
       arch=arrays(), bias=st.booleans(), relu=st.booleans())
def test_conv2d_lowering_property(batch, channels, size, filters, kernel, stride, pad, dtype, arch, bias, relu):
    conv = dict(stride=(stride, stride), pad=(pad,) * 4)
    if size + 2 * pad < kernel:
        return
    mod, inputs, ref = conv2d_model(batch, channels, size, size + 1, filters, kernel, kernel, dtype=dtype,
                                    bias=bias, relu=relu, **conv)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    assert len(prof.kernels) == 1
    _check(out, ref, inputs, channels * kernel * kernel, dtype, "conv2d", bias, False, **conv)


@settings(max_examples=8)
@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 300), dtype=st.sampled_from(HALVES),
       scale=st.sampled_from([1e-3, 1.0, 100.0]), seed=st.integers(0, 2**32 - 1))
def test_the_npu_is_within_its_stated_bound_of_the_exact_result(m, n, k, dtype, scale, seed):
    """One rounding after a float32 sum: |npu - y| <= 2 ** -p |y| + s / 2 + (1 + 2 ** -p) gamma_K sum |a b|."""
    mod, inputs, _ = matmul_model(m, n, k, dtype, bias=False, relu=False, seed=seed)
    inputs = [(a.astype(np.float32) * np.float32(scale)).astype(numpy_dtype(dtype)) for a in inputs]
    out = run(npu_backend.compile(mod, "cgra-4x4"), inputs).astype(np.float64)
    x, w = (a.astype(np.float64) for a in inputs)
    exact, terms = x @ w, np.abs(x) @ np.abs(w)
    unit = k * 2.0 ** -24
    p = 2.0 ** -SIGNIFICAND_BITS[dtype]
    bound = p * np.abs(exact) + SMALLEST_SUBNORMAL[dtype] / 2 + (1 + p) * unit / (1 - unit) * terms
    assert np.all(np.abs(out - exact) <= bound)


@pytest.mark.parametrize("arch", PRESETS)
@pytest.mark.parametrize("dtype", HALVES)
def test_a_16_bit_kernel_takes_fewer_cycles_and_bytes_than_float32(arch, dtype):
    figures = {}
    for each in ("float32", dtype):
        mod, inputs, _ = conv2d_model(1, 16, 14, 14, 32, 3, 3, pad=(1, 1, 1, 1), dtype=each)
        with npu_backend.profile() as prof:
            run(npu_backend.compile(mod, arch), inputs)
        (kernel,) = prof.kernels
        figures[each] = kernel
    half, f32 = figures[dtype], figures["float32"]
    assert half.cycles < f32.cycles and half.dma_load_bytes < f32.dma_load_bytes
    assert half.dma_store_bytes * 2 == f32.dma_store_bytes
    assert half.energy_pj < f32.energy_pj


@pytest.mark.parametrize("dtype", HALVES)
def test_a_16_bit_matmul_may_store_its_float32_sum(dtype):
    """matmul(x, w, out_dtype="float32") (what TVM's PyTorch importer writes for a bfloat16 Linear,
    an astype after it): the EPILOGUE stores the float32 sum unrounded, a float32 bias added."""
    specs = [("x", (24, 40), dtype), ("w", (40, 16), dtype), ("b", (16,), "float32")]

    def body(bb, x, w, b):
        return bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w, out_dtype="float32")), b))))

    mod = relax_module(specs, body)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(shape).astype(np.float32).astype(numpy_dtype(dt)) for _, shape, dt in specs]
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), inputs)
    assert out.dtype == np.float32 and len(prof.kernels) == 1
    x, w = (a.astype(np.float64) for a in inputs[:2])
    exact = np.maximum(x @ w + inputs[2], 0)
    unit = 41 * 2.0 ** -24
    assert np.all(np.abs(out - exact) <= unit / (1 - unit) * (np.abs(x) @ np.abs(w) + np.abs(inputs[2])))


@settings(max_examples=8)
@given(dtype=st.sampled_from(HALVES), func=st.sampled_from(["add", "subtract", "multiply", "maximum", "minimum"]),
       rows=st.integers(1, 40), cols=st.integers(1, 70), broadcast=st.sampled_from(["none", "row", "column"]),
       seed=st.integers(0, 2**16))
def test_elementwise_ops_compute_in_float32_and_round_bit_exactly(dtype, func, rows, cols, broadcast, seed):
    """ELTWISE on 16-bit floats: both operands widened, the op in float32, the result rounded to
    nearest even, as the host (TVM's bfloat16 legalisation, PyTorch's CPU kernels) computes it."""
    rhs = {"none": (rows, cols), "row": (1, cols), "column": (rows, 1)}[broadcast]
    mod = relax_module([("a", (rows, cols), dtype), ("b", rhs, dtype)],
                       lambda bb, a, b: bb.emit(getattr(relax.op, func)(a, b)))
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(shape).astype(np.float32).astype(numpy_dtype(dtype)) for shape in ((rows, cols), rhs))
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), [a, b])
    assert len(prof.kernels) == 1 and prof.kernels[0].energy_pj > 0
    np_func = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply}.get(func, getattr(np, func))
    expected = np_func(a.astype(np.float32), b.astype(np.float32)).astype(numpy_dtype(dtype))
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


def _host_reasons(mod, arch="cgra-8x8"):
    return {p.op: p.reason for p in npu_backend.explain(mod, arch) if p.where == "host"}


def test_what_the_chip_lacks_in_16_bit_floats_stays_on_the_host_saying_why():
    # A depthwise conv2d: its kernel computes float32 and int8.
    x, w = ("x", (1, 8, 6, 6), "bfloat16"), ("w", (8, 1, 3, 3), "bfloat16")
    mod = relax_module([x, w], lambda bb, a, b: bb.emit(relax.op.nn.conv2d(a, b, groups=8)))
    assert "depthwise" in _host_reasons(mod)["nn.conv2d"]
    # A sigmoid after a matmul: computed in float32 between cast kernels (normalise/half_casts.py),
    # as PyTorch's CPU kernel does; a standalone relu: the EPILOGUE's relu takes float32 or int32.
    specs = [("x", (8, 16), "float16"), ("w", (16, 8), "float16")]
    mod = relax_module(specs, lambda bb, a, b: bb.emit(relax.op.sigmoid(bb.emit(relax.op.matmul(a, b)))))
    assert _host_reasons(mod) == {}
    mod = relax_module([("x", (8, 16), "bfloat16")], lambda bb, a: bb.emit(relax.op.nn.relu(a)))
    assert "the EPILOGUE computes float32 or int32" in _host_reasons(mod)["nn.relu"]
    # A chip whose description leaves bfloat16 out of macs_per_pe.
    arch = npu_backend.load_arch("cgra-8x8")
    plain = type(arch).from_dict({**arch.to_dict(), "name": "no-bf16", "macs_per_pe": {"float32": 1, "int8": 1},
                                  "energy": None, "area": None})
    mod, inputs, _ = matmul_model(8, 8, 8, "bfloat16")
    assert "computes float32, int8, not bfloat16" in _host_reasons(mod, plain)["matmul"]
    out = run(npu_backend.compile(mod, plain), inputs)  # on the host, still right
    assert out.dtype == numpy_dtype("bfloat16")


def test_verify_checks_16_bit_floats(capsys):
    from npu_backend.tools.cli import main

    for op, shape in (("matmul", "33,20,40"), ("conv2d", "1,5,7,7,9,3,3")):
        assert main(["verify", "--op", op, "--shape", shape, "--dtype", "bfloat16", "--arch", "cgra-4x4"]) == 0
        assert capsys.readouterr().out.startswith("PASS")
    assert main(["verify", "--op", "pool", "--shape", "1,2,4,4", "--window", "2,2", "--dtype", "float16"]) == 2


def _to_float16(model):
    """An ONNX float32 model with every float32 initializer, input, output and value as float16."""
    import onnx
    from onnx import TensorProto, numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for init in model.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for value in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    model.ir_version = 10
    return model


def test_a_float16_onnx_cnn_runs_its_convs_and_gemm_on_the_npu_within_tolerance_of_onnxruntime():
    """examples/tiny_cnn.onnx in float16: its two conv + bias + relu and its Gemm as NPU kernels
    (the global average pool stays on the host: POOL averages float32), within 4 float16 ulps of
    the output's scale (4 * 2 ** -10) of onnxruntime's float16 run, as close as stock llvm's
    (both about 1.5e-3), in fewer cycles than the float32 model."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "tiny_cnn.onnx"
    model = _to_float16(onnx.load(path))
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float16)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"image": x})[0].astype(np.float64)
    figures = {}
    for name, each, data in (("float16", model, x), ("float32", onnx.load(path), x.astype(np.float32))):
        mod = npu_backend.from_onnx(each, dtype_dict=name)
        with npu_backend.profile() as prof:
            vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
            figures[name] = vm["main"](tvm.runtime.tensor(data)).numpy(), prof
    out, prof = figures["float16"]
    assert [k.source_ops for k in prof.kernels] == [("nn.conv2d", "add", "nn.relu")] * 2 + [("permute_dims", "matmul", "add")]
    assert np.abs(out.astype(np.float64) - expected).max() <= 4 * 2.0 ** -10 * np.abs(expected).max()
    assert prof.total_cycles < figures["float32"][1].total_cycles


@functools.lru_cache(maxsize=None)
def _llama_runs():
    """{dtype: (output, PyTorch's output, profile, module)} of tests/transformer_models.py's Llama
    in bfloat16 and float32 at 16 tokens on cgra-8x8 (once for the tests below)."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program
    from transformer_models import build, first_output

    results = {}
    for name in ("bfloat16", "float32"):
        model, inputs = build("llama")
        if name == "bfloat16":
            model = model.to(torch.bfloat16)
        with torch.no_grad():
            expected = first_output(model(*inputs)).float().numpy()
            mod = from_exported_program(torch.export.export(model, inputs))
        with npu_backend.profile() as prof:
            vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
            out = first_output(vm["main"](*[tvm.runtime.tensor(x.numpy()) for x in inputs])).numpy()
        results[name] = out.astype(np.float64), expected, prof, mod
    return results


@pytest.mark.slow  # about 70 s: torch, two exports and two compiles
def test_a_bfloat16_pytorch_llama_runs_its_matmuls_on_the_npu_within_tolerance_of_pytorch():
    """tests/transformer_models.py's Llama-style decoder after .to(torch.bfloat16): every matmul
    (the projections, SwiGLU's, attention's) a bfloat16 NPU kernel storing its float32 sum (TVM's
    importer writes matmul(..., out_dtype="float32")), and no compute op on the host: HF's casts
    to float32 around every norm, softmax and activation are folded (normalise/half_casts.py),
    written by the norm kernel (kernels/rows/half_norms.py) or run as cast kernels
    (kernels/elementwise/cast.py); before, 18 casts ran on the host. Within 2 ** -5 of the
    output's scale of PyTorch's own bfloat16 run (measured 0.0093, stock llvm the same 0.0093)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformer_models import host_op_counts

    out, expected, prof, mod = _llama_runs()["bfloat16"]
    computed, _, names = host_op_counts(npu_backend.explain(mod, "cgra-8x8"))
    assert computed == 0, names
    # Per layer q / k / v as one GEMM (qkv_merges.py), o, gate and up as one gated GEMM
    # (gated_linears.py, its SiLU rounded to bfloat16 in the epilogue), down and the attention kernel.
    assert sum("matmul" in k.source_ops for k in prof.kernels) == 10
    assert np.abs(out - expected).max() <= 2.0 ** -5 * np.abs(expected).max()


@pytest.mark.slow  # shares the runs above
def test_a_bfloat16_pytorch_llama_takes_fewer_cycles_than_float32():
    """On cgra-8x8, whose PEs do two bfloat16 MACs a cycle to one float32 one, the bf16 Llama at 16
    tokens takes 32,703 cycles against float32's 34,827 (32 tokens: FIGURES32). Its SwiGLU is
    one gated GEMM kernel that rounds SiLU's output to bfloat16 in its epilogue (kernels/gemm/
    gated.py; before, two GEMMs and a round-trip cast kernel: 35,863 cycles, more than float32's
    since float32's q / k / v and gate / up GEMMs took their layer's norms). The attention kernel
    rounds its output to bfloat16 on store (kernels/attention/rows.py; before, a cast kernel after
    it: 2 x 532 cycles) and the down projection is a bfloat16 GEMM of its input rounded
    (normalise/half_linears.py; before, a float32 GEMM: TVM's importer widens its weight). What it
    still pays beyond float32: that rounding as a cast kernel, the final norm as a kernel of its own."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    runs = _llama_runs()
    assert runs["bfloat16"][2].total_cycles < runs["float32"][2].total_cycles
    kernels = runs["bfloat16"][2].kernels
    attentions = [k.source_ops for k in kernels if "nn.softmax" in k.source_ops]
    assert len(attentions) == 2 and all(ops[-1] == "astype" for ops in attentions)  # the rounding store
    assert [k.source_ops for k in kernels].count(("astype",)) == 2  # the down projections' inputs, rounded


@pytest.mark.slow  # about 60 s: torch, an export and a compile
def test_a_bfloat16_pytorch_vit_imports_and_runs_on_the_npu_within_tolerance_of_pytorch():
    """tests/transformer_models.py's ViT after .to(torch.bfloat16), imported with
    npu_backend.from_exported_program (TVM's importer raises on the patch conv's bfloat16 bias:
    frontend/torch_import.py): no compute op on the host (layer norms, GELUs and the pooler's tanh
    in float32 between casts, normalise/half_casts.py), within 2 ** -5 of the output's scale of
    PyTorch's own bfloat16 run (measured 0.0055). Each biased linear is one GEMM kernel rounding
    its biased float32 sum once on store (kernels/gemm/half_bias.py): 64,137 -> 60,247 cycles on
    cgra-8x8 (float32 62,725; its patch conv too), its output bit for bit the same."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import ml_dtypes
    from transformer_models import build, first_output, host_op_counts

    model, inputs = build("vit")
    model = model.to(torch.bfloat16)
    inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    with torch.no_grad():
        expected = first_output(model(*inputs)).float().numpy().astype(np.float64)
        mod = npu_backend.from_exported_program(torch.export.export(model, inputs))
    computed, _, names = host_op_counts(npu_backend.explain(mod, "cgra-8x8"))
    assert computed == 0, names
    vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    args = [tvm.runtime.tensor(x.float().numpy().astype(ml_dtypes.bfloat16) if x.is_floating_point() else x.numpy())
            for x in inputs]
    out = first_output(vm["main"](*args)).numpy().astype(np.float64)
    assert np.abs(out - expected).max() <= 2.0 ** -5 * np.abs(expected).max()
