"""The row-reduction family: sum, mean and max along the last axis on the vector unit.

Stage: partition (its patterns and spec), kernel definition, tiling and schedule. Input: a Relax
`sum`, `mean` or `max` of a float32 tensor of rank 1..4 (static, or one symbolic leading axis
as the rows), over its last axis
(keepdims or not). Per tile of whole rows (rows.py) one REDUCE folds each row left to right
into a column (after a FILL of 0 or -inf), a mean then one VFUNC multiply by 1 / n. A sum or
max times a one-element float32 constant c (`cgra.row_{sum,max}_scaled`) is the same kernel with a
VFUNC multiply by c: one rounding, as the multiply's (masks.py's padding row: the max of an int64's
words' flags times 4, which overflows -2^127 to -inf; the multiply was a kernel of its own). The sum is
sequential float32: within (n - 1) * 2^-24 relative of the exact sum of |x| (the usual bound of
recursive summation); max is exact.
"""

from __future__ import annotations

import numpy as np
from tvm.relax.dpl import is_const, is_op, wildcard

from ...errors import UnsupportedOperator
from ..common.chains import SCALED_MARK
from ...relax_info import shape_dims
from ..common.unary import single_op_patterns
from ..family import OpFamily
from .rows import RowSpec, Step, choose_row_tiling, last_axis, read_rows, row_compute, schedule_rows

OPS = {"relax.sum": "sum", "relax.mean": "mean", "relax.max": "max"}
SCALED = SCALED_MARK  # bound inside the kernel as an immediate (partition/scalar_args.py)


def steps_of(spec: RowSpec) -> tuple:
    """One REDUCE (a max or a sum), and for a mean a VFUNC multiply of the column by 1 / n, for a
    scaled sum or max by its constant."""
    fold = Step("folded", "reduce", "max" if spec.kind == "max" else "sum", ("x",))
    scale = 1.0 / spec.cols if spec.kind == "mean" else spec.scale
    return (fold, Step("reduced", "vfunc", "identity", ("folded",), scale)) if scale is not None else (fold,)


def _patterns() -> list:
    """multiply(sum or max, a constant) first (one kernel), then each reduction alone."""
    scaled = []
    for op, kind in OPS.items():
        if kind != "mean":
            x, scale = wildcard(), is_const()
            reduced = is_op(op)(x)
            root = is_op("relax.multiply")(reduced, scale)
            scaled.append((f"cgra.row_{kind}{SCALED}", root, {"root": root, "reduced": reduced, "lhs": x,
                                                                "scale": scale}))
    return scaled + single_op_patterns({f"cgra.row_{kind}": op for op, kind in OPS.items()})


def _scale_of(annotated: dict, kind: str) -> float:
    """The one-element float32 constant of a scaled reduction (not 1: TVM would fold it away)."""
    value = annotated["scale"].value.numpy()
    if value.size != 1 or value.dtype != np.float32 or value.reshape(()) == 1 or not np.isfinite(value).all():
        raise UnsupportedOperator(f"{kind} times {value.dtype} {value.shape}: the row kernel scales by one finite "
                                  "float32 other than 1")
    return float(value.reshape(()))


def reduce_spec(name: str, annotated: dict) -> RowSpec:
    """The RowSpec of a sum, mean or max over the last axis (axis None: of a vector)."""
    kind = name.removeprefix("cgra.row_").removesuffix(SCALED)
    scale = _scale_of(annotated, kind) if name.endswith(SCALED) else None
    x, root = annotated["lhs"], annotated.get("reduced", annotated["root"])
    # A sum or max over a row of symbolic length too (a mask's rows); a mean's 1 / n is static.
    shape, rows, cols, symbols = read_rows(x, kind, symbolic_row=kind != "mean")
    if root.attrs.axis is None:
        if len(shape) != 1:
            raise UnsupportedOperator(f"{kind} over all axes: the NPU's row kernels reduce the last axis only")
    else:
        last_axis([int(a) for a in root.attrs.axis], len(shape), kind)
    out_shape = shape[:-1] + (1,) if len(shape_dims(root)) == len(shape) else shape[:-1]
    if not out_shape:
        raise UnsupportedOperator(f"{kind} of a vector to a scalar: the NPU's DMA stores tensors of rank 1..4 "
                                  "(keepdims=True keeps it on the NPU)")
    ops = (kind,) + (("multiply",) if scale is not None else ())
    return RowSpec("row_reduce", kind, shape, out_shape, rows, cols, source_ops=ops, symbols=symbols, scale=scale)


def reduce_compute(spec: RowSpec, tiling):
    """rows.row_compute of the reduction's steps, the output a column."""
    return row_compute(spec, tiling, steps_of(spec), spec.out_shape)


ROW_REDUCE = OpFamily(
    name="row_reduce", ops=("row_reduce",), patterns=_patterns, spec_from_match=reduce_spec,
    choose_tiling=lambda spec, arch: choose_row_tiling(spec, arch, steps_of(spec)), compute=reduce_compute,
    schedule=lambda sch, spec, tiling, arch: schedule_rows(sch, spec, tiling, steps_of(spec)),
    # A mean's host call is explained by pool.py's pattern (a spatial mean), which comes first.
    host_ops={op: f"cgra.row_{kind}" for op, kind in OPS.items() if kind != "mean"}, checks_pe_dtype=False)
