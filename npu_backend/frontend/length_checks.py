"""A run's symbolic lengths checked against their bounds before anything is allocated.

Stage: the end of the graph stages (relax_pipeline.py, before TVM's build), and frontend's
kv_prefill.py for its caches' bound. In: a Relax module whose functions bound their symbolic
dimensions (`tir_var_upper_bound`: torch.export's `Dim(max=...)`, compile's `shape_bounds`). Out:
each such function opening with one call per bounded dimension its parameters carry,
`cgra.check_length(value, bound, what, how)`, outside any dataflow block (an impure call, kept
in place), which raises errors.LengthPastBound naming the dimension, the parameter, the bound
and the fix when the value is past the bound (device/length_checks.py, the check at run time).

Why: the VM's memory plan allocates a symbolic tensor's storage at its bound, so that a prompt
longer than a prefill's bound failed on the first tensor past its storage ("storage allocation
failure ... in region that is 8192 bytes", an InternalError), and a prefill writing KV caches
(relax's assert_op) with an AssertionError: neither names the bound or how to raise it. The
check costs the host nothing a profile counts: device/host_calls.py treats it as the VM's own
shape checks.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

#: The host function a check calls; device/length_checks.py registers it.
CHECK = "cgra.check_length"


def length_check(value, bound: int, what: str, how: str) -> relax.Call:
    """The impure call that raises LengthPastBound when `value` (a symbolic dimension) > `bound`."""
    return relax.Call(relax.ExternFunc(CHECK), [value, tirx.IntImm("int64", bound), tvm.ir.StringImm(what),
                                                 tvm.ir.StringImm(how)],
                      ty_args=[relax.TupleType([])])


def with_length_checks(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` whose bounded functions first check their parameters' symbolic dimensions (the
    module docstring); `mod` itself when none has one."""
    out = None
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function) or not (func.attrs and "tir_var_upper_bound" in func.attrs):
            continue
        bounds = {str(name): int(bound) for name, bound in func.attrs["tir_var_upper_bound"].items()}
        checked = _checked(func)  # kv_prefill.py's, with its caches' reason
        checks = [relax.VarBinding(relax.Var("_", relax.TupleType([])), length_check(var, bounds[var.name], what, how))
                  for var, what, how in _bounded_dims(func, bounds) if var.name not in checked]
        if not checks or not isinstance(func.body, relax.SeqExpr):
            continue
        body = relax.SeqExpr([relax.BindingBlock(checks), *func.body.blocks], func.body.body)
        out = out or mod.clone()
        out[gvar] = relax.Function(func.params, body, func.ret_ty, False, func.attrs, func.span)
    return mod if out is None else out


def _bounded_dims(func: relax.Function, bounds: dict) -> list:
    """(variable, what, how) per bounded symbolic dimension, at its first parameter axis."""
    seen, found = set(), []
    for param in func.params:
        shape = getattr(getattr(param.ty, "shape", None), "values", None) or ()
        for axis, dim in enumerate(shape):
            if isinstance(dim, tirx.Var) and dim.name in bounds and dim.name not in seen:
                seen.add(dim.name)
                name = dim.name
                how = (f"compile with a larger bound: torch.export.Dim('{name}', max=...), "
                       f"npu_backend.compile(..., shape_bounds={{'{name}': ...}}) or the function's tir_var_upper_bound")
                found.append((dim, f"{param.name}.shape[{axis}] (symbolic {name})", how))
    return found


def _checked(func: relax.Function) -> set:
    """The names of the symbolic dimensions `func` checks already (calls of CHECK)."""
    names = set()
    for block in getattr(func.body, "blocks", ()):
        for binding in block.bindings:
            call = getattr(binding, "value", None)
            if isinstance(call, relax.Call) and isinstance(call.op, relax.ExternFunc) and \
                    str(call.op.global_symbol) == CHECK and isinstance(call.args[0], tirx.Var):
                names.add(call.args[0].name)
    return names
