"""Differential fuzzing: random graphs of the operators the README lists, compiled for the NPU and
for `target="llvm"`, run on the same inputs; the results must agree (integers exactly, float32
within 1e-5 of the output's scale), also with symbolic batch / height / width. Anything valid must compile: an op the NPU cannot take
stays on the host. `HYPOTHESIS_PROFILE=fuzz` runs 2,000 graphs per test; CI runs 25,
derandomised. Graphs it found failing are kept in tests/test_graph_regressions.py."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, note, reject
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.tools.workloads import mismatch, run

PRESETS = npu_backend.preset_names()


def _activation(bb, x, act: str):
    """An activation as the importers write it: one op, or a chain of elementwise ops with
    scalar constants (the fabric family's bodies; op by op on the vector unit where not)."""
    const = lambda value: relax.const(value, "float32")  # noqa: E731
    if act == "relu":
        return bb.emit(relax.op.nn.relu(x))
    if act == "clip":
        return bb.emit(relax.op.clip(x, -0.5, 1.5))
    if act == "leakyrelu":
        return bb.emit(relax.op.nn.leakyrelu(x, 0.1))
    if act == "hardswish":  # ONNX's HardSwish
        gate = bb.emit(relax.op.divide(bb.emit(relax.op.clip(bb.emit(relax.op.add(x, const(3.0))), 0, 6)), const(6.0)))
        return bb.emit(relax.op.multiply(x, gate))
    if act == "sigmoid":
        return bb.emit(relax.op.sigmoid(x))
    if act == "silu":  # ONNX's SiLU: Mul(x, Sigmoid(x))
        return bb.emit(relax.op.multiply(x, bb.emit(relax.op.sigmoid(x))))
    if act == "hardsigmoid":  # ONNX's HardSigmoid
        return bb.emit(relax.op.clip(bb.emit(relax.op.add(bb.emit(relax.op.multiply(const(0.2), x)), const(0.5))), 0, 1))
    return bb.emit(relax.op.subtract(bb.emit(relax.op.multiply(x, const(1.5))), const(0.25)))  # affine


class Graph:
    """Builds main(params...) as a chain; each parameter gets data when it is declared."""

    def __init__(self, rng):
        self.rng, self.params, self.inputs, self.steps = rng, [], [], []

    def param(self, shape, dtype="float32"):
        var = relax.Var(f"p{len(self.params)}", relax.TensorType(list(shape), dtype))
        self.params.append(var)
        if dtype == "float32":
            self.inputs.append(self.rng.standard_normal(shape).astype(dtype))
        else:
            low, high = (-8, 8) if dtype == "int8" else (-500, 500)
            self.inputs.append(self.rng.integers(low, high, shape).astype(dtype))
        return var

    def module(self, build):
        bb = relax.BlockBuilder()
        with bb.function("main", self.params):
            with bb.dataflow():
                out = bb.emit_output(build(bb))
            bb.emit_func_output(out)
        return bb.get()


@st.composite
def image_graphs(draw, symbolic=False):
    """float32 NCHW: conv2d (1x1 or 3x3, stride 1 or 2, depthwise or not) [+ bias] [relu | clip],
    residual adds, pools, broadcast elementwise ops, and a classifier (mean + matmul) at the end.
    The chain is planned first (shapes by hand, every parameter declared), then built. With
    `symbolic`, some of the input's batch, height and width are symbolic (one compiled graph for
    every size, run at the drawn one): residuals then add earlier values, elementwise operands
    are per-channel rows (a parameter of a symbolic shape needs its variables bound elsewhere)."""
    graph = Graph(np.random.default_rng(draw(st.integers(0, 2**16))))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 8))
    h, w = draw(st.integers(3, 12)), draw(st.integers(3, 12))
    graph.param((n, c, h, w))
    if symbolic:
        axes = draw(st.sets(st.sampled_from("NHW"), min_size=1))
        dims = [tvm.tirx.Var(a.lower(), "int64") if a in axes else d for a, d in zip("NCHW", (n, c, h, w))]
        graph.params[0] = relax.Var("p0", relax.TensorType(dims, "float32"))
    shape = (n, c, h, w)
    # How the height and width derive from the input's: a residual adds an earlier value of the
    # same derivation only, since two sizes equal at the drawn size may differ at another (an
    # add of (h - 2) // 4 + 1 and h // 2 rows is no valid model).
    derived = ("h", "w")
    steps, shapes = [], [(shape, derived)]  # steps: (bb, cur, values) -> expr
    for op in draw(st.lists(st.sampled_from(["conv", "conv", "act", "residual", "pool", "eltwise"]),
                            min_size=1, max_size=4)):
        if op == "conv":
            k, s = draw(st.sampled_from([1, 3])), draw(st.integers(1, 2))
            groups = shape[1] if draw(st.booleans()) else 1
            out_c = shape[1] if groups > 1 else draw(st.integers(1, 8))
            wgt = graph.param((out_c, shape[1] // groups, k, k))
            bias = graph.param((1, out_c, 1, 1)) if draw(st.booleans()) else None

            def conv(bb, cur, values, wgt=wgt, s=s, k=k, groups=groups, bias=bias):
                cur = bb.emit(relax.op.nn.conv2d(cur, wgt, strides=s, padding=k // 2, groups=groups))
                return bb.emit(relax.op.add(cur, bias)) if bias is not None else cur
            steps.append(conv)
            shape = (n, out_c, (shape[2] - 1) // s + 1, (shape[3] - 1) // s + 1)  # "same" padding
            derived = derived if s == 1 else tuple(f"conv/{s}({d})" for d in derived)
            graph.steps.append(f"conv k{k} s{s} g{groups} -> {out_c}" + " + bias" * (bias is not None))
        elif op == "act":
            act = draw(st.sampled_from(["relu", "clip", "leakyrelu", "hardswish", "hardsigmoid", "affine", "sigmoid",
                                         "silu"]))
            steps.append(lambda bb, cur, values, act=act: _activation(bb, cur, act))
            graph.steps.append(act)
        elif op == "residual":
            earlier = [i for i, (seen, how) in enumerate(shapes[:-1])
                       if seen == shape and (how == derived or not symbolic)]
            if symbolic and not earlier:
                continue
            operand = earlier[-1] if earlier and (symbolic or draw(st.booleans())) else graph.param(shape)
            steps.append(lambda bb, cur, values, operand=operand: bb.emit(relax.op.add(
                cur, values[operand] if isinstance(operand, int) else operand)))
            graph.steps.append("residual add" + (" (an earlier value)" if isinstance(operand, int) else ""))
        elif op == "pool" and shape[2] >= 3 and shape[3] >= 3:
            kind = draw(st.sampled_from(["max", "avg"]))
            # 2x2/2, a ResNet stem's 3x3/2 padded 1, a 3x3/1 padded 1 (the padding lies along
            # symbolic axes too: a max pool's is loaded as -inf, an average's as zeros), and a
            # max pool 3x3/2 in ceil mode (SqueezeNet's, GoogLeNet's)
            k, s, pad, ceil = draw(st.sampled_from([(2, 2, 0, False), (3, 2, 1, False), (3, 1, 1, False)] +
                                                   ([(3, 2, 0, True)] if kind == "max" else [])))
            include_pad = draw(st.booleans())

            def pool(bb, cur, values, kind=kind, k=k, s=s, pad=pad, include_pad=include_pad, ceil=ceil):
                if kind == "max":
                    return bb.emit(relax.op.nn.max_pool2d(cur, (k, k), (s, s), (pad, pad), ceil_mode=ceil))
                return bb.emit(relax.op.nn.avg_pool2d(cur, (k, k), (s, s), (pad, pad), count_include_pad=include_pad))
            steps.append(pool)
            # (ceil mode's last window always starts inside the image here: no window is dropped)
            shape = (n, shape[1], *(-(-(e + 2 * pad - k) // s) + 1 if ceil else (e + 2 * pad - k) // s + 1
                                    for e in shape[2:]))
            derived = derived if (k, s, pad) == (3, 1, 1) else \
                tuple(f"pool{k}/{s}p{pad}{'c' * ceil}({d})" for d in derived)
            graph.steps.append(f"{kind} pool {k}x{k}/{s} pad {pad}" + " ceil mode" * ceil +
                               (f" count_include_pad={include_pad}" if kind == "avg" and pad else ""))
        elif op == "eltwise":
            func = draw(st.sampled_from(["add", "subtract", "multiply", "maximum", "minimum"]))
            operand = graph.param((1, shape[1], 1, 1) if symbolic or draw(st.booleans()) else shape)
            steps.append(lambda bb, cur, values, func=func, operand=operand: bb.emit(
                getattr(relax.op, func)(cur, operand)))
            graph.steps.append(func)
        else:
            continue
        shapes.append((shape, derived))
    head = (graph.param((shape[1], 5)), graph.param((5,))) if draw(st.booleans()) else None

    def build(bb):
        cur = graph.params[0]
        values = [cur]
        for step in steps:
            cur = step(bb, cur, values)
            values.append(cur)
        if head is not None:
            pooled = bb.emit(relax.op.mean(cur, axis=[2, 3]))
            cur = relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(relax.op.matmul(pooled, head[0])), head[1])))
        return cur

    graph.steps.insert(0, f"x {n}x{c}x{h}x{w}" + (f" ({graph.params[0].ty.shape} symbolic)" if symbolic else ""))
    if head is not None:
        graph.steps.append("mean + dense + relu")
    return graph.module(build), graph.inputs, graph.steps


@st.composite
def int8_dense_graphs(draw):
    """int8 x int8 -> int32 matmul [+ bias] [+ residual] [relu | clip], a standalone add after."""
    graph = Graph(np.random.default_rng(draw(st.integers(0, 2**16))))
    m, k, n = draw(st.integers(1, 40)), draw(st.integers(1, 40)), draw(st.integers(1, 40))
    bias, residual = draw(st.booleans()), draw(st.booleans())
    act = draw(st.sampled_from(["relu", "clip", "none"]))
    tail = draw(st.booleans())
    x, w = graph.param((m, k), "int8"), graph.param((k, n), "int8")
    b = graph.param((n,), "int32") if bias else None
    r = graph.param((m, n), "int32") if residual else None
    t = graph.param((m, n), "int32") if tail else None

    def build(bb):
        cur = bb.emit(relax.op.matmul(x, w, out_dtype="int32"))
        for operand in (b, r):
            if operand is not None:
                cur = bb.emit(relax.op.add(cur, operand))
        if act != "none":
            cur = bb.emit(relax.op.nn.relu(cur) if act == "relu" else relax.op.clip(cur, -300, 700))
        return relax.op.subtract(cur, t) if t is not None else cur

    steps = [f"int8 matmul {m}x{k}x{n}", "bias" * bias, "residual" * residual, act, "subtract" * tail]
    return graph.module(build), graph.inputs, steps


def _agree(mod, inputs, arch, reductions: int = 1):
    """The NPU's result against TVM's llvm build of the same graph: int8 exactly, float32 within
    1e-5 of the output's scale per chained reduction (conv2d, dense): two float32 builds that sum
    in different orders drift apart with depth, each about 1e-5 from the exact result
    (test_chained_convs_differ_from_the_host_build_by_rounding_only)."""
    try:
        reference = tvm.compile(mod, target="llvm")
    except tvm.error.InternalError as error:
        # TVM 0.27's own LLVM build fails on some graphs (test_tvms_llvm_build_of_an_avg_pool_
        # is_broken): nothing to compare against. Our compile of it is tested there.
        if "LLVM module verification failed" not in str(error):
            raise
        reject()
    expected = run(reference, inputs)
    out = run(npu_backend.compile(mod, arch), inputs)
    problem = mismatch(out, expected, str(expected.dtype), 1e-5 * max(reductions, 1))
    assert problem is None, problem


def _reductions(steps) -> int:
    """The float32 reductions a fuzzed graph chains: its convs and its classifier's dense layer."""
    return sum(step.startswith("conv") or step.startswith("mean + dense") for step in steps)


def _avg_pool_after_relu():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4, 4, 10], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.avg_pool2d(bb.emit(relax.op.nn.relu(x)), (2, 2), (2, 2))))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.xfail(raises=tvm.error.InternalError, strict=True,
                   reason="TVM 0.27's target='llvm' emits invalid LLVM IR for a 2x2/2 avg_pool2d of a (1, 4, 4, 10) "
                          "tensor (shufflevector: instruction does not dominate all uses); found by the fuzzer. "
                          "When this passes, TVM fixed it: drop the reject() in _agree")
