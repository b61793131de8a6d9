"""npu_backend.tools.explain: every operator, where it runs, and an actionable reason for the host."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tvm import relax, tirx

import npu_backend
from models import assert_matches, matmul_model, relax_module, run
from npu_backend.kernels import registry


def test_fused_ops_on_npu_and_a_softmax_too_long_for_the_scratchpad_on_host():
    """A softmax runs on the NPU (softmax.py); one whose rows fit neither whole nor in column
    tiles says why."""
    mod, _, _ = matmul_model(16, 10, 8, softmax=True)
    placements = npu_backend.explain(mod)
    assert [(p.op, p.where) for p in placements] == [
        ("matmul", "npu"), ("add", "npu"), ("nn.relu", "npu"), ("nn.softmax", "npu")]
    assert placements[0].kernel.startswith("cgra.matmul_bias_relu")
    assert placements[-1].kernel.startswith("cgra.softmax")
    # 8191 is prime: no column tile divides the row, and the whole row does not fit cgra-4x4.
    long_rows = relax_module([("x", (2, 8191), "float32")], lambda bb, x: bb.emit(relax.op.nn.softmax(x)))
    (placement,) = npu_backend.explain(long_rows, "cgra-4x4")
    assert placement.where == "host" and "fit" in placement.reason and "scratchpad" in placement.reason


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


def test_a_matmul_of_a_tensor_with_itself_stays_on_the_host_and_runs():
    mod = relax_module([("x", (16, 16), "float32")], lambda bb, x: bb.emit(relax.op.matmul(x, x)))
    placements = npu_backend.explain(mod, "cgra-4x4")
    assert [(p.op, p.where) for p in placements] == [("matmul", "host")]
    assert "same tensor as lhs and rhs" in placements[0].reason
    x = np.random.default_rng(0).standard_normal((16, 16)).astype("float32")
    assert_matches(run(npu_backend.compile(mod, "cgra-4x4"), [x]), x @ x, "float32")


def test_explain_reads_each_kernel_as_the_compiler_does_and_fails_where_it_fails(monkeypatch):
    def refuse(func):
        raise npu_backend.UnsupportedOperator("this kernel cannot be read")

    monkeypatch.setattr(registry, "spec_from_composite", refuse)
    mod, _, _ = matmul_model(16, 10, 8)
    with pytest.raises(npu_backend.CGRAError, match="cannot be read") as explained:
        npu_backend.explain(mod, "cgra-4x4")
    with pytest.raises(Exception, match="cannot be read") as compiled:
        npu_backend.compile(mod, "cgra-4x4")
    assert str(explained.value) in str(compiled.value)  # "[partition] kernel '<symbol>': ..."


def test_a_symbolic_batch_of_two_activations_keeps_the_op_on_the_host_and_says_how_to_bind_it():
    # Symbolic rows, columns and reductions run on the NPU (test_dynamic_shapes,
    # test_symbolic_attention); a symbolic batch axis of two batched operands does not.
    n = tirx.Var("n", "int64")
    mod = relax_module([("x", (n, 4, 8), "float32"), ("w", (n, 8, 4), "float32")],
                       lambda bb, x, w: bb.emit(relax.op.matmul(x, w)))
    (placement,) = npu_backend.explain(mod, "cgra-4x4")
    assert placement.where == "host"
    assert "symbolic dimension n on axis 0" in placement.reason and "BindSymbolicVars" in placement.reason


def test_a_conv2d_transpose_on_the_host_counts_its_macs():
    # Every input element meets every (output channel, tap) of its group: 1*8*5*5 x 4*3*3.
    mod = relax_module([("x", (1, 8, 5, 5), "float32"), ("w", (8, 4, 3, 3), "float32")],
                       lambda bb, x, w: bb.emit(relax.op.nn.conv2d_transpose(x, w, strides=2)))
    (placement,) = npu_backend.explain(mod, "cgra-8x8")
    assert (placement.where, placement.macs) == ("host", 7200)
    assert npu_backend.npu_mac_fraction([placement]) == 0.0


@pytest.mark.parametrize("op, shapes, macs", [
    (lambda x, w: relax.op.nn.conv1d(x, w, padding=1), [(1, 8, 100), (16, 8, 3)], 100 * 16 * 8 * 3),
    (lambda x, w: relax.op.nn.conv1d(x, w, groups=8), [(1, 8, 100), (8, 1, 5)], 96 * 8 * 5),
    (lambda x, w: relax.op.nn.conv3d(x, w), [(1, 4, 6, 6, 6), (8, 4, 3, 3, 3)], 4 * 4 * 4 * 8 * 4 * 27),
    (lambda x, w: relax.op.nn.conv1d_transpose(x, w, strides=2), [(1, 8, 100), (8, 4, 3)], 100 * 8 * 4 * 3),
], ids=["conv1d", "depthwise-conv1d", "conv3d", "conv1d_transpose"])
def test_every_convolution_counts_its_macs(op, shapes, macs):
    """A conv1d or conv3d counts toward the share of MACs wherever it runs: counted as 0, a
    model whose convolutions all stay on the host claimed every MAC on the NPU."""
    mod = relax_module([("x", shapes[0], "float32"), ("w", shapes[1], "float32")],
                       lambda bb, x, w: bb.emit(op(x, w)))
    placements = npu_backend.explain(mod, "cgra-8x8")
    (placement,) = [p for p in placements if p.macs]  # a conv1d's expand_dims and squeeze beside it: none
    assert placement.macs == macs
    assert npu_backend.npu_mac_fraction(placements) == (1.0 if placement.where == "npu" else 0.0)


def test_a_model_without_macs_does_not_claim_a_share_of_them():
    mod = relax_module([("x", (4, 8), "float32"), ("y", (4, 8), "float32")],
                       lambda bb, x, y: bb.emit(relax.op.add(x, y)))
    text = npu_backend.format_placements(npu_backend.explain(mod, "cgra-8x8"))
    assert "of 0 MACs" not in text and "no multiply-accumulates" in text


def test_explain_refuses_a_dimension_name_the_module_does_not_have():
    """torch.export names a sequence length "s58": dims={"s": 48} sized nothing, so the matmul
    counted 0 MACs and explain reported 100% on the NPU whatever ran on the host."""
    seq = tirx.Var("s58", "int64")
    mod = relax_module([("x", (seq, 16), "float32")],
                       lambda bb, x: bb.emit(relax.op.matmul(x, relax.const(np.ones((16, 8), np.float32)))))
    with pytest.raises(ValueError, match=r"dims names 's'.*symbolic dimensions are 's58'"):
        npu_backend.explain(mod, "cgra-8x8", dims={"s": 48})
    (placement,) = [p for p in npu_backend.explain(mod, "cgra-8x8", dims={"s58": 48}) if p.op == "matmul"]
    assert placement.macs == 48 * 16 * 8


def test_a_host_op_without_a_kernel_names_every_registered_familys_ops():
    """The reason's list of what the NPU runs comes from the kernel registry: every family's
    Relax ops, a family registered later's too."""
    mod = relax_module([("x", (4, 8), "float32")], lambda bb, x: bb.emit(relax.op.sin(x)))
    (placement,) = npu_backend.explain(mod, "cgra-8x8")
    assert placement.where == "host" and placement.reason.startswith("no NPU kernel for sin")
    for family in registry.FAMILIES:
        for op in family.host_ops:
            assert op.replace("relax.", "") in placement.reason, (family.name, op)
    for op in ("nn.softmax", "nn.layer_norm", "nn.rms_norm", "exp", "tanh", "nn.gelu", "rsqrt", "sum", "max"):
        assert op in placement.reason
    extra = dataclasses.replace(registry.FAMILIES[-1], name="test_cos", ops=("test_cos",), roots=list,
                                patterns=list, pairs=list, host_ops={"relax.cos": "cgra.test_cos"})
    with registry.registered(extra):
        (placement,) = npu_backend.explain(mod, "cgra-8x8")
    assert "test_cos: cos" in placement.reason


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_the_host_reason_of_a_norm_reads_its_gamma_beta_and_weight_by_name(op):
    """A norm left on the host (here asked directly) is priced by its family's spec, which reads
    gamma / beta / weight by name: explain gave only lhs and rhs and raised KeyError 'gamma'."""
    from npu_backend.tools.explain import _host_reason

    x = relax.Var("x", relax.TensorType((4, 6, 8), "float32"))
    g, b = (relax.Var(n, relax.TensorType((8,), "float32")) for n in "gb")
    bb = relax.BlockBuilder()
    with bb.function("main", [x, g, b]):
        with bb.dataflow():
            norm = relax.op.nn.layer_norm(x, g, b, axes=[-1]) if op == "layer_norm" else relax.op.nn.rms_norm(x, g)
            out = bb.emit_output(norm)
        bb.emit_func_output(out)
    mod = bb.get()
    call = mod["main"].body.blocks[0].bindings[0].value
    assert isinstance(_host_reason(mod, call, npu_backend.load_arch("cgra-8x8")), str)


def test_model_macs_count_the_imported_graph_at_the_given_sizes():
    """The benchmarks' ideal: the model's own matmuls and convolutions, counted before normalise
    (a rewrite that adds a correcting GEMM must not raise the ideal it is measured against)."""
    seq = tirx.Var("s58", "int64")
    mod = relax_module([("x", (seq, 16), "float32"), ("img", (1, 8, 10, 10), "float32")],
                       lambda bb, x, img: bb.emit(relax.Tuple([
                           bb.emit(relax.op.matmul(x, relax.const(np.ones((16, 8), np.float32)))),
                           bb.emit(relax.op.nn.conv2d(img, relax.const(np.ones((4, 8, 3, 3), np.float32)), padding=1))])))
    conv = 10 * 10 * 4 * 8 * 9
    assert npu_backend.model_macs(mod, {"s58": 48}) == 48 * 16 * 8 + conv
    assert npu_backend.model_macs(mod) == conv  # a symbolic size not given counts 0, as in explain
    with pytest.raises(ValueError, match="dims names 's'"):
        npu_backend.model_macs(mod, {"s": 48})
