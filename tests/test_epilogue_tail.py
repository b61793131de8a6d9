"""A reshape, an activation and a multiply fused into a matmul's / linear's epilogue
(kernels/gemm/epilogue_tail.py, intrinsics/epilogue_tail.py).

End to end against numpy over shapes, presets and the pieces of the tail (property tests), the
transformer forms (SwiGLU as two kernels, a residual add after a linear's reshape), a multiplier
computed from the kernel's own result (which must not fuse: it would be a cycle), and the
intrinsic three ways: its TIR description on the host, the commands its implementation records
on the simulator, and the numpy model of the fabric's and the vector unit's arithmetic (bit-exact:
what the standalone kernels compute).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from cgra_sim import special
from cgra_sim.isa import DType, EltwiseFunc, Op, VFunc, encode
from cgra_sim.mapping import body as bodies
from cgra_sim.mapping import sigmoid as smooth
from models import conv2d_reference, run
from npu_backend.kernels.intrinsics import INTRINSICS, get_intrin
from three_ways import Stream, tir_reference

PRESETS = npu_backend.preset_names()
ACTS = ("none", "sigmoid", "silu", "silu_mul", "gelu", "gelu_tanh", "tanh")


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _erf(x):
    return np.vectorize(math.erf)(x)


REFERENCE = {"none": lambda x: x, "sigmoid": _sigmoid, "silu": lambda x: x * _sigmoid(x),
             "silu_mul": lambda x: x * _sigmoid(x), "gelu": lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))),
             "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
             "tanh": np.tanh}


def _act(bb, act, y):
    if act == "none":
        return y
    if act == "silu_mul":  # SiLU as HF and ONNX write it
        return bb.emit(relax.op.multiply(y, bb.emit(relax.op.sigmoid(y))))
    op = {"sigmoid": relax.op.sigmoid, "silu": relax.op.nn.silu, "gelu": relax.op.nn.gelu,
          "gelu_tanh": relax.op.nn.gelu_tanh, "tanh": relax.op.tanh}[act]
    return bb.emit(op(y))


def linear_model(s, k, n, *, act="none", bias=False, residual=False, multiplier=False, three_d=True, seed=0):
    """main(x[, residual][, multiplier]): act(reshape(reshape(x) @ Wᵀ [+ b]) [+ residual]) [* multiplier],
    PyTorch's Linear on a (1, s, k) activation as torch.export writes it (`three_d`), or a 2-D
    matmul without the reshapes. Returns (module, inputs, float64 reference)."""
    rng = np.random.default_rng(seed)
    shape = (1, s, n) if three_d else (s, n)
    x = rng.standard_normal((1, s, k) if three_d else (s, k)).astype("float32")
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    extra = {"residual": rng.standard_normal(shape).astype("float32") if residual else None,
             "multiplier": rng.standard_normal(shape).astype("float32") if multiplier else None}
    bb = relax.BlockBuilder()
    params = [relax.Var("x", relax.TensorType(x.shape, "float32"))] + \
        [relax.Var(name, relax.TensorType(shape, "float32")) for name, v in extra.items() if v is not None]
    with bb.function("main", params):
        with bb.dataflow():
            flat = bb.emit(relax.op.reshape(params[0], (s, k))) if three_d else params[0]
            y = bb.emit(relax.op.matmul(flat, bb.emit(relax.op.permute_dims(relax.const(w)))))
            y = bb.emit(relax.op.add(y, relax.const(b))) if bias else y
            y = bb.emit(relax.op.reshape(y, shape)) if three_d else y
            others = iter(params[1:])
            y = bb.emit(relax.op.add(y, next(others))) if residual else y
            y = _act(bb, act, y)
            y = bb.emit(relax.op.multiply(next(others), y)) if multiplier else y
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    ref = x.reshape(s, k).astype(np.float64) @ w.T.astype(np.float64) + (b if bias else 0)
    ref = ref.reshape(shape) + (extra["residual"] if residual else 0)
    ref = REFERENCE[act](ref) * (extra["multiplier"] if multiplier else 1)
    inputs = [x] + [v for v in extra.values() if v is not None]
    return bb.get(), inputs, ref


def _check(out, ref, act):
    scale = max(1.0, float(np.abs(ref).max()))
    bound = 4e-5 if act in ("sigmoid", "silu", "silu_mul", "gelu_tanh") else 1e-5  # the fabric's sigmoid: 3.1e-5
    np.testing.assert_allclose(out, ref, rtol=0, atol=bound * scale)


@settings(max_examples=12, deadline=None)
@given(s=st.integers(1, 40), k=st.integers(2, 48), n=st.integers(1, 48), act=st.sampled_from(ACTS),
       bias=st.booleans(), residual=st.booleans(), multiplier=st.booleans(), three_d=st.booleans(),
       arch=st.sampled_from(PRESETS), seed=st.integers(0, 2**16))
def test_linear_tail_matches_numpy(s, k, n, act, bias, residual, multiplier, three_d, arch, seed):
    mod, inputs, ref = linear_model(s, k, n, act=act, bias=bias, residual=residual, multiplier=multiplier,
                                    three_d=three_d, seed=seed)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    _check(out, ref, act)
    if act == "none" and (multiplier or (three_d and residual)):  # nothing declines these
        assert len(prof.kernels) == 1, [k.name for k in prof.kernels]


@settings(max_examples=8, deadline=None)
@given(channels=st.integers(1, 8), size=st.integers(3, 10), filters=st.integers(1, 12), kernel=st.integers(1, 3),
       stride=st.integers(1, 2), act=st.sampled_from(ACTS[1:]), residual=st.booleans(), depthwise=st.booleans(),
       arch=st.sampled_from(PRESETS), seed=st.integers(0, 2**16))
def test_conv2d_tail_matches_numpy(channels, size, filters, kernel, stride, act, residual, depthwise, arch, seed):
    """A detector's conv + bias [+ residual] + SiLU (or sigmoid, GELU) as one kernel (YOLOv8's
    conv-BN-SiLU after batch-norm folding), the depthwise conv2d's too."""
    rng = np.random.default_rng(seed)
    groups, filters = (channels, channels) if depthwise and channels > 1 else (1, filters)
    x = rng.standard_normal((1, channels, size, size)).astype("float32")
    w = (rng.standard_normal((filters, channels // groups, kernel, kernel)) / kernel).astype("float32")
    b = rng.standard_normal((1, filters, 1, 1)).astype("float32")
    pad = kernel // 2
    ref = conv2d_reference(x.astype(np.float64), w.astype(np.float64), (stride, stride), (pad,) * 4, groups=groups) + b
    res = rng.standard_normal(ref.shape).astype("float32")
    bb = relax.BlockBuilder()
    params = [relax.Var("x", relax.TensorType(x.shape, "float32"))] + \
        ([relax.Var("r", relax.TensorType(res.shape, "float32"))] if residual else [])
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(params[0], relax.const(w), strides=stride, padding=pad, groups=groups))
            y = bb.emit(relax.op.add(y, relax.const(b)))
            y = bb.emit(relax.op.add(y, params[1])) if residual else y
            out = bb.emit_output(_act(bb, act, y))
        bb.emit_func_output(out)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(bb.get(), arch), [x] + ([res] if residual else []))
    _check(out, REFERENCE[act](ref + (res if residual else 0)), act)
    assert prof.kernels


@settings(max_examples=8, deadline=None)
@given(channels=st.integers(1, 8), size=st.integers(3, 9), filters=st.integers(1, 12), kernel=st.integers(1, 3),
       shift=st.booleans(), tail=st.sampled_from(["none", "relu", "clip", "silu"]), matmul=st.booleans(),
       arch=st.sampled_from(PRESETS), seed=st.integers(0, 2**16))
def test_per_channel_scale_and_shift_after_the_bias(channels, size, filters, kernel, shift, tail, matmul, arch, seed):
    """conv2d (or matmul) + bias, * a constant per channel [+ one], then relu, clip or SiLU: a
    batch norm as Mul + Add after a conv (DenseNet's bottleneck) in the conv's epilogue, one kernel,
    computing what the four kernels compute (each op in float32, in order)."""
    rng = np.random.default_rng(seed)
    if matmul:
        x = rng.standard_normal((size * 2, channels * 3)).astype("float32")
        w = rng.standard_normal((channels * 3, filters)).astype("float32")
        row = (filters,)
        ref = x.astype(np.float64) @ w
    else:
        x = rng.standard_normal((1, channels, size, size)).astype("float32")
        w = rng.standard_normal((filters, channels, kernel, kernel)).astype("float32")
        row = (1, filters, 1, 1)
        ref = conv2d_reference(x.astype(np.float64), w.astype(np.float64), (1, 1), (kernel // 2,) * 4)
    b, scale, offset = (rng.standard_normal(row).astype("float32") for _ in range(3))
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(xv, relax.const(w)) if matmul else
                        relax.op.nn.conv2d(xv, relax.const(w), padding=kernel // 2))
            y = bb.emit(relax.op.add(y, relax.const(b)))
            y = bb.emit(relax.op.multiply(y, relax.const(scale)))
            y = bb.emit(relax.op.add(y, relax.const(offset))) if shift else y
            y = {"none": lambda: y, "relu": lambda: bb.emit(relax.op.nn.relu(y)),
                 "clip": lambda: bb.emit(relax.op.clip(y, -1.0, 2.0)), "silu": lambda: _act(bb, "silu_mul", y)}[tail]()
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(bb.get(), arch), [x])
    ref = (ref + b) * scale + (offset if shift else 0)
    ref = {"none": ref, "relu": np.maximum(ref, 0), "clip": np.clip(ref, -1, 2), "silu": REFERENCE["silu"](ref)}[tail]
    _check(out, ref, "silu" if tail == "silu" else "none")
    if tail != "silu":  # nothing declines the rest
        assert len(prof.kernels) == 1, [k.source_ops for k in prof.kernels]


@pytest.mark.parametrize("arch", ["cgra-8x8", "cgra-4x4"])
def test_swiglu_is_one_kernel_where_the_function_unit_has_silu(arch):
    """Llama's MLP gate: silu(x Wg) * (x Wu), each linear on a (1, 32, 64) activation. On cgra-8x8
    one GEMM over the interleaved weights with the gated epilogue (normalise/gated_linears.py,
    gemm/gated.py): 9,558 cycles where the gate's kernel with SiLU and the up projection's with
    the multiply took 5,982 + 5,040 (12,578 + 5,040 with the fabric's SiLU). cgra-4x4 (no function
    unit) keeps those two kernels, instead of four."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 32, 64)).astype("float32")
    wg, wu = ((rng.standard_normal((128, 64)) / 8).astype("float32") for _ in range(2))
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))

    def linear(w):
        flat = bb.emit(relax.op.reshape(xv, (32, 64)))
        y = bb.emit(relax.op.matmul(flat, bb.emit(relax.op.permute_dims(relax.const(w)))))
        return bb.emit(relax.op.reshape(y, (1, 32, 128)))

    with bb.function("main", [xv]):
        with bb.dataflow():
            gate = linear(wg)
            gate = bb.emit(relax.op.multiply(gate, bb.emit(relax.op.sigmoid(gate))))
            out = bb.emit_output(bb.emit(relax.op.multiply(gate, linear(wu))))
        bb.emit_func_output(out)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(bb.get(), arch), [x])
    g = x.reshape(32, 64).astype(np.float64) @ wg.T
    ref = (g * _sigmoid(g) * (x.reshape(32, 64) @ wu.T)).reshape(1, 32, 128)
    _check(out, ref, "silu")
    if arch == "cgra-8x8":
        assert [k.source_ops for k in prof.kernels] == [
            ("permute_dims", "matmul", "strided_slice", "strided_slice", "nn.silu", "multiply")]
        assert prof.kernels[0].cycles < 10_000 and prof.kernels[0].dma_store_bytes == 32 * 128 * 4
    else:
        assert sorted(k.source_ops for k in prof.kernels) == [
            ("permute_dims", "matmul", "reshape", "multiply"),
            ("permute_dims", "matmul", "reshape", "sigmoid", "multiply")]


@pytest.mark.parametrize("act", ["silu_mul", "gelu_tanh"])
def test_a_smooth_activation_runs_through_the_function_unit_where_the_chip_has_it(act):
    """cgra-8x8's function unit has sigmoid, SiLU and GELU's tanh form: a linear's epilogue runs
    one VFUNC a tile on the vector unit, beside the next tile's GEMM, instead of three or four
    FABRIC bodies that take the PE array between the GEMMs (a 32 x 64 x 128 linear + SiLU:
    12,578 -> 5,982 cycles; the same linear with a multiply in its epilogue takes about 5,000).
    cgra-4x4 has no function unit and keeps the bodies. Both within the bounds of float64."""
    mod, inputs, ref = linear_model(32, 64, 128, act=act)
    counts = {}
    for arch in ("cgra-8x8", "cgra-4x4"):
        with npu_backend.profile() as prof:
            out = run(npu_backend.compile(mod, arch), inputs)
        _check(out, ref, act)
        (kernel,) = prof.kernels
        counts[arch] = (kernel.op_counts, kernel.cycles)
    ops, cycles = counts["cgra-8x8"]
    assert ops.get("VFUNC") and not ops.get("FABRIC") and cycles < 6500, counts
    assert counts["cgra-4x4"][0].get("FABRIC"), counts


def test_multiplier_computed_from_the_result_is_not_fused():
    """reshape(mm) * tanh(reshape(mm)): the multiplier is computed (on its own kernel) from the
    matmul's result, so the matmul's epilogue cannot read it; fusing would be a cycle."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 24)).astype("float32")
    w = (rng.standard_normal((24, 32)) / 5).astype("float32")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(xv, relax.const(w))), (1, 16, 32)))
            out = bb.emit_output(bb.emit(relax.op.multiply(y, bb.emit(relax.op.tanh(y)))))
        bb.emit_func_output(out)
    out = run(npu_backend.compile(bb.get(), "cgra-8x8"), [x])
    y = (x.astype(np.float64) @ w).reshape(1, 16, 32)
    np.testing.assert_allclose(out, y * np.tanh(y), atol=1e-5 * np.abs(y).max() ** 2)


