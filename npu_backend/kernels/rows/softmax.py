"""The softmax family: softmax over the last axis on the vector unit, rows in the scratchpad.

Stage: partition (its pattern and spec), kernel definition, tiling and schedule. Input: a Relax
`nn.softmax` of a float32 tensor of rank 1..4 over its last axis, static or with one symbolic
leading axis among the rows and a row of symbolic length (attention's (1, H, s, s) scores: rows.py;
the normalise rewrites turn torch SDPA's safe-softmax plumbing into it). Per tile of whole rows (rows.py): REDUCE max, ELTWISE x - max (the column
broadcast), VFUNC exp, REDUCE sum, VFUNC reciprocal of the column, ELTWISE multiply:
max-subtracted, so no exp overflows; a masked -inf entry gives exp(-inf) = 0 exactly; a row
that is all -inf gives NaN, as PyTorch's softmax does. Measured within 2e-6 relative of float64
(tests/test_row_kernels.py asserts 4e-6). A row too long for the scratchpad runs in three passes
over column tiles (rows_long.py: max, exp and its sum, the output).
"""

from __future__ import annotations

from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ..family import OpFamily
from .rows import RowSpec, Step, choose_row_tiling, last_axis, read_rows, row_compute, schedule_rows

STEPS = (
    Step("row_max", "reduce", "max", ("x",)),
    Step("shifted", "eltwise", "subtract", ("x", "row_max")),
    Step("exps", "vfunc", "exp", ("shifted",)),
    Step("row_sum", "reduce", "sum", ("exps",)),
    Step("inverse", "vfunc", "reciprocal", ("row_sum",)),
    Step("softmax", "eltwise", "multiply", ("exps", "inverse")),
)


def _patterns() -> list:
    x = wildcard()
    root = is_op("relax.nn.softmax")(x)
    return [("cgra.softmax", root, {"root": root, "lhs": x})]


def softmax_spec(name: str, annotated: dict) -> RowSpec:
    """The RowSpec of a softmax over the last axis; raises UnsupportedOperator saying why not."""
    x, root = annotated["lhs"], annotated["root"]
    shape, rows, cols, symbols = read_rows(x, "softmax", symbolic_row=True)
    last_axis(int(root.attrs.axis), len(shape), "softmax")
    if cols < 1:
        raise UnsupportedOperator("softmax of an empty row")
    return RowSpec("softmax", "softmax", shape, shape, rows, cols, source_ops=("nn.softmax",), symbols=symbols)


def softmax_compute(spec: RowSpec, tiling):
    """rows.row_compute of the softmax's steps."""
    return row_compute(spec, tiling, STEPS, spec.out_shape)


SOFTMAX = OpFamily(
    name="softmax", ops=("softmax",), patterns=_patterns, spec_from_match=softmax_spec,
    choose_tiling=lambda spec, arch: choose_row_tiling(spec, arch, STEPS), compute=softmax_compute,
    schedule=lambda sch, spec, tiling, arch: schedule_rows(sch, spec, tiling, STEPS),
    host_ops={"relax.nn.softmax": "cgra.softmax"}, checks_pe_dtype=False)
