"""A concatenation of every phase of one strided slice is one transpose of a view
(normalise/patch_merges.py): Swin's patch merging, built in Relax with any steps and any order of
its phases, matches the unrewritten module run on the host, and on the NPU is one layout kernel."""

from __future__ import annotations

import itertools

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.patch_merges import merged_axes, patch_merges
from models import host_output, main_op_names


def _merging(shape: tuple, steps: tuple, phases: list):
    """main(x (1, H, W, C)) -> concat([x[:, a::sy, b::sx] for (a, b) in phases], axis=-1)."""
    x = relax.Var("x", relax.TensorType((1, *shape), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = [bb.emit(relax.op.strided_slice(x, [1, 2], list(phase), [shape[0], shape[1]], list(steps)))
                     for phase in phases]
            out = bb.emit_output(relax.op.concat(parts, axis=-1))
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=8)
@given(cells=st.tuples(st.integers(1, 3), st.integers(1, 3)), steps=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       channels=st.integers(1, 4), data=st.data())
def test_the_phases_become_one_transpose_in_either_order(cells, steps, channels, data):
    """The phases in row-major or column-major order (Swin's: rows first) are one transpose;
    in any other order the concat stays. Either way the result is the host's."""
    grid = list(itertools.product(range(steps[0]), range(steps[1])))
    phases = data.draw(st.permutations(grid))
    shape = (cells[0] * steps[0], cells[1] * steps[1], channels)
    mod = _merging(shape, steps, phases)
    rewritten = patch_merges(mod)
    by_rows = sorted(grid) == phases or sorted(grid, key=lambda p: (p[1], p[0])) == phases
    assert ("relax.concat" not in main_op_names(rewritten)) == by_rows, (phases, rewritten)
    x = np.random.default_rng(0).standard_normal((1, *shape)).astype(np.float32)
    np.testing.assert_array_equal(host_output(rewritten, x), host_output(mod, x))


def test_a_concat_missing_a_phase_is_left_alone():
    mod = _merging((4, 4, 2), (2, 2), [(0, 0), (1, 0), (0, 1)])
    assert patch_merges(mod).same_as(mod)


def test_merged_axes_counts_what_the_dma_walks():
    assert merged_axes((1, 8, 2, 8, 2, 16), [0, 1, 3, 4, 2, 5]) == 4  # Swin's: i, ho, (j wo), c
    assert merged_axes((2, 3, 4), [0, 1, 2]) == 1
    assert merged_axes((2, 3, 4), [2, 1, 0]) == 3
    assert merged_axes((1, 1), [1, 0]) == 0


def test_swins_patch_merging_is_one_layout_kernel_on_the_npu():
    phases = [(0, 0), (1, 0), (0, 1), (1, 1)]  # HF's SwinPatchMerging: x0, x1, x2, x3
    mod = _merging((16, 16, 16), (2, 2), phases)
    x = np.random.default_rng(1).standard_normal((1, 16, 16, 16)).astype(np.float32)
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
    assert [k.name.split("_cgra")[0] for k in prof.kernels] == ["fused_relax_permute_dims"], prof.kernels
    np.testing.assert_array_equal(out, host_output(mod, x))
