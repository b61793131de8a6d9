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

Custom operators (`custom_ops`): a node whose op type has a builder there becomes a call_tir of
the PrimFunc the builder makes for it (`CustomNode`: the node's name, op type, attributes and
input types), which then runs on the NPU like any user PrimFunc (partition/call_tir.py). A
builder may return None to leave a node of a known op type to TVM's converter, so the same hook
replaces chosen layers of a model with one's own TensorIR.

onnxruntime's `MatMulNBits` (4-bit weights), which TVM's importer lacks, is converted by
matmul_nbits.py.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from ..errors import InvalidModel
from ..relax_info import dtype_of, shape_dims
from . import matmul_nbits
from .provenance import node_span


@dataclasses.dataclass(frozen=True)
class CustomNode:
    """One node of a custom op, as its builder sees it."""

    name: str  # the node's name (its first output's when the model gives none)
    op_type: str
    attrs: dict  # its attributes, parsed as TVM's importer parses them
    input_shapes: tuple  # per input: its shape (ints; symbolic dims as TIR expressions)
    input_dtypes: tuple  # per input: its dtype ("float32")


#: op type -> builder(CustomNode) -> a PrimFunc (inputs then the output, destination-passing), or
#: None to convert the node as TVM's importer does.
CustomOps = dict[str, Callable]


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


#: ONNX's 4-bit tensor types (TensorProto.INT4, UINT4) -> the numpy type their values import as.
_FOUR_BIT = {22: np.int8, 21: np.uint8}


class _NamingImporter(onnx_frontend.ONNXGraphImporter):
    def __init__(self, *args, custom_ops: CustomOps | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.bb = _SpanningBuilder()
        self.custom_ops = dict(custom_ops or {})
        self.custom_nodes = {}  # name of a custom op's PrimFunc -> its node's name

    def _check_for_unsupported_ops(self, graph):
        """TVM's check, knowing the custom ops, and saying how to supply a missing one."""
        known = set(onnx_frontend._get_convert_map()) | {"If", "Constant", "MatMulNBits"} | set(self.custom_ops)
        missing = sorted({node.op_type for node in graph.node if node.op_type not in known})
        if missing:
            raise InvalidModel(f"TVM's ONNX importer has no converter for {', '.join(missing)}: give each a "
                               "builder in from_onnx(..., custom_ops={op_type: builder}) that returns its "
                               "TensorIR (docs/own-kernels.md)")

    def _parse_array(self, tensor_proto):
        """An initializer's values; a 4-bit one (onnxruntime's QDQ int4 weights and their zero
        points) as int8 / uint8, the same values a byte each: TVM's importer copies onnx's
        unpacked 4-bit arrays into tensors it sizes at half a byte an element, and fails."""
        widened = _FOUR_BIT.get(tensor_proto.data_type)
        if widened is None:
            return super()._parse_array(tensor_proto)
        from onnx import numpy_helper

        return tvm.runtime.tensor(numpy_helper.to_array(tensor_proto).astype(widened))

    def _convert_operator(self, op_name, inputs, attrs, opset):
        name = str(attrs.get("tvm_custom", {}).get("name", "") or "")
        if op_name in self.custom_ops:
            call = self._custom(op_name, name, inputs, attrs)
            if call is not None:
                return call
        if op_name == "MatMulNBits":
            return self._matmul_nbits(name, inputs, attrs)
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

    def _matmul_nbits(self, name, inputs, attrs):
        """onnxruntime's 4-bit weight-only matmul (matmul_nbits.py), its calls spanned with the node."""
        def add_func(func, hint):
            gvar = self.bb.add_func(func.with_attr("global_symbol", _symbol(hint)), _symbol(hint))
            self.custom_nodes[gvar.name_hint] = name
            return gvar

        self.bb.node = node_span(name)
        try:
            return matmul_nbits.convert(self.bb, list(inputs), attrs, name or "matmul_nbits", add_func)
        finally:
            self.bb.node = None

    def _custom(self, op_type, name, inputs, attrs):
        """The call_tir of the PrimFunc the builder of `op_type` makes for this node, or None."""
        args = [arg for arg in inputs if arg is not None]
        node = CustomNode(name, op_type, {k: v for k, v in attrs.items() if k != "tvm_custom"},
                          tuple(tuple(shape_dims(arg) or ()) for arg in args), tuple(dtype_of(arg) for arg in args))
        func = self.custom_ops[op_type](node)
        if func is None:
            return None
        where = f"custom op {op_type} (node '{name}')"
        if not isinstance(func, tvm.tirx.PrimFunc):
            raise InvalidModel(f"the builder of {where} returned {type(func).__name__}, not a PrimFunc")
        if len(func.params) != len(args) + 1:
            raise InvalidModel(f"the PrimFunc for {where} takes {len(func.params)} parameters; the node has "
                               f"{len(args)} inputs and one output, so it must take {len(args) + 1} (inputs, "
                               "then the output)")
        for index, (param, shape, dtype) in enumerate(zip(func.params, node.input_shapes, node.input_dtypes)):
            declared = tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in param.shape)
            if str(param.dtype) != dtype or (all(isinstance(d, int) for d in shape) and declared != shape):
                raise InvalidModel(f"the PrimFunc for {where}: parameter '{param.name}' is {declared} {param.dtype}, "
                                   f"but input {index} is {shape} {dtype}")
        out = func.params[-1]
        gvar = self.bb.add_func(func.with_attr("global_symbol", _symbol(name or op_type)), _symbol(name or op_type))
        self.custom_nodes[gvar.name_hint] = name
        out_ty = relax.TensorType([int(d) for d in out.shape], str(out.dtype))
        call = relax.call_tir(gvar, args, out_ty)
        return self.bb.normalize(relax.Call(call.op, call.args, call.attrs, call.ty_args, node_span(name)))


