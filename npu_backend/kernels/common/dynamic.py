"""Symbolic dimensions: one kernel for every run-time size of some axes (a batch, a sequence).

Stage: partition (a family's spec reader asks which axes of an operand may be symbolic) and
kernel definition (the compute writes those axes as TIR variables). A spec keeps every shape as
integers, a symbolic axis at its bound, so the tile searches and the footprints stay integer
arithmetic; `KernelSpec.symbols` names the symbolic axes of the shapes the caller passes
((role, axis, variable name), ...), and the compute replaces them with `dim_var(name)`. The axes a family lets be symbolic are those its
scratchpad footprint does not depend on (rows of a GEMM, images of a batch): their tiles are
the same whatever the size, the last tile is ragged and the DMA's halo pads and drops what lies
past the tensor, so the kernel is right for every size. The bound only steers the tile search
(`DEFAULT_BOUND` without one): `npu_backend.compile(mod, shape_bounds={"n": 64})` or the
function's `tir_var_upper_bound` attribute give it.
"""

from __future__ import annotations

import contextlib
import contextvars

from tvm import sym, tirx

from ...errors import UnsupportedOperator
from ...relax_info import expression_name, holds_condition, shape_dims

#: The extent a tile search assumes for a symbolic axis without a bound: large enough that the
#: tiles it picks are the ones a large size wants (a small size then runs one ragged tile).
DEFAULT_BOUND = 1024

#: PrimFunc attribute: {host tensor name: [[dim, scale, per, offset], ...]} for gathers. A
#: conv2d's gather reads the image through a halo that zero-fills its padding: cut to the
#: image's extent, the last tile's padding would not be written at all. So a gather's box loops
#: are cut only along the host dims listed, to valid * scale // per + offset coordinates, `valid`
#: counting what the innermost symbolic tile loop's last tile holds (a conv2d's GEMM rows: output
#: columns = valid // rows per column; a depthwise conv2d's output columns: input columns =
#: (valid - 1) * stride + span); an empty list: never cut. conv2d.py and depthwise.py set it for
#: a symbolic image size; lower/ragged.py reads it.
GATHERS = "cgra.gathers"
#: PrimFunc attribute: GATHERS' entries for the stores into a host tensor: a KV cache's rows
#: written from a prompt of symbolic length (kernels/layout/cache_write.py), the cache static.
STORE_CUTS = "cgra.store_cuts"
#: PrimFunc attribute: a conv2d in blocks of rows and this many columns (height and width
#: symbolic): only its outermost tile loop, over block rows, cuts its commands' rows, to the
#: block's valid rows times the columns (lower/ragged.py); a block past the image's last column
#: runs whole.
BLOCKS = "cgra.block_columns"
#: PrimFunc attribute: {device call: its parameter that counts the tile's extent along the
#: innermost symbolic tile loop, or a list of them, one per symbolic tile loop from the outermost},
#: replacing lower/ragged.py's defaults (the GEMM-shaped kernels' rows) for kernels tiled
#: otherwise: a pool's POOL "oh" or "ow", a depthwise conv2d's DEPTHWISE "ow" and EPILOGUE "m"
#: along a symbolic width, a global pool's POOL ["kh", "kw"] (global_pool.py). The last tile's commands are cut to what exists;
#: its window loads are cut to the image, which holds every tap of those outputs (pool.py) or
#: loaded whole (depthwise.py, GATHERS).
CUT_PARAMS = "cgra.cut_params"

#: For-loop annotation: {CUT_LOOP: level}: the loop runs over a tile's rows (a depthwise conv2d's
#: EPILOGUE per output row) and is cut to the rows the symbolic tile loop at that level (0: the
#: outermost) holds in its last tile (lower/ragged.py).
CUT_LOOP = "cgra.cut_level"

#: For-loop annotation: [tensor, dim, tile]: the loop walks dimension `dim` of the kernel's
#: parameter `tensor` in tiles of `tile`, for lower/ragged.py to cut its last tile where TVM has
#: folded that extent's own division into the loop's (a conv2d of stride 2 in blocks of 8
#: rows: ceildiv((h - 1) // 2 + 1, 8) reads (h - 1) // 16 + 1, the tile no longer visible).
TILE_OF = "cgra.tile_of"

