"""A conv2d between transposes to and from channels-last reads and writes channels-last itself.

Stage: normalise (before permute_chains.py). In: a Relax IRModule. Out: the same module in which

- `conv2d(permute_dims(y, [0, 3, 1, 2]))` (NCHW data) is `conv2d(y, data_layout="NHWC")`;
- `permute_dims(conv2d(x) [+ bias (1, C, 1, 1)], [0, 2, 3, 1])` (NCHW output) is
  `conv2d(x, out_layout="NHWC") [+ bias (1, 1, 1, C)]`, when the transpose alone reads the conv
  (and its bias add);
- a conv2d of NHWC data writing NCHW (or its bias add), read only by transposes back to
  channels-last, convs and adds, is `permute_dims(conv2d(out_layout="NHWC"), [0, 3, 1, 2])`, the
  transpose left for its readers to absorb (read by anything else, it would be a copy of its own);
- `add(permute_dims(a, p), permute_dims(b, p))` is `permute_dims(add(a, b), p)` for a 4-D p of
  `_TO_NCHW` (a residual add of two channels-last tensors in NCHW), so that the transpose meets
  the next one back to channels-last and both cancel (permute_chains.py).

Exact: a transpose only moves elements; the conv kernels gather NHWC data and store an NHWC
output through their DMA boxes (kernels/gemm/conv2d.py, depthwise.py: any order of the axes), the
same products summed in the same order; an add is elementwise. Why: ConvNeXt's block is
`x + permute(gamma * mlp(norm(permute(dwconv(x)))))`, its downsampling `conv(permute(norm(permute
(x))))`, each transpose a layout copy kernel (8 kernels, 11.5 k of the 178 k cycles of tests/
transformer_models.py's ConvNeXt at 64 x 64 on cgra-8x8); rewritten, its residual stream stays
channels-last from the stem to the output, and only the output's transpose stays. The stem (a
dense conv of NCHW data) stores NHWC too since its store walks the channels innermost
(kernels/gemm/gemm_schedule.py): 4,922 + 1,600 cycles for the conv and the transpose before.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims, type_of
from .norm_folds import _const, _rebuilt, _Uses
from .permute_chains import axes_of, permute_chains_composed
from .rewrite import as_pass, op_name, replace_functions

_TO_NHWC, _TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]
_CONV = "relax.nn.conv2d"


def nhwc_convs(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with conv2d's transposes to and from channels-last absorbed into its layouts, and
    residual adds of transposed tensors transposed once after the add."""
    for _ in range(8):  # each round moves every transpose one op; ConvNeXt needs 3
        rewritten = replace_functions(mod, _rewrite_function)
        if rewritten.same_as(mod):
            return mod
        mod = permute_chains_composed(rewritten)
    return mod


nhwc_convs_pass = as_pass(nhwc_convs, "cgra.NhwcConvs", ops=(_CONV,))


def _rewrite_function(func: relax.Function):
    """`func` with one round of the rewrites, or None when none applies."""
    uses = _Uses(func)
    replace, insert = {}, {}
    for var, value in uses.values.items():
        name = op_name(value)
        if name == _CONV:
            new = _conv_of_nhwc(uses, value)
            if new is not None:
                replace[var] = new
                continue
        if name in (_CONV, "relax.add"):
            found = _nhwc_in_nchw_out(uses, var, value, replace)
            if found is not None:
                replace[var], insert[var] = found
                continue
        if name == "relax.permute_dims" and axes_of(value) == _TO_NHWC:
            found = _nhwc_conv_output(uses, value.args[0], replace)
            if found is not None:
                replace[var], insert[var] = found
        elif name == "relax.add":
            found = _add_then_permute(uses, var, value)
            if found is not None:
                replace[var], insert[var] = found
    return _rebuilt(func, replace, insert) if replace else None


def _bound(uses: _Uses, expr):
    return uses.values.get(expr) if isinstance(expr, relax.Var) else None


def _conv(conv, data, **layouts):
    """A copy of the conv2d call `conv` reading `data`, with `layouts` changed."""
    attrs = conv.attrs
    given = dict(strides=attrs.strides, padding=attrs.padding, dilation=attrs.dilation,
                 groups=int(attrs.groups), data_layout=str(attrs.data_layout),
                 kernel_layout=str(attrs.kernel_layout), out_layout=str(attrs.out_layout),
                 out_dtype=dtype_of(conv))
    given.update(layouts)
    return relax.op.nn.conv2d(data, conv.args[1], **given)


