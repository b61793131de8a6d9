"""RoPE in the q / k / v projection's epilogue (normalise/rope_epilogues.py,
kernels/gemm/rope_epilogue.py): Hugging Face's rotary over the heads of one projection becomes
one GEMM kernel whose epilogue rotates the q and k heads, bit for bit what the RoPE kernels
computed, and no RoPE kernel is left.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from cgra_sim.isa import DType, EltwiseFunc, Op, encode
from npu_backend.kernels.intrinsics import INTRINSICS
from npu_backend.normalise.rope_epilogues import rope_epilogues
from three_ways import Stream, tir_reference
from npu_backend.kernels.gemm.rope_epilogue import rotary_pattern


def _tables(positions, rotary, base=10000.0):
    """HF's cos and sin of positions x inv_freq, repeated over the two halves; sin signed as
    rotations.py folds rotate_half's negation into it."""
    inv = 1.0 / base ** (np.arange(0, rotary, 2, dtype=np.float64) / rotary)
    angles = np.concatenate([np.outer(positions, inv)] * 2, axis=1)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    signed = sin * np.concatenate([-np.ones(rotary // 2), np.ones(rotary // 2)]).astype(np.float32)
    return cos, sin, signed


def _graph(s, k, heads, kv_heads, d, rotary, bias, positions, seed, leak=False, norm=None, offset=0.0):
    """The merged projection (q heads, then k, then v) and its rotary as normalise leaves it: per
    q / k part x * cos + concat(x[h:], x[:h]) * signed sin over the first `rotary` dims, the rest
    passed through (concat), v a plain part; `leak`: q's unrotated part is an output too; `norm`
    ("rms_norm", "layer_norm"): the projection reads x's pre-norm (random gamma and beta), x
    drawn around `offset`. Returns (module, input, expected outputs: float64)."""
    rng = np.random.default_rng(seed)
    total = heads + 2 * kv_heads
    w = rng.standard_normal((total * d, k)).astype(np.float32)
    b = rng.standard_normal(total * d).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, k).astype(np.float32)
    beta = rng.standard_normal(k).astype(np.float32) if norm == "layer_norm" else np.zeros(k, np.float32)
    cos, sin, signed = _tables(positions, rotary)
    x = relax.Var("x", relax.TensorType((s, k), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            lhs = x if norm is None else bb.emit(
                relax.op.nn.rms_norm(x, relax.const(gamma), axes=[-1], epsilon=1e-6) if norm == "rms_norm" else
                relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=1e-5))
            y = bb.emit(relax.op.matmul(lhs, bb.emit(relax.op.permute_dims(relax.const(w))), out_dtype="float32"))
            if bias:
                y = bb.emit(relax.op.add(y, relax.const(b)))
            y4 = bb.emit(relax.op.reshape(y, (1, s, total, d)))
            outs = []
            for h0, h1 in ((0, heads), (heads, heads + kv_heads)):
                part = bb.emit(relax.op.permute_dims(bb.emit(relax.op.strided_slice(y4, [2, 3], [h0, 0], [h1, rotary])),
                                                     [0, 2, 1, 3]))
                halves = [bb.emit(relax.op.strided_slice(part, [3], [lo], [hi])) for lo, hi in
                          ((rotary // 2, rotary), (0, rotary // 2))]
                turned = bb.emit(relax.op.concat(halves, axis=-1))
                rope = bb.emit(relax.op.add(bb.emit(relax.op.multiply(part, relax.const(cos.reshape(1, 1, s, rotary)))),
                                            bb.emit(relax.op.multiply(turned, relax.const(signed.reshape(1, 1, s, rotary))))))
                if rotary < d:
                    rest = bb.emit(relax.op.permute_dims(bb.emit(relax.op.strided_slice(
                        y4, [2, 3], [h0, rotary], [h1, d])), [0, 2, 1, 3]))
                    rope = bb.emit(relax.op.concat([rope, rest], axis=-1))
                outs.append(rope)
                if leak:
                    outs.append(part)
            outs.append(bb.emit(relax.op.permute_dims(bb.emit(relax.op.strided_slice(
                y4, [2], [heads + kv_heads], [total])), [0, 2, 1, 3])))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    data = (rng.standard_normal((s, k)) + offset).astype(np.float32)
    rows = data.astype(np.float64)
    if norm is not None:
        rows = rows - rows.mean(-1, keepdims=True) if norm == "layer_norm" else rows
        eps = 1e-6 if norm == "rms_norm" else 1e-5
        rows = rows / np.sqrt((rows ** 2).mean(-1, keepdims=True) + eps) * gamma + beta
    heads_first = (rows @ w.T.astype(np.float64) + (b if bias else 0)).reshape(s, total, d).transpose(1, 0, 2)
    expected = []
    for h0, h1 in ((0, heads), (heads, heads + kv_heads)):
        part = heads_first[h0:h1].copy()
        rot = part[..., :rotary]
        turned = np.concatenate([-rot[..., rotary // 2:], rot[..., :rotary // 2]], axis=-1)
        part[..., :rotary] = rot * cos + turned * sin
        expected.append(part[None])
    expected.append(heads_first[heads + kv_heads:][None])
    return bb.get(), data, expected


def _run(mod, data, arch="cgra-8x8"):
    executable = npu_backend.compile(mod, arch)
    with npu_backend.profile() as prof:
        out = tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(data))
    return [o.numpy() for o in out], prof


@settings(max_examples=8, deadline=None)
@given(s=st.integers(1, 24), heads=st.integers(1, 4), kv=st.integers(1, 2), d=st.sampled_from([8, 16, 32, 64, 128]),
       fraction=st.sampled_from([1.0, 0.5, 0.25]), bias=st.booleans(), start=st.integers(0, 500),
       seed=st.integers(0, 2 ** 16))
def test_the_epilogue_matches_numpy(s, heads, kv, d, fraction, bias, start, seed):
    """Random head counts, head sizes 8-128, rotary fractions, positions: the projection with RoPE
    in its epilogue (no RoPE kernel, no concat) matches float64 numpy within float32 rounding."""
    rotary = max(2, int(d * fraction)) // 2 * 2
    mod, data, expected = _graph(s, 16, heads, kv, d, rotary, bias, np.arange(start, start + s), seed)
    out, prof = _run(mod, data)
    names = [kernel.name for kernel in prof.kernels]
    assert sum("take" in name and "matmul" in name for name in names) == 1, names
    assert not any("concat" in name for name in names), names
    for got, want in zip(out, expected):
        assert np.abs(got - want).max() <= 2e-6 * max(1.0, np.abs(want).max()), np.abs(got - want).max()


@settings(max_examples=8, deadline=None)
@given(norm=st.sampled_from(["rms_norm", "layer_norm"]), s=st.integers(1, 40), k=st.sampled_from([16, 64]),
       heads=st.integers(1, 4), kv=st.integers(1, 2), d=st.sampled_from([8, 16, 32, 64]),
       fraction=st.sampled_from([1.0, 0.5, 0.25]), bias=st.booleans(), start=st.integers(0, 500),
       offset=st.sampled_from([0.0, 20.0]), seed=st.integers(0, 2 ** 16))
def test_a_normed_projection_rotates_its_heads_within_float_rounding(norm, s, k, heads, kv, d, fraction, bias, start,
                                                                     offset, seed):
    """The projection reading a pre-norm (RMSNorm, or a layer norm of rows at a mean of 20
    standard deviations; gamma and beta folded into W and b first) normalises its own A panel
    and rotates its q and k heads in the epilogue: one kernel, no norm and no RoPE kernel,
    within 1e-5 of float64 (the norm's bound, test_normed_linears.py)."""
    rotary = max(2, int(d * fraction)) // 2 * 2
    mod, data, expected = _graph(s, k, heads, kv, d, rotary, bias, np.arange(start, start + s), seed, norm=norm,
                                 offset=offset)
    kernels = {p.kernel.split(" ")[0] for p in npu_backend.explain(mod, "cgra-8x8") if p.kernel}
    assert f"cgra.linear_{norm}_rope" in kernels, kernels
    assert not any(kernel.startswith((f"cgra.{norm}", "cgra.rope")) for kernel in kernels), kernels
    out, prof = _run(mod, data)
    names = [kernel.name for kernel in prof.kernels]
    fused = [name for name in names if norm in name or "take" in name]
    assert len(fused) == 1 and all(op in fused[0] for op in (norm, "matmul", "take")), names
    for got, want in zip(out, expected):
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), np.abs(got - want).max()


def test_the_rotary_becomes_one_op_over_the_projection():
    """Golden structure after the rewrite: one take of the partners and its two multiplies and add
    over the linear's output, the parts slices of its view, no concat; the partners repeat every
    head (Llama's 4 + 2 + 2 heads of 16, rotate_half: each head's halves swapped)."""
    mod, _, _ = _graph(8, 16, 4, 2, 16, 16, False, np.arange(8), 0)
    rewritten = rope_epilogues(mod)
    ops = [b.value.op.name for b in rewritten["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    assert "relax.concat" not in ops and ops.count("relax.take") == 1, ops
    take = [b.value for b in rewritten["main"].body.blocks[0].bindings
            if isinstance(b.value, relax.Call) and b.value.op.name == "relax.take"][0]
    perm = take.args[1].value.numpy()
    pattern = rotary_pattern(perm)
    assert (pattern.period, pattern.runs) == (16, ((0, 8, 8), (8, 8, -8)))


def test_a_part_read_elsewhere_keeps_the_rope_kernels():
    """A rotary unit's input read by something else too would read the rotated output: nothing
    is rewritten."""
    mod, _, _ = _graph(8, 16, 2, 1, 16, 16, False, np.arange(8), 0, leak=True)
    tvm.ir.assert_structural_equal(rope_epilogues(mod), relax.transform.DeadCodeElimination()(mod))


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 8), heads=st.integers(1, 3), d=st.sampled_from([4, 8, 16]), fraction=st.sampled_from([1.0, 0.5]),
       seed=st.integers(0, 2 ** 16))
def test_rope_intrinsics_three_ways(rows, heads, d, fraction, seed):
    """The rotation's and the combination's TIR descriptions on the host, their ELTWISE commands
    on the simulator (as their implementations issue them) and numpy agree bit for bit."""
    rotary = max(2, int(d * fraction))
    perm = np.array([h * d + (c + rotary // 2) % rotary if c < rotary else h * d + c
                     for h in range(heads) for c in range(d)])
    pattern = rotary_pattern(perm)
    cols = heads * d
    rng = np.random.default_rng(seed)
    x, sin, cos = (rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(3))
    rot = np.zeros((rows, cols), np.float32)
    desc, _ = INTRINSICS["rope_rotate"].factory(rows, cols, pattern, scope="global")
    tir_rot = tir_reference(desc, [x, sin, rot])[2]
    desc, _ = INTRINSICS["rope_combine"].factory(rows, cols, scope="global")
    tir_out = tir_reference(desc, [x, cos, tir_rot, np.zeros_like(x)])[3]
    stream = Stream([x, sin, cos, np.zeros_like(x), np.zeros_like(x)])
    stream.load(0, 1, 2)

    def eltwise(func, n, a, b, out):
        stream.commands.append(encode(Op.ELTWISE, func=func, dtype=int(DType.from_name("float32")), rows=rows, cols=n,
                                      a_addr=a, a_row_stride=cols, a_col_stride=1, b_addr=b, b_row_stride=cols,
                                      b_col_stride=1, out_addr=out, out_stride=cols))

    for start, length, offset in pattern.tile_runs(cols):
        eltwise(EltwiseFunc.MULTIPLY, length, stream.addr[0] + 4 * (start + offset), stream.addr[1] + 4 * start,
                stream.addr[3] + 4 * start)
    eltwise(EltwiseFunc.MULTIPLY, cols, stream.addr[0], stream.addr[2], stream.addr[4])
    eltwise(EltwiseFunc.ADD, cols, stream.addr[4], stream.addr[3], stream.addr[4])
    stream.store(3, 4)
    sim = stream.run()
    expected_rot = x[:, perm] * sin
    np.testing.assert_array_equal(tir_rot, expected_rot)
    np.testing.assert_array_equal(sim[3], expected_rot)
    np.testing.assert_array_equal(tir_out, x * cos + expected_rot)
    np.testing.assert_array_equal(sim[4], tir_out)


# GPT-NeoX's layer norms read a residual stream carried centred: RMSNorms (centred_streams.py)
@pytest.mark.parametrize("name, norm", [("llama", "rms_norm"), ("gpt_neox", "rms_norm")])
def test_a_decoder_layer_has_no_rope_and_no_pre_norm_kernel(name, norm):
    """Hugging Face's Llama and GPT-NeoX (transformer_models.py): each layer's q / k / v projection
    normalises its rows (the layer's first norm) and rotates its q and k heads in one kernel,
    cgra.linear_<norm>_rope; no RoPE kernel is left, and no norm kernel either: the model's
    output norm (read by no linear) is in its last GEMM's epilogue (post_norm.py's RMSNorm)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tvm.relax.frontend.torch import from_exported_program
    from transformer_models import build
    model, inputs = build(name, tokens=16)
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, inputs))
    placements = npu_backend.explain(mod, "cgra-8x8")
    kernels = {p.kernel.split(" ")[0] for p in placements if p.where != "host"}
    assert f"cgra.linear_{norm}_rope" in kernels and "cgra.linear_rope" not in kernels, kernels
    assert not any(kernel.startswith("cgra.rope") for kernel in kernels), kernels
    alone = {p.kernel for p in placements if (p.kernel or "").startswith(f"cgra.{norm}")}
    assert not alone, alone
    assert any(kernel.startswith("cgra.linear_post_norm_rms") for kernel in kernels), kernels


@settings(max_examples=20, deadline=None)
@given(heads=st.integers(1, 4), d=st.sampled_from([8, 16, 32]), fraction=st.sampled_from([1.0, 0.5, 0.25]),
       positions=st.integers(1, 8), seed=st.integers(0, 2 ** 16))
def test_per_head_qkv_partners_repeat_every_part(heads, d, fraction, positions, seed):
    """GPT-NeoX's layout, a head's q, k and v side by side (units at dims 0 and d of each 3d-wide
    head, the first r of each rotated): Y' = Y * C' + Y[:, perm] * S' is the rotation of q's and
    k's first r dims and Y elsewhere (numpy, float64), and the partners repeat every d columns
    (the GEMM's column tiles need hold only d), not every 3 d."""
    from npu_backend.normalise.rope_epilogues import _tables as epilogue_tables
    r = max(2, int(d * fraction))
    cos, sin, signed = _tables(np.arange(positions), r)
    units = [dict(h0=0, h1=heads, d0=d0, r=r, half=r // 2, cos=cos, sin=signed) for d0 in (0, d)]
    c, s, perm = epilogue_tables(units, positions, heads, 3 * d)
    y = np.random.default_rng(seed).standard_normal((positions, heads * 3 * d))
    got = y * c + y[:, perm] * s
    want = y.copy().reshape(positions, heads, 3 * d)
    for d0 in (0, d):
        rot = want[..., d0:d0 + r].copy()
        turned = np.concatenate([-rot[..., r // 2:], rot[..., :r // 2]], axis=-1)
        want[..., d0:d0 + r] = rot * cos[:, None] + turned * sin[:, None]
    np.testing.assert_allclose(got, want.reshape(positions, -1), rtol=1e-6, atol=1e-6)
    assert d % rotary_pattern(perm).period == 0
