"""The MLP family: a transformer's fc1 [+ b1] [activation] and fc2 [+ b2] [+ residual] as one kernel.

Stage: partition (the pair's patterns and its spec), kernel definition and schedule; the tile
search is mlp_tiles.py. As two kernels the fc1 kernel stores its hidden (rows x H, the block's
widest tensor) and the fc2 kernel loads it back: Swin's first MLP on cgra-8x8 stores 64 KB and
its fc2 is bound by loading them. Fused, per tile of `tm` rows and per block of `th` hidden
columns the kernel runs one GEMM of the rows against fc1's weights (the whole depth K, the rows'
panel loaded once per row tile), fc1's EPILOGUE (b1, relu) and the activation (the VFUNC or the
FABRIC bodies the GEMM + activation kernel issues, intrinsics/epilogue_tail.py) into a
scratchpad buffer, then one GEMM of that buffer against the block of fc2's weights, accumulating
over the blocks; fc2's EPILOGUE (b2, the residual) and the one store end the tile. The hidden
never leaves the scratchpad. Structurally the attention kernel with constant K = W1 and V = W2,
the activation in place of the softmax, and no rescaling.

The pair is fused only where the kernel computes it: float32 2-D linears (matmul, or PyTorch's
permute_dims + matmul) of static rows, fc1's tail no more than [+ bias] [reshape] [GELU (erf or
tanh) | SiLU | relu], fc2's no more than [+ bias] [reshape] [+ residual], fc2 reading fc1's
output (through views) alone; and only where a tile fits the scratchpad and the estimate is
below the two kernels' (mlp_tiles.py). Otherwise the check gives the reason and the two linears
stay two kernels, as they were. Gated MLPs and 16-bit / int8 linears are refused.
"""

from __future__ import annotations

import dataclasses
import functools

from tvm import te
from tvm.relax.dpl import is_op, wildcard

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from ..common.operands import kernel_prim_func, padded
from ..common.spad_layout import a_row_stride, align_rows
from ..common.spec import BIAS_IN_ACC, BUFFER_COPIES, KernelSpec
from ..family import OpFamily
from ..gemm.bias_acc import ACC_COPIES
from ..gemm.epilogue import epilogue_compute, epilogue_intrin, epilogue_operands
from ..gemm.epilogue_tail import with_reshape
from ..gemm.gemm_schedule import loops_after
from ..gemm.matmul import matmul_spec
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.epilogue_tail import act_value
from ..intrinsics.vector_unit import activation
from .mlp_tiles import MlpTiling, choose_mlp_tiling, hidden_tiling
from .separable import channel_bias_row

#: Relax activation op -> the activation fc1's epilogue runs (relu: the EPILOGUE's own flag).
_ACTS = {"relax.nn.gelu": "gelu", "relax.nn.gelu_tanh": "gelu_tanh", "relax.nn.silu": "silu", "relax.nn.relu": "relu"}
#: fc1's roles as the pair's patterns name them -> as matmul_spec reads one linear's.
_FC1_ROLES = {"lhs": "lhs", "fc1_rhs": "rhs", "fc1_permute": "permute", "fc1_root": "root", "fc1_bias": "bias",
              "fc1_reshape": "reshape", "fc1_act": "act", "fc1_relu": "relu"}
_FC2_ROLES = ("rhs", "permute", "root", "bias", "reshape", "residual")