def _with_custom_spans(mod: tvm.IRModule, nodes: dict) -> tvm.IRModule:
    """`mod` whose call_tir of each custom op's PrimFunc carries its node's span. The builder can
    drop the span of such a call (seen when its node's output is the graph's), and with it the
    node's name in every profile; this puts it back."""
    if not nodes:
        return mod

    @relax.expr_functor.mutator
    class Respan(relax.PyExprMutator):
        def visit_call_(self, call):
            call = self.visit_expr_post_order(call)
            callee = call.args[0] if isinstance(call, relax.Call) and call.args else None
            if isinstance(callee, tvm.ir.GlobalVar) and callee.name_hint in nodes and call.span is None \
                    and getattr(call.op, "name", "") == "relax.call_tir":
                return relax.Call(call.op, call.args, call.attrs, call.ty_args, node_span(nodes[callee.name_hint]))
            return call

    mutator = Respan(mod)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()


def _symbol(name: str) -> str:
    """A PrimFunc name from a node name (letters, digits and underscores)."""
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return cleaned if cleaned and not cleaned[0].isdigit() else "op_" + cleaned


def load_model(model):
    """An onnx.ModelProto from a ModelProto, a path or the file's bytes; InvalidModel (naming the
    file) for anything onnx cannot read as a model."""
    import onnx
    from google.protobuf.json_format import ParseError
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto):
        return model
    what = f"'{os.fspath(model)}'" if isinstance(model, (str, os.PathLike)) else "these bytes"
    try:
        if isinstance(model, (bytes, bytearray)):
            return onnx.load_from_string(bytes(model))
        if isinstance(model, (str, os.PathLike)):
            return onnx.load(os.fspath(model))
    except ParseError:  # onnx reads a .json path as a ModelProto in protobuf's JSON form
        raise InvalidModel(f"cannot read {what} as an ONNX model (not a ModelProto in JSON form); is it an .onnx "
                           "file? A chip's hardware description goes to --arch") from None
    except (DecodeError, ValueError, RuntimeError) as err:
        raise InvalidModel(f"cannot read {what} as an ONNX model ({type(err).__name__}: {err}); "
                           "is it an .onnx file?") from None
    raise TypeError(f"from_onnx takes an onnx.ModelProto, a path or bytes, not {type(model).__name__}")


def from_onnx(model, shape_dict=None, dtype_dict="float32", opset=None, custom_ops: CustomOps | None = None) \
        -> tvm.IRModule:
    """`tvm.relax.frontend.onnx.from_onnx(model, ...)` with the node names kept as call spans (the
    body of TVM's function, with this module's importer). `model`: a ModelProto, a path or bytes.
    A graph the importer cannot follow (a node reading an input nothing produces) raises
    InvalidModel with onnx's checker's account of it."""
    model = load_model(model)
    if model.ir_version < 3:
        raise InvalidModel(f"ONNX IR version {model.ir_version} is not supported (the importer needs 3 or later)")
    if opset is None:
        opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    unnamed = [node for node in model.graph.node if not node.name and node.output]
    for node in unnamed:  # ONNX node names are optional: call those after their first output
        node.name = node.output[0]
    try:
        importer = _NamingImporter(shape_dict, dtype_dict, custom_ops=custom_ops)
        return _with_custom_spans(importer.from_onnx(model.graph, opset), importer.custom_nodes)
    except (KeyError, IndexError, AttributeError) as err:
        raise InvalidModel(_why_not_importable(model, err)) from err
    finally:
        for node in unnamed:  # the caller's model stays as it was
            node.name = ""


def _why_not_importable(model, err) -> str:
    """What is wrong with a model the importer tripped over: a node reading a value nothing
    produces, else onnx's checker's first complaint, else the importer's own error."""
    import onnx

    known = {value.name for value in model.graph.input} | {init.name for init in model.graph.initializer}
    for node in model.graph.node:
        missing = [name for name in node.input if name and name not in known]
        if missing:
            return (f"node '{node.name}' ({node.op_type}) reads '{missing[0]}', which no graph input, initializer "
                    "or earlier node produces: the ONNX model is not valid (onnx.checker.check_model says why)")
        known |= set(node.output)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as invalid:
        first = str(invalid).strip().splitlines()[0]
        return f"the ONNX model is not valid: {first} (onnx.checker.check_model says so too)"
    return f"TVM's ONNX importer failed on this model ({type(err).__name__}: {err})"
