"""A prefill step writing a prompt's KV rows into caches preallocated for the bound, on the NPU.

Stage: frontend (a Relax module in, a Relax module out, before `npu_backend.compile`). In: a
prefill step as torch.export and the Relax importer give it, the prompt's length s symbolic,
returning its outputs (the logits) and then each layer's new keys and values, (1, KV heads, s, d)
(examples/generate.py's `prefill_step`). Out: the same step taking one more parameter per such
output, the cache (1, KV heads, bound, d) the decode step (kv_cache.py) reads, into whose first s
rows the rows are written in place: slice_scatter(cache, rows, 0, s, axis=2), an NPU kernel
(kernels/layout/cache_write.py, `cgra.cache_rows`; device/in_place.py calls it with the cache as
its output). The step returns its outputs and then the caches written, the very tensors it was
given (an in-place call's result), so nothing is copied and the decode steps continue from
position s. A prompt longer than the bound is a LengthPastBound (a ValueError) at run time naming it, before any of
the write's commands (nothing is written past a cache).

The rows go to positions 0..s-1: a prompt's prefill from an empty cache. A later chunk of a
long prompt (rows at an offset, attention over the cache too) is not built: a slice_scatter
from another start stays on the host.

Why a prefill of its own: the decode step takes one token; a prompt of s tokens through it is s
steps, each streaming every weight. The prefill computes the s rows in one pass (its GEMMs of s
rows read each weight once) and writes them with one kernel per cache.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from .length_checks import length_check
from ..errors import InvalidModel


def prefill_kv_cache(mod: tvm.IRModule, bound: int, outputs: int = 1, axis: int = 2) -> tvm.IRModule:
    """`mod` whose main returns `outputs` outputs and then KV rows (1, KV heads, s, d), made to
    write those rows into caches preallocated for `bound` positions (the module docstring):
    main's parameters gain the caches (named cache0, cache1, ... in output order), its result
    is the outputs then the caches written. Raises InvalidModel when main is not such a step."""
    func = mod["main"]
    body = func.body
    fields = _result_fields(body) if isinstance(body, relax.SeqExpr) else None
    if fields is None or len(fields) <= outputs:
        raise InvalidModel(f"prefill_kv_cache: main returns no tuple of {outputs} output(s) then KV rows; return "
                           "(outputs..., keys0, values0, keys1, ...) with outputs=<how many come first>")
    rows = list(fields[outputs:])
    length = _length(rows, axis)
    bb = relax.BlockBuilder()
    caches = []
    for index, row in enumerate(rows):
        dims = list(row.ty.shape.values)
        dims[axis] = bound
        caches.append(relax.Var(f"cache{index}", relax.TensorType(dims, row.ty.dtype)))
    params = list(func.params) + caches
    attrs = dict(func.attrs or {})
    attrs["tir_var_upper_bound"] = {**dict(attrs.get("tir_var_upper_bound", {})), length.name: bound}
    with bb.function("main", params, attrs=attrs, pure=False):
        # before anything is allocated (the VM's memory plan holds s at its bound) or written
        bb.emit(length_check(length, bound, f"a prompt's length {length.name}",
                             f"the KV caches hold {bound} positions: preallocate them for more "
                             "(prefill_kv_cache(mod, bound=...), and the export's Dim(max=...))"))
        with bb.dataflow():
            for block in body.blocks:
                for binding in block.bindings:
                    _emit(bb, binding)
            written = [bb.emit(relax.op.slice_scatter(cache, row, 0, length, 1, axis=axis))
                       for cache, row in zip(caches, rows)]
            result = bb.emit_output(relax.Tuple([*fields[:outputs], *written]))
        bb.emit_func_output(result)
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    out["main"] = bb.get()["main"]
    return relax.transform.Normalize()(out)


def _result_fields(body):
    """The fields of the tuple `body` returns (itself, or the variable bound to it)."""
    result = body.body
    bound = {binding.var: binding.value for block in body.blocks for binding in block.bindings}
    while isinstance(result, relax.Var) and result in bound:
        result = bound[result]
    return getattr(result, "fields", None)


def _emit(bb, binding) -> None:
    """`binding` re-emitted under its own variable (the step's body as it was)."""
    if isinstance(binding, relax.MatchCast):
        bb.emit_normalized(binding)
    else:
        bb.emit_normalized(relax.VarBinding(binding.var, binding.value))


def _length(rows: list, axis: int) -> tirx.Var:
    """The one symbolic length every KV rows output has on `axis`."""
    lengths = set()
    for row in rows:
        dims = getattr(getattr(row.ty, "shape", None), "values", None)
        if dims is None or len(dims) <= axis or not isinstance(dims[axis], tirx.Var):
            raise InvalidModel(f"prefill_kv_cache: the output {row} is not KV rows with a symbolic length on axis "
                               f"{axis} (its type {row.ty}); export the prompt's length as torch.export.Dim")
        lengths.add(dims[axis])
    if len(lengths) != 1:
        raise InvalidModel(f"prefill_kv_cache: the KV rows have lengths {sorted(str(v) for v in lengths)}, not one")
    return lengths.pop()
