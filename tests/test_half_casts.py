"""float32 <-> bfloat16 / float16 casts on the NPU (kernels/elementwise/cast.py) and the graph
rewrites that leave PyTorch's bfloat16 casts to it (normalise/half_casts.py).

The cast kernel is one EPILOGUE a tile: float32 rounded to nearest even into the 16-bit format
(ties to even, overflow to infinity, NaN kept a NaN), a 16-bit float widened exactly. Hypothesis
draws shapes and float32 bit patterns (specials included: infinities, NaNs, subnormals, ties) and
holds the NPU to numpy's model of the conversion (cgra_sim/half_floats.py) bit for bit; numpy's
model itself is held to ml_dtypes' / numpy's own round-to-nearest-even conversion.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
import tvm
from tvm import relax

import npu_backend
from cgra_sim import half_floats
from npu_backend.tools.workloads import numpy_dtype, relax_module, run

HALVES = ["bfloat16", "float16"]
#: Casting specials and huge float32 values to 16 bits is the point here: numpy's warnings say so.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")


def _float32_bits(rng, shape, specials: bool):
    """float32 values: normal ones of every scale, or any bit pattern (specials included)."""
    if specials:
        return rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return (rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)).astype(np.float32)


def _same_bits(out, expected):
    """Equal bit for bit, except that any NaN equals any NaN."""
    nan = np.isnan(expected.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(out.astype(np.float32)), nan)
    width = np.uint16 if out.dtype.itemsize == 2 else np.uint32
    np.testing.assert_array_equal(out.view(width)[~nan], expected.view(width)[~nan])


@given(dtype=st.sampled_from(HALVES), seed=st.integers(0, 2**16), specials=st.booleans())
@example(dtype="bfloat16", seed=0, specials=True)
def test_numpy_model_rounds_to_nearest_even_as_ml_dtypes_and_numpy_do(dtype, seed, specials):
    values = _float32_bits(np.random.default_rng(seed), (257,), specials)
    ties = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8), 2.0 ** -133, 3.4e38], np.float32)
    values = np.concatenate([values, ties])
    model = half_floats.narrow(values, dtype)
    stored = model.view(numpy_dtype(dtype)) if dtype == "bfloat16" else model
    _same_bits(stored, values.astype(numpy_dtype(dtype)))
    _same_bits(half_floats.widen(model, dtype), stored.astype(np.float32))


def _cast_module(shape, source, target):
    return relax_module([("x", shape, source)], lambda bb, x: bb.emit(relax.op.astype(x, target)))


@settings(max_examples=6, deadline=None)  # a compile each: about 2 s
@given(dtype=st.sampled_from(HALVES), narrowing=st.booleans(), shape=st.lists(st.integers(1, 40), min_size=1,
       max_size=3).map(tuple), specials=st.booleans(), seed=st.integers(0, 2**16))
@example(dtype="bfloat16", narrowing=True, shape=(16, 64), specials=True, seed=1)
def test_a_cast_runs_on_the_npu_bit_exact_to_numpys_model(dtype, narrowing, shape, specials, seed):
    rng = np.random.default_rng(seed)
    wide = _float32_bits(rng, shape, specials)
    if narrowing:
        source, target, x = "float32", dtype, wide
        expected = half_floats.narrow(wide, dtype)
    else:
        source, target = dtype, "float32"
        x = wide.astype(numpy_dtype(dtype))
        expected = half_floats.widen(x.view(np.uint16) if dtype == "bfloat16" else x, dtype)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(_cast_module(shape, source, target), "cgra-8x8"), [x])
    assert [k.source_ops for k in prof.kernels] == [("astype",)]
    _same_bits(out.view(np.uint16) if narrowing and dtype == "bfloat16" else out, expected)


def test_a_cast_the_epilogue_has_no_conversion_for_stays_on_the_host_saying_why():
    mod = _cast_module((4, 8), "float32", "int8")
    [host] = [p for p in npu_backend.explain(mod, "cgra-8x8") if p.where == "host"]
    assert "float32 to bfloat16 / float16" in host.reason


def test_a_widening_epilogue_takes_no_other_step():
    """The simulator refuses a 16-bit accumulator with a flag (a relu): EPILOGUE only widens it."""
    from cgra_sim import load_arch, simulate
    from cgra_sim.isa import DType, Op, encode

    record = encode(Op.EPILOGUE, flags=2, acc_dtype=int(DType.BFLOAT16), out_dtype=int(DType.FLOAT32), m=1, n=4,
                    acc_addr=0, acc_stride=4, out_addr=64, out_stride=4)
    with pytest.raises(Exception, match="only widened to float32"):
        simulate(load_arch("cgra-8x8"), np.array([record], dtype=np.int64), [])


@pytest.mark.parametrize("dtype", HALVES)
def test_a_matmul_cast_to_its_inputs_16_bit_float_is_the_gemms_rounding_store(dtype):
    """astype(matmul(x, w, out_dtype="float32"), h) (TVM's importer's bfloat16 linear, cast back):
    one GEMM kernel rounding its float32 sum to h on store, within one rounding of the exact sum."""
    from cgra_sim.half_floats import error_bound

    m, k, n = 24, 40, 16
    specs = [("x", (m, k), dtype), ("w", (k, n), dtype)]
    mod = relax_module(specs, lambda bb, x, w: bb.emit(relax.op.astype(
        bb.emit(relax.op.matmul(x, w, out_dtype="float32")), dtype)))
    rng = np.random.default_rng(2)
    x, w = (rng.standard_normal(shape).astype(np.float32).astype(numpy_dtype(dtype)) for _, shape, _ in specs)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), [x, w])
    assert [k.source_ops for k in prof.kernels] == [("matmul",)] and out.dtype == numpy_dtype(dtype)
    exact = x.astype(np.float64) @ w.astype(np.float64)
    terms = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64))
    assert np.all(np.abs(out.astype(np.float64) - exact) <= error_bound(exact.astype(np.float32), terms, k, dtype))


def test_constants_under_a_widening_cast_are_widened_at_compile_time():
    """astype(take(table, ids), float32) of a bfloat16 table is a lookup in its float32 widening,
    astype(where(m, a, b), float32) of bfloat16 constants a where of theirs, astype to the dtype
    a tensor has nothing: exact, and no cast kernel."""
    import ml_dtypes

    rng = np.random.default_rng(3)
    table = rng.standard_normal((10, 8)).astype(ml_dtypes.bfloat16)

    def body(bb, ids, mask):
        rows = bb.emit(relax.op.take(relax.const(table, "bfloat16"), ids, axis=0))
        wide = bb.emit(relax.op.astype(bb.emit(relax.op.reshape(rows, (1, 4, 8))), "float32"))
        picked = bb.emit(relax.op.where(mask, relax.const(np.full((1, 4, 8), -3.5, ml_dtypes.bfloat16), "bfloat16"),
                                        relax.const(np.zeros((1, 4, 8), ml_dtypes.bfloat16), "bfloat16")))
        same = bb.emit(relax.op.astype(wide, "float32"))
        return bb.emit(relax.op.add(same, bb.emit(relax.op.astype(picked, "float32"))))

    mod = relax_module([("ids", (4,), "int64"), ("mask", (1, 4, 8), "bool")], body)
    from npu_backend.normalise.half_casts import half_casts_folded

    folded = half_casts_folded(mod)
    assert "astype" not in folded.script()
    ids, mask = np.array([3, 0, 9, 3]), rng.integers(0, 2, (1, 4, 8)).astype(bool)
    expected = table[ids].astype(np.float32).reshape(1, 4, 8) + np.where(mask, np.float32(-3.5), np.float32(0))
    np.testing.assert_array_equal(run(tvm.compile(folded, "llvm"), [ids, mask]), expected)


@pytest.mark.parametrize("ones", [True, False])
def test_a_bfloat16_rmsnorm_as_pytorch_writes_it_is_one_norm_kernel(ones):
    """HF's `weight * rms_norm(x.float()).to(bfloat16)` (multiply(g, astype(rms_norm(x, w), bf16)))
    is one norm kernel (kernels/rows/half_norms.py): the float32 norm (times w unless it is HF's ones),
    rounded to bfloat16, times g in bfloat16; within one bfloat16 rounding of each of the two steps
    of numpy's float64 model."""
    import ml_dtypes

    rng = np.random.default_rng(4)
    g = rng.standard_normal(64).astype(ml_dtypes.bfloat16)
    w = np.ones(64, np.float32) if ones else (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)

    def body(bb, x):
        normed = bb.emit(relax.op.nn.rms_norm(x, relax.const(w), axes=[-1], epsilon=1e-6))
        return bb.emit(relax.op.multiply(relax.const(g, "bfloat16"), bb.emit(relax.op.astype(normed, "bfloat16"))))

    x = rng.standard_normal((16, 64)).astype(np.float32)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(relax_module([("x", (16, 64), "float32")], body), "cgra-8x8"), [x])
    assert len(prof.kernels) == 1 and out.dtype == numpy_dtype("bfloat16")
    normed = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    expected = normed * g.astype(np.float64)
    bound = (2 * 2.0 ** -8 + 2.0 ** -16) * np.abs(normed * g.astype(np.float64)) + 1e-30
    assert np.all(np.abs(out.astype(np.float64) - expected) <= bound)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("kind", ["max", "avg", "global"])
