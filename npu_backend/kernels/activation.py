"""The activation family: a standalone relu or clip on the vector unit's EPILOGUE.

Stage: partition (its patterns and spec), kernel definition, tiling and schedule. Input: a Relax
`nn.relu` or `clip` (constant bounds) of a float32 or int32 tensor of rank 1..4 that no conv2d /
matmul kernel fuses (a relu after an elementwise add, a clip after a relu). The kernel reads the
tensor as a compact (rows, cols) view, loads tm x tn tiles by DMA, runs one EPILOGUE per tile
(no bias, no residual: acc -> relu / clip -> out) and stores the tile.
"""

from __future__ import annotations

import dataclasses
import math

from tvm import te
from tvm.relax.dpl import is_op, wildcard

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ..errors import ScratchpadTooSmall, UnsupportedOperator
from ..relax_info import dtype_of, require_static_shape
from .chains import clip_bounds
from .family import OpFamily
from .intrinsics import SPAD, get_intrin
from .intrinsics.vector_unit import activation
from .operands import padded, prim_func
from .spec import Tiling, aligned, round_up

DTYPES = ("float32", "int32")  # the EPILOGUE's accumulator dtypes


@dataclasses.dataclass(frozen=True)
class ActivationSpec:
    dtype: str
    shape: tuple  # as the caller passes it
    rows: int  # the kernel's (rows, cols) view of it
    cols: int
    relu: bool = False
    clip: tuple | None = None
    param_roles: tuple = ("lhs",)
    source_ops: tuple = ()
    op = "activation"
    macs = 0
    acc_dtype = property(lambda self: self.dtype)


def _patterns() -> list:
    x = wildcard()
    relu = is_op("relax.nn.relu")(x)
    clip = is_op("relax.clip")(x, wildcard(), wildcard())
    return [("cgra.relu", relu, {"root": relu, "lhs": x}), ("cgra.clip", clip, {"root": clip, "lhs": x})]


def activation_spec(name: str, annotated: dict) -> ActivationSpec:
    op = name.removeprefix("cgra.")
    dtype = dtype_of(annotated["lhs"])
    if dtype not in DTYPES:
        raise UnsupportedOperator(f"{op} on {dtype or 'an unknown dtype'}: the EPILOGUE computes "
                                  f"{' or '.join(DTYPES)}")
    shape = require_static_shape(annotated["lhs"], "operand", UnsupportedOperator, prefix=f"{op}: ")
    if not 1 <= len(shape) <= 4:
        raise UnsupportedOperator(f"{op} of rank {len(shape)}: the NPU's DMA moves tensors of rank 1..4")
    clip = clip_bounds(annotated["root"], dtype) if op == "clip" else None
    cols = shape[-1]
    return ActivationSpec(dtype, tuple(shape), max(math.prod(shape) // cols, 1), cols, op == "relu", clip)


def choose_activation_tiling(spec: ActivationSpec, arch: HardwareDescription) -> Tiling:
    """The largest tm x tn tile (halving from the whole view, >= 2 each) whose input and output
    tiles, double-buffered, fit the scratchpad."""
    size = DType.from_name(spec.dtype).itemsize
    for tm in halvings(spec.rows):
        for tn in halvings(spec.cols):
            if 2 * aligned(2 * tm * tn * size) <= arch.spad_bytes:
                return Tiling(tm, tn, 1, round_up(spec.rows, tm), round_up(spec.cols, tn), 1)
    raise ScratchpadTooSmall(f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold two "
                             f"2x2 {spec.dtype} tiles twice: describe a larger scratchpad")


def halvings(extent: int):
    size = max(extent, 2)
    while True:
        yield size
        if size == 2:
            return
        size = max(-(-size // 2), 2)


def unary_compute(spec, tiling: Tiling, block: str, value):
    """The TensorIR of a one-input elementwise kernel over the (rows, cols) view: `block`
    computes `value(element)` of the padded input (this family's and fabric.py's)."""
    x = te.placeholder((spec.rows, spec.cols), spec.dtype, name="lhs")
    a_pad = te.compute((tiling.mp, tiling.np), lambda i, j: padded(x, (spec.rows, spec.cols), (i, j)), name="a_pad")
    result = te.compute(a_pad.shape, lambda i, j: value(a_pad[i, j]), name=block)
    out = te.compute((spec.rows, spec.cols), lambda i, j: result[i, j], name="out")
    views = {"lhs": spec.shape, "out": spec.shape} if spec.shape != (spec.rows, spec.cols) else None
    return prim_func(spec.param_roles, {"lhs": x}, out, views)


def schedule_unary(sch, tiling: Tiling, block: str, intrin: str) -> None:
    """Tiles of `unary_compute`'s kernel: the input tile staged in the scratchpad per tile, the
    tile tensorized onto `intrin`, the output stored."""
    result = sch.get_sblock(block)
    rows, cols = sch.get_loops(result)
    row_outer, row_inner = sch.split(rows, [None, tiling.tm])
    col_outer, col_inner = sch.split(cols, [None, tiling.tn])
    sch.reorder(row_outer, col_outer, row_inner, col_inner)
    a_pad = sch.get_sblock("a_pad")
    sch.compute_at(a_pad, col_outer)
    sch.set_scope(a_pad, 0, SPAD)
    sch.reverse_compute_at(sch.get_sblock("out"), col_outer)
    sch.set_scope(result, 0, SPAD)
    sch.tensorize(row_inner, intrin)


def activation_compute(spec: ActivationSpec, tiling: Tiling):
    return unary_compute(spec, tiling, "epi", lambda value: activation(value, spec.dtype, spec.relu, spec.clip))


def schedule_activation(sch, spec: ActivationSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    schedule_unary(sch, tiling, "epi", get_intrin("epilogue", tiling.tm, tiling.tn, spec.dtype, False, spec.relu,
                                                  False, spec.clip, None))


ACTIVATION = OpFamily(
    name="activation", ops=("activation",), patterns=_patterns, spec_from_match=activation_spec,
    choose_tiling=choose_activation_tiling, compute=activation_compute, schedule=schedule_activation,
    host_ops={"relax.nn.relu": "cgra.relu", "relax.clip": "cgra.clip"}, checks_pe_dtype=False)
