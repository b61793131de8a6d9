"""A decode step's KV caches preallocated for the bound and written in place on the NPU.

Stage: frontend (a Relax module in, a Relax module out, before `npu_backend.compile`). In: a decode
step as torch.export and the Relax importer give it today, its caches inputs of symbolic length
t, (1, KV heads, t, d), each grown by the new token with `concat((cache, new), axis=2)` and
returned, the token's position an input (tests/test_symbolic_decode.py's step). Out: the same
step with every cache a tensor preallocated for `bound` positions, (1, KV heads, bound, d), which
the caller allocates once and passes to every step:

- the new row is written at the position: scatter_elements(cache, broadcast_to(position), new,
  axis=2), an NPU kernel that stores that row alone, in place (kernels/layout/cache_write.py,
  device/in_place.py);
- attention reads the cache's first t + 1 rows: strided_slice(cache, [2], [0], [t + 1]) feeding
  q Kᵀ and P V, one matmul kernel each that takes the cache whole and cuts its GEMMs to the
  length (kernels/gemm/symbolic_matmul.py); a length past the bound is a ValueError at run time;
- t is the position's value (R.tensor_to_shape, a VM builtin), so the step is called with the
  same inputs as before and the caches; the grown caches are no longer outputs;
- what the step computes from the position alone (RoPE's cos and sin of the position's angles)
  is looked up by position in a table of the bound's rows, an NPU gather (position_tables.py).

Why not the caches TVM users already have: Hugging Face's StaticCache exported with
torch.export mutates buffers (`index_copy_`), and TVM 0.27's importer binds buffers as constants
and drops the mutations (exported_program_translator.py keeps user outputs only); Relax's
PagedKVCache (relax.frontend.nn) calls the VM's paged-attention builtins, host functions of its
own, not kernels the NPU's patterns can take. docs/dynamic-shapes.md says more.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from ..errors import InvalidModel
from .position_tables import tabulate_positions

_CONCAT = tvm.ir.Op.get("relax.concat")


def preallocate_kv_cache(mod: tvm.IRModule, bound: int, position: str = "pos", axis: int = 2) -> tvm.IRModule:
    """`mod` with main's KV caches preallocated for `bound` positions and written in place (see
    the module docstring). `position`: main's parameter holding the new token's position (one
    integer); `axis`: the caches' position axis. Raises InvalidModel when main is not such a step."""
    func = mod["main"]
    params = {str(p.name): p for p in func.params}
    if position not in params:
        raise InvalidModel(f"preallocate_kv_cache: main has no parameter '{position}' (its parameters: "
                           f"{', '.join(params)}); pass position=<the parameter holding the token's position>")
    caches, length = _caches(func, axis)
    rewriter = _Preallocate(caches, params[position], length, bound, axis)
    body = rewriter.visit_expr(func.body)
    if rewriter.written != set(caches):
        missing = [str(p.name) for p in caches if p not in rewriter.written]
        raise InvalidModel(f"preallocate_kv_cache: the caches {missing} are not grown by a concat along axis {axis}")
    new_params = [rewriter.preallocated.get(p, p) for p in func.params]
    attrs = dict(func.attrs or {})
    attrs["tir_var_upper_bound"] = {length.name: bound - 1}
    attrs["tir_var_lower_bound"] = {length.name: 0}
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    out["main"] = relax.Function(new_params, body, is_pure=func.is_pure, attrs=tvm.ir.make_node("ir.DictAttrs", **attrs))
    return tabulate_positions(relax.transform.Normalize()(out), position, bound)


def _caches(func, axis: int) -> tuple[list, tirx.Var]:
    """main's cache parameters (a tensor whose `axis` is a variable, the same in all) and that variable."""
    caches, lengths = [], set()
    for param in func.params:
        ty = param.ty
        shape = getattr(ty, "shape", None)
        dims = getattr(shape, "values", None)
        if dims is None or len(dims) <= axis or not isinstance(dims[axis], tirx.Var):
            continue
        caches.append(param)
        lengths.add(dims[axis])
    if not caches or len(lengths) != 1:
        raise InvalidModel(f"preallocate_kv_cache: main needs KV cache parameters with one symbolic length on axis "
                           f"{axis} (found {len(caches)} caches, lengths {sorted(str(v) for v in lengths)})")
    return caches, lengths.pop()


@relax.expr_functor.mutator
class _Preallocate(relax.PyExprMutator):
    def __init__(self, caches: list, position, length, bound: int, axis: int):
        super().__init__()
        self.position, self.length, self.axis = position, length, axis
        self.preallocated = {}
        for cache in caches:
            dims = list(cache.ty.shape.values)
            dims[axis] = bound
            self.preallocated[cache] = relax.Var(cache.name, relax.TensorType(dims, cache.ty.dtype))
        self.written = set()
        self.grown = set()  # the concat results: no longer outputs
        self.defined = False

    def visit_var_binding_(self, binding):
        value = binding.value
        if isinstance(value, relax.Call) and value.op.same_as(_CONCAT) and isinstance(value.args[0], relax.Tuple):
            fields = value.args[0].fields
            if len(fields) == 2 and fields[0] in self.preallocated and \
                    int(value.attrs.axis) % len(fields[0].ty.shape.values) == self.axis:
                self._write(binding.var, fields[0], self.visit_expr(fields[1]))
                return
        if isinstance(value, relax.Tuple) and any(f in self.grown for f in value.fields):
            kept = [self.visit_expr(f) for f in value.fields if f not in self.grown]
            self.set_var_remap(binding.var, self.builder_.emit(relax.Tuple(kept)))
            return
        super().visit_var_binding_(binding)

    def _write(self, var, cache_param, new) -> None:
        """The new row written at the position, and the first t + 1 rows as the grown cache."""
        bb = self.builder_
        if not self.defined:  # t: the position's value
            flat = bb.emit(relax.op.reshape(self.position, (1,)))
            shape = bb.emit(relax.op.tensor_to_shape(flat))
            bb.match_cast(shape, relax.ShapeType([self.length]))
            self.defined = True
        cache = self.preallocated[cache_param]
        rank = len(cache.ty.shape.values)
        index = bb.emit(relax.op.broadcast_to(relax.op.reshape(self.position, (1,) * rank), new.ty.shape))
        written = bb.emit(relax.op.scatter_elements(cache, index, new, axis=self.axis))
        rows = bb.emit(relax.op.strided_slice(written, [self.axis], [0], [self.length + 1], assume_inbound=True))
        self.set_var_remap(var, rows)
        self.written.add(cache_param)
        self.grown.add(var)