def test_a_16_bit_pool_runs_in_float32_on_the_npu_between_casts(dtype, kind):
    """A bfloat16 / float16 max, average or global average pool: widened, pooled in float32 by
    POOL, rounded once (PyTorch's CPU arithmetic): a max bit-exact, an average within one
    rounding of numpy's float64 mean; nothing on the host."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32).astype(numpy_dtype(dtype))
    pool = {"max": lambda a: relax.op.nn.max_pool2d(a, (2, 2), (2, 2)),
            "avg": lambda a: relax.op.nn.avg_pool2d(a, (3, 3), (3, 3)),
            "global": lambda a: relax.op.nn.adaptive_avg_pool2d(a, (1, 1))}[kind]
    mod = relax_module([("x", (1, 8, 6, 6), dtype)], lambda bb, a: bb.emit(pool(a)))
    assert not [p for p in npu_backend.explain(mod, "cgra-8x8") if p.where == "host" and p.op != "reshape"]
    out = run(npu_backend.compile(mod, "cgra-8x8"), [x]).astype(np.float64)
    wide = x.astype(np.float64)
    if kind == "max":
        np.testing.assert_array_equal(out, wide.reshape(1, 8, 3, 2, 3, 2).max((3, 5)))
        return
    size = 3 if kind == "avg" else 6
    mean = wide.reshape(1, 8, 6 // size, size, 6 // size, size).mean((3, 5))
    assert np.all(np.abs(out - mean) <= 2.0 ** (1 - {"bfloat16": 8, "float16": 11}[dtype]) * np.abs(mean) + 1e-6)


def _attention_cast_module(dtype, axes, heads=4, tokens=16, dim=16):
    """An attention's P V (float32) cast to `dtype` before its head merge, as HF's bfloat16 Llama
    writes it: astype, permute_dims(axes), then [0, 2, 1, 3] and a reshape to (1, S, H * D)."""
    shape = (1, heads, tokens, dim)

    def body(bb, q, k, v):
        scores = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2])))),
                                           relax.const(0.25, "float32")))
        o = bb.emit(relax.op.matmul(bb.emit(relax.op.nn.softmax(scores, -1)), v))
        y = bb.emit(relax.op.permute_dims(bb.emit(relax.op.astype(o, dtype)), axes))
        back = [axes.index(a) for a in range(4)]  # y's axes back to (B, H, S, D), then the head merge
        merged = bb.emit(relax.op.permute_dims(y, [back[a] for a in (0, 2, 1, 3)]))
        return bb.emit(relax.op.reshape(merged, (1, tokens, heads * dim)))

    return relax_module([(name, shape, "float32") for name in "qkv"], body)


@settings(max_examples=6, deadline=None)  # host compiles: about 1 s each
@given(dtype=st.sampled_from(HALVES), axes=st.permutations([0, 1, 2, 3]), seed=st.integers(0, 2**16))
@example(dtype="bfloat16", axes=[2, 0, 1, 3], seed=0)  # Llama's, through torch.export
def test_an_attention_outputs_cast_moves_after_its_head_merge_exactly(dtype, axes, seed):
    """layout(astype(P V, h)) is astype(layout(P V), h) (half_casts.py): the same bits on the
    host, whatever the transposes, and the cast the graph's last op."""
    from npu_backend.normalise.half_casts import half_casts_folded
    from models import main_op_names

    mod = _attention_cast_module(dtype, list(axes))
    folded = half_casts_folded(mod)
    assert main_op_names(folded)[-1] == "relax.astype"
    rng = np.random.default_rng(seed)
    qkv = [rng.standard_normal((1, 4, 16, 16)).astype(np.float32) for _ in range(3)]
    _same_bits(run(tvm.compile(folded, "llvm"), qkv), run(tvm.compile(mod, "llvm"), qkv))


