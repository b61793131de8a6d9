"""Why a layer norm after a GEMM's residual add, or a patch conv, runs as its own kernel (for `explain`).

Stage: tools (read-only, on the partitioned module). A post-norm, LayerNorm(x + proj(h)), runs in
the epilogue of the GEMM that computes its input (kernels/gemm/post_norm.py) unless that kernel
refuses it: a hidden size that is not whole PE-array columns or too wide for a tile of whole rows,
or a fold no cheaper than the two kernels. The refusal happened during partitioning and left no
trace but two kernels; here each layer-norm kernel whose input is the output of a matmul or
linear kernel with a residual add is asked again, through the same `offload_reason` the
partitioner's check calls, and the answer becomes its placements' reason. A 16-bit form
(kernels/gemm/half_post_norm.py) refused leaves the GEMM rounding its sum and adding the residual
(cgra.<root>_bias_rounded_residual) and a 16-bit layer norm kernel reading it: asked the same way
as cgra.<root>_half_post_norm, the norm kernel's casts and norm joining the GEMM's roles.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..errors import UnsupportedOperator
from ..kernels import offload_reason
from ..kernels.gemm.half_post_norm import SUFFIX as HALF_SUFFIX
from ..kernels.gemm.post_norm import SUFFIX
from ..kernels.registry import entries_named
from ..partition.composite import composite_call, composite_name, composite_ops, matched_roles

#: The norm kernels' patterns (kernels/rows/norms.py) and the GEMM roots a post-norm follows.
_NORMS = ("cgra.layer_norm", "cgra.layer_norm_plain")
#: The 16-bit layer norm kernel's (widening its h input: kernels/rows/half_norms.py) and the GEMM's
#: before it (kernels/gemm/half_residual.py's suffix).
_HALF_NORM, _ROUNDED = "cgra.layer_norm_half_wide", "_bias_rounded_residual"
_ROOTS = ("matmul", "linear")


def post_norm_reasons(mod: tvm.IRModule, func: relax.Function, arch) -> dict:
    """{variable of a layer-norm kernel's call in `func`: why its norm is not in the epilogue of
    the GEMM kernel computing its input} for each such norm the GEMM refused."""
    values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    reasons = {}
    for var, call in values.items():
        norm_wrapper = _offloaded(mod, call)
        if norm_wrapper is None or composite_name(norm_wrapper) not in _NORMS + (_HALF_NORM,):
            continue
        producer = _offloaded(mod, _through_reshape(values, call.args[0]))
        if producer is None:
            continue
        name = composite_name(producer)
        root = name.removeprefix("cgra.").split("_")[0]
        if root not in _ROOTS + ("conv2d",):
            continue
        roles = matched_roles(producer, [(entry.pattern, entry.annotations) for entry in entries_named(name)])
        if "residual" not in roles and root != "conv2d":  # (a patch conv's norm: kernels/gemm/patch_norm.py)
            continue
        if composite_name(norm_wrapper) == _HALF_NORM:
            reason = _half_reason(norm_wrapper, name, root, roles, arch)
        else:
            norm = composite_ops(norm_wrapper)[-1][1]
            plain = "_plain" if composite_name(norm_wrapper).endswith("_plain") else ""
            reason = offload_reason(f"cgra.{root}{SUFFIX}{plain}", {**roles, "post_norm": norm, "norm_gamma": norm.args[1],
                                                                     "norm_beta": norm.args[2]}, arch)
        if reason:
            reasons[var] = f"its own kernel, not in the {root}'s epilogue: {reason}"
    return reasons


def _half_reason(norm_wrapper, name: str, root: str, roles: dict, arch):
    """Why the GEMM `name` (its matched `roles`) did not take the 16-bit layer norm kernel
    `norm_wrapper` (astype, layer_norm, astype) as cgra.<root>_half_post_norm, or None."""
    if not name.endswith(_ROUNDED):
        return None
    (_, wide), (_, norm), (_, cast) = composite_ops(norm_wrapper)[-3:]
    return offload_reason(f"cgra.{root}{HALF_SUFFIX}", {**roles, "res_added": roles["half_residual"], "norm_wide": wide,
                                                        "post_norm": norm, "norm_gamma": norm.args[1],
                                                        "norm_beta": norm.args[2], "norm_cast": cast}, arch)


def _through_reshape(values: dict, arg):
    """The call computing `arg`, through one reshape (a view of a patch conv's NHWC output)."""
    value = values.get(arg) if isinstance(arg, relax.Var) else None
    if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.reshape" and \
            isinstance(value.args[0], relax.Var):
        return values.get(value.args[0])
    return value


def _offloaded(mod: tvm.IRModule, call):
    """The offloaded function `call` calls (attribute Codegen "cgra") holding a composite, else
    None (a user's call_tir kernel is offloaded without one: partition/call_tir.py)."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.GlobalVar):
        return None
    func = mod[call.op]
    if (func.attrs or {}).get("Codegen") != "cgra":
        return None
    try:
        composite_call(func)
    except UnsupportedOperator:
        return None
    return func
