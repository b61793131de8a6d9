"""The matmul family: 2-D and batched matmul, and PyTorch's Linear (permute_dims + matmul).

Stage: partition (its roots and their spec) and kernel definition (its TE computes); tiling and
schedule are the GEMM's (gemm.py, gemm_schedule.py). A 2-D matmul is one GEMM: C[M, N] = act(A[M, K] @ B[K, N] +
bias) over padded tiles (blocks a_pad, b_pad, acc, epi, out and the epilogue's). A batched matmul
runs one GEMM per batch element under an outer images loop, the left operand batched alike or
shared (`batch_matmul_compute`); with shared weights the batch folds into the rows of one 2-D
GEMM read through a view (caller_shapes). Other broadcasts of the batch dims stay on the host.
"""

from __future__ import annotations

import dataclasses
import math

from tvm import te, tirx
from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from .epilogue import HALF_FLOATS, Root, epilogue_compute, epilogue_fields, epilogue_operands, static_shape, with_epilogue_tail
from ...relax_info import shape_dims
from ..common.dynamic import caller_dims, read_shape, symbols_of
from ..family import OpFamily
from .gated import gated_epilogue
from .half_post_norm import half_summed_operands
from .post_norm import post_norm_epilogue, single_buffered, summed_spec
from .rope_epilogue import rope_epilogue, rope_operands
from .gemm import choose_gemm_tiling
from .gemm_pieces import epilogue_piece_rows
from .gemm_schedule import schedule_gemm
from .residual_lhs import lhs_as_residual
from .half_row_norm import gemm_operands, lhs_dtype
from .row_norm import normed_panel, normed_roots, with_row_norm
from .row_norm import single_buffered as panel_single_buffered
from .symbolic_matmul import has_symbolic_operand, is_symbolic_matmul, symbolic_matmul_compute, symbolic_matmul_spec
from ..common.operands import kernel_prim_func, padded
from ..common.spec import SINGLE_BUFFERED, VALID_ROWS, KernelSpec, Tiling


def _roots() -> list[Root]:
    lhs, rhs, weight = wildcard(), wildcard(), wildcard()
    permute = is_op("relax.permute_dims")(weight)
    return [Root("matmul", is_op("relax.matmul")(lhs, rhs), {"lhs": lhs, "rhs": rhs}),
            Root("linear", is_op("relax.matmul")(lhs, permute), {"lhs": lhs, "rhs": weight, "permute": permute}),
            *_cache_roots(), *normed_roots()]


def _cache_roots() -> list[Root]:
    """Attention reading the first rows of a preallocated KV cache (kv_cache.py): q Kᵀ as
    matmul(q, permute_dims(strided_slice(cache))), P V as matmul(p, strided_slice(cache)); the
    kernel takes the cache whole and reads the rows up to the length (symbolic_matmul.py).
    Tried before the plain roots (chain_pattern_graphs tries a later root of as many calls first),
    whose wildcard would take the slice as an operand of its own."""
    roots = []
    # torch.export's batched matmul: broadcast_to and reshape, or the reshape alone (a broadcast_to
    # that repeats nothing is gone since no_op_broadcasts.py).
    for suffix, viewed in (("", ""), ("_view", "broadcast"), ("_reshaped", "reshape")):
        lhs, cache = wildcard(), wildcard()
        prefix = is_op("relax.strided_slice")(cache, varg_default_wildcard=True)
        permute = is_op("relax.permute_dims")(prefix)
        for name, operand, roles in (("matmul", prefix, {}), ("linear", permute, {"permute": permute})):
            view = {}
            if viewed == "broadcast":
                broadcast = is_op("relax.broadcast_to")(operand, wildcard())
                operand = is_op("relax.reshape")(broadcast, wildcard())
                view = {"broadcast": broadcast, "view": operand}
            elif viewed == "reshape":
                operand = is_op("relax.reshape")(operand, wildcard())
                view = {"view": operand}
            roots.append(Root(f"{name}_cache{suffix}", is_op("relax.matmul")(lhs, operand),
                              {"lhs": lhs, "rhs": cache, "prefix": prefix, **roles, **view}))
    return roots


