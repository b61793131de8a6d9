"""Why a layer norm after a GEMM's residual add, or a patch conv, runs as its own kernel (for `explain`).

Stage: tools (read-only, on the partitioned module). A post-norm, LayerNorm(x + proj(h)), runs in
the epilogue of the GEMM that computes its input (kernels/gemm/post_norm.py) unless that kernel
refuses it: a hidden size that is not whole PE-array columns or too wide for a tile of whole rows,
or a fold no cheaper than the two kernels. The refusal happened during partitioning and left no
trace but two kernels; here each layer-norm kernel whose input is the output of a matmul or
linear kernel with a residual add is asked again, through the same `offload_reason` the
partitioner's check calls, and the answer becomes its placements' reason.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..errors import UnsupportedOperator
from ..kernels import offload_reason
from ..kernels.gemm.post_norm import SUFFIX
from ..kernels.registry import entries_named
from ..partition.composite import composite_call, composite_name, composite_ops, matched_roles

#: The norm kernels' patterns (kernels/rows/norms.py) and the GEMM roots a post-norm follows.
_NORMS = ("cgra.layer_norm", "cgra.layer_norm_plain")
_ROOTS = ("matmul", "linear")


def post_norm_reasons(mod: tvm.IRModule, func: relax.Function, arch) -> dict:
    """{variable of a layer-norm kernel's call in `func`: why its norm is not in the epilogue of
    the GEMM kernel computing its input} for each such norm the GEMM refused."""
    values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    reasons = {}
    for var, call in values.items():
        norm_wrapper = _offloaded(mod, call)
        if norm_wrapper is None or composite_name(norm_wrapper) not in _NORMS:
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
        norm = composite_ops(norm_wrapper)[-1][1]
        plain = "_plain" if composite_name(norm_wrapper).endswith("_plain") else ""
        reason = offload_reason(f"cgra.{root}{SUFFIX}{plain}", {**roles, "post_norm": norm, "norm_gamma": norm.args[1],
                                                                 "norm_beta": norm.args[2]}, arch)
        if reason:
            reasons[var] = f"its own kernel, not in the {root}'s epilogue: {reason}"
    return reasons


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