@dataclasses.dataclass(frozen=True)
class MlpSpec:
    """fc1 with its epilogue and activation, then fc2 with its epilogue, as one kernel."""

    fc1: KernelSpec  # op "matmul": lhs (M, K), [bias], [relu], act
    fc2: KernelSpec  # op "matmul": its lhs is fc1's output, (M, H)
    source_ops: tuple = ()
    param_roles: tuple = ()  # lhs, fc1_rhs, [fc1_bias], rhs, [bias], [residual], in call order
    op = "mlp"
    compute_name = "mlp"
    symbols = ()
    symbolic_image = False
    dtype = property(lambda self: self.fc1.dtype)
    acc_dtype = property(lambda self: self.fc1.acc_dtype)
    output_shape = property(lambda self: self.fc2.output_shape)
    macs = property(lambda self: self.fc1.macs + self.fc2.macs)
    caller_shapes = property(lambda self: tuple((r, s) for r, s in self.fc1.caller_shapes if r == "lhs")
                             + tuple((r, s) for r, s in self.fc2.caller_shapes if r in ("out", "residual")))
    shape_args = ()

    @property
    def act(self) -> str | None:
        """fc1's activation: "gelu", "gelu_tanh", "silu", "relu" or None."""
        return "relu" if self.fc1.relu else self.fc1.act

    @property
    def roles(self) -> tuple:
        return self.param_roles or (("lhs", "fc1_rhs") + (("fc1_bias",) if self.fc1.bias_shape else ())
                                    + ("rhs",) + (("bias",) if self.fc2.bias_shape else ())
                                    + (("residual",) if self.fc2.residual_shape else ()))


# ------------------------------------------------------------------ partition

def _linear(lhs, weight):
    """matmul(lhs, permute_dims(weight)) (PyTorch's Linear) or matmul(lhs, weight): (pattern, permute)."""
    permute = is_op("relax.permute_dims")(weight)
    return is_op("relax.matmul")(lhs, permute | weight), permute


def _pairs() -> list:
    """(name, pattern, roles): fc1 [+ b1] [reshape] [act] [reshape] feeding fc2 [+ b2] [reshape]
    [+ residual] (the add's operands in either order under one name). The optional pieces are
    alternatives inside one pattern; the spec reads which of them matched."""
    x, w1, b1, w2, b2, residual = (wildcard() for _ in range(6))
    fc1, permute1 = _linear(x, w1)
    summed1 = is_op("relax.add")(fc1, b1) | fc1
    reshaped1 = is_op("relax.reshape")(summed1, wildcard())
    value1 = reshaped1 | summed1
    acts = {op: is_op(op)(value1) for op in _ACTS}
    sigmoid = is_op("relax.sigmoid")(value1)  # SiLU as torch.export may write it: x * sigmoid(x)
    act = functools.reduce(lambda a, b: a | b, [acts[op] for op in _ACTS if op != "relax.nn.relu"] + [
        is_op("relax.multiply")(value1, sigmoid), is_op("relax.multiply")(sigmoid, value1)])
    hidden = act | acts["relax.nn.relu"] | value1
    hidden = is_op("relax.reshape")(hidden, wildcard()) | hidden
    fc2, permute2 = _linear(hidden, w2)
    summed2 = is_op("relax.add")(fc2, b2) | fc2
    reshaped2 = is_op("relax.reshape")(summed2, wildcard())
    value2 = reshaped2 | summed2
    top = is_op("relax.add")(value2, residual) | is_op("relax.add")(residual, value2) | value2
    roles = {"lhs": x, "fc1_rhs": w1, "fc1_permute": permute1, "fc1_root": fc1, "fc1_bias": b1,
             "fc1_reshape": reshaped1, "fc1_act": act, "fc1_relu": acts["relax.nn.relu"],
             "rhs": w2, "permute": permute2, "root": fc2, "bias": b2, "reshape": reshaped2, "residual": residual}
    return [("cgra.mlp", top, roles)]


def _linear_spec(roles: dict) -> KernelSpec:
    """One linear's KernelSpec from its roles (lhs, rhs, [permute], root, [bias], [reshape],
    [act | relu], [residual]), as the linear's own pattern would have read it."""
    tail = "act" in roles or ("reshape" in roles and ("residual" in roles or "relu" in roles))
    if tail:
        return matmul_spec("cgra.linear_epilogue", roles)
    spec = matmul_spec("cgra.mlp_linear", {r: e for r, e in roles.items() if r != "reshape"})
    return with_reshape(spec, roles) if "reshape" in roles else spec


