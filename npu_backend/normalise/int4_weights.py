"""MatMulNBits layers (4-bit weights) as the NPU's unpack-and-GEMM kernel for the chip.

Stage: normalise. In: a Relax IRModule whose MatMulNBits layers the importer made call_tir of
host PrimFuncs marked `cgra.matmul_nbits` (frontend/matmul_nbits.py). Out: the same module in
which each such PrimFunc is the `cgra.kernel` of kernels/gemm/int4_matmul.py for `arch`: same
parameters (X, packed weights, scales[, zero points], Y), the weights DMAed packed and unpacked
in the scratchpad by UNPACK4. A layer whose tiles do not fit the chip keeps its host PrimFunc
(explain says so: a PrimFunc of several blocks stays on the host). The same for the int8 x int4
layers of QDQ models and `cgra-sim verify --weight-dtype int4 --dtype int8` (host PrimFuncs marked
`cgra.qdq_int4`, kernels/gemm/int4_qmatmul.py: UNPACK4_INT8, int8 GEMM, requantising EPILOGUE), and
for conv2d layers with int4 weights (`cgra.int4_conv`: QDQ ones, int4_convs.py, and verify's;
kernels/gemm/int4_conv.py).

Why here and not at import: the kernel's tiles depend on the chip, which the importer does not
know; the host PrimFunc keeps the imported module buildable for any target.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from ..errors import ScratchpadTooSmall
from ..frontend.matmul_nbits import LAYER_ATTR
from .int4_convs import LAYER_ATTR as CONV_LAYER_ATTR
from .int4_convs import Int4ConvLayer
from .qdq_int4 import LAYER_ATTR as QDQ_LAYER_ATTR
from .qdq_int4 import QInt4Layer


def int4_weight_kernels(mod: tvm.IRModule, arch, kernel_of, qdq_kernel_of, conv_kernel_of=None) -> tvm.IRModule:
    """`mod` with every MatMulNBits PrimFunc replaced by its NPU kernel on `arch` (where it fits):
    `kernel_of(m, k, n, block, zero_points, arch)` builds it (kernels/gemm/int4_matmul.py; given
    by the stage's body, as the kernels come after normalise in the flow), raising
    ScratchpadTooSmall where the layer does not fit; `qdq_kernel_of(layer, arch)` likewise for a
    QDQ int8 x int4 layer (kernels/gemm/int4_qmatmul.py); `conv_kernel_of(layer, arch)` for a
    conv2d with int4 weights (normalise/int4_convs.py's layers, kernels/gemm/int4_conv.py)."""
    if arch is None:
        return mod
    updates = {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc) or func.attrs is None:
            continue
        try:
            if LAYER_ATTR in func.attrs:
                m, k, n, block, zero_points = (int(v) for v in func.attrs[LAYER_ATTR])
                kernel = kernel_of(m, k, n, block, bool(zero_points), arch)
            elif QDQ_LAYER_ATTR in func.attrs:
                kernel = qdq_kernel_of(QInt4Layer(*(int(v) for v in func.attrs[QDQ_LAYER_ATTR])), arch)
            elif CONV_LAYER_ATTR in func.attrs and conv_kernel_of is not None:
                kernel = conv_kernel_of(Int4ConvLayer.from_words(func.attrs[CONV_LAYER_ATTR]), arch)
            else:
                continue
        except ScratchpadTooSmall:
            continue
        symbol = func.attrs["global_symbol"] if "global_symbol" in func.attrs else gvar.name_hint
        updates[gvar] = kernel.with_attr("global_symbol", symbol)
    if not updates:
        return mod
    mod = mod.shallow_copy() if hasattr(mod, "shallow_copy") else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gvar, kernel in updates.items():
        mod[gvar] = kernel
    return mod