#: PrimFunc attribute: {device call: [[parameter, tile, variable name], ...]}: a command whose
#: `parameter` is `tile` computes min(tile, variable) instead (lower/ragged.py): a symbolic axis
#: held whole in one tile as wide as its bound, not tiled (a softmax's row of symbolic length).
CUT_EXTENTS = "cgra.cut_extents"
#: PrimFunc attribute: [[variable name, bound, what], ...]: the kernel holds that symbolic axis
#: whole up to its bound; lowering makes a longer one a ValueError at run time that names the
#: bound and how to raise it (lower/ragged.py), before any command is recorded.
BOUNDED = "cgra.bounded"

_BOUNDS: contextvars.ContextVar = contextvars.ContextVar("cgra_shape_bounds", default={})
_VARS: dict = {}  # name -> the kernel-side TIR variable (one object per name, int32)


@contextlib.contextmanager
def shape_bounds(bounds: dict):
    """Within the block, symbolic dimension `name` is assumed at most `bounds[name]`."""
    token = _BOUNDS.set(dict(bounds))
    try:
        yield
    finally:
        _BOUNDS.reset(token)


def bound_of(name: str) -> int:
    return int(_BOUNDS.get().get(name, DEFAULT_BOUND))


def dim_var(name: str) -> tirx.Var:
    """The TIR variable of symbolic dimension `name` in kernels (int32: the kernels' index type;
    the code generator binds it from the tensor's shape and checks that it fits)."""
    var = _VARS.get(name)
    if var is None:
        var = _VARS[name] = tirx.Var(name, "int32")
    return var