def test_tvms_llvm_build_of_an_avg_pool_is_broken():
    tvm.compile(_avg_pool_after_relu(), target="llvm")


def test_the_graph_tvms_llvm_build_breaks_on_runs_on_the_npu():
    x = np.random.default_rng(0).standard_normal((1, 4, 4, 10)).astype("float32")
    for arch in PRESETS:
        out = run(npu_backend.compile(_avg_pool_after_relu(), arch), [x])
        relu = np.maximum(x, 0)
        expected = relu.reshape(1, 4, 2, 2, 5, 2).mean(axis=(3, 5))
        assert mismatch(out, expected, "float32") is None


@given(graph=image_graphs(), arch=st.sampled_from(PRESETS))
def test_random_image_graphs_agree_with_the_host_build(graph, arch):
    mod, inputs, steps = graph
    note(f"{arch}: {' -> '.join(steps)}")
    _agree(mod, inputs, arch, _reductions(steps))


@given(graph=image_graphs(symbolic=True), arch=st.sampled_from(PRESETS))
def test_random_image_graphs_with_symbolic_sizes_agree_with_the_host_build(graph, arch):
    """The same graphs with a symbolic batch, height and / or width (docs/dynamic-shapes.md)."""
    mod, inputs, steps = graph
    note(f"{arch}: {' -> '.join(steps)}")
    _agree(mod, inputs, arch, _reductions(steps))


