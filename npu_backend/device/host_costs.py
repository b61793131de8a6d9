"""What the host's work costs: arithmetic operations per output element of every host PrimFunc,
carried in the executable for profiles to model host time with (host_calls.py).

Stage: codegen (the end of the Relax pipeline, after TVM's default build made the host PrimFuncs).
In: the built module and the chip. Out: the module with one more Relax function,
`__cgra_host_costs`, returning a JSON text: the chip's host table and NPU clock, and for each host
PrimFunc the arithmetic operations it does per element it writes, and the names of the shape
functions TVM made (which are not the model's operators) (counted from its TIR: every
add, multiply, max, comparison, select in a stored value one, a transcendental function such as
exp, erf or tanh `TRANSCENDENTAL_OPS`, times the trip counts of the loops around it; index
arithmetic is not counted). A function of the executable survives
`export_library`, so a library loaded in a fresh process models its host calls the same way.

A symbolic extent is counted at `REPRESENTATIVE_SIZE`: the ratio of operations to elements written
is what profiles use, and for the host's elementwise operators, reductions over a fixed axis and
softmaxes it does not depend on the size.
"""

from __future__ import annotations

import json
import math

import tvm
from tvm import relax, s_tir, tirx

from cgra_sim.arch import HardwareDescription

from .host_ops import HOST_ANCHOR

#: The Relax function holding the costs, and the version of its JSON layout.
HOST_COSTS = "__cgra_host_costs"
COSTS_VERSION = 1
#: The size a symbolic extent is counted at.
REPRESENTATIVE_SIZE = 64

#: Expression nodes that are one operation each (besides their operands').
_OPERATIONS = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod, tirx.Min,
               tirx.Max, tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.And, tirx.Or, tirx.Not,
               tirx.Select, tvm.ir.Call)
#: Operations a transcendental function counts as (a libm exp or erf on an Arm core: a range
#: reduction and a polynomial of about ten multiply-adds).
TRANSCENDENTAL_OPS = 10
_TRANSCENDENTAL = {f"tirx.{name}" for name in ("exp", "exp2", "exp10", "log", "log2", "log10", "log1p", "erf",
                                               "tanh", "sigmoid", "sqrt", "rsqrt", "pow", "sin", "cos", "tan",
                                               "atan", "asin", "acos", "sinh", "cosh", "atanh", "asinh", "acosh")}
_LOADS = (tvm.ir.TensorLoad,)  # a buffer load (its indices are not counted)


def with_host_costs(mod: tvm.IRModule, arch: HardwareDescription) -> tvm.IRModule:
    """`mod` with `__cgra_host_costs` (see the module docstring)."""
    costs = {"version": COSTS_VERSION, "host": arch.host_cpu, "npu_clock_mhz": arch.clock_mhz,
             "ops_per_element": host_ops_per_element(mod), "shape_functions": shape_functions(mod)}
    body = relax.SeqExpr([], relax.expr.String(json.dumps(costs, sort_keys=True)))
    func = relax.Function([], body, relax.ObjectType()).with_attr("global_symbol", HOST_COSTS)
    mod = mod.clone()
    mod[HOST_COSTS] = func
    return mod


def shape_functions(mod: tvm.IRModule) -> list[str]:
    """The PrimFuncs TVM made to compute symbolic shapes (VMShapeLower's): bookkeeping, like the
    VM's builtins, not an operator of the model."""
    return sorted(str(func.attrs.get("global_symbol", gvar.name_hint)) for gvar, func in mod.functions.items()
                  if isinstance(func, tirx.PrimFunc) and func.attrs is not None and func.attrs.get("tirx.is_host_func"))


def host_ops_per_element(mod: tvm.IRModule) -> dict[str, float]:
    """Arithmetic operations per element written, of every PrimFunc the VM calls as an operator
    (not the shape functions TVM makes, not the host anchor)."""
    ratios = {}
    for gvar, func in mod.functions.items():
        attrs = func.attrs if isinstance(func, tirx.PrimFunc) else None
        if attrs is None or attrs.get("tirx.is_host_func") or gvar.name_hint == HOST_ANCHOR:
            continue
        counter = _OpCounter()
        operations = counter.stmt(func.body)
        written = sum(counter.elements(buffer) for buffer in counter.written if buffer not in counter.local)
        ratios[str(attrs.get("global_symbol", gvar.name_hint))] = round(operations / max(written, 1), 3)
    return ratios


class _OpCounter:
    """Counts a PrimFunc's operations; remembers the buffers it stores to and those it allocates."""

    def __init__(self):
        self.analyzer = tvm.sym.Analyzer()
        self.bound = set()
        self.written = []  # the buffers it stores to (names are not unique: LegalizeOps reuses them)
        self.local = []  # the buffers the function allocates

    def stmt(self, node) -> float:
        handler = _STATEMENTS.get(type(node))
        if handler is not None:
            return handler(self, node)
        body = getattr(node, "body", None)
        return self.stmt(body) if isinstance(body, tirx.Stmt) else 0.0

    def expr(self, node) -> float:
        if isinstance(node, _LOADS) or not isinstance(node, tirx.Expr):
            return 0.0
        operands = [getattr(node, name) for name in ("a", "b", "condition", "true_value", "false_value", "value")
                    if isinstance(getattr(node, name, None), tirx.Expr)]
        operands += list(node.args) if isinstance(node, tvm.ir.Call) else []
        own = 1.0 if isinstance(node, _OPERATIONS) else 0.0
        if isinstance(node, tvm.ir.Call) and getattr(node.op, "name", "") in _TRANSCENDENTAL:
            own = float(TRANSCENDENTAL_OPS)
        return own + sum(self.expr(operand) for operand in operands)

    def size(self, expr) -> int:
        """`expr` as a number, its symbolic variables at REPRESENTATIVE_SIZE."""
        for var in tirx.analysis.undefined_vars(expr):
            if var not in self.bound:
                self.bound.add(var)
                self.analyzer.bind(var, tirx.IntImm(var.ty.dtype, REPRESENTATIVE_SIZE))
        value = self.analyzer.simplify(expr)
        return int(value.value) if hasattr(value, "value") else REPRESENTATIVE_SIZE

    def elements(self, buffer) -> int:
        return math.prod(self.size(extent) for extent in buffer.shape)


def _for(counter, node):
    return counter.size(node.extent) * counter.stmt(node.body)


def _block(counter, node):
    counter.local.extend(node.alloc_buffers)
    init = counter.stmt(node.init) if node.init is not None else 0.0
    return init + counter.stmt(node.body)


def _store(counter, node):
    if node.buffer not in counter.written:
        counter.written.append(node.buffer)
    return counter.expr(node.value)


def _allocate(counter, node):
    counter.local.append(node.buffer)
    body = getattr(node, "body", None)
    return counter.stmt(body) if isinstance(body, tirx.Stmt) else 0.0


def _if(counter, node):
    other = counter.stmt(node.else_case) if node.else_case is not None else 0.0
    return counter.expr(node.condition) + counter.stmt(node.then_case) + other


_STATEMENTS = {
    tirx.For: _for,
    tirx.SeqStmt: lambda counter, node: sum(counter.stmt(s) for s in node.seq),
    s_tir.SBlockRealize: lambda counter, node: counter.stmt(node.block),
    s_tir.SBlock: _block,
    tirx.BufferStore: _store,
    tirx.AllocBuffer: _allocate,
    tirx.DeclBuffer: _allocate,
    tirx.IfThenElse: _if,
    tirx.Evaluate: lambda counter, node: counter.expr(node.value),
}
