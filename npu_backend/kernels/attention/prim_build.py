"""Attention kernels built as lowered TIR with TVM's IR builder: no TVMScript text to parse.

Stage: kernel definition (rows.py builds its kernel with it; script_text.py's device-call helpers
return the calls themselves when their operands are this module's buffers). In: the
AttentionSpec's parameters and the kernel's statements as the kernel's generator emits them.
Out: the PrimFunc, the same (structurally equal) as the one TVMScript's parser made of the text
it replaces (tests/test_attention_build.py), at a fraction of the cost (the parser took about
0.2 s a kernel). Expressions are built the way the parser evaluates text: + - * // % through
PrimExpr's operators (Python ints stay ints, as the parser folds them), comparisons and `and` as
their nodes, T.min / T.max / T.if_then_else the builder's own functions.
"""

from __future__ import annotations

import contextlib

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from ..intrinsics import SPAD
from .head_layouts import base_role, buffer_of, stored, stored_shape


def lt(a, b):
    """a < b as the parser makes it (an LT node, an int converted to the other side's dtype)."""
    return _compare(tirx.LT, a, b)


def eq(a, b):
    return _compare(tirx.EQ, a, b)


def ne(a, b):
    return _compare(tirx.NE, a, b)


def both(a, b):
    """`a and b` of the text (an And node)."""
    return tirx.And(a, b)


def _compare(node, a, b):
    if isinstance(a, int) and isinstance(b, int):  # the parser compares Python ints in Python
        return {tirx.LT: a < b, tirx.EQ: a == b, tirx.NE: a != b}[node]
    a = tirx.IntImm(str(b.ty.dtype), a) if isinstance(a, int) else a
    b = tirx.IntImm(str(a.ty.dtype), b) if isinstance(b, int) else b
    return node(a, b)


def plus(origin, index):
    """`origin + index` as the text "{origin} + {index}" parses: left to right through index's
    own top-level sums and differences (origin 0: index)."""
    if isinstance(origin, int) and origin == 0:
        return index
    if isinstance(index, (tirx.Add, tirx.Sub)) and not isinstance(index, tirx.IntImm):
        inner = plus(origin, index.a)
        return inner + index.b if isinstance(index, tirx.Add) else inner - index.b
    return origin + index


def guarded(row, sq: int, tq: int, load):
    """`load`, or 0 past the sequence's sq rows when tq does not divide it (script_text.guarded)."""
    return load if sq % tq == 0 else T.if_then_else(lt(row, sq), load, T.float32(0))


class KernelBuilder:
    """A PrimFunc under construction: its parameter and scratchpad buffers by name, loops and
    branches as context managers, statements appended where the builder stands."""

    def __init__(self, spec, name: str):
        """Opens the prim_func `name`: q, k, v [, mask] and out as flat float32 buffers of their
        stored shapes (a mask's heads as Hk * G; out in spec.half_out where it is set), as
        script_text.kernel_writer's header."""
        from .script_text import head_shapes
        self.spec = spec
        shapes = {role: stored_shape(spec, role, shape) for role, shape in head_shapes(spec).items()}
        if spec.mask_shape:
            mb, mhk, mg, msq, msk = spec.mask_shape
            shapes["mask"] = (mb, mhk * mg, msq, msk)
        params = [base_role(r) for r in spec.param_roles] + ["out"]
        self._stack = contextlib.ExitStack()
        self._builder = self._stack.enter_context(IRBuilder())
        self._stack.enter_context(T.prim_func())
        T.func_name(name)
        dtypes = {"out": spec.half_out or "float32"}  # a rounding store's output (rows.py's _normalise)
        self.buffers = {role: T.arg(role, T.Buffer(tuple(shapes[role]), dtypes.get(role, "float32")))
                        for role in params}
        T.func_attr({"tirx.noalias": True})

    def __getitem__(self, name: str):
        return self.buffers[name]

    def finish(self):
        """The PrimFunc built."""
        self._stack.close()
        return self._builder.get()

    def alloc(self, name: str, shape: tuple, dtype: str = "float32"):
        """A scratchpad buffer `name` (float32 unless told) from here to the end of the enclosing scope."""
        buffer = T.alloc_buffer(tuple(shape), dtype, scope=SPAD)
        IRBuilder.name(name, buffer)
        self.buffers[name] = buffer
        return buffer

    def add(self, *calls) -> None:
        """Device calls (script_text's helpers, given this builder's buffers) evaluated in order."""
        for value in calls:
            T.evaluate(value)

    def store(self, name: str, indices: tuple, value) -> None:
        T.buffer_store(self.buffers[name], value, list(indices))

    @contextlib.contextmanager
    def serial(self, name: str, extent):
        """`for name in range(extent)`: the loop variable."""
        with T.serial(0, extent) as var:
            IRBuilder.name(name, var)
            yield var

    @contextlib.contextmanager
    def grid(self, names: str, *extents):
        """`for a, b, ... in T.grid(...)`: the loop variables (`names` as "a, b")."""
        with T.grid(*extents) as variables:
            variables = [variables] if isinstance(variables, tirx.Var) else list(variables)
            for name, var in zip(names.split(", "), variables):
                IRBuilder.name(name, var)
            yield variables

    @contextlib.contextmanager
    def when(self, condition):
        """`if condition:` (a PrimExpr)."""
        with T.If(condition):
            with T.Then():
                yield

    @contextlib.contextmanager
    def when_else(self, condition):
        """`if condition: ... else: ...`: yields (then, else) frames to enter in turn."""
        with T.If(condition):
            yield T.Then, T.Else

    def element(self, role: str, n, head, row, col):
        """`role`'s element (n, head, row, col) where its tensor keeps it (script_text.element)."""
        return self.buffers[buffer_of(self.spec, role)][self._place(role, n, head, row, col)]

    def store_element(self, role: str, n, head, row, col, value) -> None:
        """`role`'s element (n, head, row, col) = value, where its tensor keeps it."""
        T.buffer_store(self.buffers[buffer_of(self.spec, role)], value, list(self._place(role, n, head, row, col)))

    def _place(self, role: str, *index) -> tuple:
        return tuple(stored(self.spec, role, index, plus))
