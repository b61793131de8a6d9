"""Which model operators (ONNX nodes) each Relax call came from: carried as the call's span.

Stage: import, normalise and partition. A call's `span` names the model node it was made for
(`node_span`); a call made from several nodes (a clip merged from two) carries a
`SequentialSpan` of them. Spans are not part of structural equality, so they ride along through
TVM's passes without changing what is compiled; our own rewrites (fold_weights, clip_form) hand
them on with `with_span`.

After partitioning, `record_source_nodes` gives every offloaded call site the model nodes of
its operators as the attribute `cgra.source_nodes` of its function. Partitioning merges
structurally equal kernels into one function (two identical conv layers), so a function called
from sites with different nodes is copied, one copy per site: each kernel launch then reports
its own layer. The copies compile once (target_hook's kernel cache ignores names).
"""

from __future__ import annotations

import tvm
from tvm import relax

SOURCE_NODES_ATTR = "cgra.source_nodes"  # per composite operator: its nodes joined by NODE_JOIN
NODE_JOIN = "+"  # several nodes behind one operator (a folded batch norm's bias add stays one)


def node_span(name: str):
    """The span that says "made for model node `name`"."""
    return tvm.ir.Span(tvm.ir.SourceName(name), 0, 0, 0, 0)


def span_names(span) -> tuple[str, ...]:
    """The model node names a span carries, in order, without repeats (() for none)."""
    if span is None:
        return ()
    parts = list(span.spans) if isinstance(span, tvm.ir.SequentialSpan) else [span]
    names = []
    for part in parts:
        if part.line != 0:  # a source position (a TVMScript file's line), not a model node
            continue
        name = str(part.source_name.name) if part.source_name is not None else ""
        if name and name not in names:
            names.append(name)
    return tuple(names)


def merged_span(*spans):
    """One span for a call made from several: None, the one span, or a SequentialSpan."""
    names = []
    for span in spans:
        names += [n for n in span_names(span) if n not in names]
    if not names:
        return None
    if len(names) == 1:
        return node_span(names[0])
    return tvm.ir.SequentialSpan([node_span(n) for n in names])


def with_span(call, span):
    """`call` carrying `span` (unchanged if span is None or the call already carries it)."""
    if span is None or not isinstance(call, relax.Call) or span_names(call.span) == span_names(span):
        return call
    return relax.Call(call.op, call.args, call.attrs, call.ty_args, span)


def call_nodes(expr) -> str:
    """The node names of a call, joined with NODE_JOIN ("" for anything without a span)."""
    return NODE_JOIN.join(span_names(getattr(expr, "span", None)))
