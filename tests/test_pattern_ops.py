"""Partition tries only the patterns that can match (npu_backend/partition/pattern_ops.py: their
operators called, nested as deeply as they are): what it leaves out could not have matched. A
module partitioned before tries only the patterns that made its groups (partition/plans.py),
with the same result."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, is_tuple, is_var, wildcard
from tvm.script import relax as R

import npu_backend
import onnx_models
import zoo_models
from npu_backend.kernels.common.dynamic import shape_bounds
from npu_backend.options import CompileOptions
from npu_backend.partition.pattern_ops import ModuleCalls, can_match, pattern_shape, required_ops
from npu_backend.partition.plans import grouped_patterns
from npu_backend.normalise.stage import normalise
from npu_backend.partition.stage import bounds_of, fusion_patterns


def test_required_ops_of_alternatives_and_calls():
    conv = is_op("relax.nn.conv2d")(wildcard(), wildcard())
    biased = is_op("relax.add")(conv, wildcard())
    act = is_op("relax.nn.relu")(biased) | is_op("relax.clip")(biased, wildcard(), wildcard())
    assert required_ops(conv) == {"relax.nn.conv2d"}
    assert required_ops(act) == {"relax.nn.conv2d", "relax.add"}  # relu or clip: neither is needed
    assert required_ops(act | conv) == {"relax.nn.conv2d"}
    assert required_ops(wildcard()) == frozenset()


def test_pattern_depth_and_operators():
    conv = is_op("relax.nn.conv2d")(wildcard(), wildcard())
    biased = is_op("relax.add")(conv, is_const())
    act = is_op("relax.nn.relu")(biased) | is_op("relax.clip")(biased, wildcard(), wildcard())
    assert pattern_shape(conv).depth == 1
    assert pattern_shape(act).depth == 3
    assert pattern_shape(act | conv).depth == 1  # the shallower alternative
    assert pattern_shape(act).ops == {"relax.nn.conv2d", "relax.add", "relax.nn.relu", "relax.clip"}
    anything = wildcard()(wildcard())  # a call to any callee: no operator set to test
    assert pattern_shape(is_op("relax.add")(anything, wildcard())).ops is None
    assert not pattern_shape(is_tuple([is_var(), wildcard()])).plain  # a field the match test does not read
    assert pattern_shape(is_tuple([is_const(), wildcard()])).plain


@R.function
def _chain(x: R.Tensor((4, 4), "float32"), w: R.Tensor((4, 4), "float32")):
    with R.dataflow():
        a = R.matmul(x, w)
        b = R.add(a, R.const(1.0))
        c = R.nn.relu(b)
        d = R.multiply(c, R.const(2.0))
        t = (d, a)
        e = R.matmul(t[0], w)  # through a tuple and its item
        f = R.add(e, e)
        R.output(f)
    return f


def test_longest_run_of_calls():
    calls = ModuleCalls(tvm.IRModule({"main": _chain}))
    assert calls.ops == {"relax.matmul", "relax.add", "relax.nn.relu", "relax.multiply"}
    assert calls.longest_run(frozenset({"relax.add", "relax.nn.relu", "relax.multiply"})) == 3  # b, c, d
    assert calls.longest_run(frozenset({"relax.matmul", "relax.add", "relax.nn.relu", "relax.multiply"})) == 6
    assert calls.longest_run(frozenset({"relax.add"})) == 1
    assert calls.longest_run(None) == float("inf")
    link = lambda inner: is_op("relax.add")(inner, wildcard()) | is_op("relax.nn.relu")(inner) | \
        is_op("relax.multiply")(inner, wildcard())
    assert can_match(link(link(link(wildcard()))), calls)
    assert not can_match(link(link(link(link(wildcard())))), calls)  # four links: the run is three
    # deep enough, and its operators called, but no relu reads a multiply
    assert not can_match(is_op("relax.nn.relu")(is_op("relax.multiply")(wildcard(), wildcard())), calls)
    assert can_match(is_op("relax.multiply")(is_op("relax.nn.relu")(wildcard()), is_const()), calls)
    # a kind of pattern the test does not read is kept
    assert not pattern_shape(is_op("relax.nn.relu")(is_var())).plain
    assert can_match(is_op("relax.nn.relu")(is_var()), calls)


def test_a_module_the_walk_cannot_read_keeps_every_pattern():
    @R.function
    def branchy(x: R.Tensor((4,), "float32"), flag: R.Tensor((), "bool")):
        if flag:
            y = R.add(x, x)
        else:
            y = R.multiply(x, x)
        return y

    calls = ModuleCalls(tvm.IRModule({"main": branchy}))
    assert calls.longest_run(frozenset({"relax.add"})) == float("inf")
    assert calls.ops == {"relax.add", "relax.multiply"}  # the branches' calls are read


@pytest.mark.parametrize("model", [
    lambda: onnx_models.mobilenet_v2(32), lambda: onnx_models.resnet(32), lambda: zoo_models.shufflenet_v2(64),
    lambda: zoo_models.squeezenet11(64), lambda: zoo_models.mobilenet_v3_small(64),
], ids=["mobilenet_v2", "resnet", "shufflenet_v2", "squeezenet", "mobilenet_v3_small"])
def test_the_patterns_left_out_or_not_in_the_plan_change_nothing(model):
    arch = npu_backend.load_arch("cgra-8x8")
    mod = normalise(npu_backend.from_onnx(model()), arch, CompileOptions())
    patterns = fusion_patterns(arch)
    calls = ModuleCalls(mod)
    kept = [pattern for pattern in patterns if can_match(pattern.pattern, calls)]
    assert len(kept) < len(patterns)
    with shape_bounds(bounds_of(mod, CompileOptions())):
        every = relax.transform.FuseOpsByPattern(patterns, bind_constants=False, annotate_codegen=True)(mod)
        fewer = relax.transform.FuseOpsByPattern(kept, bind_constants=False, annotate_codegen=True)(mod)
        grouped = grouped_patterns(every)
        planned = relax.transform.FuseOpsByPattern([pattern for pattern in kept if pattern.name in grouped],
                                                   bind_constants=False, annotate_codegen=True)(mod)
    tvm.ir.assert_structural_equal(every, fewer)
    tvm.ir.assert_structural_equal(every, planned)
    assert 0 < len(grouped) < len(kept)