def _conv_of_nhwc(uses: _Uses, conv):
    """conv2d(y, data_layout="NHWC") for a conv2d of NCHW data permute_dims(y, [0, 3, 1, 2])."""
    source = _bound(uses, conv.args[0])
    if str(conv.attrs.data_layout) != "NCHW" or op_name(source) != "relax.permute_dims" or \
            axes_of(source) != _TO_NCHW:
        return None
    return _conv(conv, source.args[0], data_layout="NHWC")


def _nhwc_conv_output(uses: _Uses, operand, replace: dict):
    """(add(inner, bias (1, 1, 1, C)) or inner, (inner var, conv2d writing NHWC)) when `operand`,
    read by the transpose alone, is an NCHW conv2d or its add of a (1, C, 1, 1) constant bias."""
    if not isinstance(operand, relax.Var) or len(uses.only(operand) or ()) != 1 or operand in replace:
        return None
    return _channels_last(uses, operand, replace)


def _channels_last(uses: _Uses, var, replace: dict):
    """(the value of `var` in NHWC, (inner var, conv2d writing NHWC)) when `var` is an NCHW
    conv2d, or the add of a (1, C, 1, 1) constant bias to one that nothing else reads."""
    value, bias = uses.values.get(var), None
    if op_name(value) == "relax.add":
        bias = next((_const(arg) for arg in value.args if _const(arg) is not None), None)
        conv_var = next((arg for arg in value.args if _const(arg) is None), None)
        channels = (shape_dims(value) or (None, None))[1]
        if bias is None or bias.shape != (1, channels, 1, 1) or not isinstance(conv_var, relax.Var) or \
                len(uses.only(conv_var) or ()) != 1 or conv_var in replace:
            return None
        value = uses.values.get(conv_var)
    if op_name(value) != _CONV or str(value.attrs.out_layout) != "NCHW":
        return None
    conv = _conv(value, value.args[0], out_layout="NHWC")
    inner = _var(var, conv)
    if bias is None:
        return inner, (inner, conv)
    return relax.op.add(inner, relax.const(np.ascontiguousarray(bias.reshape(1, 1, 1, -1)))), (inner, conv)


def _nhwc_in_nchw_out(uses: _Uses, var, value, replace: dict):
    """permute_dims(the NHWC value, [0, 3, 1, 2]) and its conv's insertion, for a conv2d of NHWC
    data writing NCHW (or its bias add): the readers see the transpose, which they absorb."""
    conv = uses.values.get(next((a for a in value.args if _const(a) is None), None)) \
        if op_name(value) == "relax.add" else value
    if op_name(conv) != _CONV or str(conv.attrs.data_layout) != "NHWC" or var in replace:
        return None
    if op_name(value) == _CONV and any(op_name(v) == "relax.add" for _, v in uses.only(var) or ()):
        return None  # its bias add takes it whole
    if not _absorbed(uses.only(var)):
        return None  # the transpose would be a copy kernel of its own (the function's result, a pool)
    found = _channels_last(uses, var, replace)
    return None if found is None else (relax.op.permute_dims(found[0], _TO_NCHW), found[1])


def _absorbed(readers) -> bool:
    """Whether every reader of a conv's output could take the transpose left in front of it: a
    transpose back to channels-last (the two cancel), a conv2d (it reads the channels-last data:
    `_conv_of_nhwc`) or an add (`_add_then_permute`)."""
    return bool(readers) and all(op_name(v) in ("relax.add", _CONV) or (op_name(v) == "relax.permute_dims" and
                                                                         axes_of(v) == _TO_NHWC) for _, v in readers)


def _add_then_permute(uses: _Uses, var, add):
    """(permute_dims(inner, p), (inner var, add(a, b))) for add(permute_dims(a, p), permute_dims(b, p))."""
    sources = [_bound(uses, arg) for arg in add.args]
    if not all(op_name(s) == "relax.permute_dims" and axes_of(s) == _TO_NCHW for s in sources):
        return None
    a, b = (s.args[0] for s in sources)
    if shape_dims(a) != shape_dims(b):
        return None  # a broadcast: the transposed operands would not line up
    inner_add = relax.op.add(a, b)
    inner = _var(var, inner_add)
    return relax.op.permute_dims(inner, _TO_NCHW), (inner, inner_add)


def _var(like, call):
    """A variable of `like`'s kind (dataflow or not) typed as `call`'s result."""
    var_class = relax.DataflowVar if isinstance(like, relax.DataflowVar) else relax.Var
    return var_class(f"{like.name}_nhwc", type_of(relax.BlockBuilder().normalize(call)))