# ------------------------------------------------------------------ the intrinsic, three ways

def _model(act, value, vfunc=False):
    """The standalone kernels' float32 arithmetic (bit-exact: the fabric's and special.py's), or
    (`vfunc`) the function unit's VFUNC of a smooth activation."""
    if act in ("gelu", "tanh") or vfunc:
        return special.FUNCTIONS[act](value)
    return {"sigmoid": smooth.sigmoid, "silu": smooth.silu, "gelu_tanh": smooth.gelu_tanh}[act](value)


def _fabric(stream, nodes, rows, cols, a, out, b=None):
    words = bodies.encode(nodes, "float32")
    stream.commands.append(encode(
        Op.FABRIC, flags=1 if b is not None else 0, dtype=int(DType.FLOAT32), rows=rows, cols=cols, a_addr=a,
        a_row_stride=cols, a_col_stride=1, b_addr=b or 0, b_row_stride=cols if b is not None else 0,
        b_col_stride=1 if b is not None else 0, out_addr=out, out_stride=cols, nodes=len(words),
        **{f"node{i}": w for i, w in enumerate(words)}))


def _multiply(stream, rows, cols, a, b, out):
    stream.commands.append(encode(
        Op.ELTWISE, func=EltwiseFunc.MULTIPLY, dtype=int(DType.FLOAT32), rows=rows, cols=cols, a_addr=a,
        a_row_stride=cols, a_col_stride=1, b_addr=b, b_row_stride=cols, b_col_stride=1, out_addr=out,
        out_stride=cols))


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 9), act=st.sampled_from(["sigmoid", "silu", "gelu_tanh", "gelu",
                                                                            "tanh", None]),
       bias=st.booleans(), residual=st.booleans(), multiplier=st.booleans(), channel=st.booleans(),
       relu=st.booleans(), vfunc=st.booleans(), seed=st.integers(0, 2**16))
