"""RoPE's compact tables (normalise/rope_epilogues.py, kernels/gemm/rope_epilogue.py,
lower/held_tables.py): when the projection's cos / sin tables repeat every W columns (GPT-NeoX:
a head's q, k and v side by side, W = 3 d), the graph holds (S, W) tables whose columns a take
repeats, and the GEMM kernel loads each slice once, in the first period of column tiles.
"""

from __future__ import annotations

import os
import re
import types

import numpy as np
import pytest
import tvm
from hypothesis import Phase, example, given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.kernels.gemm.rope_epilogue import rotating_ranges, table_runs
from npu_backend.normalise.rope_epilogues import rope_epilogues
from npu_backend.partition import stage as partition_stage
from test_rope_epilogues import _tables


def _neox_graph(s, k, heads, d, rotary, bias, positions, seed):
    """GPT-NeoX's projection: y4 (1, s, H, 3 d), per head q, k, v of d columns each, the first
    `rotary` dims of q and k rotated (rotate_half, sin signed). Returns (module, input, expected
    float64 outputs: q, k, v heads first)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((heads * 3 * d, k)).astype(np.float32)
    b = rng.standard_normal(heads * 3 * d).astype(np.float32)
    cos, sin, signed = _tables(positions, rotary)
    x = relax.Var("x", relax.TensorType((s, k), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(w))), out_dtype="float32"))
            y = bb.emit(relax.op.add(y, relax.const(b))) if bias else y
            y4 = bb.emit(relax.op.reshape(y, (1, s, heads, 3 * d)))
            outs = []
            for d0 in (0, d):
                part = bb.emit(relax.op.permute_dims(bb.emit(relax.op.strided_slice(y4, [3], [d0], [d0 + rotary])),
                                                     [0, 2, 1, 3]))
                halves = [bb.emit(relax.op.strided_slice(part, [3], [lo], [hi]))
                          for lo, hi in ((rotary // 2, rotary), (0, rotary // 2))]
                turned = bb.emit(relax.op.concat(halves, axis=-1))
                rope = bb.emit(relax.op.add(bb.emit(relax.op.multiply(part, relax.const(cos.reshape(1, 1, s, rotary)))),
                                            bb.emit(relax.op.multiply(turned, relax.const(signed.reshape(1, 1, s, rotary))))))
                if rotary < d:
                    rest = bb.emit(relax.op.permute_dims(bb.emit(relax.op.strided_slice(
                        y4, [3], [d0 + rotary], [d0 + d])), [0, 2, 1, 3]))
                    rope = bb.emit(relax.op.concat([rope, rest], axis=-1))
                outs.append(rope)
            outs.append(bb.emit(relax.op.permute_dims(bb.emit(relax.op.strided_slice(y4, [3], [2 * d], [3 * d])),
                                                      [0, 2, 1, 3])))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    data = rng.standard_normal((s, k)).astype(np.float32)
    y = data.astype(np.float64) @ w.T.astype(np.float64) + (b if bias else 0)
    heads_first = y.reshape(s, heads, 3 * d).transpose(1, 0, 2)
    expected = []
    for d0 in (0, d):
        part = heads_first[..., d0:d0 + d].copy()
        rot = part[..., :rotary].copy()
        turned = np.concatenate([-rot[..., rotary // 2:], rot[..., :rotary // 2]], axis=-1)
        part[..., :rotary] = rot * cos + turned * sin
        expected.append(part[None])
    expected.append(heads_first[None, ..., 2 * d:])
    return bb.get(), data, expected


def _takes_of_constants(mod):
    return [b.value for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)
            and b.value.op.name == "relax.take" and isinstance(b.value.args[0], tvm.ir.GenericConst)]


def test_neox_tables_become_compact():
    """Golden structure: the (S, 3 H d) tables become (S, 3 d) constants and takes of their
    columns arange(N) mod 3 d; Llama's layout (v heads unrotated after q and k) keeps whole tables."""
    mod, _, _ = _neox_graph(8, 16, 4, 16, 8, True, np.arange(8), 0)
    takes = _takes_of_constants(rope_epilogues(mod))
    assert len(takes) == 2, takes
    for take in takes:
        assert take.args[0].value.numpy().shape == (8, 48)
        np.testing.assert_array_equal(take.args[1].value.numpy(), np.arange(192) % 48)


@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(s=st.integers(1, 40), heads=st.integers(2, 4), d=st.sampled_from([8, 16, 32]),
       fraction=st.sampled_from([1.0, 0.5, 0.25]), bias=st.booleans(), start=st.integers(0, 500),
       arch=st.sampled_from(["cgra-8x8", "cgra-4x4", "cgra-16x16"]), seed=st.integers(0, 2 ** 16))
