"""How a kernel's TE compute reads its operands and is called: padded tiles, layouts, views.

Stage: kernel definition (every family's compute uses these). A scratchpad tile is read through
`padded`: the tensor's element inside the tensor, zero outside it. The DMA pass turns exactly
that guard into the DMA halo (zero fill on load), so tiles may run past a tensor's edge and
convolutions need no padded copy. `stored` and `logical` move a shape or index between the
logical axis order (NCHW, OIHW) and a layout. `prim_func` builds the kernel's PrimFunc with its
parameters in the order the offloaded Relax function passes them, and records the arguments the
kernel reads through a view of another shape (attribute `cgra.arg_shapes`).
"""

from __future__ import annotations

from tvm import te, tirx

from ...errors import FamilyError
from .dynamic import caller_dims


def in_bounds(indices, shape):
    """The condition under which `indices` lie inside a tensor of `shape` (the DMA halo test)."""
    cond = None
    for index, extent in zip(indices, shape):
        for term in (index >= 0 if not _provably_nonnegative(index) else None, index < extent):
            if term is not None:
                cond = term if cond is None else tirx.all(cond, term)
    return cond if cond is not None else tirx.const(True, "bool")


def _provably_nonnegative(index) -> bool:
    """Loop variables and their non-negative combinations need no lower-bound test."""
    return isinstance(index, (tirx.Var, int)) or (
        isinstance(index, tirx.Add) and _provably_nonnegative(index.a) and _provably_nonnegative(index.b)) or (
        isinstance(index, tirx.Mul) and _provably_nonnegative(index.a) and _provably_nonnegative(index.b)) or (
        isinstance(index, tirx.IntImm) and index.value >= 0)


def padded(tensor, shape, indices, fill=0):
    """tensor[indices] inside the tensor, `fill` outside: what a DMA load with a halo puts in a
    tile (0, or the dtype's lowest value with DMA_FILL_LOWEST: lower/dma.py)."""
    value = tensor(*indices)
    return tirx.if_then_else(in_bounds(indices, shape), value, tirx.const(fill, tensor.dtype) if isinstance(fill, int)
                             else fill)


def stored(logical_values, logical_axes: str, layout: str) -> tuple:
    """A logical shape or index, e.g. (N, C, H, W), in the order `layout` (e.g. "NHWC") stores it."""
    return tuple(logical_values[logical_axes.index(axis)] for axis in layout)


def logical(stored_values, layout: str, logical_axes: str = "NCHW") -> tuple:
    """A shape stored in `layout` in the logical order `logical_axes` (e.g. NHWC -> NCHW)."""
    return tuple(stored_values[layout.index(axis)] for axis in logical_axes)


def prim_func(roles, inputs: dict, out, views=None, shape_args=()):
    """The PrimFunc over `inputs` (role -> placeholder) and `out`, parameters in `roles` order.

    `views` maps a role ("lhs", ..., "out") whose parameter is a view to the shape the caller
    passes; the code generator checks that shape and binds the view (`cgra.arg_shapes`).
    `shape_args`: the positions of the symbolic sizes Relax passes beside the tensors (tir_vars,
    e.g. w when a tensor's width is (w - 1) // 2 + 1), which the kernel skips (`cgra.shape_args`):
    it reads its sizes from its tensors."""
    func = te.create_prim_func([inputs[role] for role in roles] + [out])
    if views:
        func = func.with_attr("cgra.arg_shapes", [list(views.get(role, ())) for role in list(roles) + ["out"]])
    return func.with_attr("cgra.shape_args", list(shape_args)) if shape_args else func


def kernel_prim_func(spec, inputs: dict, out, views=None):
    """`prim_func` for a KernelSpec: parameters in `spec.roles` order, the views the spec's
    caller shapes name (a compact (B, S, K) input read as (B * S, K), symbolic axes as their
    variables) plus `views`."""
    callers = {role: caller_dims(spec, role, shape) for role, shape in spec.caller_shapes}
    return prim_func(spec.roles, inputs, out, {**callers, **(views or {})}, spec.shape_args)


def check_views(func, caller_shapes: list, family: str, where: str) -> None:
    """Refuse a kernel PrimFunc `func` whose parameters the caller cannot pass: `caller_shapes`
    are the offloaded function's tensors then its result (dims: int, or symbolic), each of which
    must be the parameter's own shape or the view `prim_func(..., views=...)` recorded for it.
    Without it a family reading a rank-3 tensor as (rows, cols) compiles, and the kernel's
    argument check fails at run time; this fails at compile time and names the fix."""
    views = (func.attrs or {}).get("cgra.arg_shapes")
    if len(func.params) != len(caller_shapes):
        return  # not one tensor a parameter (a tuple result): the code generator checks those
    for index, (param, caller) in enumerate(zip(func.params, caller_shapes)):
        if caller is None:
            continue
        declared = views[index] if views is not None and len(views[index]) else param.ty.shape
        if not _same_dims(declared, caller):
            role = "the output" if index == len(func.params) - 1 else f"parameter '{param.name}'"
            raise FamilyError(
                f"{where}: {role} of the {family} kernel is {_dims(param.ty.shape)} but the caller passes "
                f"{_dims(caller)}: build the PrimFunc with operands.prim_func(..., views={{role: caller shape}}) "
                "for every operand (and 'out') the kernel reads through a view of another shape")


def _same_dims(declared, caller) -> bool:
    """Same rank, and the same extent wherever both are static (a symbolic one is bound at run time)."""
    if len(declared) != len(caller):
        return False
    for a, b in zip(declared, caller):
        a, b = (int(x.value) if hasattr(x, "value") else x for x in (a, b))
        if isinstance(a, int) and isinstance(b, int) and a != b:
            return False
    return True


def _dims(shape) -> str:
    """A shape as a message shows it: (2, 3, 9)."""
    return "(" + ", ".join(str(int(d.value)) if hasattr(d, "value") else str(d) for d in shape) + ")"