def test_epilogue_tail_three_ways(rows, cols, act, bias, residual, multiplier, channel, relu, vfunc, seed):
    """EPILOGUE [+ bias] [+ residual], the activation's FABRIC bodies (from the accumulator tile,
    which the EPILOGUE writes in place) or VFUNC (in place on the output), then ELTWISE times the
    multiplier: the simulator bit-exact to the numpy model, within the functions' bounds of the
    host's TIR; the implementation's calls start with the EPILOGUE. With `channel`, a row of
    scales multiplies the sum (ELTWISE) and a row of shifts is added with the relu (an EPILOGUE).
    With `vfunc` a smooth activation is one VFUNC of the function unit's, as GELU's."""
    multiplier = multiplier or (act is None and not channel)
    vfunc = vfunc and act in ("sigmoid", "silu", "gelu_tanh")
    relu = relu and act is None
    rng = np.random.default_rng(seed)
    acc, row, res, mul, scale, shift = (rng.standard_normal(shape).astype("float32") * 2 for shape in (
        (rows, cols), (cols,), (rows, cols), (rows, cols), (cols,), (cols,)))
    out = np.zeros((rows, cols), "float32")
    desc, impl = INTRINSICS["epilogue"].factory(rows, cols, "float32", bias=bias, relu=relu, residual=residual,
                                                act=act, multiplier=multiplier, channel_scale=channel,
                                                channel_shift=channel, act_vfunc=vfunc, scope="global")
    operands = [acc] + ([row] if bias else []) + ([res] if residual else []) + ([mul] if multiplier else []) + \
        ([scale, shift] if channel else []) + [out]
    tir_out = tir_reference(desc, operands)[-1]
    stream = Stream(operands)
    stream.load(*range(len(operands) - 1))
    slot = {name: stream.addr[i] for i, name in enumerate(
        ["acc"] + (["bias"] if bias else []) + (["res"] if residual else []) + (["mul"] if multiplier else []) +
        (["scale", "shift"] if channel else []) + ["out"])}
    smooth_act = act in ("sigmoid", "silu", "gelu_tanh") and not vfunc
    # An EPILOGUE with nothing to add, clip or scale is a copy: the tail reads the accumulator.
    identity = not (bias or residual or relu or channel)
    first = slot["acc"] if smooth_act or identity else slot["out"]
    code = int(DType.FLOAT32)
    if not identity:
        stream.commands.append(encode(
            Op.EPILOGUE, flags=(1 if bias else 0) | (4 if residual else 0) | (2 if relu and not channel else 0),
            acc_dtype=code, out_dtype=code, m=rows, n=cols, acc_addr=slot["acc"], acc_stride=cols,
            bias_addr=slot.get("bias", 0), residual_addr=slot.get("res", 0), residual_stride=cols if residual else 0,
            out_addr=first, out_stride=cols))
    if channel:
        stream.commands.append(encode(
            Op.ELTWISE, func=EltwiseFunc.MULTIPLY, dtype=code, rows=rows, cols=cols, a_addr=first, a_row_stride=cols,
            a_col_stride=1, b_addr=slot["scale"], b_row_stride=0, b_col_stride=1, out_addr=first, out_stride=cols))
        stream.commands.append(encode(
            Op.EPILOGUE, flags=1 | (2 if relu else 0), acc_dtype=code, out_dtype=code, m=rows, n=cols, acc_addr=first,
            acc_stride=cols, bias_addr=slot["shift"], out_addr=first, out_stride=cols))
    if smooth_act:
        *passes, logistic = smooth.passes(act)
        for index, nodes in enumerate(passes):
            _fabric(stream, nodes, rows, cols, slot["out"] if index else slot["acc"], slot["out"])
        _fabric(stream, logistic, rows, cols, slot["acc"], slot["out"], b=slot["out"])
        if act != "sigmoid":
            _multiply(stream, rows, cols, slot["acc"], slot["out"], slot["out"])
    elif act is not None:
        stream.commands.append(encode(
            Op.VFUNC, func=VFunc[act.upper()], dtype=code, rows=rows, cols=cols, a_addr=first, a_row_stride=cols,
            a_col_stride=1, out_addr=slot["out"], out_stride=cols))
    if multiplier:
        _multiply(stream, rows, cols, slot["out"] if act else first, slot["mul"], slot["out"])
    stream.store(len(operands) - 1)
    sim_out = stream.run()[-1]
    value = acc + (row if bias else np.float32(0)) + (res if residual else np.float32(0))
    value = value * scale + shift if channel else value
    value = np.maximum(value, np.float32(0)) if relu else value
    value = _model(act, value, vfunc) if act else value
    np.testing.assert_array_equal(sim_out, value * mul if multiplier else value)
    np.testing.assert_allclose(sim_out, tir_out, rtol=4e-5, atol=1e-5)
    text = impl.script()
    assert all((f'"cgra_{name}"' in text) == expected for name, expected in (
        ("epilogue", not identity), ("fabric", smooth_act), ("vfunc", act is not None and not smooth_act),
        ("eltwise", multiplier or channel or (smooth_act and act in ("silu", "gelu_tanh")))))


