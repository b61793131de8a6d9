"""What a prefill computes from its length alone (RoPE's cos and sin of arange(s)) is a view of the
first s rows of a table computed for the bound (frontend/position_tables.py `tabulate_prefix`;
such a view times a constant row, a view of the product table: `scale_prefix_tables`):
no arange, astype, cos or sin on the host at any length; a tensor that is not its table's prefix
at a shorter length (reversed positions) is left as it was."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import npu_backend
from npu_backend.frontend.position_tables import scale_prefix_tables, tabulate_prefix

BOUND, WIDTH = 64, 16
INVERSE = (1.0 / 10000 ** (np.arange(0, WIDTH, 2) / WIDTH)).astype("float32")


def _rotary_scale(reverse: bool = False) -> tvm.IRModule:
    """x (1, s, WIDTH) * cos(concat(positions * inverse, twice)), positions arange(s) (or reversed)."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([1, s, WIDTH], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": BOUND}}):
        with bb.dataflow():
            positions = bb.emit(relax.op.arange(0, s, 1, "int64"))
            if reverse:
                positions = bb.emit(relax.op.flip(positions, axis=0))
            angles = bb.emit(relax.op.multiply(relax.op.astype(relax.op.reshape(positions, relax.ShapeExpr([1, s, 1])),
                                                               "float32"), relax.const(INVERSE)))
            table = bb.emit(relax.op.cos(relax.op.concat([angles, angles], axis=-1)))
            out = bb.emit_output(relax.op.multiply(x, table))
        bb.emit_func_output(out)
    return relax.transform.Normalize()(bb.get())


def _expected(x: np.ndarray, reverse: bool = False) -> np.ndarray:
    positions = np.arange(x.shape[1], dtype="float32")[::-1 if reverse else 1]
    angles = positions[:, None] * INVERSE
    return x * np.cos(np.concatenate([angles, angles], axis=-1))[None]


def test_rope_tables_of_a_symbolic_length_are_views_of_a_bound_table_on_no_host_op():
    mod = _rotary_scale()
    for n in (1, 5, BOUND):
        ops = {p.op for p in npu_backend.explain(mod, "cgra-8x8", dims={"s": n}) if p.where == "host"}
        assert not ops & {"arange", "astype", "cos", "concat", "multiply"}, ops
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    for n in (1, 7, BOUND):
        x = np.random.default_rng(n).standard_normal((1, n, WIDTH)).astype("float32")
        with npu_backend.profile() as prof:
            out = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(out, _expected(x), rtol=1e-5, atol=1e-6)
        # no host operator computes; here a runtime copy (cgra.host.*) still moves the view once
        assert all(call.name.startswith("cgra.host.") for call in prof.host_calls), prof.host_calls


def test_positions_that_are_no_prefix_of_the_bounds_table_stay_computed():
    mod = _rotary_scale(reverse=True)
    assert tabulate_prefix(mod).same_as(mod)


@pytest.mark.parametrize("n", [3, 9])
def test_reversed_positions_are_still_right(n):
    vm = relax.VirtualMachine(npu_backend.compile(_rotary_scale(reverse=True), "cgra-8x8"), tvm.cpu())
    x = np.random.default_rng(n).standard_normal((1, n, WIDTH)).astype("float32")
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), _expected(x, True), rtol=1e-5, atol=1e-6)


def _signed_view(signs) -> tvm.IRModule:
    """x (1, s, WIDTH) * (view(table)[:s] * signs), as rotations.py leaves RoPE's sine after
    tabulate_prefix made it a view of the bound's table."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([1, s, WIDTH], "float32"))
    table = np.random.default_rng(0).standard_normal((BOUND, WIDTH)).astype("float32")
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": BOUND}}):
        with bb.dataflow():
            view = bb.emit(relax.op.memory.view(relax.const(table), relax.ShapeExpr([s, WIDTH]), "float32",
                                                tirx.IntImm("int64", 0)))
            signed = bb.emit(relax.op.multiply(view, relax.const(signs)))
            out = bb.emit_output(relax.op.multiply(x, bb.emit(relax.op.reshape(signed, relax.ShapeExpr([1, s, WIDTH])))))
        bb.emit_func_output(out)
    return bb.get()


def test_a_table_prefix_times_a_constant_row_is_a_view_of_the_product_table():
    """scale_prefix_tables: the sine's signs (rotations.py) multiply the table once at compile time
    (float32, as the NPU's multiply rounds), no kernel per prefill; the same values at any length."""
    signs = np.where(np.arange(WIDTH) < WIDTH // 2, -1.0, 1.0).astype("float32") * np.float32(1.5)
    before = _signed_view(signs)
    after = scale_prefix_tables(before)
    multiplies = [mod.script().count("R.multiply(") for mod in (before, after)]
    assert multiplies == [2, 1], multiplies
    for n in (1, 6, BOUND):
        x = np.random.default_rng(n).standard_normal((1, n, WIDTH)).astype("float32")
        outs = [relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
                for mod in (before, after)]
        np.testing.assert_array_equal(outs[0], outs[1])


def _split_table() -> tvm.IRModule:
    """GPT-J's sincos rows split into sin and cos, each repeated pairwise (repeat_interleave) and
    multiplied into x (1, s, WIDTH): the split's parts are what the layers read."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([1, s, WIDTH], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": BOUND}}):
        with bb.dataflow():
            positions = bb.emit(relax.op.astype(relax.op.reshape(relax.op.arange(0, s, 1, "int64"),
                                                                 relax.ShapeExpr([1, s, 1])), "float32"))
            angles = bb.emit(relax.op.multiply(positions, relax.const(INVERSE)))
            sincos = bb.emit(relax.op.concat([relax.op.sin(angles), relax.op.cos(angles)], axis=-1))
            parts = bb.emit(relax.op.split(sincos, [WIDTH // 2], axis=-1))
            sin, cos = (bb.emit(relax.op.repeat(relax.TupleGetItem(parts, i), 2, axis=-1)) for i in (0, 1))
            out = bb.emit_output(relax.op.add(relax.op.multiply(x, cos), relax.op.multiply(x, sin)))
        bb.emit_func_output(out)
    return relax.transform.Normalize()(bb.get())


def test_a_split_tables_parts_are_views_of_bound_tables():
    mod = tabulate_prefix(_split_table())
    ops = {b.value.op.name for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)}
    assert not ops & {"relax.split", "relax.repeat", "relax.sin", "relax.arange"}, ops
    assert "relax.memory.view" in ops
    vm = relax.VirtualMachine(npu_backend.compile(_split_table(), "cgra-8x8"), tvm.cpu())
    for n in (2, 7, BOUND):
        x = np.random.default_rng(n).standard_normal((1, n, WIDTH)).astype("float32")
        angles = np.arange(n, dtype="float32")[:, None] * INVERSE
        sin, cos = (np.repeat(f(angles), 2, axis=-1)[None] for f in (np.sin, np.cos))
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), x * cos + x * sin, rtol=1e-5, atol=1e-6)
