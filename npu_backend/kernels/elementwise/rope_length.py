"""RoPE over a symbolic number of positions: rope.py's kernel for a prompt of any length.

Stage: partition (rope.py's spec reader calls `length_spec` when a shape has a symbolic
dimension), tiling (`choose_length_tiling`) and kernel definition (`length_compute`, lowered TIR
as rope.py's). In: rope.py's match, the positions axis (out's axis -2, cos's and sin's axis -2,
the axis of x the transpose walks there) one symbolic length s, every other axis static. Out:
rope.py's kernel with ceildiv(s, St) position tiles; every ELTWISE and DMA box of the last tile
is cut to min(St, s - ts * St) rows (lower/ragged.py), so a ragged tile costs what a kernel
compiled for its rows would, and no row past s is read or written.

Why: at a symbolic length RoPE ran as ten small kernels per q or k (two multiplies, two slices,
a concat, an add and the transpose: 14.6 k cycles against a static compile's 4.1 k for
Llama's four RoPEs at 16 tokens on cgra-8x8).

The tile's positions come from the bound (`shape_bounds`, `tir_var_upper_bound`, torch.export's
`Dim(max=...)`): the largest power of two whose tiles fit, at most the bound rounded up to one;
a shorter prompt runs one ragged tile of exactly its rows.
"""

from __future__ import annotations

from ...errors import ScratchpadTooSmall, UnsupportedOperator
from ...relax_info import dtype_of, shape_dims
from ..common.dynamic import read_shape

#: Names the kernel's text uses for its own buffers and loops: a length variable named like one is renamed.
_RESERVED = {"T", "rope", "ts", "i", "j", "c", "sn", "xs", "t", "r", "o", "lhs", "cos", "sin", "out"}


def length_spec(annotated: dict, what: str, rope):
    """rope.py's RopeSpec of a RoPE whose positions axis is symbolic (shapes at the bound, `length`
    the variable's name); raises UnsupportedOperator saying why not. `rope`: the rope.py module
    (passed in: it imports this one)."""
    root, x = annotated["root"], annotated["lhs"]
    dims = shape_dims(root)
    if dims is None or len(dims) not in (3, 4):
        raise UnsupportedOperator(f"{what} of shape {dims}: the NPU's rotary kernel takes ranks 3 and 4")
    rank = len(dims)
    prefix = f"{what} over a symbolic length: "
    out_shape, names = read_shape(root, "output", symbolic_axes=(rank - 2,), prefix=prefix)
    axes = tuple(range(rank))
    if "transpose" in annotated:
        given = annotated["transpose"].attrs.axes
        axes = tuple(reversed(range(rank))) if given is None else tuple(int(a) % rank for a in given)
    param_shape, x_names = read_shape(x, "x", symbolic_axes=(axes[rank - 2],), prefix=prefix)
    x_shape, origin = param_shape, (0,) * rank
    if "part" in annotated:  # x a slice of a fused projection's heads (qkv_merges.py): its origin
        x_shape, part_names = read_shape(annotated["part"], "x", symbolic_axes=(axes[rank - 2],), prefix=prefix)
        origin = rope.part_origin(annotated["part"], param_shape, what)
        if part_names != x_names or origin[axes[rank - 2]] != 0:
            raise UnsupportedOperator(prefix + "x a slice along the positions")
    name = names.get(rank - 2)
    if name is None or x_names != {axes[rank - 2]: name}:
        raise UnsupportedOperator(prefix + f"x and the output have the symbolic axes {x_names} and {names}: the "
                                  "kernel takes one symbolic length, the positions")
    if axes[-1] != rank - 1 or tuple(x_shape[a] for a in axes) != out_shape:
        raise UnsupportedOperator(f"{prefix}a transpose {axes} that moves the last axis: a row of the tile "
                                  "must be a run of x")
    half = rope.check_halves(annotated, out_shape, what, lambda expr: read_shape(expr, "half", (-2,), prefix)[0])
    tables = []
    for role in ("cos", "sin"):
        shape, table_names = read_shape(annotated[role], role, symbolic_axes=(-2,), prefix=prefix)
        if (tuple(shape[-2:]) != out_shape[-2:] or len(shape) > rank or any(e != 1 for e in shape[:-2])
                or table_names != {len(shape) - 2: name}):
            raise UnsupportedOperator(f"{prefix}{role} of shape {shape_dims(annotated[role])}: the kernel reads a "
                                      f"table of ({name}, {out_shape[-1]}), the same for every head")
        tables.append(tuple(shape))
    if dtype_of(annotated["cos"]) != dtype_of(root) or dtype_of(annotated["sin"]) != dtype_of(root):
        raise UnsupportedOperator(prefix + "cos and sin of another dtype than x")
    return rope.RopeSpec(dtype_of(root), tuple(param_shape), axes, tuple(out_shape), half, *tables,
                     x_origin=origin, length=name)


def choose_length_rows(spec, arch, tiles: int, itemsize: int) -> int:
    """Positions per tile: the largest power of two whose `tiles` double-buffered tiles fit half the
    scratchpad, at most the bound rounded up to a power of two."""
    bound, width = spec.out_shape[-2:]
    row = width * itemsize
    rows, fits = 1, []
    while rows < 2 * bound:
        if 2 * tiles * rows * row <= arch.spad_bytes // 2:
            fits.append(rows)
        rows *= 2
    if not fits:
        raise ScratchpadTooSmall(f"RoPE's row of {width} elements: {2 * tiles} of them do not fit half of "
                                 f"{arch.name}'s {arch.spad_bytes}-byte scratchpad")
    return max(fits)


def _variable(spec) -> str:
    return spec.length + "_length" if spec.length in _RESERVED else spec.length


def length_compute(spec, tiling, rope_body):
    """The kernel's PrimFunc: rope.py's statements (`rope_body`) under ceildiv(s, St) position
    tiles, its parameters' positions axis the variable s (bound from the tensors by the code
    generator)."""
    import tvm
    from tvm.script import tirx as T  # noqa: F401 (the script's T)
    s = _variable(spec)
    rows, width = tiling.rows, spec.out_shape[-1]
    x_shape = list(spec.x_shape)
    x_shape[spec.x_axes[-2]] = s
    out_shape = list(spec.out_shape)
    out_shape[-2] = s
    shapes = {"lhs": tuple(x_shape), "cos": (s, width), "sin": (s, width), "out": tuple(out_shape)}
    roles = list(spec.param_roles) + ["out"]
    header = ["@T.prim_func", f"def rope({', '.join(f'{r}_handle: T.handle' for r in roles)}):",
              '    T.func_attr({"tirx.noalias": True})', f"    {s} = T.int32()"]
    header += [f'    {r} = T.match_buffer({r}_handle, ({", ".join(map(str, shapes[r]))},), "{spec.dtype}")'
               for r in roles]
    body = rope_body(spec, tiling, f"T.floordiv({s} + {rows - 1}, {rows})", s)
    func = tvm.script.from_source("\n".join(header + body) + "\n")
    var = next(e for e in func.params[-1].ty.shape if not hasattr(e, "value"))
    views = {"cos": spec.cos_shape, "sin": spec.sin_shape}
    if any(len(shape) != 2 for shape in views.values()):
        func = func.with_attr("cgra.arg_shapes", [
            [var if axis == len(views[r]) - 2 else e for axis, e in enumerate(views[r])]
            if r in views and len(views[r]) != 2 else [] for r in roles])
    if spec.shape_args:
        func = func.with_attr("cgra.shape_args", list(spec.shape_args))
    return func
