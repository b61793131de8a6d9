"""The whole-row attention over a symbolic length with a share of its exps on the PE fabric
(kernels/attention/length_exps.py, rows_length.py).

Stated bound: the rows whose exps the function unit computes are bit-identical to the kernel with
no share (the function unit alone); every row, the fabric's too, within test_attention's bound
of float64 (4e-6 of the largest |O|), the fabric's exp itself within 2^-21 relative of float64
(test_fabric_exps.py). Shares are forced (any rows, from any run length on) through
attention_tilings.compiled_afresh.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.kernels.attention.flash_length import choose_length_tiling
from npu_backend.kernels.attention.spec import AttentionSpec
from attention_tilings import compiled_afresh
from test_attention import BOUND
from test_open_length_attention import _attention, _expected, _inputs

ARCH = "cgra-8x8"
BOUND_LENGTH = 64  # the symbolic length's bound: whole-row branches up to it on cgra-8x8


def _compiled(heads: int, depth: int, masked: str, fabric_rows: int, start: int):
    """(the symbolic attention's VM, its whole-row branches ((limit, RowTiling), ...)) with
    `fabric_rows` rows of each item forced onto the fabric at the static lengths from `start` on
    (so a branch takes them from its first length >= start: length_exps.share_from)."""
    def forced(spec, arch, t):
        return dataclasses.replace(t, fabric_rows=min(fabric_rows, t.rows)) if spec.sq >= start else t

    spec = AttentionSpec(1, heads, 1, BOUND_LENGTH, BOUND_LENGTH, depth, depth, scale=0.25, causal=None, length="s")
    with compiled_afresh(fabric_tiling=forced):
        vm = relax.VirtualMachine(npu_backend.compile(_attention(BOUND_LENGTH, masked, heads=heads, depth=depth),
                                                      ARCH), tvm.cpu())
        return vm, choose_length_tiling(spec, npu_backend.load_arch(ARCH)).rows


def _run(vm, n: int, heads: int, depth: int):
    arrays = _inputs(n, heads, depth)
    with npu_backend.profile() as prof:
        out = vm["main"](*(tvm.runtime.tensor(a) for a in arrays)).numpy()
    assert len(prof.kernels) == 1 and not prof.host_calls, n
    return out, arrays, sum(kernel.op_counts["FABRIC"] for kernel in prof.kernels)


def _fabric_rows(n: int, branches: tuple, start: int) -> np.ndarray:
    """Which of the n query rows the fabric computes: none below `start`, else the first
    fabric_rows of each query tile of the branch whose limit is the shortest >= n."""
    t = next((t for limit, t in branches if limit >= n), None)  # (None: the key tiles, no share)
    return (np.arange(n) % t.tq < t.fabric_rows) & (n >= start) if t else np.zeros(n, bool)


_ALONE: dict = {}


@pytest.mark.slow  # (about a minute: two symbolic compiles an example)
@settings(max_examples=5, deadline=None)
@given(heads=st.sampled_from([1, 2, 4]), depth=st.sampled_from([8, 16, 32]), masked=st.sampled_from(["open", ""]),
       fabric_rows=st.integers(1, 20), start=st.sampled_from([1, 5, 24]),
       lengths=st.lists(st.integers(1, BOUND_LENGTH), min_size=2, max_size=4))
@example(heads=4, depth=16, masked="open", fabric_rows=5, start=24, lengths=[1, 16, 23, 24, 64])
@example(heads=1, depth=8, masked="", fabric_rows=20, start=1, lengths=[1, 2, 17])  # every row: the key tiles
@example(heads=1, depth=8, masked="", fabric_rows=3, start=1, lengths=[1, 25, 33])  # one item a query tile
def test_a_forced_share_matches_numpy_and_the_function_unit(heads, depth, masked, fabric_rows, start, lengths):
    """At each length: the function unit's rows bit-identical to the kernel without a share
    (where the share leaves the branches as they were),
    every row within the bound of float64; FABRIC commands exactly where the share is taken
    (none below `start`: those lengths leave the fabric no rows)."""
    vm, branches = _compiled(heads, depth, masked, fabric_rows, start)
    key = (heads, depth, masked)
    if key not in _ALONE:
        _ALONE[key] = _compiled(heads, depth, masked, 0, 0)
    for n in lengths:
        out, (q, k, v), fabric = _run(vm, n, heads, depth)
        alone, _, none = _run(_ALONE[key][0], n, heads, depth)
        assert none == 0
        expected = _expected(*(a.astype(np.float64) for a in (q, k, v)))
        assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max(), n
        on_fabric = _fabric_rows(n, branches, start)
        assert (fabric > 0) == on_fabric.any(), (n, fabric, on_fabric)
        if _unshared(branches) == _ALONE[key][1]:  # (a share may cost the whole rows their branch)
            assert np.array_equal(out[..., ~on_fabric, :], alone[..., ~on_fabric, :]), n


@pytest.mark.parametrize("masked", ["open", ""])
def test_five_rows_from_24_tokens_on(masked):
    """The forced share of the Hypothesis test's first example, masked (the open padding mask,
    dropped) and not: none below 24 tokens, five rows of each 16-row item from 24 on."""
    test_a_forced_share_matches_numpy_and_the_function_unit.hypothesis.inner_test(
        heads=4, depth=16, masked=masked, fabric_rows=5, start=24, lengths=[1, 23, 24, 64])


def _unshared(branches: tuple) -> tuple:
    return tuple((limit, dataclasses.replace(t, fabric_rows=0, fabric_from=0)) for limit, t in branches)


@pytest.mark.parametrize("n", [1, 2, 9, 25, 33])
def test_one_head_at_every_tile_equals_numpy(n):
    """One batch and head (an item a query tile): the items' loop read as lower/ragged.py's
    tile loop had every command in it cut to tile `it`'s rows, the neighbours' too (at 25 tokens
    rows 17 .. 23 came from item 0's stale copy: 0.79 off; at 1 and 2 a read of unwritten bytes)."""
    vm, _ = _ALONE.get((1, 8, "")) or _compiled(1, 8, "", 0, 0)
    _ALONE[(1, 8, "")] = (vm, _)
    out, (q, k, v), _ = _run(vm, n, 1, 8)
    expected = _expected(*(a.astype(np.float64) for a in (q, k, v)))
    assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max()


def test_the_share_follows_the_static_compile_at_each_length():
    """DistilBERT's attention (4 heads x 16 dims) at bound 1024 on cgra-8x8: the 16-row items of
    lengths up to 512 take 3 rows on the fabric from 43 tokens on (a static compile takes none
    at 42: the passes' latencies meet too few keys; 5 rows from 29 before the vector lanes took
    a share of the function unit's exps, function_unit.split); a causal attention (a decoder's)
    none."""
    arch = npu_backend.load_arch(ARCH)
    spec = AttentionSpec(1, 4, 1, 1024, 1024, 16, 16, scale=0.25, causal=None, length="s")
    branches = dict(choose_length_tiling(spec, arch).rows)
    assert (branches[512].fabric_rows, branches[512].fabric_from) == (3, 43), branches
    causal = dataclasses.replace(spec, causal=0)
    assert all(t.fabric_rows == 0 for _, t in choose_length_tiling(causal, arch).rows)


@pytest.mark.parametrize("n", [42, 43, 512])
def test_the_symbolic_kernel_takes_the_share_where_the_static_does(n):
    """Bit-identical to the static compile at 512 tokens (the branch's limit: the same tiling),
    FABRIC where the static kernel has it (43 and 512 tokens), none at 42 (bound 1024)."""
    vm = relax.VirtualMachine(npu_backend.compile(_attention(1024), ARCH), tvm.cpu())
    out, _, fabric = _run(vm, n, 4, 16)
    static = relax.VirtualMachine(npu_backend.compile(_attention(masked="", length=n), ARCH), tvm.cpu())
    static_out, _, static_fabric = _run(static, n, 4, 16)
    assert (fabric > 0) == (static_fabric > 0) == (n >= 43), (fabric, static_fabric)
    if n == 512:
        assert np.array_equal(out, static_out)
