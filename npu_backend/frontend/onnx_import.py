"""ONNX -> Relax, keeping each ONNX node's name on the Relax calls made for it.

Stage: import. Input: an onnx.ModelProto. Output: the IRModule `tvm.relax.frontend.onnx.from_onnx`
gives, identical but for the calls' spans: every call a node's converter makes carries
`provenance.node_span(node.name)` (nodes without a name: their first output's name).

Why: TVM's importer drops node names (its variables are lv, lv1, ...), so a kernel could only say
which Relax operators it fused ("nn.conv2d,add,nn.relu"), not which layers of the model
("conv3,batchnormalization4,relu5"). Spans do not enter structural equality, so nothing else
changes. This subclasses TVM 0.27's `ONNXGraphImporter` at two points: `_convert_operator`
(where the node's name is in `attrs["tvm_custom"]["name"]`) and the BlockBuilder the converters
emit into (some converters, Clip's for one, emit calls themselves).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from .provenance import node_span


class _Spanner:
    """Gives every call without a span in an expression the current node's span, and emits nested
    calls one by one (the builder rebuilds a call whose arguments it has to emit, which would
    drop the span of that call)."""

    def __init__(self, builder, span):
        self.builder, self.span = builder, span
        self.memo = {}  # hash (address) of an expression -> its spanned version; keeps them alive

    def __call__(self, expr):
        if not isinstance(expr, (relax.Call, relax.Tuple, relax.TupleGetItem)):
            return expr  # variables, constants, shapes, PrimExpr arguments (clip bounds)
        key = hash(expr)  # the object's address: `==` is overloaded on expressions
        if key in self.memo:
            return self.memo[key]
        if isinstance(expr, relax.Call):
            args = [self._leaf(self(arg)) for arg in expr.args]
            changed = any(not new.same_as(old) for new, old in zip(args, expr.args))
            result = expr if expr.span is not None and not changed else \
                relax.Call(expr.op, args, expr.attrs, expr.ty_args, expr.span or self.span)
        elif isinstance(expr, relax.Tuple):
            fields = [self._leaf(self(field)) for field in expr.fields]
            changed = any(not new.same_as(old) for new, old in zip(fields, expr.fields))
            result = relax.Tuple(fields) if changed else expr
        elif isinstance(expr, relax.TupleGetItem):
            value = self._leaf(self(expr.tuple_value))
            result = expr if value.same_as(expr.tuple_value) else relax.TupleGetItem(value, expr.index)
        self.memo[key] = result
        return result

    def _leaf(self, expr):
        """A nested call or tuple item as a bound variable: the builder emits it unchanged (its
        arguments already are leaves), and emits the same object once."""
        if isinstance(expr, (relax.Call, relax.TupleGetItem)):
            return self.builder.normalize(relax.Tuple([expr])).fields[0]
        return expr


class _SpanningBuilder(relax.BlockBuilder):
    """The importer's BlockBuilder: what a converter emits while a node is current gets its span."""

    node = None  # the span of the node being converted

    def emit(self, expr, name_hint: str = ""):
        if self.node is not None:
            expr = _Spanner(self, self.node)(expr)
        return super().emit(expr, name_hint)


class _NamingImporter(onnx_frontend.ONNXGraphImporter):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bb = _SpanningBuilder()

    def _convert_operator(self, op_name, inputs, attrs, opset):
        name = str(attrs.get("tvm_custom", {}).get("name", "") or "")
        convert_map = onnx_frontend._get_convert_map()
        if not name or op_name not in convert_map:
            return super()._convert_operator(op_name, inputs, attrs, opset)
        self.bb.node = node_span(name)
        try:
            converter = convert_map[op_name].get_converter(opset)
            result = converter(self.bb, inputs, attrs, [self._nodes, self._params])
            if isinstance(result, relax.Expr):
                result = self.bb.normalize(_Spanner(self.bb, self.bb.node)(result))
            return result
        finally:
            self.bb.node = None


def from_onnx(model, shape_dict=None, dtype_dict="float32", opset=None) -> tvm.IRModule:
    """`tvm.relax.frontend.onnx.from_onnx(model, ...)` with the node names kept as call spans
    (the body of TVM's function, with this module's importer)."""
    if model.ir_version < 3:
        raise ValueError(f"Model IR version {model.ir_version} not supported. Must be at least after 1.1.0.")
    if opset is None:
        opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    unnamed = [node for node in model.graph.node if not node.name and node.output]
    for node in unnamed:  # ONNX node names are optional: call those after their first output
        node.name = node.output[0]
    try:
        return _NamingImporter(shape_dict, dtype_dict).from_onnx(model.graph, opset)
    finally:
        for node in unnamed:  # the caller's model stays as it was
            node.name = ""
