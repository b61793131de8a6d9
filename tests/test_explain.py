"""npu_backend.explain: every operator, where it runs, and an actionable reason for the host."""

from __future__ import annotations

from tvm import relax

import npu_backend
from models import matmul_model, relax_module


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
