"""Which columns of RoPE's tables rotate nothing, read where the tables are constants.

Stage: partition (after scalar_args.py; kept beside the kernel whose spec reads it: the kernels
layer may read partition's helpers, not the other way). In: a module whose offloaded functions include linears
with RoPE in their epilogue (patterns "cgra.*_rope": kernels/gemm/rope_epilogue.py), called with
their cos / sin tables as arguments (constants of the caller, or views of them at a symbolic
length: `bind_constants=False` leaves the kernel only their parameters). Out: each such function
with attribute ROPE_PASS_COLUMNS [first, columns, ...]: the runs of table columns where C = 1 and
S = 0 at every call site (identical layers share one function), which the kernel's spec reads
(rope_epilogue.with_pass_columns) and its tiles wholly inside skip (lower/rope_skips.py).

Why: GPT-NeoX rotates a quarter of each q and k head and none of v, yet every tile of its q / k / v
kernel multiplied by tables of ones and zeros (four of a head's six 8-column tiles on cgra-8x8).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ...errors import UnsupportedOperator
from ...partition.composite import composite_call, composite_name, matched_roles
from ...partition.scalar_args import _calls_of
from ..registry import entries_named
from .rope_epilogue import ROPE_PASS_COLUMNS, is_rope_pattern, passing_columns, table_runs


def mark_pass_columns(mod):
    """`mod` with each RoPE kernel's function given its pass-through columns (module doc)."""
    rope = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function) and (func.attrs or {}).get("Codegen") == "cgra":
            try:
                if is_rope_pattern(composite_name(func)):
                    rope[gvar] = func
            except UnsupportedOperator:  # a user's PrimFunc (call_tir.py)
                continue
    bound = {}  # a caller's variable -> its value (a symbolic length's tables are views bound there)
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and (func.attrs or {}).get("Codegen") != "cgra":
            bound.update(relax.analysis.get_var2val(func))
    for gvar, sites in _calls_of(mod, list(rope)).items():
        positions = _table_positions(rope[gvar])
        passing = None
        for call in sites:
            tables = [_constant(call.args[i], bound) if i is not None and i < len(call.args) else None
                      for i in positions]
            flags = passing_columns(*tables)
            if flags is None or passing is not None and passing.shape != flags.shape:
                passing = None
                break
            passing = flags if passing is None else passing & flags
        runs = table_runs(passing) if passing is not None and sites else ()
        if runs:
            mod[gvar] = rope[gvar].with_attr(ROPE_PASS_COLUMNS, [v for run in runs for v in run])
    return mod


def _table_positions(func) -> list:
    """The indices of the cos and sin tables among `func`'s parameters (None where a table is no
    parameter: the composite passes the function's parameters in order, scalar_args.py dropped
    the bound ones from both)."""
    composite, _ = composite_call(func)
    annotated = matched_roles(func, [(e.pattern, e.annotations) for e in entries_named(composite_name(func))])
    positions = []
    for role in ("cos", "sin"):
        table = annotated.get(role)
        if isinstance(table, relax.Call) and getattr(table.op, "name", "") == "relax.memory.view":
            table = table.args[0]  # a symbolic length's view of the table's first rows
        found = [i for i, param in enumerate(composite.params) if table is not None and param.same_as(table)]
        positions.append(found[0] if found else None)
    return positions


def _constant(arg, bound):
    """The constant `arg` is, or is a view of the first rows of (through the caller's bindings:
    every row of it then, a superset of the rows that run), else None."""
    arg = bound.get(arg, arg) if isinstance(arg, relax.Var) else arg
    if isinstance(arg, relax.Call) and getattr(arg.op, "name", "") == "relax.memory.view":
        arg = arg.args[0]
        arg = bound.get(arg, arg) if isinstance(arg, relax.Var) else arg
    return arg.value.numpy() if isinstance(arg, tvm.ir.GenericConst) else None
