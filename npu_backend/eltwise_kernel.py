"""The standalone elementwise kernel: an `EltwiseSpec` -> TensorIR -> ELTWISE commands.

Stage: target hook (TE compute) and schedule. Input: an `EltwiseSpec` (eltwise.py) and its
`Tiling`. Output: the schedulable PrimFunc (blocks a_pad, b_pad: the operand tiles in the
scratchpad, zero outside the tensors: the DMA halo; elt: the function, on the vector unit; out:
the store of the valid region), then that PrimFunc tiled (tm x tn view rows x columns, any outer
view axes looping around the tiles), the operand tiles loaded by DMA per tile, one ELTWISE per
tile, the output tile stored by DMA. The lowering's double buffering overlaps the loads of the
next tile with this tile's ELTWISE and store.
"""

from __future__ import annotations

from tvm import te, tirx

from .eltwise import EltwiseSpec
from .eltwise_intrin import eltwise_value
from .intrinsics import SPAD, get_intrin
from .tiling import Tiling


def _padded(tensor, shape, indices):
    """tensor[indices], 0 outside it (ragged tiles): the guard the DMA pass turns into a halo."""
    cond = None
    for index, extent in zip(indices, shape):
        if extent > 1 or not isinstance(index, int):
            term = index < extent
            cond = term if cond is None else tirx.all(cond, term)
    value = tensor(*indices)
    return value if cond is None else tirx.if_then_else(cond, value, tirx.const(0, tensor.dtype))


def _loader(tensor, view):
    return lambda *indices: _padded(tensor, view, indices)


def _walked(indices, full):
    """The indices of an operand: 0 on the axes it is broadcast along."""
    return tuple(i if walks else 0 for i, walks in zip(indices, full))


def eltwise_compute(spec: EltwiseSpec, tiling: Tiling):
    """out = func(lhs, rhs) over the view (outer..., rows, cols), rows and columns padded to
    whole tiles (mp, np). Each operand's tile keeps extent 1 on the axes it is broadcast along."""
    padded = spec.extents[:-2] + (tiling.mp, tiling.np)
    operands = {}
    for role, name, full in (("lhs", "a_pad", spec.lhs_full), ("rhs", "b_pad", spec.rhs_full)):
        view = spec.view(role)
        tensor = te.placeholder(view, spec.dtype, name=role)
        shape = tuple(extent if walks else 1 for extent, walks in zip(padded, full))
        operands[role] = (tensor, te.compute(shape, _loader(tensor, view), name=name))
    (lhs, a_pad), (rhs, b_pad) = operands["lhs"], operands["rhs"]
    elt = te.compute(padded, lambda *i: eltwise_value(
        spec.func, a_pad(*_walked(i, spec.lhs_full)), b_pad(*_walked(i, spec.rhs_full))), name="elt")
    out = te.compute(spec.extents, lambda *i: elt(*i), name="out")
    func = te.create_prim_func([{"lhs": lhs, "rhs": rhs}[role] for role in spec.param_roles] + [out])
    caller = {"lhs": spec.lhs_shape, "rhs": spec.rhs_shape, "out": spec.output_shape}
    kernel = {role: spec.view(role) for role in caller}
    roles = list(spec.param_roles) + ["out"]
    if any(tuple(caller[role]) != tuple(kernel[role]) for role in roles):
        func = func.with_attr("cgra.arg_shapes", [list(caller[role]) for role in roles])
    return func


def schedule_eltwise(sch, spec: EltwiseSpec, tiling: Tiling, arch) -> None:
    """Tiles of tm x tn under the outer view loops; per tile the operand tiles are loaded into
    the scratchpad and one ELTWISE computes the tile on the vector unit."""
    del arch
    elt = sch.get_sblock("elt")
    *_, rows, cols = sch.get_loops(elt)
    row_outer, row_inner = sch.split(rows, [None, tiling.tm])
    col_outer, col_inner = sch.split(cols, [None, tiling.tn])
    sch.reorder(row_outer, col_outer, row_inner, col_inner)
    for name in ("a_pad", "b_pad"):
        block = sch.get_sblock(name)
        sch.compute_at(block, col_outer)
        sch.set_scope(block, 0, SPAD)
    sch.reverse_compute_at(sch.get_sblock("out"), col_outer)
    sch.set_scope(elt, 0, SPAD)
    sch.tensorize(row_inner, get_intrin("eltwise", tiling.tm, tiling.tn, spec.func, spec.dtype,
                                        spec.lhs_full[-2:], spec.rhs_full[-2:]))
