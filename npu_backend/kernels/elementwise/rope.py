"""The rotary family: RoPE, x * cos + rotate_half(x) * sin, as one kernel with its halves and the
head transpose before it read by the DMA and the vector unit's operand offsets.

Stage: partition (its patterns and spec) and kernel definition (the kernel is written as
lowered TIR, like the layout copies). Input, as Hugging Face's rotary models write it once
normalise/rotations.py has moved rotate_half's negation into the sine:

    add(multiply(x, cos), multiply(concat((x[..., h:], x[..., :h]), axis=-1), sin))

(or the add's operands swapped), x of rank 3 or 4, optionally x = permute_dims(y, axes) with
the last axis kept last (the heads' transpose after the q / k projection's reshape:
(1, S, H, D) -> (1, H, S, D)), y itself possibly a unit-step slice of the parameter (the q or k
part of a fused projection, normalise/split_slices.py: the origin of the load's box); cos and sin of shape (S, D) with any leading 1s; float32.
Before, that was seven NPU kernels per q or k (a transpose, two multiplies, two slices, a
concat, an add: five DMA passes over x and launches of a few hundred cycles each).

Per tile of St positions (St x D of cos and of sin loaded once) and per outer index (batch,
head), the kernel loads x's St x D box through the transpose (a box of strides: the DMA reads
y where the output's element lies), then four ELTWISE commands: t = x * cos; the two halves
of r = rotate_half(x) * sin, each an ELTWISE on half the columns whose x operand starts at
the other half's column (an offset in the scratchpad, no copy); out = t + r; one DMA store.
The same float32 operations in the same order as the separate kernels: the result is equal
bit for bit.
"""

from __future__ import annotations

import dataclasses
import sys

import tvm
from tvm.relax.dpl import is_op, is_tuple, wildcard

from cgra_sim.isa import DType, EltwiseFunc

from ...errors import ScratchpadTooSmall, UnsupportedOperator
from ...relax_info import dtype_of, shape_dims, static_shape
from ..family import OpFamily
from .rope_length import choose_length_rows, length_compute, length_spec

SPAD = "global.cgra_spad"
PREFIX = "cgra.rope"
DTYPES = ("float32",)
#: Scratchpad tiles live at once: cos, sin, and per head x, x * cos, the rotated product and
#: the sum; each double-buffered.
TILES = 6


@dataclasses.dataclass(frozen=True)
class RopeSpec:
    """RoPE over out (..., S, D): out[o, s, d] = x[axes applied to (o, s, d)] * cos[s, d] + ...;
    `x_axes[a]` is the axis of x (the parameter) that output axis a walks."""

    dtype: str
    x_shape: tuple
    x_axes: tuple
    out_shape: tuple
    half: int  # h: the rotation's first half x[..., :h]
    cos_shape: tuple
    sin_shape: tuple
    x_origin: tuple = ()  # where x's part starts in the parameter (a slice of it), else at 0
    param_roles: tuple = ("lhs", "cos", "sin")
    source_ops: tuple = ()
    shape_args: tuple = ()
    length: str | None = None  # the positions axis' variable when symbolic (rope_length.py), shapes at its bound
    op = "rope"
    macs = 0
    acc_dtype = property(lambda self: self.dtype)


@dataclasses.dataclass(frozen=True)
class RopeTiling:
    """Positions per tile (a divisor of S)."""

    rows: int


def rope_patterns() -> list:
    """With the transpose (tried first) and without it, each with the add's operands in
    either order."""
    entries = []
    for sliced, transposed in ((True, True), (False, True), (False, False)):
        for swapped in (False, True):
            x, cos, sin = wildcard(), wildcard(), wildcard()
            part = is_op("relax.strided_slice")(x, varg_default_wildcard=True) if sliced else x
            read = is_op("relax.permute_dims")(part) if transposed else x
            lo = is_op("relax.strided_slice")(read, varg_default_wildcard=True)
            hi = is_op("relax.strided_slice")(read, varg_default_wildcard=True)
            rotated = is_op("relax.concat")(is_tuple([hi, lo]))
            plain, turned = is_op("relax.multiply")(read, cos), is_op("relax.multiply")(rotated, sin)
            root = is_op("relax.add")(*((turned, plain) if swapped else (plain, turned)))
            roles = {"root": root, "lhs": x, "cos": cos, "sin": sin, "lo": lo, "hi": hi, "rotated": rotated}
            if transposed:
                roles["transpose"] = read
            if sliced:
                roles["part"] = part
            name = f"{PREFIX}{'_sliced' if sliced else ''}{'_transposed' if transposed else ''}{'_swapped' if swapped else ''}"
            entries.append((name, root, roles))
    return entries


