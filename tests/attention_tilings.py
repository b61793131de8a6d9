"""The attention tests' switch: kernels compiled afresh with some of the tile search's steps
(kernels/attention/attention_tiles.py) replaced. The kernel caches' and the process's tilings'
keys are the spec, not the tiling, so both are emptied before and after."""

from __future__ import annotations

import contextlib

import pytest

from npu_backend.kernels import registry
from npu_backend.kernels.attention import attention_tiles, flash_length
from npu_backend.target import relax_ext


@contextlib.contextmanager
def compiled_afresh(**steps):
    """Within: attention_tiles' functions named by `steps` replaced by their values (e.g.
    fabric_tiling=lambda spec, arch, t: t), and no kernel or tiling cached from before.
    A context manager, not a fixture: Hypothesis runs its examples in one test call."""
    with pytest.MonkeyPatch.context() as patch:
        for name, step in steps.items():
            patch.setattr(attention_tiles, name, step)
        patch.setenv("CGRA_KERNEL_CACHE", "off")
        patch.setattr(registry, "_TILINGS", {})
        relax_ext.clear_kernel_cache()
        flash_length.choose_length_tiling.cache_clear()  # (a symbolic length's: memoised by spec)
        try:
            yield
        finally:
            relax_ext.clear_kernel_cache()
            flash_length.choose_length_tiling.cache_clear()