@example(s=1, heads=2, d=8, fraction=1.0, bias=False, start=0, arch="cgra-16x16", seed=0)  # W = 24: no tile divided it
@example(s=32, heads=4, d=16, fraction=0.5, bias=True, start=0, arch="cgra-8x8", seed=1)  # the test model's shape
def test_compact_tables_match_numpy(s, heads, d, fraction, bias, start, arch, seed):
    """Random heads, head sizes, rotary fractions, lengths, positions and presets: GPT-NeoX's
    projection with RoPE in its epilogue reading compact tables is one kernel (no RoPE kernel,
    no host op) within 1e-5 of float64 numpy; on cgra-8x8 it loads less than the whole tables.
    (Tables of a width no preset's column tiles divide, 24 on cgra-16x16, stay whole.)"""
    rotary = max(2, int(d * fraction)) // 2 * 2
    mod, data, expected = _neox_graph(s, 16, heads, d, rotary, bias, np.arange(start, start + s), seed)
    executable = npu_backend.compile(mod, arch)
    with npu_backend.profile() as prof:
        out = tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(data))
    names = [kernel.name for kernel in prof.kernels]
    fused = [kernel for kernel in prof.kernels if "matmul" in kernel.name and "take" in kernel.name]
    assert len(fused) == 1 and not any("concat" in name or name.startswith("fused_relax_take") for name in names), names
    for got, want in zip(out, expected):
        got = got.numpy()
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), np.abs(got - want).max()
    whole = 2 * s * heads * 3 * d * 4  # both tables, (S, N) float32
    operands = (heads * 3 * d * 16 + s * 16 + (heads * 3 * d if bias else 0)) * 4
    if arch == "cgra-8x8" and (3 * d) % 16 == 0:  # (compact tables: a multiple of 16 columns)
        assert fused[0].dma_load_bytes < operands + whole, (fused[0].dma_load_bytes, operands, whole)


