"""RMSNorm folded into the linear layer that reads it: the GEMM normalises its own A panel.

Stage: partition (the roots `cgra.<matmul | linear>_rms_norm...` and the spec field they set) and
kernel definition, tiling and schedule (the A panel's row program). A pre-norm transformer
(Llama, Qwen, Mistral) feeds each RMSNorm's output only to linear layers, the norm's weight
already in their weights (normalise/norm_folds.py) and each reader given its own copy of the
norm (normalise/normed_linears.py). For such a

    matmul(rms_norm(x, ones, eps), W)      x float32 (M, K), static, W a constant

the kernel takes x itself: per tile of rows, once its A panel (tm x K) is in the scratchpad,

    REDUCE  s = sum_k x[i, k]^2                    (a FILL of 0 first)
    VFUNC   r = rsqrt(s * (1 / K) + eps)           a column of tm
    ELTWISE a = x * r                              the panel, r broadcast along the row

and the GEMMs read `a`: the very commands the norm kernel runs (kernels/rows/norms.py) on the
same values, so the result is bit-exact to the two kernels it replaces, without the norm's
launch, its store of the normed rows and the GEMM's load of them. The REDUCE and VFUNC run on
the vector unit beside the PE array (the previous row tile's GEMMs); the ELTWISE is a pass over
the panel, not over the wider output (Llama's q / k / v and gate / up outputs are 2-4x K).

Only where the kernel holds the whole reduction in one step (tk = K): the row's statistics need
the row whole. A tiling that splits K refuses the root and the norm runs as its own kernel.
"""

from __future__ import annotations

import dataclasses

import tvm
from tvm import relax, te
from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from ..common.spec import KernelSpec, Tiling, aligned
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.row_ops import reduce_start
from ..rows.rows import Step, stage_of
from .epilogue import Root

F32 = "float32"
#: The blocks of the panel's row program, in order.
BLOCKS = ("row_sq", "row_scale", "a_normed")


def normed_roots() -> list[Root]:
    """A matmul and a linear (permute_dims + matmul) whose left operand is a plain RMSNorm. Its
    weight (ones) is a wildcard: inside the composite it is a parameter (role "norm_weight", which
    the kernel takes and never reads); at partition it is the constant `with_row_norm` checks."""
    roots = []
    for name, permuted in (("matmul", False), ("linear", True)):
        x, rhs, weight = wildcard(), wildcard(), wildcard()
        norm = is_op("relax.nn.rms_norm")(x, weight)
        operand = is_op("relax.permute_dims")(rhs) if permuted else rhs
        roles = {"lhs": x, "rhs": rhs, "row_norm": norm, "norm_weight": weight, **({"permute": operand} if permuted else {})}
        roots.append(Root(f"{name}_rms_norm", is_op("relax.matmul")(norm, operand), roles))
    return roots


def with_row_norm(spec: KernelSpec, annotated: dict) -> KernelSpec:
    """`spec` normalising its left operand's rows (RMSNorm, weight ones) when the match has a
    norm; raises UnsupportedOperator when the kernel cannot (the norm then runs on its own)."""
    norm = annotated.get("row_norm")
    if norm is None:
        return spec
    weight = norm.args[1]
    if not isinstance(weight, (tvm.ir.GenericConst, relax.Var)) or \
            isinstance(weight, tvm.ir.GenericConst) and not (weight.value.numpy() == 1).all():
        raise UnsupportedOperator("rms_norm before a matmul: its weight is not all 1 (norm_folds.py folds it into "
                                  "the weights where it can); the norm runs on its own")
    if spec.op != "matmul" or spec.compute_name != "matmul" or spec.dtype != F32 or spec.symbols or spec.batch > 1:
        raise UnsupportedOperator("rms_norm folded into a matmul: a 2-D float32 GEMM with static rows only; the "
                                  "norm runs on its own")
    axes = [int(a) for a in norm.attrs.axes]
    if axes not in ([-1], [len(spec.lhs_shape) - 1]) or dtype_of(norm) != F32:
        raise UnsupportedOperator("rms_norm folded into a matmul normalises the last axis of float32 rows")
    return dataclasses.replace(spec, row_norm_eps=float(norm.attrs.epsilon))