def rope_spec(name: str, annotated: dict) -> RopeSpec:
    """The kernel a matched RoPE becomes; raises UnsupportedOperator with the reason."""
    x, root = annotated["lhs"], annotated["root"]
    what = "RoPE (x * cos + rotate_half(x) * sin)"
    dtype = dtype_of(root)
    if dtype not in DTYPES:
        raise UnsupportedOperator(f"{what} on {dtype}: the NPU's rotary kernel computes {', '.join(DTYPES)}")
    out_shape, x_shape = static_shape(root), static_shape(x)
    if shape_dims(root) is not None and shape_dims(x) is not None and None in (out_shape, x_shape):
        return length_spec(annotated, what, sys.modules[__name__])
    if out_shape is None or x_shape is None or len(out_shape) not in (3, 4) or 0 in out_shape:
        raise UnsupportedOperator(f"{what} of shape {out_shape}: the NPU's rotary kernel takes static ranks 3 and 4")
    rank = len(out_shape)
    axes = tuple(range(rank))
    if "transpose" in annotated:
        given = annotated["transpose"].attrs.axes
        axes = tuple(reversed(range(rank))) if given is None else tuple(int(a) % rank for a in given)
    origin = (0,) * rank
    if "part" in annotated:  # x is a slice of the parameter: its origin, unit steps
        origin = part_origin(annotated["part"], x_shape, what)
        x_shape = static_shape(annotated["part"])
    if axes[-1] != rank - 1 or tuple(x_shape[a] for a in axes) != out_shape:
        raise UnsupportedOperator(f"{what} after a transpose {axes} that moves the last axis: a row of the tile "
                                  "must be a run of x")
    half = check_halves(annotated, out_shape, what)
    tables = []
    for role in ("cos", "sin"):
        shape = static_shape(annotated[role])
        if (shape is None or tuple(shape[-2:]) != out_shape[-2:] or len(shape) > rank
                or any(e != 1 for e in shape[:-2])):
            raise UnsupportedOperator(f"{what} with {role} of shape {shape}: the kernel reads a table of (positions, "
                                      f"{out_shape[-1]}) = {out_shape[-2:]}, the same for every head")
        tables.append(tuple(shape))
    return RopeSpec(dtype, tuple(static_shape(x)), axes, tuple(out_shape), half, *tables, x_origin=origin)


def part_origin(part, shape: tuple, what: str) -> tuple:
    """The origin of a unit-step slice with constant bounds (a fused projection's part)."""
    args = list(part.args[1:])
    if len(shape) != len(shape_dims(part) or ()) or len(args) < 3 or not all(
            isinstance(a, (tvm.relax.Tuple, tvm.relax.ShapeExpr)) for a in args[:3]):
        raise UnsupportedOperator(f"{what} of a slice with bounds computed at run time")
    steps = _ints(args[3]) if len(args) > 3 and args[3] is not None else [1] * len(_ints(args[0]))
    if any(step != 1 for step in steps):
        raise UnsupportedOperator(f"{what} of a slice with steps {steps}: the kernel reads unit-step parts")
    origin = [0] * len(shape)
    for axis, begin in zip(_ints(args[0]), _ints(args[1])):
        axis %= len(shape)
        origin[axis] = min(max(begin + shape[axis] if begin < 0 else begin, 0), shape[axis])
    return tuple(origin)