def mlp_spec(name: str, annotated: dict) -> MlpSpec:
    """The kernel a matched fc1 -> fc2 pair becomes; raises UnsupportedOperator with the reason
    the pair stays two kernels."""
    del name
    dtype = dtype_of(annotated["lhs"])
    if dtype != "float32":
        raise UnsupportedOperator(f"a {dtype} MLP stays two kernels (its hidden would need rounding between the "
                                  "GEMMs); float32 pairs fuse")
    if "fc1_act" in annotated and "fc1_relu" in annotated:
        raise UnsupportedOperator("two activations after fc1")
    fc1_roles = {ours: annotated[role] for role, ours in _FC1_ROLES.items() if role in annotated}
    if "fc1_permute" not in annotated:
        fc1_roles.pop("permute", None)
    fc1 = _linear_spec(fc1_roles)
    fc2_roles = {role: annotated[role] for role in _FC2_ROLES if role in annotated}
    hidden = annotated["root"].args[0]  # (no role of its own: it is fc1's act, reshape or sum too)
    fc2 = _linear_spec({**fc2_roles, "lhs": hidden})
    if "residual" in annotated and any(annotated["residual"].same_as(e) for e in (annotated["lhs"], hidden)):
        raise UnsupportedOperator("the residual is the MLP's input or hidden: one tensor in two roles")
    _check_pair(fc1, fc2)
    return MlpSpec(fc1, fc2)


def _check_pair(fc1: KernelSpec, fc2: KernelSpec) -> None:
    """What the fused kernel computes: refuse the rest with the reason (they stay two kernels)."""
    m, h, k = fc1.gemm_extents
    what = f"fc1 {m} x {k} -> {h}, fc2 -> {fc2.gemm_extents[1]}"
    for spec in (fc1, fc2):
        if spec.batch != 1 or spec.symbols or spec.row_norm or spec.post_norm or spec.gated or spec.rope_pattern \
                or spec.multiplier_shape or spec.channel_scale_shape or spec.fabric_body or spec.half_out \
                or spec.half_via or spec.clip is not None or spec.residual_is_lhs:
            raise UnsupportedOperator(f"{what}: the fused MLP takes static 2-D float32 linears with [+ bias] "
                                      "[activation] and [+ bias] [+ residual]; these stay two kernels")
    if fc1.residual_shape:
        raise UnsupportedOperator(f"{what}: a residual add between the two linears")
    if fc2.act or fc2.relu:
        raise UnsupportedOperator(f"{what}: an activation after fc2 (the fused kernel ends with its residual)")
    if fc2.gemm_extents[0] != m or fc2.gemm_extents[2] != h or tuple(fc2.lhs_shape) != (m, h):
        raise UnsupportedOperator(f"{what}: fc2 reads fc1's output as {fc2.lhs_shape}, not its ({m}, {h}) rows")


# ------------------------------------------------------------------ kernel definition

def _weights(name: str, spec: KernelSpec, depth_pad: int, cols_pad: int):
    """(placeholder, its padded (depth, cols) scratchpad block `name`) of a linear's weights."""
    w = te.placeholder(spec.rhs_shape, spec.dtype, name=name)
    return w, te.compute((depth_pad, cols_pad), lambda r, j: padded(
        w, spec.rhs_shape, (j, r) if spec.rhs_transposed else (r, j)), name=f"{name}_pad")


