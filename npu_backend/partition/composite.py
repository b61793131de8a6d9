"""Reading an offloaded function: its composite, the composite's operators, and the roles the
pattern it was fused with gives its expressions.

Stage: partition (read by the target hook, explain and source_nodes). FuseOpsByPattern wraps each
match in a composite function (attribute `Composite`: the pattern's name), called from an
offloaded function (attribute `Codegen`, what RunCodegen compiles); `composite_call` finds the
composite inside. `matched_roles` runs the pattern it was fused with over the composite's body
and returns what each annotated role (lhs, rhs, bias, ...) matched: the same roles the pattern's
check function saw during partitioning, taken from the match itself. `reads_what_it_computes`
is one of those checks, on a match before it is fused.
"""

from __future__ import annotations

import contextlib

import tvm
from tvm import relax
from tvm.relax.dpl import WildcardPattern

from ..errors import UnsupportedOperator


def composite_call(func):
    """(composite function, its call) inside an offloaded wrapper function; (func, None) for a
    composite itself."""
    if "Composite" in (func.attrs or {}):
        return func, None
    bindings = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    for value in bindings.values():
        callee = getattr(value, "op", None)
        callee = bindings.get(callee, callee)
        if isinstance(callee, relax.Function) and "Composite" in (callee.attrs or {}):
            return callee, value
    raise UnsupportedOperator("the offloaded function holds no cgra composite")


def composite_name(func) -> str:
    """The pattern name of the composite inside `func` ("cgra.conv2d_bias_relu")."""
    return str(composite_call(func)[0].attrs["Composite"])