def matmul_spec(name: str, annotated: dict) -> KernelSpec:
    """The kernel a matched matmul chain becomes; raises UnsupportedOperator with the reason."""
    normed, annotated = annotated, gemm_operands(annotated)  # a 16-bit norm's panel: the GEMM's lhs
    common = epilogue_fields("matmul", annotated)
    if has_symbolic_operand(annotated) and common["dtype"] in HALF_FLOATS:
        raise UnsupportedOperator(f"a {common['dtype']} matmul of two operands of symbolic length runs on the host "
                                  "(the NPU's symbolic matmul computes float32)")
    if has_symbolic_operand(annotated):  # two activations of symbolic lengths (attention's Q Kᵀ, P V)
        if "residual" in annotated or "n1" in annotated:
            raise UnsupportedOperator("an add or chain after a matmul with a symbolic right operand runs on its own")
        return with_epilogue_tail(symbolic_matmul_spec(annotated, annotated.get("permute"), common), annotated, name)
    # The rows may be symbolic (one kernel for every number of rows, dynamic.py): a 2-D
    # matmul's, and with shared 2-D weights every leading axis of the left operand.
    rhs_shape = static_shape(annotated["rhs"], "right operand")
    lhs_rank = _rank(annotated["lhs"])
    lhs_shape, lhs_symbols = read_shape(annotated["lhs"], "left operand",
                                        symbolic_axes=range(lhs_rank - 1) if len(rhs_shape) == 2 else ())
    if min(len(lhs_shape), len(rhs_shape)) < 2:
        raise UnsupportedOperator(f"matmul of rank {len(lhs_shape)} x {len(rhs_shape)}: the NPU kernel takes "
                                  "matrices (reshape a vector operand to (1, K) or (K, 1))")
    permute, bias_shape = annotated.get("permute"), common["bias_shape"]
    symbols = symbols_of("lhs", lhs_symbols) + symbols_of("out", lhs_symbols)
    if len(lhs_shape) != 2 or len(rhs_shape) != 2:
        spec = dataclasses.replace(_batched_spec(lhs_shape, rhs_shape, permute, bias_shape, common),
                                   symbols=symbols)
    else:
        if permute is not None:
            axes = permute.attrs.axes
            if axes is not None and [int(a) for a in axes] != [1, 0]:
                raise UnsupportedOperator(f"permute_dims with axes {list(axes)} before matmul is not a transpose")
        n = rhs_shape[0] if permute is not None else rhs_shape[1]
        if bias_shape is not None and (bias_shape[-1] != n or any(d != 1 for d in bias_shape[:-1])):
            raise UnsupportedOperator(f"the bias of shape {bias_shape} is not a row of {n} columns")
        spec = KernelSpec("matmul", lhs_shape=lhs_shape, rhs_shape=rhs_shape, rhs_transposed=permute is not None,
                          symbols=symbols, caller_shapes=_bias_ranked_out(lhs_shape, n, bias_shape), **common)
    return with_row_norm(with_epilogue_tail(spec, annotated, name), normed)


def _bias_ranked_out(lhs_shape, n, bias_shape) -> tuple:
    """The caller's view of a 2-D GEMM's output when a bias of more axes (1, 1, N) makes it
    (1, 1, M, N) (numpy's broadcast); the kernel stores (M, N) under it."""
    if bias_shape is None or len(bias_shape) <= 2:
        return ()
    if not all(isinstance(d, int) for d in lhs_shape):
        raise UnsupportedOperator(f"a bias of shape {bias_shape} adds axes to a matmul of symbolic rows: "
                                  f"reshape the bias to ({n},)")
    return (("out", (1,) * (len(bias_shape) - 2) + (lhs_shape[0], n)),)


def _rank(expr) -> int:
    dims = shape_dims(expr)
    return len(dims) if dims is not None else 0