def check_row_norm(spec: KernelSpec, tiling: Tiling) -> None:
    """Refuse a tiling that does not hold whole rows of A: the statistics need the row whole."""
    if spec.row_norm_eps is not None and (tiling.tk != tiling.kp or tiling.stream_panel):
        raise UnsupportedOperator(f"rms_norm folded into a matmul of depth {spec.gemm_extents[2]}: the tiling "
                                  f"steps through it {tiling.tk} at a time, and the row's statistics need the "
                                  "row whole; the norm runs on its own")


def _steps(spec: KernelSpec) -> tuple:
    """The panel's row program (kernels/rows/norms.py's RMSNorm without its weight)."""
    depth = spec.gemm_extents[2]
    return (Step("row_sq", "reduce", "sum_squares", ("x",)),
            Step("row_scale", "vfunc", "rsqrt", ("row_sq",), 1.0 / depth, spec.row_norm_eps),
            Step("a_normed", "eltwise", "multiply", ("x", "row_scale")))


def normed_panel(spec: KernelSpec, a_pad, tiling: Tiling, inputs: dict):
    """The A panel the GEMMs read: `a_pad` itself, or its rows normalised (module doc); the
    norm's weight, a parameter the kernel never reads, joins `inputs`."""
    if spec.row_norm_eps is None:
        return a_pad
    inputs["norm_weight"] = te.placeholder((spec.gemm_extents[2],), F32, name="norm_weight")
    mp, kp = a_pad.shape
    tensors, kinds = {"x": a_pad}, {"x": "full", "row_sq": "column", "row_scale": "column", "a_normed": "full"}
    for step in _steps(spec):
        tensors[step.name] = stage_of(step, tensors, kinds, mp, int(kp))
    return tensors["a_normed"]


def place_row_norm(sch, spec: KernelSpec, at) -> None:
    """The panel's row program under the loop `at`, where the A panel is loaded (before the
    panel's own compute_at, which needs its readers there)."""
    if spec.row_norm_eps is None:
        return
    for name in reversed(BLOCKS):
        block = sch.get_sblock(name)
        sch.compute_at(block, at)
        sch.set_scope(block, 0, SPAD)


def tensorize_row_norm(sch, spec: KernelSpec, tiling: Tiling, align) -> None:
    """Each step of the panel's row program tensorized onto its command; `align(block)` pads the
    rows of the normalised panel as the GEMM schedule pads A's (after tensorize, which blockizes
    "a_normed" into "a_normed_o" and would drop an annotation made before)."""
    if spec.row_norm_eps is None:
        return
    tm, kp = tiling.tm, tiling.kp
    block = sch.get_sblock("row_sq")
    init = sch.decompose_reduction(block, sch.get_loops(block)[-2])
    sch.add_unit_loop(init)
    sch.tensorize(sch.get_loops(init)[-2], get_intrin("fill", tm, 1, F32, value=reduce_start("sum_squares")))
    sch.add_unit_loop(sch.get_loops(block)[-1])
    sch.tensorize(sch.get_loops(block)[-3], get_intrin("reduce", tm, kp, "sum_squares"))
    scale = sch.get_sblock("row_scale")
    sch.add_unit_loop(scale)
    step = _steps(spec)[1]
    sch.tensorize(sch.get_loops(scale)[-2], get_intrin("vfunc", tm, 1, "rsqrt", scale=step.scale, offset=step.offset))
    normed = sch.get_sblock("a_normed")
    sch.tensorize(sch.get_loops(normed)[-2], get_intrin("eltwise", tm, kp, "multiply", F32, a_full=(True, True),
                                                           b_full=(True, False)))
    align(sch.get_sblock("a_normed_o"))


def fits_normed_panel(tm: int, depth: int, in_bytes: int, arch, footprint: int) -> bool:
    """Whether a tile whose footprint (without the panel program) is `footprint` has room for the
    normalised panel (tm x depth) and its two columns too."""
    return footprint + aligned(tm * depth * in_bytes) + 2 * aligned(tm * 4) <= arch.spad_bytes