@given(graph=int8_dense_graphs(), arch=st.sampled_from(PRESETS))
def test_random_int8_dense_graphs_agree_exactly_with_the_host_build(graph, arch):
    mod, inputs, steps = graph
    note(f"{arch}: {' -> '.join(s for s in steps if s)}")
    _agree(mod, inputs, arch)


def _conv64(x, w, pad: int, groups: int = 1):
    """conv2d in float64, stride 1, NCHW / OIHW: the exact result's stand-in."""
    n, _, h, width = x.shape
    filters, per_group, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((n, filters, h + 2 * pad - kh + 1, width + 2 * pad - kw + 1))
    for o in range(filters):
        first = o // (filters // groups) * per_group
        for i in range(per_group):
            for a in range(kh):
                for b in range(kw):
                    out[:, o] += xp[:, first + i, a:a + out.shape[2], b:b + out.shape[3]] * w[o, i, a, b]
    return out


def test_chained_convs_differ_from_the_host_build_by_rounding_only():
    """Found by the fuzzer (symbolic batch): three chained convs, 1.6e-5 of the output's scale
    from TVM's llvm build. Against the exact (float64) result both are within 1e-5, the NPU's
    error of the size of llvm's own, so the fuzzer allows 1e-5 per chained reduction."""
    n = tvm.tirx.Var("n", "int64")
    shapes = [(n, 5, 7, 3), (5, 1, 1, 1), (1, 5, 1, 1), (5, 5, 3, 3), (3, 5, 3, 3)]
    params = [relax.Var(f"p{i}", relax.TensorType(list(s), "float32")) for i, s in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            x = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(params[0], params[1], groups=5)), params[2]))
            x = bb.emit(relax.op.nn.conv2d(bb.emit(relax.op.nn.conv2d(x, params[3], padding=1)), params[4], padding=1))
            out = bb.emit_output(bb.emit(relax.op.clip(x, -0.5, 1.5)))
        bb.emit_func_output(out)
    mod = bb.get()
    npu, host = npu_backend.compile(mod, "cgra-8x8"), tvm.compile(mod, target="llvm")
    for seed in range(4):
        rng = np.random.default_rng(seed)
        inputs = [rng.standard_normal([2 if d is n else d for d in s]).astype("float32") for s in shapes]
        x = [a.astype(np.float64) for a in inputs]
        exact = np.clip(_conv64(_conv64(_conv64(x[0], x[1], 0, 5) + x[2], x[3], 1), x[4], 1), -0.5, 1.5)
        ours, theirs = run(npu, inputs), run(host, inputs)
        scale = max(1.0, float(np.abs(exact).max()))
        assert mismatch(ours, exact, "float32") is None and mismatch(theirs, exact, "float32") is None
        assert np.abs(ours - exact).max() <= 2 * np.abs(theirs - exact).max() + 1e-6 * scale