def _batched_spec(lhs_shape, rhs_shape, permute, bias_shape, common) -> KernelSpec:
    """A matmul with batch dimensions: as a 2-D GEMM over all the batch's rows when the right
    operand is shared (its batch dims all 1), else with one image per batch element, the left
    operand batched alike or shared. Other broadcasts of the batch dims stay on the host."""
    transposed = permute is not None
    if transposed:
        _check_transpose(permute, len(rhs_shape))
    m, k = lhs_shape[-2:]
    n = rhs_shape[-2] if transposed else rhs_shape[-1]
    lhs_batch, rhs_batch = lhs_shape[:-2], rhs_shape[:-2]
    rank = max(len(lhs_batch), len(rhs_batch))
    out_shape = _broadcast(lhs_batch, rhs_batch) + (m, n)
    if bias_shape is not None and (len(bias_shape) > rank + 2 or bias_shape[-1] != n
                                   or any(d != 1 for d in bias_shape[:-1])):
        raise UnsupportedOperator(f"the bias of shape {bias_shape} is not a row of {n} columns")
    lhs_count, rhs_count = math.prod(lhs_batch), math.prod(rhs_batch)
    if rhs_count == 1:  # shared weights: one GEMM over lhs_count * m rows
        kernel_lhs, kernel_rhs, kernel_out, batch = (lhs_count * m, k), rhs_shape[-2:], (lhs_count * m, n), 1
    elif lhs_count == 1 or _broadcast(lhs_batch, (1,) * rank) == _broadcast(rhs_batch, (1,) * rank):
        kernel_lhs = (m, k) if lhs_count == 1 else (lhs_count, m, k)
        kernel_rhs, kernel_out, batch = (rhs_count,) + rhs_shape[-2:], (rhs_count, m, n), rhs_count
    else:
        raise UnsupportedOperator(f"matmul of {lhs_shape} x {rhs_shape} broadcasts the batch dimensions against "
                                  "each other; the NPU kernel takes equal batches or a shared operand")
    # The kernel reads every operand as a compact view of what the caller passes.
    caller = tuple((role, stored) for role, stored, kernel in (
        ("lhs", lhs_shape, kernel_lhs), ("rhs", rhs_shape, kernel_rhs), ("out", out_shape, kernel_out))
        if tuple(stored) != tuple(kernel))
    return KernelSpec("matmul", lhs_shape=kernel_lhs, rhs_shape=tuple(kernel_rhs), rhs_transposed=transposed,
                      batch=batch, caller_shapes=caller, **common)


def _check_transpose(permute, rank: int) -> None:
    """permute_dims before matmul must swap the last two axes and keep the batch axes."""
    axes = permute.attrs.axes
    expected = list(range(rank - 2)) + [rank - 1, rank - 2]
    actual = list(reversed(range(rank))) if axes is None else [int(a) for a in axes]
    if actual != expected:
        raise UnsupportedOperator(f"permute_dims with axes {actual} before matmul is not a transpose of the "
                                  f"last two axes ({expected})")


def _broadcast(a: tuple, b: tuple) -> tuple:
    """numpy's broadcast of two batch shapes (relax has checked they broadcast)."""
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    return tuple(max(x, y) for x, y in zip(a, b))


