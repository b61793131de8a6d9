"""MatMulNBits layers (4-bit weights) as the NPU's unpack-and-GEMM kernel for the chip.

Stage: normalise. In: a Relax IRModule whose MatMulNBits layers the importer made call_tir of
host PrimFuncs marked `cgra.matmul_nbits` (frontend/matmul_nbits.py). Out: the same module in
which each such PrimFunc is the `cgra.kernel` of kernels/gemm/int4_matmul.py for `arch`: same
parameters (X, packed weights, scales[, zero points], Y), the weights DMAed packed and unpacked
in the scratchpad by UNPACK4. A layer whose tiles do not fit the chip keeps its host PrimFunc
(explain says so: a PrimFunc of several blocks stays on the host).

Why here and not at import: the kernel's tiles depend on the chip, which the importer does not
know; the host PrimFunc keeps the imported module buildable for any target.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from ..errors import ScratchpadTooSmall
from ..frontend.matmul_nbits import LAYER_ATTR


def int4_weight_kernels(mod: tvm.IRModule, arch, kernel_of) -> tvm.IRModule:
    """`mod` with every MatMulNBits PrimFunc replaced by its NPU kernel on `arch` (where it fits):
    `kernel_of(m, k, n, block, zero_points, arch)` builds it (kernels/gemm/int4_matmul.py; given
    by the stage's body, as the kernels come after normalise in the flow), raising
    ScratchpadTooSmall where the layer does not fit."""
    if arch is None:
        return mod
    updates = {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc) or func.attrs is None or LAYER_ATTR not in func.attrs:
            continue
        m, k, n, block, zero_points = (int(v) for v in func.attrs[LAYER_ATTR])
        try:
            kernel = kernel_of(m, k, n, block, bool(zero_points), arch)
        except ScratchpadTooSmall:
            continue
        updates[gvar] = kernel.with_attr("global_symbol", func.attrs["global_symbol"])
    if not updates:
        return mod
    mod = mod.shallow_copy() if hasattr(mod, "shallow_copy") else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gvar, kernel in updates.items():
        mod[gvar] = kernel
    return mod
