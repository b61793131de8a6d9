"""A GEMM whose residual is its own left operand: relu(conv2d(x) + x), x @ W + x.

Stage: partition (whether the kernel takes such a match, and the spec it becomes) and kernel
definition (where the residual tile is read from). The add's two operands are one tensor, so
the offloaded function has one parameter in the roles "lhs" and "residual"; the kernel takes it
once (`KernelSpec.residual_is_lhs`: no "residual" parameter) and loads each output tile's
residual from it as it would from a tensor of its own: a 2-D matmul's rows i, columns j of x
(the output is (M, N) = (M, K), so W is square), an NCHW conv2d's image, channels and pixels of
its output in the data (shape-keeping: as many channels out as in, stride 1, same padding).
The same additions on the same values as the three kernels (GEMM, add, relu) it replaces.
Where the residual load would follow another path (a symbolic size's ragged tiles and
gathers, a grouped, patch or channels-last conv2d, a batched matmul) the add keeps its kernel.
"""

from __future__ import annotations

import dataclasses

from ..common.spec import KernelSpec


def reads_lhs_twice(spec: KernelSpec) -> bool:
    """Whether the kernel can load its residual from its left operand (module doc)."""
    if spec.symbols:
        return False
    if spec.op == "matmul":
        return spec.compute_name == "matmul" and spec.batch == 1
    return spec.compute_name == "conv2d" and spec.groups == 1 and not spec.patch_channels


def with_lhs_residual(spec: KernelSpec, shape: tuple) -> KernelSpec:
    """`spec` adding its left operand, of the output's `shape`, as the residual."""
    return dataclasses.replace(spec, residual_shape=tuple(shape), residual_is_lhs=True)


def lhs_as_residual(spec: KernelSpec, operands: dict, lhs) -> dict:
    """The epilogue's operands (epilogue.epilogue_operands) with the residual read from the left
    operand's placeholder `lhs` when it is the residual."""
    return {**operands, "residual": lhs} if spec.residual_is_lhs else operands