def mlp_compute(spec: MlpSpec, tiling: MlpTiling):
    """out[i, j] = epilogue2(sum over h of act(epilogue1(x[i] . W1[:, h]))[h] * W2[h, j]) over
    whole tiles: tiling.mp rows, tiling.kp of fc1's depth, tiling.hp hidden columns (blocks of
    tiling.tk), tiling.np output columns (zero beyond the real extents)."""
    fc1, fc2 = spec.fc1, spec.fc2
    m, _, k = fc1.gemm_extents
    x = te.placeholder((m, k), fc1.dtype, name="lhs")
    a_pad = te.compute((tiling.mp, tiling.kp), lambda i, r: padded(x, (m, k), (i, r)), name="a_pad")
    w1, b1_pad = _weights("fc1_weight", fc1, tiling.kp, tiling.hp)
    w2, b2_pad = _weights("weight", fc2, tiling.hp, tiling.np)
    r = te.reduce_axis((0, tiling.kp), name="r")
    acc1 = te.compute((tiling.mp, tiling.hp), lambda i, h: te.sum(a_pad[i, r] * b1_pad[r, h], axis=r), name="acc1")
    bias1 = te.placeholder(fc1.bias_shape, fc1.acc_dtype, name="fc1_bias") if fc1.bias_shape else None
    bias1_pad = channel_bias_row(fc1, bias1, tiling.hp, "bias1_pad")
    vfunc = hidden_tiling(spec, tiling).act_on_vector

    def hidden_value(b, i, c):  # the EPILOGUE intrinsic's expression (intrinsics/epilogue_tail.py)
        h = b * tiling.tk + c
        value = acc1[i, h] + bias1_pad[h] if bias1_pad is not None else acc1[i, h]
        value = activation(value, fc1.acc_dtype, fc1.relu, None)
        return act_value(fc1.act, value, vfunc) if fc1.act else value

    # The hidden block by block, each block's rows one run of the scratchpad (blocks, rows, tk):
    # fc2's GEMM of block b then waits for block b's activation alone, not for every block's
    # (the scoreboard tracks a command's region as one interval).
    blocks = tiling.hp // tiling.tk
    hid = te.compute((blocks, tiling.mp, tiling.tk), hidden_value, name="hid")
    rb, rc = te.reduce_axis((0, blocks), name="rb"), te.reduce_axis((0, tiling.tk), name="rc")
    acc = te.compute((tiling.mp, tiling.np), lambda i, j: te.sum(
        hid[rb, i, rc] * b2_pad[rb * tiling.tk + rc, j], axis=[rb, rc]), name="acc")
    n = fc2.gemm_extents[1]
    operands = epilogue_operands(fc2, (m, n))
    epi = epilogue_compute(fc2, acc, tiling, operands, out_index=lambda i, j: (i, j))
    out = te.compute((m, n), lambda i, j: epi[i, j], name="out")
    inputs = {"lhs": x, "fc1_rhs": w1, "fc1_bias": bias1, "rhs": w2, **operands}
    return kernel_prim_func(spec, inputs, out)


# ------------------------------------------------------------------ schedule

