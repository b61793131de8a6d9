"""The normalise rewrites of transformer graphs, at the Relax level: hand-written RMSNorm as
nn.rms_norm, hand-written tanh (and erf) GELU as nn.gelu_tanh (nn.gelu), PyTorch's safe softmax
as nn.softmax, constant negative indices counted from the end; each checked for its structure after the
rewrite and for the same numbers as before it on target "llvm". Forms that compute something
else are left alone.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import tvm
from tvm import relax

import npu_backend
from npu_backend.errors import UnsupportedOperator
from npu_backend.normalise.gelus import gelus_as_ops
from npu_backend.normalise.negative_indices import wrap_negative_indices
from npu_backend.normalise.no_op_broadcasts import no_op_broadcasts_removed
from npu_backend.normalise.rms_norms import rms_norms_as_ops
from npu_backend.normalise.softmaxes import safe_softmaxes_as_softmax

SHAPE = (2, 5, 16)
op = relax.op


def _module(build, shapes=(SHAPE,), dtypes=None):
    """main(x0, x1, ...) = build(bb, *params)'s value."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(shape, (dtypes or ["float32"] * len(shapes))[i]))
              for i, shape in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod) -> collections.Counter:
    counts = collections.Counter()
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            for block in func.body.blocks:
                for binding in block.bindings:
                    if isinstance(binding.value, relax.Call) and isinstance(binding.value.op, tvm.ir.Op):
                        counts[binding.value.op.name.replace("relax.", "")] += 1
    return counts


def _run(mod, *inputs):
    """The module's output on llvm (a tuple's as TVM returns it)."""
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return out.numpy() if hasattr(out, "numpy") else out


def _same_numbers(before, after, *inputs, rtol=1e-6):
    expected, got = _run(before, *inputs), _run(after, *inputs)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol)
    return got


def _f32(value):
    return relax.const(np.float32(value))


RNG = np.random.default_rng(0)
X = RNG.standard_normal(SHAPE).astype(np.float32) * 2
WEIGHT = RNG.standard_normal(SHAPE[-1:]).astype(np.float32)


# ------------------------------------------------------------------------------------ RMSNorm

def _rms(bb, x, square="power", weight=WEIGHT, swap=False, axis=-1, eps=1e-6):
    squared = bb.emit(op.power(x, _f32(2)) if square == "power" else op.multiply(x, x))
    mean = bb.emit(op.mean(squared, axis=[axis], keepdims=True))
    shifted = bb.emit(op.add(_f32(eps), mean) if swap else op.add(mean, _f32(eps)))
    scale = bb.emit(op.rsqrt(shifted))
    normed = bb.emit(op.multiply(scale, x) if swap else op.multiply(x, scale))
    if weight is None:
        return normed
    return op.multiply(normed, relax.const(weight)) if swap else op.multiply(relax.const(weight), normed)