def check_halves(annotated: dict, out_shape: tuple, what: str, shape_of=static_shape) -> int:
    """h, where the match is concat((x[..., h:], x[..., :h]), axis=-1), else the reason
    (`shape_of`: a slice's shape, symbolic axes at their bound for rope_length.py)."""
    width, halves = out_shape[-1], []
    for role in ("lo", "hi"):
        call = annotated[role]
        args = list(call.args[1:])
        if len(args) < 3 or any(not isinstance(a, (tvm.relax.Tuple, tvm.relax.ShapeExpr)) for a in args[:3]):
            raise UnsupportedOperator(f"{what} whose slices have bounds computed at run time")
        axes, begin = _ints(args[0]), _ints(args[1])
        steps = _ints(args[3]) if len(args) > 3 and args[3] is not None else [1] * len(axes)
        shape = shape_of(call)
        if [a % len(out_shape) for a in axes] != [len(out_shape) - 1] or steps != [1] or shape is None:
            raise UnsupportedOperator(f"{what} whose halves are not unit-step slices of the last axis")
        start = begin[0] + width if begin[0] < 0 else begin[0]
        halves.append((start, shape[-1]))
    (lo_start, lo_width), (hi_start, hi_width) = halves
    axis = int(annotated["rotated"].attrs.axis) % len(out_shape)
    if lo_start != 0 or hi_start != lo_width or lo_width + hi_width != width or axis != len(out_shape) - 1:
        raise UnsupportedOperator(f"{what} whose concat is not (x[..., h:], x[..., :h]) along the last axis")
    return lo_width


def _ints(expr) -> list:
    """The ints of a Relax tuple of PrimValues or a ShapeExpr."""
    values = getattr(expr, "fields", None) or getattr(expr, "values", None) or expr
    return [int(getattr(getattr(v, "value", v), "value", getattr(v, "value", v))) for v in values]