def matmul_compute(spec: KernelSpec, tiling: Tiling):
    """The kernel's PrimFunc: a 2-D GEMM, or `batch_matmul_compute` for a batch of them
    (`symbolic_matmul_compute` when the right operand or the reduction is symbolic)."""
    if is_symbolic_matmul(spec):
        return symbolic_matmul_compute(spec, tiling)
    if spec.batch > 1:
        return batch_matmul_compute(spec, tiling)
    m, n, _ = spec.gemm_extents
    # Symbolic rows: the product of the caller's leading axes of the left operand (one of them
    # a variable), over whole tiles of them.
    if spec.symbolic("lhs"):
        m = math.prod(caller_dims(spec, "lhs", spec.lhs_shape)[:-1])
        mp = tirx.ceildiv(m, tiling.tm) * tiling.tm
    else:
        mp = tiling.mp
    lhs_shape = (m, spec.lhs_shape[1])
    a = te.placeholder(lhs_shape, lhs_dtype(spec), name="lhs")  # float32 rows a 16-bit norm's panel rounds
    b = te.placeholder(spec.rhs_shape, spec.rhs_dtype, name="rhs")
    a_pad = te.compute((mp, tiling.kp), lambda i, r: padded(a, lhs_shape, (i, r)), name="a_pad")
    if spec.rhs_transposed:
        b_pad = te.compute((tiling.kp, tiling.np), lambda r, j: padded(b, spec.rhs_shape, (j, r)), name="b_pad")
    else:
        b_pad = te.compute((tiling.kp, tiling.np), lambda r, j: padded(b, spec.rhs_shape, (r, j)), name="b_pad")
    normed = {}
    a_in = normed_panel(spec, a_pad, tiling, normed)  # an RMSNorm's rows normalised in the panel (row_norm.py)
    r = te.reduce_axis((0, tiling.kp), name="r")
    acc = te.compute(
        (mp, tiling.np),
        lambda i, j: te.sum(a_in[i, r].astype(spec.acc_dtype) * b_pad[r, j].astype(spec.acc_dtype), axis=r),
        name="acc")
    if spec.gated:  # act(even columns) * odd columns, (m, n / 2): gated.py
        operands, epi, n = {}, gated_epilogue(spec, acc, tiling), n // 2
    elif spec.rope_pattern:  # x * C + x[:, partner] * S: rope_epilogue.py
        operands = rope_operands(spec, m)
        epi = rope_epilogue(spec, acc, tiling, operands, m)
        operands = {role: value for role, value in operands.items() if value is not None}
    else:
        operands = lhs_as_residual(spec, epilogue_operands(spec, (m, n)), a)  # x @ W + x: residual_lhs.py
        epi = epilogue_compute(summed_spec(spec) if spec.post_norm else spec, acc, tiling,
                               half_summed_operands(spec, operands),  # (a 16-bit post-norm's: half_post_norm.py)
                               out_index=lambda i, j: (i, j), name="post_summed" if spec.post_norm else "epi")
        if spec.post_norm:  # the layer norm of the sum's rows: post_norm.py
            epi = post_norm_epilogue(spec, epi, tiling, operands)
    out = te.compute((m, n), lambda i, j: epi[i, j], name="out")
    func = kernel_prim_func(spec, {"lhs": a, "rhs": b, **operands, **normed}, out)
    if isinstance(m, int) and m < tiling.tm == mp:  # one row tile, padded: lower/padded_rows.py
        func = func.with_attr(VALID_ROWS, [m, tiling.tm, epilogue_piece_rows(tiling)])
    # a post-norm's and a pre-norm's program intermediates: one copy each (post_norm.py, row_norm.py)
    single = (single_buffered(spec) if spec.post_norm else []) + panel_single_buffered(spec)
    return func.with_attr(SINGLE_BUFFERED, single) if single else func


def batch_matmul_compute(spec: KernelSpec, tiling: Tiling):
    """C[b] = act(A[b] @ B[b] + bias) for b < spec.batch: the 2-D GEMM under an outer images
    loop, as a conv2d runs its images; A may be one (M, K) matrix shared by all images."""
    m, n, _ = spec.gemm_extents
    a = te.placeholder(spec.lhs_shape, spec.dtype, name="lhs")
    b = te.placeholder(spec.rhs_shape, spec.rhs_dtype, name="rhs")
    shared_lhs = len(spec.lhs_shape) == 2
    a_pad = te.compute((spec.batch, tiling.mp, tiling.kp), lambda b_, i, r: padded(
        a, spec.lhs_shape, (i, r) if shared_lhs else (b_, i, r)), name="a_pad")
    b_pad = te.compute((spec.batch, tiling.kp, tiling.np), lambda b_, r, j: padded(
        b, spec.rhs_shape, (b_, j, r) if spec.rhs_transposed else (b_, r, j)), name="b_pad")
    r = te.reduce_axis((0, tiling.kp), name="r")
    acc = te.compute((spec.batch, tiling.mp, tiling.np), lambda b_, i, j: te.sum(
        a_pad[b_, i, r].astype(spec.acc_dtype) * b_pad[b_, r, j].astype(spec.acc_dtype), axis=r), name="acc")
    operands = epilogue_operands(spec, (spec.batch, m, n))
    epi = epilogue_compute(spec, acc, tiling, operands)
    out = te.compute((spec.batch, m, n), lambda b_, i, j: epi[b_, i, j], name="out")
    return kernel_prim_func(spec, {"lhs": a, "rhs": b, **operands}, out)


MATMUL = OpFamily(
    name="matmul", ops=("matmul",), roots=_roots, spec_from_match=matmul_spec,
    choose_tiling=choose_gemm_tiling, compute=matmul_compute, schedule=schedule_gemm,
    host_ops={"relax.matmul": "cgra.matmul"}, checks_pe_dtype=True)
