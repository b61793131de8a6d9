"""npu_backend.explain: every operator, where it runs, and an actionable reason for the host."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

import npu_backend
from models import assert_matches, matmul_model, relax_module, run
from npu_backend import target_hook


def test_fused_ops_on_npu_and_softmax_on_host():
    mod, _, _ = matmul_model(16, 10, 8, softmax=True)
    placements = npu_backend.explain(mod)
    assert [(p.op, p.where) for p in placements] == [
        ("matmul", "npu"), ("add", "npu"), ("nn.relu", "npu"), ("nn.softmax", "host")]
    assert placements[0].kernel.startswith("cgra.matmul_bias_relu")
    assert "no NPU kernel for nn.softmax" in placements[-1].reason


def test_reasons_name_what_blocks_the_offload():
    def body(bb, x, w, y, k, a, b):
        return relax.Tuple([bb.emit(relax.op.matmul(x, w)),
                            bb.emit(relax.op.nn.conv2d(y, k, data_layout="NHWC", kernel_layout="HWIO")),
                            bb.emit(relax.op.matmul(a, b, out_dtype="int8"))])
    mod = relax_module([("x", (4, 8, 8), "float32"), ("w", (8, 5), "float32"),
                   ("y", (3, 6, 6, 8), "float32"), ("k", (3, 3, 8, 8), "float32"),
                   ("a", (4, 8), "int8"), ("b", (8, 3), "int8")], body)
    placements = npu_backend.explain(mod, "cgra-4x4")
    assert [(p.op, p.where) for p in placements] == [("matmul", "host"), ("nn.conv2d", "host"), ("matmul", "host")]
    assert "2-D operands" in placements[0].reason
    assert "NHWC" in placements[1].reason and "NCHW" in placements[1].reason
    assert 'out_dtype="int32"' in placements[2].reason
    assert "runs on" in npu_backend.format_placements(npu_backend.explain(mod))


def test_a_matmul_of_a_tensor_with_itself_stays_on_the_host_and_runs():
    mod = relax_module([("x", (16, 16), "float32")], lambda bb, x: bb.emit(relax.op.matmul(x, x)))
    placements = npu_backend.explain(mod, "cgra-4x4")
    assert [(p.op, p.where) for p in placements] == [("matmul", "host")]
    assert "same tensor as lhs and rhs" in placements[0].reason
    x = np.random.default_rng(0).standard_normal((16, 16)).astype("float32")
    assert_matches(run(npu_backend.compile(mod, "cgra-4x4"), [x]), x @ x, "float32")


def test_explain_reads_each_kernel_as_the_compiler_does_and_fails_where_it_fails(monkeypatch):
    def refuse(func, source_ops=()):
        raise npu_backend.UnsupportedOperator("this kernel cannot be read")

    monkeypatch.setattr(target_hook, "spec_from_composite", refuse)
    mod, _, _ = matmul_model(16, 10, 8)
    with pytest.raises(npu_backend.CGRAError, match="cannot be read") as explained:
        npu_backend.explain(mod, "cgra-4x4")
    with pytest.raises(Exception, match="cannot be read") as compiled:
        npu_backend.compile(mod, "cgra-4x4")
    assert str(explained.value) in str(compiled.value)  # "[partition] kernel '<symbol>': ..."
