"""A matmul of two activations with symbolic lengths: attention's Q Kᵀ and P V over a sequence.

Stage: partition (the spec, from matmul.py's reader) and kernel definition (the TE compute);
tiling and schedule are the GEMM's (gemm.py, gemm_schedule.py). The right operand is an activation whose last two
axes may be symbolic (a key length, a query length), so the GEMM's rows M, columns N and
reduction K may each be a variable: Q (B, s, d) @ Kᵀ (B, d, s) has M = N = s, P (B, s, s) @ V
(B, s, d) has M = K = s, a decode step's q (B, 1, d) @ Kᵀ (B, d, t) has N = t. The batch axes (the
heads) are static and equal in both operands; they are the outer images loop of
batch_matmul_compute's kernel.

Every symbolic extent is padded to whole tiles of the tiling chosen at its bound (dynamic.py);
the tile loops over the rows, columns and reduction of a symbolic axis are cut in their last
tile (lower/ragged.py, one CUT_PARAMS entry per tile loop level): the GEMM's m, n and k, the
FILL's and the EPILOGUE's rows and columns, every DMA box to the tensor's extent. A tile of
the reduction cut to k columns leaves the rest of the A and B tiles unwritten, which the GEMM,
cut to k, never reads. The profile counts a symbolic reduction's MACs from the commands
(`symbolic_reduction`: macs_per_output -1), which the cut makes exact.
"""

from __future__ import annotations

import math

from tvm import te, tirx

from ...errors import UnsupportedOperator
from ...relax_info import shape_dims, static_shape
from ..common.dynamic import BOUNDED, CUT_PARAMS, GATHERS, dim_var, read_shape, symbols_of
from ..common.operands import kernel_prim_func, padded
from ..common.spec import KernelSpec, Tiling
from .epilogue import epilogue_compute, epilogue_operands


def has_symbolic_operand(annotated: dict) -> bool:
    """Whether the matmul's right operand, or its left operand's reduction axis, is symbolic:
    the case this module takes (a symbolic left operand's rows alone are matmul.py's)."""
    if "prefix" in annotated:  # the first rows of a preallocated KV cache
        return True
    lhs, rhs = shape_dims(annotated["lhs"]), shape_dims(annotated["rhs"])
    if lhs is None or rhs is None:
        return False
    return any(not isinstance(d, int) for d in rhs) or (len(lhs) > 0 and not isinstance(lhs[-1], int))


