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
    def body(bb, x, w, y, k, a, b, z, v):
        return relax.Tuple([bb.emit(relax.op.matmul(x, w)),
                            bb.emit(relax.op.nn.conv2d(y, k, data_layout="NCHW4c", kernel_layout="OIHW")),
                            bb.emit(relax.op.matmul(a, b, out_dtype="int8")),
                            bb.emit(relax.op.nn.conv2d(z, v, data_layout="CHWN", kernel_layout="HWIO", groups=2))])
    mod = relax_module([("x", (2, 1, 4, 8), "float32"), ("w", (1, 3, 8, 5), "float32"),
                        ("y", (1, 2, 6, 6, 4), "float32"), ("k", (8, 8, 3, 3), "float32"),
                        ("a", (4, 8), "int8"), ("b", (8, 3), "int8"),
                        ("z", (8, 6, 6, 1), "float32"), ("v", (3, 3, 4, 8), "float32")], body)
    placements = npu_backend.explain(mod, "cgra-4x4")
    assert [(p.op, p.where) for p in placements] == [
        ("matmul", "host"), ("nn.conv2d", "host"), ("matmul", "host"), ("nn.conv2d", "host")]
    assert "broadcasts the batch dimensions" in placements[0].reason
    assert "NCHW4c" in placements[1].reason and "blocked layout" in placements[1].reason
    assert 'out_dtype="int32"' in placements[2].reason
    assert "CHWN" in placements[3].reason and "NHWC" in placements[3].reason
    assert placements[3].macs == 8 * 4 * 4 * 1 * 3 * 3 * 4  # HWIO weights: (3, 3, 4, 8)
    assert "runs on" in npu_backend.format_placements(npu_backend.explain(mod))


def test_nhwc_conv2d_and_batched_matmul_run_on_the_npu():
    """The layouts and batch forms issue 4 asks for: explain() shows each on the NPU."""
    def body(bb, y, k, d, e, x, w, s, t):
        return relax.Tuple([
            bb.emit(relax.op.nn.conv2d(y, k, data_layout="NHWC", kernel_layout="HWIO", padding=1)),
            bb.emit(relax.op.nn.conv2d(d, e, data_layout="NHWC", kernel_layout="OHWI", groups=8)),
            bb.emit(relax.op.matmul(x, w)),
            bb.emit(relax.op.matmul(s, relax.op.permute_dims(t, [1, 0])))])
    mod = relax_module([("y", (1, 6, 6, 8), "float32"), ("k", (3, 3, 8, 16), "float32"),
                        ("d", (1, 6, 6, 8), "float32"), ("e", (8, 3, 3, 1), "float32"),
                        ("x", (2, 3, 4, 8), "float32"), ("w", (2, 3, 8, 5), "float32"),
                        ("s", (4, 7, 8), "float32"), ("t", (5, 8), "float32")], body)
    placements = npu_backend.explain(mod, "cgra-4x4")
    assert [(p.op, p.where) for p in placements] == [
        ("nn.conv2d", "npu"), ("nn.conv2d", "npu"), ("matmul", "npu"), ("permute_dims", "npu"), ("matmul", "npu")]
    assert placements[0].macs == 6 * 6 * 16 * 3 * 3 * 8 and placements[1].macs == 4 * 4 * 8 * 3 * 3
    assert placements[4].kernel.startswith("cgra.linear")