def test_epilogue_without_a_tail_is_the_plain_intrinsic():
    """Without an activation or a multiplier the name (and intrinsic) is the EPILOGUE's own."""
    assert get_intrin("epilogue", 4, 8, "float32", bias=True, relu=False) == "cgra.epilogue.4.8.float32.True.False"
    with pytest.raises(ValueError, match="float32"):
        INTRINSICS["epilogue"].factory(4, 8, "int32", bias=False, relu=False, act="silu")


def test_a_linear_then_tanh_is_one_kernel():
    """tanh after a linear (BERT's and ViT's pooler, batched) is the epilogue's VFUNC, as GELU's."""
    mod, inputs, ref = linear_model(32, 64, 64, act="tanh", bias=True, three_d=False)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), inputs)
    _check(out, ref, "tanh")
    assert [k.name for k in prof.kernels] == ["fused_relax_permute_dims_relax_matmul_relax_add_relax_tanh_cgra"]


@pytest.mark.parametrize("s, k, n, act", [(4, 128, 512, "gelu"), (1, 64, 64, "tanh"), (2, 64, 64, "gelu")])
def test_a_few_rows_activation_hidden_by_the_weight_load_is_one_kernel(s, k, n, act):
    """A linear of a few rows (ConvNeXt's last stage: 4 tokens, fc1 + GELU; a pooler's one row +
    tanh) pads its rows to a whole tile, and the activation over the padding costs more than the
    activation alone; but its weights' load is longer than the whole padded tail, which runs beside
    it: one kernel (4 x 128 x 512: 17,442 cycles against 17,228 + 2,556 as two on cgra-8x8)."""
    mod, inputs, ref = linear_model(s, k, n, act=act, bias=True)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), inputs)
    _check(out, ref, act)
    assert len(prof.kernels) == 1, [k.name for k in prof.kernels]