@pytest.mark.parametrize("name", ["gpt_neox"])
def test_neox_model_within_1e5_with_compact_tables(name):
    """Hugging Face's GPT-NeoX (transformer_models.py, 32 tokens): its q / k / v kernels read
    compact tables (three takes in the kernel's name: the partners and the two tables' columns),
    rotate only the tiles holding rotated dims, and the model's output is within 1e-5 of PyTorch."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tvm.relax.frontend.torch import from_exported_program
    from transformer_models import build, first_output
    model, inputs = build(name, tokens=32)
    with torch.no_grad():
        want = first_output(model(*inputs)).numpy()
        mod = from_exported_program(torch.export.export(model, inputs))
    executable = npu_backend.compile(mod, "cgra-8x8")
    with npu_backend.profile() as prof:
        got = tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](*[tvm.runtime.tensor(i.numpy()) for i in inputs])
    got = first_output(got).numpy()
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    rope = [k for k in prof.kernels if "rms_norm" in k.name and k.name.count("take") == 3]
    assert len(rope) == 2, [k.name for k in prof.kernels]
    # (70,400 with every table slice; the four of six a period that pass through are not loaded)
    assert all(k.dma_load_bytes == 62208 for k in rope), [k.dma_load_bytes for k in rope]
    # 8 of 24 tiles rotate (four ELTWISEs each), and the norm's scaling of A's panel is one per
    # 8-row piece of the 32 rows (row_norm.py, lower/norm_rows.py)
    assert all(k.op_counts["ELTWISE"] == 8 * 4 + 4 for k in rope), [k.op_counts for k in rope]


# ------------------------------------------------------------------ pass-through column tiles

def _rotating_tiles(heads, d, rotary, tn, positions):
    """The column tiles of tn of the (S, heads * 3 d) projection holding a rotated column: one of
    q's and k's first `rotary` dims of a head whose table is not 1 and 0 at every position (at
    position 0 alone none is)."""
    cos, _, signed = _tables(positions, rotary)
    rotated = np.zeros((heads, 3, d), bool)
    rotated[:, :2, :rotary] = ((cos != 1) | (signed != 0)).any(axis=0)
    return int(rotated.reshape(-1, tn).any(axis=1).sum())


def _fused_kernel(mod, data, arch, dump_dir=None):
    executable = npu_backend.compile(mod, arch, dump_dir=dump_dir)
    with npu_backend.profile() as prof:
        out = tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(data))
    fused = [kernel for kernel in prof.kernels if "matmul" in kernel.name and "take" in kernel.name]
    assert len(fused) == 1, [kernel.name for kernel in prof.kernels]
    return out, fused[0]


def test_pass_through_tiles_issue_no_rotation():
    """Golden: NeoX's projection at 32 tokens on cgra-8x8 (4 heads of 16, 8 dims rotated, 8-column
    tiles): 8 of the 24 column tiles rotate (q's and k's first halves), and only they run the
    rotation's four ELTWISEs (two rotated runs, the multiply and the add) and load their table
    slices; every tile still runs its bias's EPILOGUE and one store (the others store x + b)."""
    mod, data, expected = _neox_graph(32, 64, 4, 16, 8, True, np.arange(32), 0)
    out, kernel = _fused_kernel(mod, data, "cgra-8x8")
    for got, want in zip(out, expected):
        assert np.abs(got.numpy() - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    counts = kernel.op_counts
    assert (counts["ELTWISE"], counts["EPILOGUE"], counts["DMA_STORE"], counts["GEMM"]) == (32, 24, 24, 24), counts
    # A's panel, B's 24 tiles, the bias's 24 rows, and the two rotating tiles' slices of each table
    assert counts["DMA_LOAD"] == 1 + 24 + 24 + 2 * 2, counts
    assert kernel.dma_load_bytes == (32 * 64 + 192 * 64 + 192 + 2 * 2 * 32 * 8) * 4, kernel.dma_load_bytes


@settings(max_examples=4, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(s=st.integers(1, 40), heads=st.integers(2, 4), d=st.sampled_from([8, 16, 32]),
       fraction=st.sampled_from([1.0, 0.5, 0.25]), bias=st.booleans(),
       arch=st.sampled_from(["cgra-8x8", "cgra-4x4", "cgra-16x16"]), seed=st.integers(0, 2 ** 16))
@example(s=32, heads=4, d=32, fraction=0.25, bias=True, arch="cgra-8x8", seed=0)  # 1 of 12 tiles of a head rotates
@example(s=5, heads=2, d=16, fraction=1.0, bias=False, arch="cgra-4x4", seed=2)  # no bias: the store reads acc
@example(s=1, heads=2, d=8, fraction=1.0, bias=False, arch="cgra-8x8", seed=0)  # position 0 alone: nothing rotates
def test_pass_through_tiles_match_numpy(s, heads, d, fraction, bias, arch, seed):
    """Random heads, head sizes, rotary fractions, lengths and presets: with the pass-through
    tiles skipped the outputs stay within 1e-5 of float64, and the rotation's ELTWISEs run on the
    rotating tiles only: the kernel without the skip (no pass columns found at partitioning)
    runs T / R times as many, T the column tiles, R those holding a rotated column."""
    import tempfile
    rotary = max(2, int(d * fraction)) // 2 * 2
    mod, data, expected = _neox_graph(s, 16, heads, d, rotary, bias, np.arange(s), seed)
    with tempfile.TemporaryDirectory() as dump:
        out, kernel = _fused_kernel(mod, data, arch, dump)
        tiling = next(open(os.path.join(root, "1_tiling.py")).read() for root, _, files in os.walk(dump)
                      if "take" in root and "1_tiling.py" in files)
    for got, want in zip(out, expected):
        assert np.abs(got.numpy() - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    tn = int(re.search(r"\btn=(\d+)", tiling).group(1))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(partition_stage, "mark_pass_columns", lambda mod: mod)
        whole_out, whole = _fused_kernel(mod, data, arch)
    for got, want in zip(whole_out, out):
        np.testing.assert_array_equal(got.numpy(), want.numpy())  # the skipped products were x * 1 + 0
    total, rotating = heads * 3 * d // tn, _rotating_tiles(heads, d, rotary, tn, np.arange(s))
    assert kernel.op_counts["ELTWISE"] * total == whole.op_counts["ELTWISE"] * rotating, \
        (kernel.op_counts["ELTWISE"], whole.op_counts["ELTWISE"], rotating, total)
    assert kernel.cycles <= whole.cycles, (kernel.cycles, whole.cycles)


@settings(max_examples=60, deadline=None)
@given(flags=st.lists(st.booleans(), min_size=1, max_size=12), tn=st.sampled_from([1, 2, 4, 8]),
       repeats=st.integers(1, 3), compact=st.booleans())
def test_rotating_ranges_name_the_tiles_with_a_rotated_column(flags, tn, repeats, compact):
    """rotating_ranges against a direct count: column tile c (of tn columns) rotates, by its
    (p, ranges), exactly when one of its columns is not pass-through (C = 1, S = 0)."""
    passing = np.repeat(np.array(flags * repeats), tn // 2 or 1)[: len(flags) * repeats * (tn // 2 or 1)]
    width = -(-len(passing) // tn) * tn
    spec = types.SimpleNamespace(rope_pass_columns=table_runs(passing), gemm_extents=(8, len(passing), 8),
                                 rope_table_period=len(passing) if compact else 0)
    if compact and len(passing) % tn:
        return  # compact tables are a whole number of column tiles (rope_tables)
    tiling = types.SimpleNamespace(table_cols=len(passing) if compact else 0, np=width, tn=tn)
    padded = np.concatenate([passing, np.ones(width - len(passing), bool)])
    want = ~padded.reshape(-1, tn).all(axis=1)
    found = rotating_ranges(spec, tiling)
    if found is None:
        assert want.all() or not passing.any() and not spec.rope_pass_columns
        return
    period, ranges = found
    got = [any(a <= c % period < b for a, b in ranges) for c in range(len(want))]
    assert got == want.tolist()