def choose_rope_tiling(spec: RopeSpec, arch) -> RopeTiling:
    """The most positions per tile whose TILES double-buffered tiles fit half the scratchpad
    (a symbolic length's: rope_length.py)."""
    if spec.length is not None:
        return RopeTiling(rows=choose_length_rows(spec, arch, TILES, DType.from_name(spec.dtype).itemsize))
    positions, width = spec.out_shape[-2:]
    row = width * DType.from_name(spec.dtype).itemsize
    fits = [rows for rows in range(1, positions + 1)
            if positions % rows == 0 and 2 * TILES * rows * row <= arch.spad_bytes // 2]
    if not fits:
        raise ScratchpadTooSmall(f"RoPE's row of {width} elements: {2 * TILES} of them do not fit half of "
                                 f"{arch.name}'s {arch.spad_bytes}-byte scratchpad")
    return RopeTiling(rows=max(fits))


def rope_compute(spec: RopeSpec, tiling: RopeTiling):
    """The kernel's PrimFunc (lowered TIR: copies the DMA pass makes boxes, ELTWISE calls)."""
    from tvm.script import tirx as T  # noqa: F401 (the script's T)
    if spec.length is not None:
        return length_compute(spec, tiling, rope_body)
    func = tvm.script.from_source(rope_script(spec, tiling))
    table = spec.out_shape[-2:]
    views = {"cos": spec.cos_shape, "sin": spec.sin_shape}
    if any(shape != table for shape in views.values()):
        func = func.with_attr("cgra.arg_shapes", [list(views[r]) if r in views and views[r] != table else []
                                                  for r in list(spec.param_roles) + ["out"]])
    return func


def rope_script(spec: RopeSpec, tiling: RopeTiling) -> str:
    """The TVMScript text of the kernel (parameters in spec.param_roles order, then out)."""
    positions, width = spec.out_shape[-2:]
    dtype = spec.dtype
    shapes = {"lhs": spec.x_shape, "cos": (positions, width), "sin": (positions, width)}
    params = ", ".join(f"{role}: T.Buffer({_tuple(shapes[role])}, \"{dtype}\")" for role in spec.param_roles)
    lines = ["@T.prim_func", f"def rope({params}, out: T.Buffer({_tuple(spec.out_shape)}, \"{dtype}\")):",
             "    T.func_attr({\"tirx.noalias\": True})"]
    return "\n".join(lines + rope_body(spec, tiling, positions // tiling.rows)) + "\n"


def rope_body(spec: RopeSpec, tiling: RopeTiling, tiles, length: str | None = None) -> list:
    """The kernel's statements: `tiles` position tiles (an int, or the text of a symbolic count;
    then `length` names the positions, which guard every load and store of a row past them)."""
    width = spec.out_shape[-1]
    rows, h, dtype = tiling.rows, spec.half, spec.dtype
    lines, indent, position = [], "    ", []
    if not isinstance(tiles, int) or tiles > 1:
        lines.append(f"{indent}for ts in range({tiles}):")
        indent += "    "
    at = "i" if tiles == 1 else f"ts * {rows} + i"
    load = (lambda text: text) if length is None else \
        (lambda text: f"T.if_then_else({at} < {length}, {text}, T.{dtype}(0))")
    for name, role in (("c", "cos"), ("sn", "sin")):
        lines += [f"{indent}{name} = T.alloc_buffer(({rows}, {width}), \"{dtype}\", scope=\"{SPAD}\")",
                  f"{indent}for i, j in T.grid({rows}, {width}):",
                  f"{indent}    {name}[i, j] = {load(f'{role}[{at}, j]')}"]
    for axis, extent in enumerate(spec.out_shape[:-2]):
        if extent == 1:
            position.append("0")
            continue
        lines.append(f"{indent}for o{axis} in range({extent}):")
        indent += "    "
        position.append(f"o{axis}")
    position += [at, "j"]
    x_index = [""] * len(spec.x_shape)
    for axis, walked in enumerate(spec.x_axes):
        start = spec.x_origin[walked] if spec.x_origin else 0
        x_index[walked] = f"{start} + {position[axis]}" if start else position[axis]
    for name in ("xs", "t", "r", "o"):
        lines.append(f"{indent}{name} = T.alloc_buffer(({rows}, {width}), \"{dtype}\", scope=\"{SPAD}\")")
    x_read = f"lhs[{', '.join(x_index)}]"
    lines += [f"{indent}for i, j in T.grid({rows}, {width}):", f"{indent}    xs[i, j] = {load(x_read)}"]
    mul, add = int(EltwiseFunc.MULTIPLY), int(EltwiseFunc.ADD)
    lines += [f"{indent}{_eltwise(mul, dtype, rows, width, ('xs', 0), ('c', 0), ('t', 0), width)}",
              f"{indent}{_eltwise(mul, dtype, rows, width - h, ('xs', h), ('sn', 0), ('r', 0), width)}",
              f"{indent}{_eltwise(mul, dtype, rows, h, ('xs', 0), ('sn', width - h), ('r', width - h), width)}",
              f"{indent}{_eltwise(add, dtype, rows, width, ('t', 0), ('r', 0), ('o', 0), width)}",
              f"{indent}for i, j in T.grid({rows}, {width}):"]
    store = f"out[{', '.join(position)}] = o[i, j]"
    lines += [f"{indent}    {store}"] if length is None else [f"{indent}    if {at} < {length}:", f"{indent}        {store}"]
    return lines


def _eltwise(func: int, dtype: str, rows: int, cols: int, a, b, out, stride: int) -> str:
    """One ELTWISE device call in TVMScript: operands (tile, column offset), every tile's rows
    `stride` apart (docs/runtime-abi.md's cgra_eltwise)."""
    code = int(DType.from_name(dtype))
    return (f"T.call_extern(\"int32\", \"cgra_eltwise\", {func}, {code}, {rows}, {cols}, "
            f"{a[0]}.data, {a[1]}, {stride}, 1, {b[0]}.data, {b[1]}, {stride}, 1, {out[0]}.data, {out[1]}, {stride})")


def _tuple(values) -> str:
    return "(" + ", ".join(str(int(v)) for v in values) + ("," if len(values) == 1 else "") + ")"


def schedule_rope(sch, spec, tiling, arch) -> None:
    """None: the kernel is written as lowered TIR (rope_script)."""
    del sch, spec, tiling, arch


ROPE = OpFamily(name="rope", ops=("rope",), patterns=rope_patterns, spec_from_match=rope_spec,
                choose_tiling=choose_rope_tiling, compute=rope_compute, schedule=schedule_rope,
                checks_pe_dtype=False)