def rebind_dimensions(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` whose free variables named like one of its parameters' symbolic dimensions are
    bound to that dimension (a Bind each, first). A kernel names a symbolic dimension by one
    variable (`dim_var`), and an intrinsic may read it (global_pool.py's FILL of 1 / (H * W));
    tensorize matches the description against the kernel by that very variable, but inlines a
    deep copy of the implementation, whose variables are new objects of the same names."""
    dims = {extent.name: extent for param in func.params if isinstance(param.ty, tirx.BufferType)
            for extent in param.shape if isinstance(extent, tirx.Var)}
    defined = list(func.params) + list(dims.values())
    binds = [tirx.Bind(var, dims[var.name]) for var in tirx.analysis.undefined_vars(func.body, defined)
             if var.name in dims]
    return func.with_body(tirx.SeqStmt([*binds, func.body])) if binds else func


def read_shape(expr, role: str, symbolic_axes=(), prefix: str = "", expressions: bool = False) -> tuple[tuple, dict]:
    """(shape with symbolic axes at their bound, {axis: variable name}) of `expr`. Axes listed in
    `symbolic_axes` (negative from the end allowed) may be a symbolic variable, and with
    `expressions` an expression of variables too (a strided conv2d's output width, (w - 1) // 2 + 1:
    the kernel reads it as a variable of its own, named by the expression, bound from the tensor
    it is given); any other symbolic axis, an unknown shape or an empty tensor raise
    UnsupportedOperator saying why."""
    dims = shape_dims(expr)
    if dims is None:
        raise UnsupportedOperator(f"{prefix}the {role} has no known shape")
    allowed = {axis % len(dims) for axis in symbolic_axes} if dims else set()
    shape, names = [], {}
    for axis, dim in enumerate(dims):
        if isinstance(dim, int):
            if dim == 0:
                raise UnsupportedOperator(f"{prefix}the {role} of shape {tuple(dims)} is empty: nothing for the "
                                          "NPU to compute, it stays on the host")
            shape.append(dim)
            continue
        if holds_condition(dim):
            raise UnsupportedOperator(
                f"{prefix}the {role}'s size {expression_name(dim)} on axis {axis} holds a condition, which TVM "
                "0.27 cannot carry into an offloaded function (FuseOpsByPattern has no type rule for "
                "if_then_else): the op runs on the host")
        if axis not in allowed or not (isinstance(dim, tirx.Var) or expressions):
            where = "this axis" if isinstance(dim, tirx.Var) else f"an expression ({expression_name(dim)}) of variables"
            raise UnsupportedOperator(
                f"{prefix}the {role} has a symbolic dimension {expression_name(dim)} on axis {axis}; the NPU "
                f"kernel takes {_axes_text(allowed, len(dims))} symbolic, not {where} (bind it, e.g. with "
                "relax.transform.BindSymbolicVars)")
        names[axis] = dim.name if isinstance(dim, tirx.Var) else expression_name(dim)
        shape.append(bound_of(dim.name) if isinstance(dim, tirx.Var) else _expression_bound(dim, prefix, role))
    return tuple(shape), names


def _expression_bound(dim, prefix: str, role: str) -> int:
    """The largest value of an extent that is an expression of symbolic dimensions, each at its
    bound (the extents of a model's shapes grow with their variables)."""
    at_bounds = dim
    for var in tirx.analysis.undefined_vars(dim):
        at_bounds = tirx.Let(var, tirx.IntImm(str(var.ty), bound_of(var.name)), at_bounds)
    value = sym.Analyzer().simplify(at_bounds)
    if not isinstance(value, tirx.IntImm) or int(value.value) < 1:
        raise UnsupportedOperator(f"{prefix}the {role}'s symbolic dimension {expression_name(dim)} has no "
                                  "positive size at its variables' bounds")
    return int(value.value)


def _axes_text(allowed: set, rank: int) -> str:
    if not allowed:
        return "no axis"
    return "axis " + " and ".join(str(a) for a in sorted(allowed)) + f" (of {rank})"


def least_regret(candidates, cycles, bound: int):
    """The candidate tile whose estimated cycles (`cycles(candidate, size)`) at the worst of the
    sizes 1, 2, 4, ..., `bound` are the closest to the best candidate's at that size (minimax
    regret, as flash_length.py's and symbolic_take.py's searches); ties go to the fastest at the
    bound. A tile chosen for the bound alone is one unpipelined ragged tile at a short length."""
    candidates = list(candidates)
    sizes = sorted({min(2 ** k, bound) for k in range(bound.bit_length() + 1)})
    table = {c: [cycles(c, n) for n in sizes] for c in candidates}
    best = [min(t[i] for t in table.values()) for i in range(len(sizes))]
    return min(candidates, key=lambda c: (round(max(x / b for x, b in zip(table[c], best)), 3), table[c][-1]))


def padded_extent(name: str | None, extent: int, tile: int, padded: int):
    """The padded extent of an axis tiled by `tile`: `padded` when static, else the symbolic
    whole number of tiles covering the variable."""
    if name is None:
        return padded
    return tirx.ceildiv(dim_var(name), tile) * tile


def with_vars(shape: tuple, names: dict) -> tuple:
    """`shape` with the symbolic axes (`names`: axis -> variable name) as their variables."""
    return tuple(dim_var(names[axis]) if axis in names else extent for axis, extent in enumerate(shape))


def caller_dims(spec, role: str, shape: tuple) -> tuple:
    """The shape the caller passes for `role` (`shape`, the spec's, when it is not read through
    a view), with the spec's symbolic axes of that role as their variables."""
    stored = dict(spec.caller_shapes).get(role, shape)
    return with_vars(tuple(stored), {axis: name for r, axis, name in spec.symbols if r == role})


def symbols_of(role: str, names: dict) -> tuple:
    """KernelSpec.symbols entries for `role`'s symbolic axes (`names`: axis -> variable)."""
    return tuple((role, axis, name) for axis, name in sorted(names.items()))


def batch_extent(spec):
    """A conv2d's or pool's batch as the kernel indexes it: an int, or the symbolic batch's
    variable (the N axis of the data as the caller stores it)."""
    name = spec.symbolic("lhs").get(spec.data_layout.index("N"))
    return dim_var(name) if name is not None else spec.lhs_shape[0]


def spatial_extents(spec) -> tuple:
    """(OH, OW) of a conv2d's KernelSpec as the kernel indexes them: ints, or for a symbolic
    input height or width the output extent as an expression of the input's variable."""
    names = spec.symbolic("lhs")
    _, _, oh, ow = spec.output_shape
    _, _, kh, kw = spec.rhs_shape
    top, left, bottom, right = spec.padding
    (sh, sw), (dh, dw) = spec.strides, spec.dilation
    extents = []
    for axis, static, pad, kernel, step, dilation in (("H", oh, top + bottom, kh, sh, dh),
                                                      ("W", ow, left + right, kw, sw, dw)):
        name = names.get(spec.data_layout.index(axis))
        extents.append(static if name is None else sym.Analyzer().simplify(
            tirx.floordiv(dim_var(name) + (pad - dilation * (kernel - 1) - 1), step) + 1))
    return tuple(extents)