def test_the_attention_kernel_writes_a_cast_outputs_merged_heads():
    """The cast moved after the head merge (above): the attention kernel stores (B, S, H, D)
    itself, rounded to bfloat16 by its own store (normalise/half_attention_outputs.py, the
    attention's rounded patterns; before, one cast kernel after it, and before that a transposing
    copy of the 16-bit output too: Llama at 16 tokens on cgra-8x8, 352 cycles a layer)."""
    mod = _attention_cast_module("bfloat16", [2, 0, 1, 3])
    rng = np.random.default_rng(4)
    qkv = [rng.standard_normal((1, 4, 16, 16)).astype(np.float32) for _ in range(3)]
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), qkv)
    assert [k.source_ops[-2:] for k in prof.kernels] == [("permute_dims", "astype")], \
        [k.source_ops for k in prof.kernels]
    np.testing.assert_allclose(out.astype(np.float32), run(tvm.compile(mod, "llvm"), qkv).astype(np.float32),
                               rtol=2.0 ** -7, atol=1e-6)


@settings(max_examples=4, deadline=None)  # two compiles each: about 4 s
@given(dtype=st.sampled_from(HALVES), rows=st.integers(1, 40), cols=st.integers(2, 96), widened=st.booleans(),
       seed=st.integers(0, 2**16))
