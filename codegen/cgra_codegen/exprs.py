"""Lowering of TIR expressions to LLVM values (stage: codegen).

In: a scalar TIR expression and the kernel state (values of variables, buffer bindings). Out: an
LLVM value of the expression's own dtype (`llvm_types.llvm_type`; bool is i1). One short method
per node kind, found through `_table`; integer division follows TIR: Div/Mod truncate,
FloorDiv/FloorMod round towards negative infinity.
"""

from __future__ import annotations

import functools

import llvmlite.ir as ir
import tvm
from tvm import tirx

from .context import KernelState
from .errors import UnsupportedNode
from .llvm_types import I1, cast_value, int_arith, is_float, is_signed, llvm_type

BUFFER_DATA_OP = "tirx.buffer_data"

_ARITH = {tirx.Add: ("add", "fadd"), tirx.Sub: ("sub", "fsub"), tirx.Mul: ("mul", "fmul")}
_BITWISE = {tirx.BitwiseAnd: "and_", tirx.BitwiseOr: "or_", tirx.BitwiseXor: "xor",
            tirx.LShift: "shl"}
_COMPARE = {tirx.EQ: "==", tirx.NE: "!=", tirx.LT: "<", tirx.LE: "<=", tirx.GT: ">",
            tirx.GE: ">="}


def dtype_of(expr) -> str:
    return str(expr.ty)


def op_name(call) -> str:
    return str(call.op.name) if hasattr(call.op, "name") else str(call.op)


def is_buffer_data(expr) -> bool:
    return isinstance(expr, tvm.ir.Call) and op_name(expr) == BUFFER_DATA_OP