def symbolic_matmul_spec(annotated: dict, permute, common: dict) -> KernelSpec:
    """The spec of a matmul whose operands are activations with symbolic last axes; raises
    UnsupportedOperator saying what stays on the host."""
    prefix = annotated.get("prefix")
    rhs_expr = annotated["rhs"] if prefix is None else prefix
    lhs_dims, rhs_dims = shape_dims(annotated["lhs"]), shape_dims(rhs_expr)
    rank = len(lhs_dims)
    if prefix is not None:  # the cache's leading axes as the matmul sees them (a reshape after the slice)
        rhs_dims = _folded(rhs_dims, rank)
    if len(rhs_dims) != rank or not 2 <= rank <= 4:
        raise UnsupportedOperator(f"matmul of rank {rank} x {len(rhs_dims)} with a symbolic right operand: the NPU "
                                  "kernel takes operands of one rank (2 to 4) with equal batch axes")
    # A length may be an expression of a variable (a KV cache grown by the new token: t + 1); the
    # kernel binds a variable of its own from the tensor (dynamic.read_shape).
    lhs_shape, lhs_names = read_shape(annotated["lhs"], "left operand", symbolic_axes=(-2, -1), expressions=True)
    rhs_shape, rhs_names = read_shape(rhs_expr, "right operand", symbolic_axes=(-2, -1), expressions=True)
    cache = None if prefix is None else cache_rows(prefix, annotated["rhs"], annotated)
    if cache is not None:  # the tile search sees the length at the cache's size, not past it
        folded = len(rhs_shape) - rank
        rhs_shape = _folded(rhs_shape[:-2], rank - 2) + (cache[-2], rhs_shape[-1])
        rhs_names = {axis - folded: name for axis, name in rhs_names.items()}
    if lhs_shape[:-2] != rhs_shape[:-2]:
        raise UnsupportedOperator(f"matmul of {_text(lhs_dims)} x {_text(rhs_dims)}: with a symbolic right operand "
                                  "the NPU kernel takes equal batch axes (broadcast them first)")
    transposed = permute is not None
    if transposed:
        axes, own = permute.attrs.axes, len(shape_dims(permute.args[0]) or ()) if prefix is not None else rank
        expected = list(range(own - 2)) + [own - 1, own - 2]
        if axes is not None and [int(a) for a in axes] != expected:
            raise UnsupportedOperator(f"permute_dims with axes {[int(a) for a in axes]} before matmul is not a "
                                      f"transpose of the last two axes ({expected})")
    k_axis, n_axis = (rank - 1, rank - 2) if transposed else (rank - 2, rank - 1)
    if lhs_names.get(rank - 1) != rhs_names.get(k_axis):
        raise UnsupportedOperator(f"matmul of {_text(lhs_dims)} x {_text(rhs_dims)}: the reduction axes differ")
    if common["bias_shape"] is not None:
        raise UnsupportedOperator("a bias after a matmul with a symbolic right operand runs on its own")
    batch = math.prod(lhs_shape[:-2])
    m, k = lhs_shape[-2:]
    n = rhs_shape[n_axis]
    kernel = {"lhs": (batch, m, k), "rhs": (batch,) + tuple(rhs_shape[-2:]), "out": (batch, m, n)}
    out_shape = tuple(lhs_shape[:-2]) + (m, n)
    caller = tuple((role, stored) for role, stored in (("lhs", lhs_shape), ("rhs", cache or rhs_shape),
                                                       ("out", out_shape)) if tuple(stored) != kernel[role])
    out_names = {axis: name for axis, name in ((rank - 2, lhs_names.get(rank - 2)), (rank - 1, rhs_names.get(n_axis)))
                 if name is not None}
    symbols = symbols_of("lhs", lhs_names) + symbols_of("rhs", rhs_names if cache is None else {}) + \
        symbols_of("out", out_names)
    return KernelSpec("matmul", lhs_shape=kernel["lhs"], rhs_shape=kernel["rhs"], rhs_transposed=transposed,
                      batch=batch, caller_shapes=caller, symbols=symbols, rhs_capacity=cache[-2] if cache else 0,
                      **common)


def _folded(dims, rank: int) -> tuple:
    """`dims` with its leading axes (all but the last rank - 1) multiplied into one: a cache
    (1, heads, t, d) as a reshape to (heads, t, d) reads it (ints, or symbolic kept as they are)."""
    dims = tuple(dims)
    if len(dims) <= rank or rank < 1:
        return dims
    lead = dims[:len(dims) - rank + 1]
    return ((math.prod(lead),) if all(isinstance(d, int) for d in lead) else lead) + dims[len(dims) - rank + 1:]


