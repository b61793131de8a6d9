"""The layout family: transposes, slices, broadcasts, concatenations, pads and embedding lookups
left between NPU kernels run on the NPU's DMA engines instead of the host.

Stage: partition (its patterns and their specs) and kernel definition (copy_kernel.py). Each op
becomes a DMA-only kernel (copy_kernel.py): no arithmetic, the op's index map (index_maps.py) is
the DMA boxes' strides, origins and halos. A host call costs the host's call overhead plus its bytes
(cgra_sim/host.py) and two host/NPU crossings when it sits between kernels; the DMA moves
the same bytes at the engine's rate, its loads and stores overlapped. A reshape (and
expand_dims, squeeze, flatten) is a view in the VM and no call at all (host_calls.py).

Ops taken (static shapes or symbolic variables (`s`), of at most 4 axes once those moved alike are merged, any rank for a concat;
a static one-input copy of up to 8 (folds.py: its tensors seen through views of 4);
int8 / int32 / float32 data): permute_dims (any axis order),
strided_slice (positive steps), broadcast_to, concat (2-8 inputs), nn.pad (constant zero,
non-negative widths), a transpose of a slice (one box: a fused projection's part cut into heads,
normalise/split_slices.py), take (any axis; int32 / int64 indices, read by the kernel's control code,
each index clipped into the table), repeat (of unit axes: a broadcast). An operand may be a constant (a weight: an embedding table,
ViT's class token; constant indices are box origins fixed when compiling), but not all of them: an
op on constants alone stays on the host, where normalise folds it. The family comes last in
FAMILIES: a kernel that can take the op itself (the linear matmul's transposed weights) is tried
first.

A symbolic axis (a prefill's sequence length: the head split's transposes, RoPE's rotate_half
slices and concat, repeat_kv's repeat) is held at its bound in the spec (`symbols` name it), never
merged with another axis, and must be copied whole (`_check_walks`: not sliced, padded or
broadcast along it); the kernel's tile loop along it runs ceildiv(length, tile) tiles, its boxes
guarded by the length (the DMA's halo), and lower/ragged.py cuts the last tile's boxes to the
length. permute_dims, strided_slice (along static axes), concat (along a static axis) and repeat
take one; broadcast_to does not (TVM 0.27 gives its offloaded result no shape: normalise writes a
unit-axis broadcast as repeat, no_op_broadcasts.py); take takes a symbolic number of indices
(symbolic_take.py).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.dpl import is_op, is_tuple, wildcard

from cgra_sim.host import host_call_cycles
from cgra_sim.isa import DType

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of, expression_name, shape_dims
from ..common.dynamic import bound_of
from ..family import OpFamily
from .cache_write import PATTERNS as CACHE_WRITES, cache_write_patterns, cache_write_spec, write_func, write_tiling
from .copy_build import copy_func
from .copy_kernel import Gather, LayoutTiling, Piece, choose_splits, copy_script, gather_rows, parse_script
from .folds import MAX_AXES, fold_input, fold_output
from .index_maps import READERS, concat_views, kept_names, symbolic_concat_views
from .symbolic_take import symbolic_gather_rows, symbolic_take_parts

DTYPES = ("int8", "int32", "float32", "bfloat16", "float16")  # what the DMA moves (isa.DType)
MAX_RANK = 4  # the DMA's tensors
MAX_CONCAT = 8
#: The ops copied with a symbolic axis (moved whole: its DMA boxes cut to the length, lower/ragged.py).
#: Not broadcast_to: its target shape is a parameter of the offloaded function, whose result then
#: has no shape, and TVM 0.27's call_tir lowering cannot allocate it ("call_tir expects all
#: TensorType has shape").
SYMBOLIC_OPS = ("permute_dims", "strided_slice", "concat", "repeat")
_OPS = {"relax.permute_dims": "permute_dims", "relax.strided_slice": "strided_slice",
        "relax.broadcast_to": "broadcast_to", "relax.nn.pad": "pad", "relax.take": "take",
        "relax.concat": "concat", "relax.repeat": "repeat"}


@dataclasses.dataclass(frozen=True)
class LayoutSpec:
    """A layout copy: the output, and what each input (by role) contributes to it."""

    op: str
    dtype: str
    in_shapes: tuple  # ((role, shape, dtype), ...) in role order
    out_shape: tuple
    pieces: tuple = ()
    gather: Gather | None = None
    views: tuple = ()  # ((role, caller shape), ...): a lookup's operands read as (P, V, Q), (N,), (P, N, Q)
    param_roles: tuple = ("lhs",)
    symbols: tuple = ()  # ((role, axis of its kernel shape, variable name), ...): symbolic axes ("out" too)
    caller_symbols: tuple = ()  # the same for the caller's shapes (`views`)
    source_ops: tuple = ()
    shape_args: tuple = ()
    write: object = None  # a KV cache's row(s) written in place (cache_write.py's RowWrite, RowsWrite)
    out_groups: tuple = ()  # the piece's axes in each dimension of `out_shape`, a view of fewer (folds.py)
    macs = 0
    acc_dtype = property(lambda self: self.dtype)


def layout_patterns() -> list:
    """One pattern per op (a concat per number of inputs), each input annotated with its role."""
    entries = []
    for op in ("permute_dims", "strided_slice", "broadcast_to", "nn.pad", "repeat"):
        x = wildcard()
        root = is_op(f"relax.{op}")(x, varg_default_wildcard=True)
        entries.append((f"cgra.{op.replace('nn.', '')}", root, {"root": root, "lhs": x}))
    x = wildcard()  # a transpose of a slice (a fused q / k / v projection's part): one box
    sliced = is_op("relax.strided_slice")(x, varg_default_wildcard=True)
    root = is_op("relax.permute_dims")(sliced)
    entries.insert(0, ("cgra.permute_dims_sliced", root, {"root": root, "lhs": x, "slice": sliced}))
    table, indices = wildcard(), wildcard()
    root = is_op("relax.take")(table, indices)
    entries.append(("cgra.take", root, {"root": root, "lhs": table, "rhs": indices}))
    for count in range(2, MAX_CONCAT + 1):
        inputs = [wildcard() for _ in range(count)]
        root = is_op("relax.concat")(is_tuple(inputs))
        entries.append((f"cgra.concat{count}", root, {"root": root, **{f"in{i}": x for i, x in enumerate(inputs)}}))
    return entries + cache_write_patterns()


def layout_spec(name: str, annotated: dict) -> LayoutSpec:
    """The copy kernel a matched layout op becomes; raises UnsupportedOperator with the reason."""
    call = annotated["root"]
    if name in CACHE_WRITES:
        return LayoutSpec(**cache_write_spec(name, annotated))
    op = _OPS[call.op.name]
    out_shape, out_names = _shape(call, f"{op}'s result")
    dtype = dtype_of(call)
    if dtype not in DTYPES:
        raise UnsupportedOperator(f"{op} of {dtype or 'an unknown dtype'}: the NPU's DMA moves {', '.join(DTYPES)}")
    sliced = annotated.get("slice")
    operands = _operands(op, call) if sliced is None else {"lhs": sliced.args[0]}
    roles = tuple(operands)
    if all(isinstance(operand, tvm.ir.GenericConst) for operand in operands.values()):
        raise UnsupportedOperator(f"{op} of constants: normalise folds it, no kernel copies it at run time")
    read = {role: _shape(operand, f"{op}'s operand", scalar=role == "rhs") for role, operand in operands.items()}
    in_shapes = tuple((role, read[role][0], dtype_of(operand)) for role, operand in operands.items())
    names = {"out": out_names, **{role: read[role][1] for role in roles}}
    symbolic = any(names.values())
    if symbolic and op == "take":  # a symbolic number of indices (a prompt's token ids: symbolic_take.py)
        gather, views, symbols, callers = symbolic_take_parts(call, in_shapes, out_shape, names, READERS["take"])
        return LayoutSpec(op, dtype, in_shapes, out_shape, (), gather, views, param_roles=roles, symbols=symbols,
                          caller_symbols=callers)
    if symbolic and op not in SYMBOLIC_OPS:
        why = {"broadcast_to": " (TVM 0.27 gives an offloaded broadcast_to of a symbolic shape no result shape to "
                                "allocate; normalise writes a broadcast of unit axes as repeat)",
}.get(op, "")
        raise UnsupportedOperator(f"{op} with a symbolic dimension: the NPU's layout copies take one in "
                                  f"{', '.join(SYMBOLIC_OPS)} only{why}")
    reader = READERS[op]
    pieces, gather, views = reader(call, in_shapes, out_shape)
    if sliced is not None:
        pieces = [_through_slice(pieces[0], sliced, in_shapes)]
    if op == "concat":
        axis = int(call.attrs.axis) % len(out_shape)
        if symbolic:
            in_shapes, out_shape, pieces, views, names = symbolic_concat_views(axis, in_shapes, out_shape, names)
        else:
            in_shapes, out_shape, pieces, views = concat_views(axis, in_shapes, out_shape)
    groups = ()
    if len(pieces) == 1 and op != "concat":  # one input: its view and the output's made compact
        (role, shape, kind), = in_shapes
        if symbolic:
            _check_walks(op, pieces[0], names[role], names["out"])
        fixed = (set(names[role]), set(names["out"]))
        compact_in, compact_out, piece, kept = compact(pieces[0], shape, out_shape, fixed)
        if not symbolic and MAX_RANK < max(len(compact_in), len(compact_out)) <= MAX_AXES:
            compact_in, piece = fold_input(piece, compact_in, MAX_RANK, op)
            compact_out, groups = fold_output(compact_out, MAX_RANK)
        views = tuple((r, caller) for r, caller, view in ((role, shape, compact_in), ("out", out_shape, compact_out))
                      if caller != view)
        names = {**names, role: kept_names(names[role], kept[0]), "out": kept_names(names["out"], kept[1])}
        in_shapes, out_shape, pieces = ((role, compact_in, kind),), compact_out, [piece]
    for _, shape, _ in in_shapes if gather is None else ():  # a lookup reads (P, V, Q) views
        if len(shape) > MAX_RANK or len(out_shape) > MAX_RANK:
            raise UnsupportedOperator(f"{op} of {shape} into {out_shape}: more than {MAX_AXES if len(pieces) == 1 else MAX_RANK} "
                                      f"axes after merging those it moves alike, and the NPU's DMA moves tensors of "
                                      f"rank 1..{MAX_RANK}")
    symbols = tuple((role, axis, var) for role in (*roles, "out") for axis, var in sorted(names.get(role, {}).items()))
    callers = tuple((role, axis, var) for role in (*roles, "out") for axis, var in sorted(read.get(role, (0, out_names))[1].items())
                    if role in dict(views))
    return LayoutSpec(op, dtype, in_shapes, out_shape, tuple(pieces), gather, tuple(views), param_roles=tuple(roles),
                      symbols=symbols, caller_symbols=callers, out_groups=groups)


def _check_walks(op: str, piece: Piece, in_names: dict, out_names: dict) -> None:
    """A symbolic axis is copied whole, not sliced, padded or broadcast: each symbolic output
    axis walks the input axis of the same variable at step 1 from 0, so that the DMA boxes along
    it are cut to the length alike (lower/ragged.py)."""
    walked = {}
    for axis, (source, step) in enumerate(piece.walks):
        if axis in out_names:
            if source < 0 or step != 1 or in_names.get(source) != out_names[axis] or piece.origin[source] != 0 \
                    or source in piece.guarded:
                raise UnsupportedOperator(f"{op} along a symbolic axis of length {out_names[axis]} that it does not "
                                          "copy whole: the NPU's layout copies move a symbolic axis as it is")
            walked[source] = axis
    if set(walked) != set(in_names):
        raise UnsupportedOperator(f"{op} of a symbolic axis into a static one: the NPU's layout copies move a "
                                  "symbolic axis as it is")


def compact(piece: Piece, in_shape: tuple, out_shape: tuple, fixed: tuple = (set(), set())) -> tuple:
    """(input view, output view, the piece over them, (the input axis of each input view axis,
    the output axis of each output view axis)): axes of extent 1 that carry nothing dropped, and
    neighbouring output axes that walk neighbouring input axes whole, in order and unguarded (or
    that both broadcast) merged; a Swin window partition's rank-6 transpose is one of rank 3 or 4.
    `fixed` (input axes, output axes) are never merged (symbolic ones: their extent is the bound)."""
    fixed_in, fixed_out = fixed
    outs = [[e, *w, a] for a, (e, w) in enumerate(zip(out_shape, piece.walks))
            if e != 1 or a in fixed_out]  # [extent, input axis, step, output axis]
    walked = {axis for _, axis, step, _ in outs if step}
    ins = [[e, o, d in piece.guarded, d] for d, (e, o) in enumerate(zip(in_shape, piece.origin))
           if not (e == 1 and o == 0 and d not in piece.guarded and d not in walked and d not in fixed_in)]
    merged = True
    while merged:
        merged = False
        for a in range(len(outs) - 1):
            (e1, d1, s1, o1), (e2, d2, s2, o2) = outs[a], outs[a + 1]
            if o1 in fixed_out or o2 in fixed_out or d1 in fixed_in or d2 in fixed_in:
                continue
            if s1 == s2 == 0:
                outs[a:a + 2] = [[e1 * e2, -1, 0, -1]]
                merged = True
                break
            pos = [i for i, entry in enumerate(ins) if entry[3] in (d1, d2)]
            if s1 != 1 or s2 != 1 or len(pos) != 2 or pos[1] != pos[0] + 1 or ins[pos[0]][3] != d1:
                continue
            first, second = ins[pos[0]], ins[pos[1]]
            if second[1] != 0 or second[0] != e2 or first[2] or second[2]:
                continue
            ins[pos[0]:pos[1] + 1] = [[first[0] * second[0], first[1] * second[0], False, d1]]
            outs[a:a + 2] = [[e1 * e2, d1, 1, -1]]
            merged = True
            break
    position = {entry[3]: i for i, entry in enumerate(ins)}
    walks = tuple((position[d], step) if step else (-1, 0) for _, d, step, _ in outs) or ((-1, 0),)
    out_view = tuple(e for e, _, _, _ in outs) or (1,)
    in_view = tuple(e for e, _, _, _ in ins) or (1,)
    origin = tuple(o for _, o, _, _ in ins) or (0,)
    guarded = tuple(i for i, entry in enumerate(ins) if entry[2])
    kept = ([entry[3] for entry in ins], [entry[3] for entry in outs])
    return in_view, out_view, Piece(piece.role, (0,) * len(out_view), out_view, walks, origin, guarded), kept


def _operands(op: str, call) -> dict:
    """Role -> operand, read from the call itself (a pattern's roles, explain's guess alike)."""
    if op == "concat":
        fields = getattr(call.args[0], "fields", None)
        if fields is None or not 2 <= len(fields) <= MAX_CONCAT:
            raise UnsupportedOperator(f"concat of {len(fields) if fields else 'a tuple variable of'} tensors: the NPU's "
                                      f"copy takes 2..{MAX_CONCAT} listed inputs")
        if any(a.same_as(b) for i, a in enumerate(fields) for b in fields[i + 1:]):
            raise UnsupportedOperator("concat of a tensor with itself: each input of the NPU's copy is its own tensor")
        return {f"in{i}": field for i, field in enumerate(fields)}
    if op == "take":
        return {"lhs": call.args[0], "rhs": call.args[1]}
    return {"lhs": call.args[0]}


def _shape(expr, what: str, scalar: bool = False) -> tuple[tuple, dict]:
    """(the shape of an operand, a symbolic axis at its bound; {axis: variable name}) (`scalar`: a
    lookup's one index may be a scalar). A symbolic dimension must be a variable (`s`, not `s + 1`)."""
    dims = shape_dims(expr)
    if dims is None and isinstance(expr, relax.Call) and expr.op.name == "relax.broadcast_to":
        target = expr.args[1]  # a ShapeExpr, or (in an offloaded function) a parameter of shape type
        values = getattr(target, "values", None) or getattr(getattr(target, "ty", None), "values", None) or ()
        dims = [int(d.value) if isinstance(d, tirx.IntImm) else d for d in values] or None
    if dims is None or any(not isinstance(d, (int, tirx.Var)) for d in dims):
        raise UnsupportedOperator(f"{what} has an unknown shape or one of symbolic expressions "
                                  f"({dims and [expression_name(d) if not isinstance(d, int) else d for d in dims]}): "
                                  "the NPU's layout copies take static shapes and symbolic variables")
    if (not dims and not scalar) or 0 in dims:
        raise UnsupportedOperator(f"{what} of shape {tuple(dims)}: the NPU's DMA moves non-empty tensors")
    names = {axis: d.name for axis, d in enumerate(dims) if not isinstance(d, int)}
    return tuple(d if isinstance(d, int) else bound_of(d.name) for d in dims), names


def _through_slice(piece: Piece, sliced, in_shapes) -> Piece:
    """`piece` (a transpose of the slice's result) as a piece of the slice's operand: each
    output axis walks the operand's axis the slice's axis walks, at its step, from its origin."""
    inner, = READERS["strided_slice"](sliced, in_shapes, _shape(sliced, "strided_slice's result")[0])[0]
    walks = tuple(inner.walks[axis] if step else (-1, 0) for axis, step in piece.walks)
    return Piece(piece.role, piece.offset, piece.extent, walks, inner.origin)


def choose_layout_tiling(spec: LayoutSpec, arch) -> LayoutTiling:
    """The fastest tiles (copy_kernel.choose_splits, gather_rows); refused when the host's copy
    is estimated faster (its call overhead and bytes, arch's host table, at the NPU's clock)."""
    size = DType.from_name(spec.dtype).itemsize
    if spec.write is not None:  # in place: the host would copy the whole cache
        return write_tiling(arch, spec.write, size)
    if spec.gather is not None:
        if spec.symbols:  # a prompt of any length: tiles of rows after a first tile of `head` (symbolic_take.py)
            rows, head, cycles = symbolic_gather_rows(arch, spec.gather, size)
        else:
            (rows, cycles), head = gather_rows(arch, spec.gather, size), 0
        tiling = LayoutTiling(rows=rows, cycles=cycles, head=head)
    else:
        chosen, cycles = choose_splits(arch, spec.pieces, size, tuple(a for r, a, _ in spec.symbols if r == "out"))
        tiling = LayoutTiling(splits=chosen, cycles=cycles)
    host = _host_cycles(spec, arch)
    if tiling.cycles >= host:
        raise UnsupportedOperator(f"{spec.op} of {spec.out_shape}: the host copies it faster ({host} cycles at the NPU's "
                                  f"clock against the DMA's {tiling.cycles}, {arch.name})")
    return tiling


def _host_cycles(spec: LayoutSpec, arch) -> int:
    """What the host call would cost at the NPU's clock (cgra_sim/host.py): its overhead and the
    bytes of its tensors (a lookup's table whole, as host_calls.py counts it)."""
    nbytes = sum(math.prod(shape) * np.dtype(dtype).itemsize for _, shape, dtype in spec.in_shapes)
    nbytes += math.prod(spec.out_shape) * np.dtype(spec.dtype).itemsize
    return round(host_call_cycles(arch.host_cpu, 0, nbytes) * arch.clock_mhz / arch.host_cpu["clock_mhz"])


def layout_compute(spec: LayoutSpec, tiling: LayoutTiling):
    """The copy kernel's PrimFunc (copy_kernel.py), parameters in `spec.param_roles` order."""
    shapes = {role: (shape, dtype) for role, shape, dtype in spec.in_shapes}
    if spec.write is not None:
        return write_func(spec, tiling)
    params, out_shape = [], spec.out_shape
    if spec.gather is not None:
        g = spec.gather
        shapes = {"lhs": (g.table, spec.dtype), "rhs": (() if g.scalar else (g.count,), shapes["rhs"][1])}
        out_shape = (g.table[0], g.count, g.table[2])
    params = [(role, *shapes[role]) for role in spec.param_roles]  # a constant operand is no parameter
    symbolic = {(role, axis): name for role, axis, name in spec.symbols}
    if symbolic:
        func = parse_script(copy_script(params, out_shape, spec.dtype, spec.pieces, tiling, spec.gather, symbolic,
                                        spec.out_groups))
    else:  # built (copy_build.py): no text parsed
        func = copy_func(params, out_shape, spec.dtype, spec.pieces, tiling, spec.gather, spec.out_groups)
    if spec.views:  # the caller's shapes of the operands read through a view (operands.prim_func)
        variables = {extent.name: extent for param in func.params for extent in param.ty.shape
                     if isinstance(extent, tirx.Var)}  # the script's own: the code generator compares them
        named = {(role, axis): variables[name] for role, axis, name in spec.caller_symbols}
        callers = {role: [named.get((role, axis), extent) for axis, extent in enumerate(shape)]
                   for role, shape in spec.views}
        func = func.with_attr("cgra.arg_shapes", [list(callers.get(role, ())) for role in list(spec.param_roles) + ["out"]])
    if spec.gather is not None and spec.gather.constants is None:
        func = func.with_attr("cgra.read_params", [list(spec.param_roles).index("rhs")])
    return func


def schedule_layout(sch, spec, tiling, arch) -> None:
    """None: the kernel is written as lowered TIR (copy_kernel.py)."""
    del sch, spec, tiling, arch


LAYOUT = OpFamily(name="layout", ops=tuple(READERS) + ("cache_write", "cache_rows"), patterns=layout_patterns, spec_from_match=layout_spec,
                  choose_tiling=choose_layout_tiling, compute=layout_compute, schedule=schedule_layout,
                  host_ops={**{op: f"cgra.{name}" + ("2" if name == "concat" else "") for op, name in _OPS.items()},
                            "relax.scatter_elements": CACHE_WRITES[0],
                            "relax.slice_scatter": CACHE_WRITES[1]},
                  checks_pe_dtype=False)