def test_an_op_after_a_ceil_mode_pool_whose_size_holds_a_condition_runs_on_the_host():
    """Found by the fuzzer: a 3x3/2 ceil-mode max pool of a width (w - 1) // 2 + 1 has an output
    width Relax writes with if_then_else; the conv2d after it crashed TVM's FuseOpsByPattern
    ("Cannot find the FInferType attribute registered to op: prim.if_then_else"). Both now stay on
    the host with the reason, the rest on the NPU."""
    w = tvm.tirx.Var("w", "int64")
    shapes = [(1, 1, 5, w), (1, 1, 1, 1), (2, 1, 1, 1), (2, 1, 1, 1)]
    params = [relax.Var(f"p{i}", relax.TensorType(list(s), "float32")) for i, s in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            x = bb.emit(relax.op.nn.conv2d(bb.emit(relax.op.nn.conv2d(params[0], params[1])), params[2], strides=2))
            x = bb.emit(relax.op.nn.max_pool2d(x, (3, 3), (2, 2), ceil_mode=True))
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(x, params[3], groups=2)))
        bb.emit_func_output(out)
    mod = bb.get()
    placements = npu_backend.explain(mod, "cgra-8x8", dims={"w": 9})
    assert [p.where for p in placements] == ["npu", "npu", "host", "host"]
    assert "holds a condition" in placements[3].reason, placements[3].reason
    rng = np.random.default_rng(0)
    for width in (5, 9, 23):
        inputs = [rng.standard_normal([width if d is w else d for d in s]).astype("float32") for s in shapes]
        expected = run(tvm.compile(mod, target="llvm"), inputs)
        assert mismatch(run(npu_backend.compile(mod, "cgra-8x8"), inputs), expected, "float32") is None