def cache_rows(prefix, cache, annotated: dict) -> tuple:
    """The static shape of the KV cache `prefix` reads the first rows of: `prefix` is
    strided_slice(cache, axes=[rank - 2], begin=[0], end=[length]) (kv_cache.py writes it), the
    cache a buffer preallocated for the longest length; a broadcast_to between it and the matmul
    (torch.export's batched matmul) must change nothing, a reshape only fold leading axes.
    Raises UnsupportedOperator otherwise."""
    shape = static_shape(cache)
    rank = len(shape or ())
    rows = shape_dims(prefix)
    if rows is None or len(rows) != rank or isinstance(rows[-2], int):
        raise UnsupportedOperator("a matmul reading a slice of static length: the slice is a layout copy of its own")
    broadcast, view = annotated.get("broadcast"), annotated.get("view")
    target = shape_dims(broadcast) if broadcast is not None else None
    if target is None and broadcast is not None:  # an offloaded function's call may carry no type: its shape argument
        given = broadcast.args[1]  # a ShapeExpr, or a parameter of the offloaded function (a shape passed in)
        values = getattr(given, "values", None) or getattr(getattr(given, "ty", None), "values", None) or ()
        target = [int(v.value) if isinstance(v, tirx.IntImm) else v for v in values]
    if broadcast is not None and not _same(target, shape_dims(broadcast.args[0])):
        raise UnsupportedOperator("a broadcast_to between a KV cache and its matmul that broadcasts: the NPU kernel "
                                  "reads the cache's rows as they are")
    viewed = target if broadcast is not None else shape_dims(view.args[0]) if view is not None else None
    if view is not None and (shape_dims(view) is None or viewed is None or
                             not _same(shape_dims(view)[-2:], viewed[-2:])):
        raise UnsupportedOperator("a reshape between a KV cache and its matmul that changes its last two axes")
    args = prefix.args
    fields = [[_constant(v) for v in getattr(arg, "fields", ())] for arg in args[1:]]
    axes, begin, strides = fields[0], fields[1], fields[3] if len(fields) > 3 else []
    if shape is None or rank < 2 or len(axes) != 1 or axes[0] is None or axes[0] % rank != rank - 2 or \
            any(v != 0 for v in begin) or any(v != 1 for v in strides):
        raise UnsupportedOperator("a matmul reading a slice of a tensor: the NPU kernel reads the first rows "
                                  "(axis -2, from 0, step 1) of a static tensor (a preallocated KV cache)")
    return tuple(shape)


def _same(a, b) -> bool:
    """Two shapes (ints or symbolic) equal axis by axis (a symbolic extent by its expression: an
    offloaded function's variables are its own objects)."""
    return a is not None and b is not None and len(a) == len(b) and all(
        x == y if isinstance(x, int) and isinstance(y, int) else
        not isinstance(x, int) and not isinstance(y, int) and str(x) == str(y) for x, y in zip(a, b))


def _constant(value) -> int | None:
    """The int a slice's axis, begin or stride holds (an IntImm, or a PrimValue of one), else None."""
    value = getattr(value, "value", value) if not isinstance(value, tirx.IntImm) else value
    return int(value.value) if isinstance(value, tirx.IntImm) else value if isinstance(value, int) else None


def _text(dims) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


def is_symbolic_matmul(spec: KernelSpec) -> bool:
    """A matmul spec this module built: its right operand has a symbolic axis, or its left
    operand's reduction axis is symbolic, or it reads a KV cache's first rows."""
    return spec.op == "matmul" and (bool(spec.symbolic("rhs")) or symbolic_reduction(spec) or spec.rhs_capacity > 0)


def symbolic_reduction(spec) -> bool:
    """Whether a matmul's reduction axis (the left operand's last) is symbolic."""
    if getattr(spec, "op", None) != "matmul" or not spec.symbols:
        return False
    rank = len(dict(spec.caller_shapes).get("lhs", spec.lhs_shape))
    return (rank - 1) in spec.symbolic("lhs")


def _axis_names(spec: KernelSpec) -> tuple:
    """The variable names (None: static) of the GEMM's rows, columns and reduction."""
    lhs_rank = len(dict(spec.caller_shapes).get("lhs", spec.lhs_shape))
    # The output has the caller's left operand's rank (symbolic_matmul_spec numbers its symbols
    # so); not spec.output_shape's, which drops a batch of one: (m, n) where the caller has (1, s, n).
    out_rank = len(dict(spec.caller_shapes).get("out", ())) or lhs_rank
    lhs, out = spec.symbolic("lhs"), spec.symbolic("out")
    return lhs.get(lhs_rank - 2), out.get(out_rank - 1), lhs.get(lhs_rank - 1)


