"""Layout copies of 5 to 8 axes (kernels/layout/folds.py): a transpose whose axes do not merge
into 4 walks them all, its tensors seen through views of at most 4 axes (the DMA's), each tile
a loop of 4-loop boxes: exact against numpy on random shapes, permutations, slices and chips."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st
from tvm import relax

from npu_backend.kernels.layout.copy_kernel import Piece, tile_transfers
from npu_backend.kernels.layout.folds import MAX_AXES, fold_input, fold_output, folded_targets
from test_layout_copies import DTYPES, PRESETS, _check, _data, _run


@settings(max_examples=10)
@given(shape=st.lists(st.integers(1, 3), min_size=4, max_size=MAX_AXES).map(tuple), data=st.data(), dtype=DTYPES,
       arch=PRESETS)
def test_a_transpose_of_up_to_eight_axes_matches_numpy(shape, data, dtype, arch):
    perm = data.draw(st.permutations(range(len(shape))))
    x = _data(np.random.default_rng(len(shape)), shape, dtype)
    identity = list(perm) == sorted(perm)  # moves nothing: normalise/permute_chains.py drops it
    _check(lambda a: relax.op.permute_dims(a, perm), [x], np.transpose(x, perm), arch, kernels=0 if identity else 1)


@settings(max_examples=8)
@given(shape=st.lists(st.integers(2, 4), min_size=5, max_size=MAX_AXES).map(tuple), data=st.data(), arch=PRESETS)
def test_a_transpose_of_a_slice_of_many_axes_matches_numpy(shape, data, arch):
    """A slice's origin and steps along some axes, then a transpose: origins and steps of the
    merged input axes are those of the axes they hold."""
    perm = data.draw(st.permutations(range(len(shape))))
    begins = [data.draw(st.integers(0, e - 1)) for e in shape]
    steps = [data.draw(st.integers(1, 2)) for _ in shape]
    x = _data(np.random.default_rng(1), shape, "float32")
    cut = tuple(slice(b, None, s) for b, s in zip(begins, steps))

    def build(a):
        bb = relax.BlockBuilder.current()
        sliced = bb.emit(relax.op.strided_slice(a, list(range(len(shape))), begins, list(shape), steps))
        return relax.op.permute_dims(sliced, perm)

    out, prof = _run(build, [x], arch)
    np.testing.assert_array_equal(out, np.transpose(x[cut], perm))
    assert prof.host_calls == [] or not prof.kernels, (prof.kernels, prof.host_calls)


def test_swins_stem_transpose_and_window_partition_are_one_copy():
    """(C, H, W) -> windows of tokens (H/w, W/w, w, w, C): 5 axes that do not merge, one kernel
    of 4 boxes on cgra-8x8, the cycles of the plain (C, HW) -> (HW, C) transpose."""
    x = _data(np.random.default_rng(3), (16, 4, 4, 4, 4), "float32")
    _check(lambda a: relax.op.permute_dims(a, [1, 3, 2, 4, 0]), [x], np.transpose(x, (1, 3, 2, 4, 0)), "cgra-8x8")


def test_folding_keeps_every_element_where_it_was():
    """fold_input's view and walks, fold_output's groups: the same source of every output element."""
    shape, perm = (2, 3, 4, 5, 3, 2, 2, 3), (5, 1, 7, 3, 0, 6, 4, 2)
    piece = Piece("lhs", (0,) * 8, tuple(shape[a] for a in perm), tuple((a, 1) for a in perm), (0,) * 8)
    view, folded = fold_input(piece, shape, 4, "permute_dims")
    out_view, groups = fold_output(piece.extent, 4)
    assert len(view) == 4 and len(out_view) == 4 and sum(groups) == 8
    source = np.arange(np.prod(shape)).reshape(view)
    got = np.zeros(out_view, dtype=np.int64)
    for index in np.ndindex(*piece.extent):
        at = list(folded.origin)
        for axis, (walked, step) in enumerate(folded.walks):
            at[walked] += step * index[axis]
        target = [int(eval(t)) for t in folded_targets([str(i) for i in index], piece.extent, groups)]
        got[tuple(target)] = source[tuple(at)]
    np.testing.assert_array_equal(got.reshape(-1), np.arange(np.prod(shape)).reshape(shape).transpose(perm).reshape(-1))


def test_normalise_composes_no_copy_the_layout_kernel_cannot_walk():
    from npu_backend.normalise import patch_merges, window_stems
    assert window_stems.MAX_AXES == patch_merges.MAX_AXES == MAX_AXES


def test_a_tile_of_more_axes_than_a_box_is_a_loop_of_boxes():
    """Swin's window reverse, patch merge and next partition as one copy of 8 axes: a tile may
    hold more axes than a DMA box walks (a loop of 4-loop boxes into one scratchpad tile), so
    the DMA's latency is paid per tile of several boxes, not per box: exact, and 2,368 cycles on
    cgra-8x8 with tiles of one box each -> under 1,300."""
    perm = (0, 2, 1, 4, 3, 6, 5, 7)
    x = _data(np.random.default_rng(5), (2, 2, 2, 2, 2, 2, 4, 16), "float32")
    out, prof = _run(lambda a: relax.op.permute_dims(a, perm), [x], "cgra-8x8")
    np.testing.assert_array_equal(out, np.transpose(x, perm))
    assert len(prof.kernels) == 1 and prof.kernels[0].cycles < 1300, [k.cycles for k in prof.kernels]


def test_tile_transfers_counts_a_box_per_index_of_the_outer_axes():
    extent = (2, 3, 4, 5, 6, 7)
    whole = 2 * 3 * 4 * 5 * 6 * 7 * 4
    assert tile_transfers(extent, (0, 2, 1, whole)) == ((whole // 6,) * 6, whole)
    assert tile_transfers(extent, (1, 3, 2, 3 * 4 * 5 * 6 * 7 * 4)) == ((4 * 5 * 6 * 7 * 4,) * 3, 3 * 4 * 5 * 6 * 7 * 4)
    assert tile_transfers(extent, (2, 4, 6, 4 * 5 * 6 * 7 * 4)) == ((4 * 5 * 6 * 7 * 4,), 4 * 5 * 6 * 7 * 4)
