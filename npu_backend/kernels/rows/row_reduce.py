"""The row-reduction family: sum, mean and max along the last axis on the vector unit.

Stage: partition (its patterns and spec), kernel definition, tiling and schedule. Input: a Relax
`sum`, `mean` or `max` of a float32 tensor of rank 1..4 (static, or one symbolic leading axis
as the rows), over its last axis
(keepdims or not). Per tile of whole rows (rows.py) one REDUCE folds each row left to right
into a column (after a FILL of 0 or -inf), a mean then one VFUNC multiply by 1 / n. The sum is
sequential float32: within (n - 1) * 2^-24 relative of the exact sum of |x| (the usual bound of
recursive summation); max is exact.
"""

from __future__ import annotations

from ...errors import UnsupportedOperator
from ...relax_info import shape_dims
from ..common.unary import single_op_patterns
from ..family import OpFamily
from .rows import RowSpec, Step, choose_row_tiling, last_axis, read_rows, row_compute, schedule_rows

OPS = {"relax.sum": "sum", "relax.mean": "mean", "relax.max": "max"}


def steps_of(spec: RowSpec) -> tuple:
    """One REDUCE (a max or a sum), and for a mean a VFUNC multiply of the column by 1 / n."""
    fold = Step("folded", "reduce", "max" if spec.kind == "max" else "sum", ("x",))
    return (fold, Step("reduced", "vfunc", "identity", ("folded",), 1.0 / spec.cols)) if spec.kind == "mean" \
        else (fold,)


def _patterns() -> list:
    return single_op_patterns({f"cgra.row_{kind}": op for op, kind in OPS.items()})


def reduce_spec(name: str, annotated: dict) -> RowSpec:
    """The RowSpec of a sum, mean or max over the last axis (axis None: of a vector)."""
    kind = name.removeprefix("cgra.row_")
    x, root = annotated["lhs"], annotated["root"]
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
    return RowSpec("row_reduce", kind, shape, out_shape, rows, cols, source_ops=(kind,), symbols=symbols)


def reduce_compute(spec: RowSpec, tiling):
    """rows.row_compute of the reduction's steps, the output a column."""
    return row_compute(spec, tiling, steps_of(spec), spec.out_shape)


ROW_REDUCE = OpFamily(
    name="row_reduce", ops=("row_reduce",), patterns=_patterns, spec_from_match=reduce_spec,
    choose_tiling=lambda spec, arch: choose_row_tiling(spec, arch, steps_of(spec)), compute=reduce_compute,
    schedule=lambda sch, spec, tiling, arch: schedule_rows(sch, spec, tiling, steps_of(spec)),
    # A mean's host call is explained by pool.py's pattern (a spatial mean), which comes first.
    host_ops={op: f"cgra.row_{kind}" for op, kind in OPS.items() if kind != "mean"}, checks_pe_dtype=False)
