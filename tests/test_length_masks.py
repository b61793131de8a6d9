"""A mask computed from a symbolic length alone, proven for every length (normalise/length_masks.py),
and the scalar operands of symbolic-length tensors on the NPU (normalise/scalars.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import npu_backend
from npu_backend.normalise.chain_match import Chain
from npu_backend.normalise.length_masks import causal_masks_built_from_length, is_causal, keeps_diagonal

ARCH = "cgra-8x8"


def _mask_function(compare: str, from_input: bool = False):
    """main(x (1, s)) whose where(mask, 0, -inf) reads compare(j, i) of positions: arange(s), or
    the input's values (not the length alone)."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((1, s), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            positions = bb.emit(relax.op.reshape(x, (s,))) if from_input else \
                bb.emit(relax.op.add(relax.op.arange(0, s, 1, "int64"), relax.const(0, "int64")))
            shifted = bb.emit(relax.op.concat([relax.const(np.array([-1]), "int64"), positions], axis=0))
            previous = bb.emit(relax.op.strided_slice(shifted, [0], [0], [s]))  # positions - 1, via the concat
            ahead = bb.emit(relax.op.add(previous, relax.const(1, "int64")))
            rows = bb.emit(relax.op.expand_dims(ahead, [1]))
            columns = bb.emit(relax.op.expand_dims(positions, [0]))
            mask = bb.emit(getattr(relax.op, compare)(columns, rows))
            out = bb.emit_output(relax.op.where(mask, relax.const(np.float32(0)), relax.const(np.float32(-np.inf))))
        bb.emit_func_output(out)
    return bb.get()


def _claims(mod) -> list:
    found = []

    @relax.expr_functor.mutator
    class Probe(relax.PyExprMutator):
        def visit_call_(self, call):
            call = self.visit_expr_post_order(call)
            if isinstance(call, relax.Call) and call.op.same_as(tvm.ir.Op.get("relax.where")):
                chain = Chain(self)
                found.append((is_causal(chain, call.args[0]), keeps_diagonal(chain, call.args[0])))
            return call

    Probe(mod).visit_expr(mod["main"])
    return found


@pytest.mark.parametrize("compare, from_input, causal, diagonal", [
    ("less_equal", False, True, True),      # j <= i: causal, every row keeps (i, i)
    ("less", False, False, False),          # j < i: row 0 keeps nothing
    ("greater_equal", False, False, True),  # j >= i: keeps the diagonal, not causal
    ("less_equal", True, False, False),     # positions read from the input: nothing proven
])
def test_a_mask_from_the_length_is_proven_only_when_it_holds_at_every_length(compare, from_input, causal, diagonal):
    assert _claims(_mask_function(compare, from_input)) == [(causal, diagonal)]


@pytest.mark.parametrize("compare", ["less_equal", "less"])
def test_a_causal_mask_is_rebuilt_from_one_arange_and_computes_the_same(compare):
    mod = _mask_function(compare)
    rebuilt = causal_masks_built_from_length(mod)
    ops = {b.value.op.name for b in rebuilt["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)}
    assert ("relax.concat" not in ops) == (compare == "less_equal")
    for module in (mod, rebuilt):
        vm = relax.VirtualMachine(tvm.compile(module, "llvm"), tvm.cpu())
        for n in (1, 2, 7):
            got = vm["main"](tvm.runtime.tensor(np.zeros((1, n), "int64"))).numpy()
            i, j = np.indices((n, n))
            expected = np.where(getattr(np, compare)(j, i), np.float32(0), np.float32(-np.inf))
            np.testing.assert_array_equal(got, expected)


def _scaled(scale, op="multiply"):
    """main(x (1, 4, s, 16)): x * scale, or -x."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((1, 4, s, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            value = relax.op.negative(x) if op == "negative" else relax.op.multiply(x, relax.const(np.float32(scale)))
            out = bb.emit_output(value)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("scale, op", [(0.5, "multiply"), (None, "negative")])
def test_a_scalar_operand_of_a_symbolic_length_tensor_runs_on_the_npu(scale, op):
    """Before, scalars.py read the other operand's static shape: none at a symbolic length, so
    attention's 1 / sqrt(d) on the queries and RoPE's negation stayed on the host."""
    mod = _scaled(scale, op)
    placements = npu_backend.explain(mod, ARCH, dims={"s": 9})
    assert [p.where for p in placements if p.op in ("multiply", "negative")] == ["npu"]
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    x = np.random.default_rng(0).standard_normal((1, 4, 9, 16)).astype("float32")
    expected = -x if op == "negative" else x * np.float32(scale)
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), expected)


def test_a_multiplication_by_one_is_its_operand():
    placements = npu_backend.explain(_scaled(1.0), ARCH, dims={"s": 9})
    assert not [p for p in placements if p.op == "multiply"]