def _extent(name, static: int):
    return dim_var(name) if name is not None else static


def _padded(name, tile: int, padded_static: int):
    return tirx.ceildiv(dim_var(name), tile) * tile if name is not None else padded_static


def symbolic_matmul_compute(spec: KernelSpec, tiling: Tiling):
    """C[b] = act(A[b] @ B[b]) for b < batch over tiles padded from the symbolic extents, and
    the commands each symbolic tile loop cuts in its last tile (CUT_PARAMS)."""
    m_name, n_name, k_name = _axis_names(spec)
    m0, n0, k0 = spec.gemm_extents
    m, n, k = _extent(m_name, m0), _extent(n_name, n0), _extent(k_name, k0)
    mp, np_, kp = (_padded(m_name, tiling.tm, tiling.mp), _padded(n_name, tiling.tn, tiling.np),
                   _padded(k_name, tiling.tk, tiling.kp))
    batch = spec.batch
    lhs_shape = (batch, m, k)
    rhs_shape = (batch, n, k) if spec.rhs_transposed else (batch, k, n)
    if spec.rhs_capacity:  # a KV cache's buffer: rows past the length are read, never used (the GEMM is cut)
        rhs_shape = (batch, spec.rhs_capacity, rhs_shape[2])
    a = te.placeholder(lhs_shape, spec.dtype, name="lhs")
    b = te.placeholder(rhs_shape, spec.dtype, name="rhs")
    a_pad = te.compute((batch, mp, kp), lambda b_, i, r: padded(a, lhs_shape, (b_, i, r)), name="a_pad")
    b_pad = te.compute((batch, kp, np_), lambda b_, r, j: padded(
        b, rhs_shape, (b_, j, r) if spec.rhs_transposed else (b_, r, j)), name="b_pad")
    r = te.reduce_axis((0, kp), name="r")
    acc = te.compute((batch, mp, np_), lambda b_, i, j: te.sum(
        a_pad[b_, i, r].astype(spec.acc_dtype) * b_pad[b_, r, j].astype(spec.acc_dtype), axis=r), name="acc")
    operands = epilogue_operands(spec, (batch, m, n))
    epi = epilogue_compute(spec, acc, tiling, operands)
    out = te.compute((batch, m, n), lambda b_, i, j: epi[b_, i, j], name="out")
    func = kernel_prim_func(spec, {"lhs": a, "rhs": b, **operands}, out)
    if spec.rhs_capacity:  # a length past the cache: a ValueError before any command (lower/ragged.py)
        length = n_name if spec.rhs_transposed else k_name
        func = func.with_attr(BOUNDED, [[length, spec.rhs_capacity, "attention over a KV cache",
                                         f"the cache holds {spec.rhs_capacity} positions: preallocate it for more "
                                         "(preallocate_kv_cache(mod, bound=...))"]])
        # The cache's rows past the length are not loaded either: its boxes are cut like a gather's,
        # to the rows the last tile of the length holds (the cache's own extent is the bound).
        func = func.with_attr(GATHERS, {"rhs": [[1, 1, 1, 0]]})
    return func.with_attr(CUT_PARAMS, cut_params(m_name, n_name, k_name))


def cut_params(m_name, n_name, k_name) -> dict:
    """CUT_PARAMS of the kernel: per device call, the parameter each symbolic tile loop (rows,
    columns, reduction, outermost first, the static ones absent) cuts ("": not cut by it)."""
    levels = [level for level, name in zip("mnk", (m_name, n_name, k_name)) if name is not None]
    per_call = {"cgra_gemm": {"m": "m", "n": "n", "k": "k"}, "cgra_fill": {"m": "rows", "n": "cols"},
                "cgra_epilogue": {"m": "m", "n": "n"}}
    # FILL and EPILOGUE run per output tile, outside the reduction's tile loop.
    return {call: [params[level] for level in levels if level in params]
            for call, params in per_call.items()}