@example(dtype="bfloat16", rows=17, cols=64, widened=True, seed=0)  # ViT's
@example(dtype="float16", rows=17, cols=64, widened=False, seed=1)
def test_a_16_bit_layer_norm_is_one_norm_kernel_rounding_the_float32_norm(dtype, rows, cols, widened, seed):
    """astype(layer_norm(x, gamma, beta), h) (half_casts.py's form of PyTorch's 16-bit layer norm),
    x float32 or astype(x_h, float32), is one norm kernel (kernels/rows/half_norms.py): bit for bit
    the float32 norm kernel's result on x (x_h widened) rounded to nearest even (ml_dtypes), with
    no cast kernel before or after it."""
    rng = np.random.default_rng(seed)
    gamma, beta = (rng.standard_normal(cols).astype(np.float32) for _ in range(2))

    def body(cast):
        def emit(bb, x):
            x = bb.emit(relax.op.astype(x, "float32")) if cast and widened else x
            normed = bb.emit(relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=1e-5))
            return bb.emit(relax.op.astype(normed, dtype)) if cast else normed
        return emit

    x = (rng.standard_normal((rows, cols)) * 3 + 1).astype(np.float32)
    x_in = x.astype(numpy_dtype(dtype)) if widened else x
    x = x_in.astype(np.float32)
    wide = run(npu_backend.compile(relax_module([("x", (rows, cols), "float32")], body(False)), "cgra-8x8"), [x])
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(relax_module([("x", (rows, cols), dtype if widened else "float32")], body(True)),
                                      "cgra-8x8"), [x_in])
    assert len(prof.kernels) == 1 and out.dtype == numpy_dtype(dtype)
    _same_bits(out, wide.astype(numpy_dtype(dtype)))


@settings(max_examples=6, deadline=None)  # host compiles: about 1 s each
@given(dtype=st.sampled_from(HALVES), axes=st.permutations([0, 1, 2, 3]), gelu=st.booleans(), seed=st.integers(0, 2**16))
@example(dtype="bfloat16", axes=[0, 2, 1, 3], gelu=False, seed=0)  # ViT's head split
def test_a_widening_cast_moves_before_the_layout_ops_of_a_rounded_tensor_exactly(dtype, axes, gelu, seed):
    """astype(layout(astype(z, h)), float32) is layout(astype(astype(z, h), float32)) (half_casts.py),
    also where the widening is a 16-bit GELU's (run in float32): the same bits on the host, the
    two casts side by side (one round-trip kernel) and the layout ops after them."""
    from npu_backend.normalise.half_casts import half_casts_folded
    from models import main_op_names

    def body(explicit):
        def emit(bb, z):
            split = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(z, dtype)), (1, 17, 4, 16)))
            moved = bb.emit(relax.op.permute_dims(split, list(axes)))
            if gelu and explicit:  # PyTorch's 16-bit GELU (the host's own computes in the 16-bit float)
                return bb.emit(relax.op.astype(bb.emit(relax.op.nn.gelu(bb.emit(relax.op.astype(moved, "float32")))),
                                               dtype))
            return bb.emit(relax.op.nn.gelu(moved) if gelu else relax.op.astype(moved, "float32"))
        return emit

    mod = relax_module([("z", (1, 17, 64), "float32")], body(False))
    folded = relax.transform.DeadCodeElimination()(half_casts_folded(mod))
    assert main_op_names(folded)[:4] == ["relax.astype", "relax.astype", "relax.reshape", "relax.permute_dims"]
    z = (np.random.default_rng(seed).standard_normal((1, 17, 64)) * 4).astype(np.float32)
    reference = relax_module([("z", (1, 17, 64), "float32")], body(True))
    _same_bits(run(tvm.compile(folded, "llvm"), [z]), run(tvm.compile(reference, "llvm"), [z]))