@pytest.mark.parametrize("square, swap, weight", [
    ("power", False, WEIGHT),  # Llama, Qwen, Mistral, T5
    ("multiply", True, WEIGHT),  # x * x, every operand the other way round
    ("power", False, 1 + WEIGHT.reshape(1, 1, -1)),  # Gemma's folded (1 + w), broadcast (1, 1, D)
    ("power", False, None),  # no weight
])
def test_hand_written_rms_norm_becomes_one_op(square, swap, weight):
    before = _module(lambda bb, x: _rms(bb, x, square, weight, swap))
    after = rms_norms_as_ops(before)
    assert _ops(after) == {"nn.rms_norm": 1}, _ops(after)
    (norm,) = [b.value for b in after["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    assert float(norm.attrs.epsilon) == pytest.approx(1e-6) and [int(a) for a in norm.attrs.axes] == [-1]
    _same_numbers(before, after, X)


def test_rms_norm_over_another_axis_or_a_per_row_weight_is_left_alone():
    over_rows = _module(lambda bb, x: _rms(bb, x, axis=1))
    assert _ops(rms_norms_as_ops(over_rows))["rsqrt"] == 1
    # A weight per row (D, 1) is not a norm's weight: the core becomes rms_norm, the multiply stays.
    per_row = _module(lambda bb, x: _rms(bb, x, weight=np.ones((5, 1), np.float32)))
    after = rms_norms_as_ops(per_row)
    assert _ops(after) == {"nn.rms_norm": 1, "multiply": 1}
    _same_numbers(per_row, after, X)


def test_rms_norm_of_another_value_is_left_alone():
    # mean(y ** 2) with x * rsqrt(...): not a norm of x
    def build(bb, x, y):
        mean = bb.emit(op.mean(bb.emit(op.power(y, _f32(2))), axis=[-1], keepdims=True))
        return op.multiply(x, bb.emit(op.rsqrt(bb.emit(op.add(mean, _f32(1e-6))))))
    before = _module(build, shapes=(SHAPE, SHAPE))
    assert "nn.rms_norm" not in _ops(rms_norms_as_ops(before))


# --------------------------------------------------------------------------------------- GELU

def _new_gelu(bb, x, c3=0.044715, c1=math.sqrt(2 / math.pi)):
    """Hugging Face's NewGELU (GPT-2, GPT-J, ALBERT) as torch.export leaves it."""
    half = bb.emit(op.multiply(x, _f32(0.5)))
    cube = bb.emit(op.multiply(bb.emit(op.power(x, _f32(3))), _f32(c3)))
    inner = bb.emit(op.multiply(bb.emit(op.add(x, cube)), _f32(c1)))
    return op.multiply(half, bb.emit(op.add(bb.emit(op.tanh(inner)), _f32(1))))


def _bloom_gelu(bb, x):
    """Bloom's `x * 0.5 * (1.0 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))`."""
    half = bb.emit(op.multiply(x, _f32(0.5)))
    scaled = bb.emit(op.multiply(x, _f32(0.79788456)))
    square = bb.emit(op.multiply(bb.emit(op.multiply(x, _f32(0.044715))), x))
    inner = bb.emit(op.multiply(scaled, bb.emit(op.add(square, _f32(1)))))
    return op.multiply(half, bb.emit(op.add(_f32(1), bb.emit(op.tanh(inner)))))


def _erf_gelu(bb, x):
    """0.5 * x * (1 + erf(x / sqrt 2))."""
    erf = bb.emit(op.erf(bb.emit(op.divide(x, _f32(math.sqrt(2))))))
    return op.multiply(bb.emit(op.multiply(_f32(0.5), x)), bb.emit(op.add(erf, _f32(1))))


@pytest.mark.parametrize("build, expected", [(_new_gelu, "nn.gelu_tanh"), (_bloom_gelu, "nn.gelu_tanh"),
                                             (_erf_gelu, "nn.gelu")])
def test_hand_written_gelu_becomes_one_op(build, expected):
    before = _module(build)
    after = gelus_as_ops(before)
    assert _ops(after) == {expected: 1}, _ops(after)
    (gelu,) = [b.value for b in after["main"].body.blocks[0].bindings]
    assert gelu.args[0].same_as(after["main"].params[0])
    _same_numbers(before, after, X, rtol=2e-6)


@pytest.mark.parametrize("c3, c1", [(0.045, math.sqrt(2 / math.pi)), (0.044715, 0.8)])
def test_a_gelu_with_other_constants_is_left_alone(c3, c1):
    after = gelus_as_ops(_module(lambda bb, x: _new_gelu(bb, x, c3, c1)))
    assert "nn.gelu_tanh" not in _ops(after) and _ops(after)["tanh"] == 1


def test_a_gelu_of_a_sum_is_a_gelu_of_the_sum():
    # x + b feeds the GELU: the op is gelu_tanh(x + b), the add stays.
    def build(bb, x):
        return _new_gelu(bb, bb.emit(op.add(x, relax.const(WEIGHT))))
    before = _module(build)
    after = gelus_as_ops(before)
    assert _ops(after) == {"add": 1, "nn.gelu_tanh": 1}
    _same_numbers(before, after, X, rtol=2e-6)


def test_tanh_times_x_plus_half_x_is_not_taken_for_a_gelu_with_an_extra_term():
    def build(bb, x):  # 0.5 x (1 + tanh(p)) + x: a GELU plus x
        return op.add(bb.emit(_new_gelu(bb, x)), x)
    after = gelus_as_ops(_module(build))
    assert _ops(after)["add"] >= 1 and _ops(after)["nn.gelu_tanh"] == 1  # the GELU inside, the add kept


# ------------------------------------------------------------------------------ safe softmax

def _safe_softmax(bb, x):
    """torch.export's decomposition of scaled_dot_product_attention's softmax."""
    soft = bb.emit(op.nn.softmax(x, axis=-1))
    masked = bb.emit(op.equal(x, _f32(-np.inf)))
    kept = bb.emit(op.astype(bb.emit(op.logical_not(masked)), "int8"))
    any_kept = bb.emit(op.astype(bb.emit(op.max(kept, axis=[-1], keepdims=True)), "bool"))
    zeros = bb.emit(op.full_like(soft, _f32(0)))
    return op.where(bb.emit(op.logical_not(any_kept)), zeros, soft)


CAUSAL = np.triu(np.full((5, 5), -np.inf, np.float32), 1)


def test_safe_softmax_after_a_constant_causal_mask_is_softmax():
    def build(bb, q, k):
        scores = bb.emit(op.multiply(bb.emit(op.matmul(q, bb.emit(op.permute_dims(k, [0, 2, 1])))), _f32(0.25)))
        return _safe_softmax(bb, bb.emit(op.add(scores, relax.const(CAUSAL))))
    before = _module(build, shapes=((2, 5, 16), (2, 5, 16)))
    after = safe_softmaxes_as_softmax(before)
    assert _ops(after) == {"permute_dims": 1, "matmul": 1, "multiply": 1, "add": 1, "nn.softmax": 1}, _ops(after)
    _same_numbers(before, after, X, X[::-1].copy())


def test_safe_softmax_of_a_run_time_mask_keeps_zeros_for_a_row_that_is_all_minus_infinity():
    def build(bb, scores, mask):
        return _safe_softmax(bb, bb.emit(op.add(scores, mask)))
    before = _module(build, shapes=((2, 5, 5), (2, 5, 5)))
    after = safe_softmaxes_as_softmax(before)
    assert _ops(after) == {"add": 1, "not_equal": 1, "astype": 1, "max": 1, "greater": 1, "nn.softmax": 1,
                            "where": 1}, _ops(after)
    mask = np.zeros((2, 5, 5), np.float32)
    mask[0, 2, :] = -np.inf  # a row every entry of which is masked
    mask[1, :, 3:] = -np.inf
    got = _same_numbers(before, after, X[:, :, :5].copy(), mask)
    assert not np.isnan(got).any() and np.all(got[0, 2] == 0)


def test_a_boolean_run_time_mask_gets_one_guard_for_every_layer():
    # Hugging Face's padding mask: where(b, 0, -inf) added to each layer's scores, b from the inputs
    def build(bb, q, keep):
        additive = bb.emit(op.where(keep, _f32(0), _f32(-np.inf)))
        out = q
        for _ in range(2):  # two layers, one mask
            scores = bb.emit(op.matmul(out, bb.emit(op.permute_dims(out, [0, 2, 1]))))
            out = bb.emit(op.matmul(bb.emit(_safe_softmax(bb, bb.emit(op.add(scores, additive)))), out))
        return out
    before = _module(build, shapes=((2, 5, 16), (2, 5, 5)), dtypes=["float32", "bool"])
    after = safe_softmaxes_as_softmax(before)
    ops = _ops(after)
    assert {name: ops[name] for name in ("astype", "max", "greater", "where", "nn.softmax", "not_equal", "equal")} == \
        {"astype": 1, "max": 1, "greater": 1, "where": 3, "nn.softmax": 2, "not_equal": 0, "equal": 0}, ops
    keep = np.ones((2, 5, 5), bool)
    keep[0, 1, :] = False  # a query that may attend to nothing
    keep[1, :, :2] = False
    got = _same_numbers(before, after, X[:, :, :] / 4, keep)
    assert not np.isnan(got).any() and np.all(got[0, 1] == 0)


def test_a_constant_mask_with_a_row_all_minus_infinity_keeps_the_guard():
    mask = CAUSAL.copy()
    mask[3] = -np.inf
    before = _module(lambda bb, x: _safe_softmax(bb, bb.emit(op.add(bb.emit(op.matmul(x, x)), relax.const(mask)))),
                     shapes=((5, 5),))
    after = safe_softmaxes_as_softmax(before)
    assert _ops(after)["where"] == 1 and _ops(after)["nn.softmax"] == 1
    got = _same_numbers(before, after, X[0, :, :5].copy())
    assert np.all(got[3] == 0)


def test_a_softmax_selected_by_another_condition_is_left_alone():
    def build(bb, x, y):  # zeros where *y*'s row is all -inf: not a safe softmax of x
        soft = bb.emit(op.nn.softmax(x, axis=-1))
        kept = bb.emit(op.astype(bb.emit(op.logical_not(bb.emit(op.equal(y, _f32(-np.inf))))), "int8"))
        any_kept = bb.emit(op.astype(bb.emit(op.max(kept, axis=[-1], keepdims=True)), "bool"))
        return op.where(bb.emit(op.logical_not(any_kept)), bb.emit(op.full_like(soft, _f32(0))), soft)
    after = safe_softmaxes_as_softmax(_module(build, shapes=((2, 5, 5), (2, 5, 5))))
    assert _ops(after)["logical_not"] == 2 and _ops(after)["equal"] == 1


# -------------------------------------------------------------------------- negative indices

@pytest.mark.parametrize("mode", ["fast"])
def test_a_constant_negative_take_index_counts_from_the_end(mode):
    # Falcon's qkv[..., [-2], :]: take(x, [-2], axis=2, mode="fast") read before the tensor
    before = _module(lambda bb, x: op.take(x, relax.const(np.array([-2], np.int64)), axis=1, mode=mode))
    after = wrap_negative_indices(before)
    (take,) = [b.value for b in after["main"].body.blocks[0].bindings]
    assert take.args[1].value.numpy().tolist() == [3]
    np.testing.assert_array_equal(_run(after, X), X[:, [-2], :])


def test_negative_indices_of_index_tensor_and_gather_elements_count_from_the_end():
    rows, cols = np.array([[-1], [0]], np.int64), np.array([[-3, 2]], np.int64)
    indexed = wrap_negative_indices(_module(lambda bb, x: op.index_tensor(
        x, relax.Tuple([relax.const(rows), relax.const(cols)]))))
    np.testing.assert_array_equal(_run(indexed, X), X[rows, cols])
    picks = np.full((2, 5, 4), -1, np.int64)
    gathered = wrap_negative_indices(_module(lambda bb, x: op.gather_elements(x, relax.const(picks), axis=2)))
    np.testing.assert_array_equal(_run(gathered, X), np.take_along_axis(X, picks, axis=2))


@pytest.mark.parametrize("index", [-6, 5])
def test_a_constant_index_out_of_range_is_refused(index):
    mod = _module(lambda bb, x: op.take(x, relax.const(np.array([0, index], np.int64)), axis=1))
    with pytest.raises(UnsupportedOperator, match=rf"take: constant index {index} .* outside axis 1"):
        wrap_negative_indices(mod)



# ------------------------------------------------------------------------ no-op broadcasts

def test_a_broadcast_to_the_operands_own_shape_is_the_operand_and_a_real_one_stays():
    before = _module(lambda bb, x: op.add(bb.emit(op.broadcast_to(x, SHAPE)),
                                          bb.emit(op.broadcast_to(bb.emit(op.expand_dims(x, 0)), (3, 2, 5, 16)))))
    after = no_op_broadcasts_removed(before)
    assert _ops(after) == {"expand_dims": 1, "broadcast_to": 1, "add": 1}
    _same_numbers(before, after, X)


def test_compile_refuses_an_index_out_of_range_with_the_typed_error():
    mod = _module(lambda bb, x: op.take(x, relax.const(np.array([0, 7], np.int64)), axis=1))
    with pytest.raises(UnsupportedOperator, match="constant index 7"):
        npu_backend.compile(mod, "cgra-8x8")


# ------------------------------------------------------------------------ symbolic lengths

def test_the_rewrites_take_a_symbolic_sequence_length():
    """A sequence length torch.export leaves symbolic (s58): only the last axis (the norm's, the
    softmax's) and an axis a constant index reads need a static size."""
    seq = tvm.tirx.Var("s58", "int64")

    def build(bb, x, qkv):
        normed = bb.emit(_rms(bb, x))
        gelu = bb.emit(_new_gelu(bb, normed))
        soft = bb.emit(_safe_softmax(bb, bb.emit(op.matmul(gelu, bb.emit(op.permute_dims(gelu, [1, 0]))))))
        picked = bb.emit(op.take(qkv, relax.const(np.array([-2], np.int64)), axis=1, mode="fast"))
        return relax.Tuple([soft, picked])
    before = _module(build, shapes=((seq, 16), (seq, 3, 4)))
    after = wrap_negative_indices(safe_softmaxes_as_softmax(gelus_as_ops(rms_norms_as_ops(before))))
    ops = _ops(after)
    assert {name: ops[name] for name in ("nn.rms_norm", "nn.gelu_tanh", "nn.softmax", "where", "tanh", "rsqrt")} == \
        {"nn.rms_norm": 1, "nn.gelu_tanh": 1, "nn.softmax": 1, "where": 0, "tanh": 0, "rsqrt": 0}, ops
    take = [b.value for b in after["main"].body.blocks[0].bindings if getattr(b.value, "op", None) is not None
            and getattr(b.value.op, "name", "") == "relax.take"][0]
    assert take.args[1].value.numpy().tolist() == [1]
    x, qkv = (RNG.standard_normal(shape).astype(np.float32) for shape in ((7, 16), (7, 3, 4)))
    expected, got = _run(before, x, qkv), _run(after, x, qkv)
    np.testing.assert_allclose(got[0].numpy(), expected[0].numpy(), rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(got[1].numpy(), qkv[:, [-2], :])