def composite_ops(func) -> list:
    """The (var, call) bindings of the Relax operators the composite inside `func` computes, in order."""
    composite, _ = composite_call(func)
    return [(b.var, b.value) for block in composite.body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def matched_roles(func, candidates) -> dict:
    """role -> expression of the composite inside `func`, from the first of `candidates`
    ((pattern, annotations) pairs: the patterns registered under its name) that matches its
    body. Raises UnsupportedOperator if none does."""
    composite, _ = composite_call(func)
    var2val = relax.analysis.get_var2val(composite)
    output = composite.body.body
    for pattern, roles in candidates:
        matched = pattern.extract_matched_expr(var2val.get(output, output), var2val)
        if matched is not None:
            return {role: matched[node] for role, node in roles.items() if node in matched}
    raise UnsupportedOperator(f"the composite '{composite.attrs['Composite']}' does not match its own pattern")


def reads_what_it_computes(context, annotations: dict | None = None) -> bool:
    """Whether an operand of the match is a value computed inside it (`z = y + (y + b)` with
    y = conv(x), or `z = y + y` with y = matmul(x, w) + b: the "residual" is the kernel's own
    output, which a kernel cannot load before it has stored it); the matcher then annotates one
    call under two roles, or an operand role (one whose pattern in `annotations`, role -> pattern,
    is a wildcard) with a call the match computes. A smaller pattern then takes the op, and the
    add runs on its own."""
    operands = {role for role, pattern in (annotations or {}).items() if isinstance(pattern, WildcardPattern)}
    # One tensor several boxes are read from (roles "<x>_src": the attention's parts of a merged
    # projection) is one operand in several roles, not a value computed twice.
    # Nor is a GEMM's left operand that is also its residual (x @ W + x: kernels/gemm/residual_lhs.py).
    annotated = context.annotated_expr
    computed = [expr for role, expr in annotated.items()
                if isinstance(expr, relax.Call) and not role.endswith(SHARED_SOURCE)
                and not (role == "residual" and "lhs" in annotated and expr.same_as(annotated["lhs"]))]
    inside = list(context.matched_bindings.values())
    return any(not isinstance(expr, relax.Call) and any(expr.same_as(var) for var in context.matched_bindings)
               or isinstance(expr, relax.Call) and sum(expr.same_as(other) for other in computed) > 1
               or role in operands and any(expr.same_as(value) for value in inside)
               for role, expr in context.annotated_expr.items())


#: The suffix of operand roles a kernel reads boxes of, several of which may be one tensor.
SHARED_SOURCE = "_src"

#: Operand roles that may be computed from the match's own result outside it (the residual or
#: multiplier of `reshape(mm) * tanh(reshape(mm))`); `operand_depends_on_match` looks for that.
_DOWNSTREAM_ROLES = ("residual", "multiplier", "ch_scale", "ch_shift")


def cache_read_elsewhere(context) -> bool:
    """Whether a KV cache write's cache (role "data" of kernels/layout/cache_write.py's
    patterns, written in place: device/in_place.py) is read by anything but the write: that
    reader would see it written, or the write a cache another op changes."""
    if "data" not in context.annotated_expr or not str(context.annotated_expr["root"].op.name).endswith(
            ("scatter_elements", "slice_scatter")):
        return False
    data = context.annotated_expr["data"]
    var = context.value_to_bound_var.get(data, data)
    return any(user not in context.matched_bindings for user in context.var_usages.get(var, []))


#: The norms a linear's own kernel takes with it: a pre-norm in its A panel (kernels/gemm/row_norm.py)
#: and a post-norm after its epilogue (kernels/gemm/post_norm.py).
_NORMS = ("relax.nn.layer_norm", "relax.nn.rms_norm")


def mlp_norms(context) -> tuple:
    """(pre-norm, post-norm) of a fused MLP's match (role "fc1_rhs": kernels/fused/mlp.py): the
    layer norm or RMSNorm call its fc1 reads when nothing else reads it, and whether its result
    feeds one alone, or an elementwise op fc2's own epilogue would take (`_TAILS`); (None, False)
    for another match. The linears' own kernels may take those
    norms (a pre-norm in fc1's A panel, a post-norm in fc2's epilogue); the MLP's kernel takes
    neither, and a norm left alone runs as a kernel of its own."""
    if "fc1_rhs" not in context.annotated_expr:
        return None, False
    values = {var: value for value, var in context.value_to_bound_var.items()}

    def norm(expr):
        expr = values.get(expr, expr)
        return expr if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and \
            expr.op.name in _NORMS else None

    def only_user(var) -> list:
        users = list(context.var_usages.get(var, []))
        return users if len(users) == 1 else []

    lhs = context.annotated_expr["lhs"]
    top = context.value_to_bound_var.get(context.matched_expr, context.matched_expr)
    pre = norm(lhs) if only_user(context.value_to_bound_var.get(lhs, lhs)) else None
    return pre, any(norm(user) is not None or _is_tail(values.get(user, _BINDINGS.get(user))) for user in only_user(top))


#: Elementwise ops a linear's own kernel takes after its GEMM (its epilogue: a bias, a residual, an
#: activation): a fused MLP whose fc2 feeds one alone would leave it to a kernel of its own
#: (relu(relu(x W1 + b1) W2 + b2) became the MLP, then an add and a relu kernel).
_TAILS = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.nn.relu", "relax.nn.gelu",
          "relax.nn.gelu_tanh", "relax.nn.silu", "relax.sigmoid", "relax.tanh", "relax.clip", "relax.nn.leakyrelu")


#: Var -> bound value of every binding of the module being partitioned (`module_bindings`): a check's
#: context knows the bindings up to its match only, and fc2's reader comes after it.
_BINDINGS: dict = {}


@contextlib.contextmanager
def module_bindings(mod):
    """Within: `_BINDINGS` holds `mod`'s Relax functions' top-level bindings."""
    _BINDINGS.clear()
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            _BINDINGS.update((binding.var, binding.value) for block in func.body.blocks for binding in block.bindings
                             if isinstance(binding, relax.VarBinding))
    try:
        yield
    finally:
        _BINDINGS.clear()


def _is_tail(value) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in _TAILS


def operand_depends_on_match(context) -> bool:
    """Whether a residual or multiplier operand of the match is computed, outside it, from a
    value it computes: fusing would make the kernel read its own result (a cycle). Walks the
    uses forward from the match's bindings (context.var_usages)."""
    operands = [context.annotated_expr[role] for role in _DOWNSTREAM_ROLES if role in context.annotated_expr]
    targets = [context.value_to_bound_var.get(expr, expr) for expr in operands]
    targets = [var for var in targets if isinstance(var, relax.Var)]
    if not targets:
        return False
    seen, frontier = set(), list(context.matched_bindings.keys())
    while frontier:
        var = frontier.pop()
        for user in context.var_usages.get(var, []):
            if user in seen or user in context.matched_bindings:
                continue
            if any(user.same_as(target) for target in targets):
                return True
            seen.add(user)
            frontier.append(user)
    return False