class ExprLowering:
    def __init__(self, state: KernelState):
        self.state = state
        self._table = {
            tirx.IntImm: self._int_imm, tirx.FloatImm: self._float_imm, tirx.Var: self._var,
            tirx.Div: self._div, tirx.Mod: self._mod, tirx.FloorDiv: self._floordiv,
            tirx.FloorMod: self._floormod, tirx.Min: self._min, tirx.Max: self._max,
            tirx.And: self._and, tirx.Or: self._or, tirx.Not: self._not,
            tirx.BitwiseNot: self._bitwise_not, tirx.RShift: self._rshift,
            tirx.Select: self._select, tirx.Cast: self._cast, tirx.Let: self._let,
            tvm.ir.TensorLoad: self._load, tvm.ir.Call: self._call,
        }
        for kind, ops in _ARITH.items():
            self._table[kind] = functools.partial(self._arith, ops)
        for kind, op in _BITWISE.items():
            self._table[kind] = functools.partial(self._bitwise, op)
        for kind, op in _COMPARE.items():
            self._table[kind] = functools.partial(self._compare, op)
        self._calls = {"prim.likely": self._likely, "tirx.likely": self._likely,
                       "prim.if_then_else": self._if_then_else,
                       "tirx.if_then_else": self._if_then_else}

    @property
    def b(self) -> ir.IRBuilder:
        return self.state.builder

    def lower(self, expr) -> ir.Value:
        method = self._table.get(type(expr))
        if method is None:
            raise UnsupportedNode(self.state.kernel, type(expr).__name__,
                                  f"in the expression {expr}")
        return method(expr)

    def lower_as(self, expr, dtype: str) -> ir.Value:
        """`expr` converted to TIR dtype `dtype` (C conversion rules)."""
        return cast_value(self.b, self.lower(expr), dtype_of(expr), dtype)

    def lower_condition(self, expr) -> ir.Value:
        return self.lower_as(expr, "bool")

    def _operands(self, expr):
        dtype = dtype_of(expr.a)
        return self.lower(expr.a), self.lower_as(expr.b, dtype), dtype

    # Leaves.
    def _int_imm(self, expr):
        return ir.Constant(llvm_type(dtype_of(expr)), int(expr.value))

    def _float_imm(self, expr):
        return ir.Constant(llvm_type(dtype_of(expr)), float(expr.value))

    def _var(self, expr):
        return self.state.value_of(expr)

    # Arithmetic.
    def _arith(self, ops, expr):
        a, b, dtype = self._operands(expr)
        if is_float(dtype):
            return getattr(self.b, ops[1])(a, b)
        return int_arith(self.b, ops[0], a, b)

    def _bitwise(self, op, expr):
        a, b, _ = self._operands(expr)
        return getattr(self.b, op)(a, b)

    def _rshift(self, expr):
        a, b, dtype = self._operands(expr)
        return self.b.ashr(a, b) if is_signed(dtype) else self.b.lshr(a, b)

    def _bitwise_not(self, expr):
        return self.b.not_(self.lower(expr.a))

    def _div(self, expr):
        a, b, dtype = self._operands(expr)
        if is_float(dtype):
            return self.b.fdiv(a, b)
        return self.b.sdiv(a, b) if is_signed(dtype) else self.b.udiv(a, b)

    def _mod(self, expr):
        a, b, dtype = self._operands(expr)
        if is_float(dtype):
            return self.b.frem(a, b)
        return self.b.srem(a, b) if is_signed(dtype) else self.b.urem(a, b)

    def _floor_fixup(self, remainder, divisor):
        """True where truncating division rounded up: remainder nonzero with the divisor's
        opposite sign."""
        zero = ir.Constant(remainder.type, 0)
        nonzero = self.b.icmp_signed("!=", remainder, zero)
        signs_differ = self.b.icmp_signed("<", self.b.xor(remainder, divisor), zero)
        return self.b.and_(nonzero, signs_differ)

    def _floordiv(self, expr):
        a, b, dtype = self._operands(expr)
        if is_float(dtype):
            return self._float_floor(self.b.fdiv(a, b))
        if not is_signed(dtype):
            return self.b.udiv(a, b)
        fixup = self._floor_fixup(self.b.srem(a, b), b)
        return self.b.sub(self.b.sdiv(a, b), self.b.zext(fixup, a.type))

    def _floormod(self, expr):
        a, b, dtype = self._operands(expr)
        if is_float(dtype):
            return self.b.fsub(a, self.b.fmul(self._float_floor(self.b.fdiv(a, b)), b))
        if not is_signed(dtype):
            return self.b.urem(a, b)
        remainder = self.b.srem(a, b)
        fixup = self._floor_fixup(remainder, b)
        return self.b.select(fixup, self.b.add(remainder, b), remainder)

    def _float_floor(self, value):
        floor = self.b.module.declare_intrinsic("llvm.floor", [value.type])
        return self.b.call(floor, [value])

    def _min(self, expr):
        return self._pick(expr, "<")

    def _max(self, expr):
        return self._pick(expr, ">")

    def _pick(self, expr, op):
        a, b, dtype = self._operands(expr)
        return self.b.select(self.compare(op, a, b, dtype), a, b)

    # Comparisons and logic.
    def compare(self, op, a, b, dtype):
        if is_float(dtype):
            return self.b.fcmp_ordered(op, a, b)
        if is_signed(dtype):
            return self.b.icmp_signed(op, a, b)
        return self.b.icmp_unsigned(op, a, b)

    def _compare(self, op, expr):
        a, b, dtype = self._operands(expr)
        return self.compare(op, a, b, dtype)

    def _and(self, expr):
        return self.b.and_(self.lower_condition(expr.a), self.lower_condition(expr.b))

    def _or(self, expr):
        return self.b.or_(self.lower_condition(expr.a), self.lower_condition(expr.b))

    def _not(self, expr):
        return self.b.xor(self.lower_condition(expr.a), I1(1))

    def _select(self, expr):
        dtype = dtype_of(expr)
        return self.b.select(self.lower_condition(expr.condition),
                             self.lower_as(expr.true_value, dtype),
                             self.lower_as(expr.false_value, dtype))

    def _cast(self, expr):
        return self.lower_as(expr.value, dtype_of(expr))

    def _let(self, expr):
        self.state.bind_value(expr.var, self.lower(expr.value))
        return self.lower(expr.body)

    # Memory.
    def _load(self, expr):
        pointer = self.host_element(expr.source, expr.indices)
        return self.b.load(pointer, typ=llvm_type(dtype_of(expr)))

    def host_element(self, buffer_var, indices) -> ir.Value:
        """Address of one element of a buffer the host code reads or writes itself."""
        if len(indices) != 1:
            raise UnsupportedNode(self.state.kernel, "BufferLoad/BufferStore",
                                  f"{len(indices)}-D access to '{buffer_var.name}' (run "
                                  "FlattenBuffer first)")
        base = self.state.host_memory(buffer_var)
        index = self.lower_as(indices[0], "int64")
        return self.b.gep(base, [index], source_etype=llvm_type(buffer_var.ty.dtype))

    # Calls (intrinsics only; device calls are statements).
    def _call(self, expr):
        name = op_name(expr)
        method = self._calls.get(name)
        if method is None:
            detail = (f"'{name}' in an expression" if name != BUFFER_DATA_OP else
                      "a buffer's data pointer may only be an argument of a cgra_* call")
            raise UnsupportedNode(self.state.kernel, f"Call({name})", detail)
        return method(expr)

    def _likely(self, expr):
        return self.lower(expr.args[0])

    def _if_then_else(self, expr):
        """Only the chosen side is evaluated (it may guard an out-of-range load)."""
        dtype = dtype_of(expr)
        condition, true_value, false_value = expr.args
        flag = self.lower_condition(condition)
        then_block, else_block = self.state.new_block("ite.then"), self.state.new_block("ite.else")
        merge = self.state.new_block("ite.end")
        self.b.cbranch(flag, then_block, else_block)
        incoming = []
        for block, side in ((then_block, true_value), (else_block, false_value)):
            self.b.position_at_end(block)
            value = self.lower_as(side, dtype)
            incoming.append((value, self.b.block))
            self.b.branch(merge)
        self.b.position_at_end(merge)
        phi = self.b.phi(llvm_type(dtype))
        for value, block in incoming:
            phi.add_incoming(value, block)
        return phi
