"""Differential fuzzing: random graphs of the operators the README lists, compiled for the NPU and
for `target="llvm"`, run on the same inputs; the results must agree (integers exactly, float32
within 1e-5 of the output's scale) and have the dtype the graph declares, also with symbolic
batch / height / width. Anything valid must compile: an op the NPU cannot take stays on the host.
The graphs: image chains (convs, pools, activations, residuals, elementwise ops with an input, a
scalar or the value itself: `x op x`), int8 dense layers, integer pools feeding other ops, and
pools and means over long thin maps (1 x L up to 7,000). Graphs it found failing are kept in
tests/test_graph_regressions.py.

CI runs 25 graphs per test (10 of the integer pools and the thin maps), derandomised: about 2.5
min. `HYPOTHESIS_PROFILE=fuzz` runs 2,000 per test, `CGRA_FUZZ_EXAMPLES=N` N per test. An hour
on a new seed: the five `random` tests at 0.7 to 1.2 s a graph (measured on 2 shared cores: 300
graphs in 352 s, 500 in 345 s), N=600:

    HYPOTHESIS_PROFILE=fuzz CGRA_FUZZ_EXAMPLES=600 python -m pytest -q tests/test_differential_fuzz.py \
        -k random --hypothesis-seed=$RANDOM -p no:cacheprovider --hypothesis-show-statistics
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, note, reject, settings
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
            self.inputs.append(np.asarray(self.rng.standard_normal(shape), dtype))
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
    for op in draw(st.lists(st.sampled_from(["conv", "conv", "act", "residual", "pool", "eltwise", "twice",
                                             "scalar"]), min_size=1, max_size=4)):
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
        elif op == "twice":  # one value as both operands (y + y after a bias add: issue 35)
            func = draw(st.sampled_from(["add", "subtract", "multiply", "maximum", "minimum"]))
            steps.append(lambda bb, cur, values, func=func: bb.emit(getattr(relax.op, func)(cur, cur)))
            graph.steps.append(f"{func}(x, x)")
        elif op == "scalar":  # a rank-0 operand: an input, or a constant (normalise/scalars.py)
            func = draw(st.sampled_from(["add", "subtract", "multiply", "maximum", "minimum"]))
            operand = graph.param(()) if draw(st.booleans()) else relax.const(draw(st.sampled_from([0.5, -1.25, 3.0])),
                                                                               "float32")
            steps.append(lambda bb, cur, values, func=func, operand=operand: bb.emit(
                getattr(relax.op, func)(cur, operand)))
            graph.steps.append(f"{func} scalar {'input' if isinstance(operand, relax.Var) else 'constant'}")
        else:
            continue
        shapes.append((shape, derived))
    # the classifier's bias: a row, or a scalar input (ONNX's Gemm with a scalar C)
    head = (graph.param((shape[1], 5)), graph.param(draw(st.sampled_from([(5,), ()])))) if draw(st.booleans()) \
        else None

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
        graph.steps.append("mean + dense" + " + scalar bias" * (head[1].ty.ndim == 0) + " + relu")
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



def _layout_shape(layout: str, n: int, c: int, h: int, w: int) -> tuple:
    return tuple({"N": n, "C": c, "H": h, "W": w}[axis] for axis in layout)


def _typed(bb, average, typed: bool):
    """`average`, cast to the dtype Relax gives it when `typed` (see int_pool_graphs)."""
    return bb.emit(relax.op.astype(average, str(average.ty.dtype))) if typed else average


@st.composite
def int_pool_graphs(draw):
    """int8 (or int32) pools feeding other ops, NCHW or NHWC: average pools (which TVM's
    legalization computes as int64: device/host_averages.py), max pools, elementwise ops with an
    input or with the value itself, in a chain of up to four. Inputs in [-8, 8) and no multiply,
    so no value leaves int8 (TVM's llvm build computes what follows an average in int64)."""
    dtype, layout = draw(st.sampled_from(["int8", "int8", "int32"])), draw(st.sampled_from(["NCHW", "NHWC"]))
    graph = Graph(np.random.default_rng(draw(st.integers(0, 2**16))))
    n, c, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 8)), draw(st.integers(3, 14)), draw(st.integers(3, 14))
    graph.param(_layout_shape(layout, n, c, h, w), dtype)
    graph.inputs[0] = np.clip(graph.inputs[0], -8, 7).astype(dtype)
    steps, dims = [], "x".join(map(str, _layout_shape(layout, n, c, h, w)))
    ops = st.sampled_from(["avg", "avg", "max", "twice", "eltwise", "relu"])
    for op in draw(st.lists(ops, min_size=1, max_size=4)):
        if op in ("avg", "max"):
            windows = [(2, 2, 0, False), (3, 2, 0, True), (3, 2, 1, False), (3, 1, 1, False)]  # (k, stride, pad, ceil)
            k, s, pad, ceil = draw(st.sampled_from(windows))
            if min(h, w) + 2 * pad < k:
                continue
            include_pad = draw(st.booleans())
            pool = relax.op.nn.avg_pool2d if op == "avg" else relax.op.nn.max_pool2d
            extra = {"count_include_pad": include_pad} if op == "avg" else {}
            def step(bb, cur, typed, pool=pool, k=k, s=s, pad=pad, ceil=ceil, extra=extra, average=op == "avg"):
                out = bb.emit(pool(cur, (k, k), (s, s), (pad, pad), ceil_mode=ceil, layout=layout, **extra))
                return _typed(bb, out, typed and average)
            steps.append(step)
            h, w = (-(-(e + 2 * pad - k) // s) + 1 if ceil else (e + 2 * pad - k) // s + 1 for e in (h, w))
            graph.steps.append(f"{dtype} {op} pool {k}x{k}/{s} pad {pad}" + " ceil mode" * ceil)
        elif op == "twice":
            func = draw(st.sampled_from(["add", "subtract", "maximum", "minimum"]))
            steps.append(lambda bb, cur, typed, func=func: bb.emit(getattr(relax.op, func)(cur, cur)))
            graph.steps.append(f"{func}(x, x)")
        elif op == "eltwise":
            func = draw(st.sampled_from(["add", "subtract", "maximum", "minimum"]))
            operand = graph.param(_layout_shape(layout, n, c, h, w), dtype)
            graph.inputs[-1] = np.clip(graph.inputs[-1], -8, 7).astype(dtype)
            steps.append(lambda bb, cur, typed, func=func, operand=operand: bb.emit(
                getattr(relax.op, func)(cur, operand)))
            graph.steps.append(func)
        else:
            steps.append(lambda bb, cur, typed: bb.emit(relax.op.nn.relu(cur)))
            graph.steps.append("relu")

    def build(bb, typed=False):
        cur = graph.params[0]
        for step in steps:
            cur = step(bb, cur, typed)
        return cur

    graph.steps.insert(0, f"x {layout} {dims} {dtype}")
    # TVM's llvm build computes an integer average as int64 and cannot add an int8 input to it
    # ("Binary operators must have the same datatype"): its reference casts each average to the
    # dtype Relax gives it, in the graph, which TVM then builds as written.
    reference = graph.module(lambda bb: build(bb, typed=True))
    return graph.module(build), graph.inputs, graph.steps, reference


@st.composite
def thin_map_graphs(draw):
    """float32 pools and means over long thin maps (1 x L, L x 1, 2 x L, L x 2, L up to 7,000),
    NCHW or NHWC: a global mean (keepdims or not), adaptive_avg_pool2d to 1 x 1, a max pool over
    the whole map, or a small window sliding along it; then maybe an add of an input."""
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    graph = Graph(np.random.default_rng(draw(st.integers(0, 2**16))))
    length, side = draw(st.integers(100, 7000)), draw(st.sampled_from([1, 2]))
    h, w = (side, length) if draw(st.booleans()) else (length, side)
    c = draw(st.integers(1, 24))
    graph.param(_layout_shape(layout, 1, c, h, w))
    spatial = [layout.index("H"), layout.index("W")]
    op = draw(st.sampled_from(["mean", "adaptive", "whole max", "window"]))
    if op == "mean":
        keepdims = draw(st.booleans())
        body = lambda bb, x: bb.emit(relax.op.mean(x, axis=spatial, keepdims=keepdims))  # noqa: E731
        out = _layout_shape(layout, 1, c, 1, 1) if keepdims else (1, c)
    elif op == "adaptive":
        body = lambda bb, x: bb.emit(relax.op.nn.adaptive_avg_pool2d(x, 1, layout=layout))  # noqa: E731
        out = _layout_shape(layout, 1, c, 1, 1)
    elif op == "whole max":
        body = lambda bb, x: bb.emit(relax.op.nn.max_pool2d(x, (h, w), layout=layout))  # noqa: E731
        out = _layout_shape(layout, 1, c, 1, 1)
    else:
        kind = draw(st.sampled_from([relax.op.nn.max_pool2d, relax.op.nn.avg_pool2d]))
        kh, kw = min(h, 2), min(w, 2)
        body = lambda bb, x: bb.emit(kind(x, (kh, kw), (kh, kw), layout=layout))  # noqa: E731
        out = _layout_shape(layout, 1, c, h // kh, w // kw)
        op = f"{'max' if kind is relax.op.nn.max_pool2d else 'avg'} pool {kh}x{kw}/{kh}x{kw}"
    tail = graph.param(out) if draw(st.booleans()) else None

    def build(bb):
        cur = body(bb, graph.params[0])
        return relax.op.add(cur, tail) if tail is not None else cur

    steps = [f"x {layout} 1x{c}x{h}x{w}", op, "add" * (tail is not None)]
    return graph.module(build), graph.inputs, steps


def _agree(mod, inputs, arch, reductions: int = 1, reference=None):
    """The NPU's result against TVM's llvm build of the same graph (or of `reference`, the same
    graph as TVM builds it right), in the dtype the graph declares: int8 exactly, float32 within
    1e-5 of the output's scale per chained reduction (conv2d, dense): two float32 builds that sum
    in different orders drift apart with depth, each about 1e-5 from the exact result
    (test_chained_convs_differ_from_the_host_build_by_rounding_only)."""
    try:
        reference = tvm.compile(mod if reference is None else reference, target="llvm")
    except tvm.error.InternalError as error:
        # TVM 0.27's own LLVM build fails on some graphs (test_tvms_llvm_build_of_an_avg_pool_
        # is_broken): nothing to compare against. Our compile of it is tested there.
        if "LLVM module verification failed" not in str(error):
            raise
        reject()
    expected = run(reference, inputs)
    out = run(npu_backend.compile(mod, arch), inputs)
    declared = str(mod["main"].ret_ty.dtype)
    assert str(out.dtype) == declared, f"the result is {out.dtype}, the graph declares {declared}"
    problem = mismatch(out, expected.astype(declared), declared, 1e-5 * max(reductions, 1))
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



def _short(examples: int):
    """`examples` per test in the default (ci) profile, which must stay short; any other
    profile's own count (fuzz: 2,000 or $CGRA_FUZZ_EXAMPLES)."""
    return settings(max_examples=examples) if settings.default.derandomize else settings()


@_short(10)
@given(graph=int_pool_graphs(), arch=st.sampled_from(PRESETS))
def test_random_integer_pool_graphs_agree_exactly_with_the_host_build(graph, arch):
    """Exactly, and in the dtype the graph declares (TVM's own build returns an integer average,
    and what follows it, as int64)."""
    mod, inputs, steps, reference = graph
    note(f"{arch}: {' -> '.join(steps)}")
    _agree(mod, inputs, arch, reference=reference)


@_short(10)
@given(graph=thin_map_graphs(), arch=st.sampled_from(PRESETS))
def test_random_pools_over_long_thin_maps_agree_with_the_host_build(graph, arch):
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
