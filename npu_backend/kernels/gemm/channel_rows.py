"""The per-output-channel rows of a GEMM's epilogue (bias, requantisation scale, a folded norm's
channel scale and shift): where they live in the scratchpad and which axis carries the channels.

Stage: kernel definition (TE computes) and schedule (the blocks' names). Split out of epilogue.py.
"""

from __future__ import annotations

from tvm import te

from ..common.operands import padded
from ..common.spec import KernelSpec


def channel_row(spec: KernelSpec, acc, tiling, tensor, shape, name: str):
    """The padded scratchpad row of a per-output-channel parameter (bias, requantisation scale),
    one per group for a grouped conv2d; None without the parameter."""
    if tensor is None:
        return None
    carrier = channel_axis(shape)

    def index(channel):
        return [channel if axis == carrier else 0 for axis in range(len(shape))]

    if spec.grouped:
        per_group = spec.gemm_extents[1]
        return te.compute((acc.shape[0], tiling.np), lambda b_, j: padded(
            tensor, shape, index(b_ % spec.groups * per_group + j)), name=name)
    return te.compute((tiling.np,), lambda j: padded(tensor, shape, index(j)), name=name)


def channel_axis(shape) -> int:
    """The axis of a broadcast channel row that carries the channels: the one whose extent is not 1."""
    axes = [axis for axis, extent in enumerate(shape) if extent != 1]
    return axes[0] if axes else len(shape) - 1


def channel_rows(spec: KernelSpec) -> tuple:
    """The blocks of the per-channel rows the epilogue reads (bias, requantisation scale; a
    post-norm's program reads its channel scale and shift itself, post_norm.py)."""
    affine = not spec.post_norm
    return (("bias_pad",) if spec.bias_shape else ()) + (("scale_pad",) if spec.scale_shape else ()) + \
        (("cscale_pad",) if spec.channel_scale_shape and affine else ()) + \
        (("cshift_pad",) if spec.channel_shift_shape and affine else ())
