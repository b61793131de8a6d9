"""The normalise rewrites run only on a module that calls their operators (normalise/rewrite.py):
one without them comes back as it was, one with them rewritten, one the operator read cannot
vouch for (a branch) rewritten too; the read is shared inside one normalise and let go after."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.script import relax as R

from npu_backend.normalise import rewrite
from npu_backend.normalise.conv3ds import conv3ds_as_conv2ds_pass


def _module(conv3d: bool, branch: bool = False):
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 2, 4, 6, 6), "float32"))
    with bb.function("main", [x]):
        if conv3d:
            weight = relax.const(np.ones((2, 2, 1, 1, 1), "float32"))
            y = bb.emit(relax.op.nn.conv3d(x, weight))
        else:
            y = bb.emit(relax.op.nn.relu(x))
        if branch:
            flag = relax.Var("flag", R.Tensor((), "bool"))
            y = bb.emit(relax.If(flag, relax.SeqExpr([], y), relax.SeqExpr([], y)))
        bb.emit_func_output(y)
    return bb.get()


def test_a_rewrite_returns_a_module_without_its_operators_as_it_was():
    without, with_conv3d = _module(conv3d=False), _module(conv3d=True)
    assert rewrite.called_ops(without) == {"relax.nn.relu"}
    assert conv3ds_as_conv2ds_pass(without).same_as(without)
    assert "relax.nn.conv3d" not in rewrite.called_ops(conv3ds_as_conv2ds_pass(with_conv3d))


def test_a_module_the_read_cannot_vouch_for_is_rewritten():
    branchy = _module(conv3d=True, branch=True)
    assert rewrite.called_ops(branchy) is None
    assert not conv3ds_as_conv2ds_pass(branchy).same_as(branchy)


def test_the_read_is_shared_inside_scans_shared_and_let_go_after(monkeypatch):
    mod, reads = _module(conv3d=False), []
    functions = tvm.IRModule.functions
    monkeypatch.setattr(tvm.IRModule, "functions", property(lambda self: reads.append(1) or functions.__get__(self)))
    with rewrite.scans_shared():
        for _ in range(3):
            rewrite.called_ops(mod)
        assert len(reads) == 1
    assert rewrite._SCANS.last is None  # the module (and its weights) is not held
    rewrite.called_ops(mod)
    assert len(reads) == 2  # outside, every call reads