def schedule_mlp(sch, spec: MlpSpec, tiling: MlpTiling, arch: HardwareDescription) -> None:
    """Tiles of `tm` rows x every output column. Per tile: A's panel (the whole depth), fc2's
    bias row and residual tile; per block of `tk` hidden columns fc1's weights and bias loaded,
    one FILL, GEMM and EPILOGUE (+ activation) into the tile's whole hidden (tm x hp, in the
    scratchpad); then one FILL of the accumulator and per block fc2's weights loaded and one
    GEMM; fc2's EPILOGUE and the store. All of fc1's GEMMs come before fc2's, so the PE array
    runs block b + 1's while the vector unit activates block b (a block's fc2 GEMM would
    otherwise wait for it)."""
    fc1, fc2 = spec.fc1, spec.fc2
    epi, acc = sch.get_sblock("epi"), sch.get_sblock("acc")
    row, col = sch.get_loops(epi)
    row_outer, row_inner = sch.split(row, [None, tiling.tm])
    col_outer, col_inner = sch.split(col, [None, tiling.np])
    sch.reorder(row_outer, col_outer, row_inner, col_inner)
    tile = col_outer
    sch.compute_at(acc, tile)
    for name in (("bias_pad",) if fc2.bias_shape else ()) + (("res_pad",) if fc2.residual_shape else ()):
        _stage(sch, name, tile)
    sch.reverse_compute_at(sch.get_sblock("out"), tile)
    loops = loops_after(sch, acc, tile)
    if len(loops) == 4:
        i, j, block_outer, block_inner = loops
        sch.reorder(block_outer, i, j, block_inner)
    else:  # one hidden block: compute_at dropped its unit loop
        (i, j, _), block_outer = loops, None
    for name in ("weight_pad", "fc1_weight_pad"):  # both weights held: loaded once, before the tiles
        sch.set_scope(sch.get_sblock(name), 0, SPAD)
    hid = sch.get_sblock("hid")
    sch.compute_at(hid, tile)
    sch.set_scope(hid, 0, SPAD)
    hidden_block, hi, _ = ([None] if len(loops) == 3 else []) + loops_after(sch, hid, tile)
    hidden_block = hidden_block or tile
    for name in ("acc1",) + (("bias1_pad",) if fc1.bias_shape else ()):
        _stage(sch, name, hidden_block)
    if tiling.bias_in_acc:  # b1 loaded into fc1's accumulator, the VFUNC reads it (gemm/bias_acc.py)
        sch.annotate(hidden_block, BUFFER_COPIES, {"acc1": ACC_COPIES})
        sch.annotate(hidden_block, BIAS_IN_ACC, 1)
    _stage(sch, "a_pad", tile)
    for block in (acc, epi):
        sch.set_scope(block, 0, SPAD)
    acc1 = sch.get_sblock("acc1")
    init1 = sch.decompose_reduction(acc1, loops_after(sch, acc1, hidden_block)[0])
    init = sch.decompose_reduction(acc, block_outer or i)
    sch.tensorize(loops_after(sch, acc1, hidden_block)[0],
                  get_intrin("gemm", tiling.tm, tiling.tk, tiling.kp, fc1.dtype, fc1.acc_dtype))
    sch.tensorize(sch.get_loops(init1)[-2], get_intrin("fill", tiling.tm, tiling.tk, fc1.acc_dtype))
    sch.tensorize(hi, epilogue_intrin(fc1, hidden_tiling(spec, tiling), rows=tiling.tm))
    sch.tensorize(loops_after(sch, acc, block_outer)[0] if block_outer is not None else i,
                  get_intrin("gemm", tiling.tm, tiling.np, tiling.tk, fc2.dtype, fc2.acc_dtype))
    sch.tensorize(sch.get_loops(init)[-2], get_intrin("fill", tiling.tm, tiling.np, fc2.acc_dtype))
    sch.tensorize(row_inner, epilogue_intrin(fc2, tiling, rows=tiling.tm))
    # The PE array reads one element of each A row a cycle: rows a multiple of the banks'
    # period apart would sit in one bank (spad_layout.py). (After tensorize, which blockizes.)
    item = DType.from_name(spec.dtype).itemsize
    align_rows(sch, sch.get_sblock("a_pad"), tiling.kp, a_row_stride(tiling.tm, tiling.kp, item, arch),
               spec.dtype, arch)
    align_rows(sch, sch.get_sblock("hid_o"), tiling.tk, a_row_stride(tiling.tm, tiling.tk, item, arch),
               spec.dtype, arch)


def _stage(sch, name: str, loop) -> None:
    """Block `name` computed under `loop`, into the scratchpad."""
    block = sch.get_sblock(name)
    sch.compute_at(block, loop)
    sch.set_scope(block, 0, SPAD)


MLP = OpFamily(
    name="mlp", ops=("mlp",), pairs=_pairs, spec_from_match=mlp_spec,
    choose_tiling=choose_mlp_tiling, compute=mlp_compute, schedule=schedule_mlp,
    checks_pe_dtype=True)
