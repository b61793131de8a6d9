"""Layout copies with a symbolic axis (kernels/layout/): a prefill's head split, RoPE's
rotate_half slices and concat at any length, one compile, the last tile cut to the length."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx

import npu_backend

ARCH = "cgra-8x8"


def _rotate_half_of_heads(bound: int = 256):
    """x (1, s, 4, 16) -> heads (1, 4, s, 16) -> rotate_half's concat(x2, x1) -> repeated for 2 groups."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((1, s, 4, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": bound}}):
        with bb.dataflow():
            heads = bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))
            first = bb.emit(relax.op.strided_slice(heads, [3], [0], [8]))
            second = bb.emit(relax.op.strided_slice(heads, [3], [8], [16]))
            rotated = bb.emit(relax.op.concat([second, first], axis=-1))
            grouped = bb.emit(relax.op.expand_dims(rotated, [2]))
            out = bb.emit_output(relax.op.broadcast_to(grouped, (1, 4, 2, s, 16)))
        bb.emit_func_output(out)
    return bb.get()


def test_symbolic_layout_copies_run_on_the_npu_at_every_length():
    mod = _rotate_half_of_heads()
    where = {(p.op, p.where) for p in npu_backend.explain(mod, ARCH, dims={"s": 9}) if p.op != "expand_dims"}
    # the broadcast of a unit axis as a repeat (no_op_broadcasts.py), which the layout family copies
    assert where == {("permute_dims", "npu"), ("strided_slice", "npu"), ("concat", "npu"), ("repeat", "npu")}
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    cycles = {}
    for n in (1, 9, 64, 200):
        x = np.random.default_rng(n).standard_normal((1, n, 4, 16)).astype("float32")
        heads = x.transpose(0, 2, 1, 3)
        expected = np.broadcast_to(np.concatenate([heads[..., 8:], heads[..., :8]], -1)[:, :, None], (1, 4, 2, n, 16))
        with npu_backend.profile() as prof:
            got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_array_equal(got, expected)
        # 4: each half's slice of the transpose is a transpose of a slice of x (split_slices.py
        # at a symbolic length too), a copy each, the transpose of the whole no kernel of its own
        assert len(prof.kernels) == 4 and not prof.host_calls
        cycles[n] = prof.total_cycles
    assert cycles[1] < cycles[9] < cycles[64] < cycles[200]  # the last tile cut: a short length costs less
    assert cycles[1] * 4 < cycles[200]


def test_a_slice_along_the_symbolic_axis_stays_on_the_host_saying_why():
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((4, s), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": 64}}):
        with bb.dataflow():
            out = bb.emit_output(relax.op.strided_slice(x, [1], [1], [s]))
        bb.emit_func_output(out)
    (placement,) = [p for p in npu_backend.explain(bb.get(), ARCH, dims={"s": 9}) if p.op == "strided_slice"]
    assert placement.where == "host" and "symbolic" in placement.reason
