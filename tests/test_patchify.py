"""A conv2d over non-overlapping patches of few channels (kernels/gemm/patchify.py): one GEMM of a
kernel row's depth per kernel row instead of one of depth C per tap; right on the simulator
(float32 and int8, ragged row tiles, residual, image wider than tall) and faster than the tap
form it replaces (a ViT's patch embedding).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import npu_backend
from models import assert_matches, conv2d_model, run
from npu_backend.kernels.common.spec import KernelSpec
from npu_backend.kernels.gemm.gemm import choose_gemm_tiling


@pytest.mark.parametrize("c, h, w, f, k, dtype, residual", [
    (3, 32, 32, 16, 8, "float32", False),  # a ViT-style patch embedding, 4 x 4 patches
    (3, 16, 24, 8, 4, "float32", True),  # wider than tall: tiles of output columns; 2 images
    (8, 12, 12, 24, 2, "int8", False),  # 2 x 2 patches, 36 rows: a ragged row tile
    (1, 10, 10, 8, 5, "float32", False),
])
def test_patch_convolutions_match_numpy(c, h, w, f, k, dtype, residual):
    mod, inputs, ref = conv2d_model(1 + residual, c, h, w, f, k, k, stride=(k, k), dtype=dtype, relu=False,
                                    residual=residual, seed=3)
    assert_matches(run(npu_backend.compile(mod, "cgra-8x8"), inputs), ref, dtype)


def _spec(c, kernel, stride, padding=(0, 0, 0, 0)):
    return KernelSpec("conv2d", lhs_shape=(1, c, 64, 64), rhs_shape=(64, c, kernel, kernel), strides=(stride, stride),
                      padding=padding, dilation=(1, 1), groups=1, data_layout="NCHW", kernel_layout="OIHW",
                      out_layout="NCHW", dtype="float32", acc_dtype="float32")


def test_only_non_overlapping_patches_of_few_channels_take_a_kernel_rows_depth():
    assert _spec(3, 16, 16).patch_channels == 3
    assert _spec(3, 16, 16).gemm_extents == (16, 64, 48)
    assert _spec(3, 3, 2).patch_channels == 0  # overlapping windows
    assert _spec(3, 4, 4, (1, 1, 1, 1)).patch_channels == 0  # padded
    assert _spec(3, 1, 1).patch_channels == 0  # a 1 x 1 conv2d: nothing to merge
    assert _spec(32, 2, 2).patch_channels == 0  # deep taps: the tap form is faster
    assert dataclasses.replace(_spec(3, 4, 4), groups=3, rhs_shape=(63, 1, 4, 4)).patch_channels == 0


@pytest.mark.parametrize("c, kernel", [(3, 16), (3, 4), (8, 2), (6, 14)])
def test_a_depth_chunk_holds_whole_patch_columns(c, kernel):
    spec = _spec(c, kernel, kernel)
    tiling = choose_gemm_tiling(spec, npu_backend.load_arch("cgra-4x4"))
    assert tiling.tk % c == 0 and (kernel * c) % tiling.tk == 0


def test_a_vit_patch_embedding_runs_near_its_weights_dma():
    """3 x 64 x 64 px, 16 x 16 patches, 64 channels: 786 k MACs (12.3 k cycles on 64 PEs), but
    the 196 kB of weights alone take 12.3 k cycles of DMA. The tap form ran 256 GEMMs of depth
    3 in 26.4 k cycles; the kernel-row form runs 16 of depth 48."""
    mod, inputs, ref = conv2d_model(1, 3, 64, 64, 64, 16, 16, stride=(16, 16), relu=False, seed=1)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), inputs)
    assert_matches(out, ref, "float32")
    assert prof.total_cycles < 18_000, prof.total_cycles
    assert np.isfinite(out).all()
