"""The CGRA tensor intrinsics: one table, from which TensorIntrins are made on demand.

Stage: schedule and tensorize. Each entry of `INTRINSICS` ties an ISA opcode to a factory
(pe_array.py for the PE array, vector_unit.py and row_ops.py for the vector unit, fabric.py for a dataflow
body on the PE fabric, smooth.py for sigmoid and its kin as several bodies) that returns the TVMScript
description (what the hardware computes, in TIR) and implementation (the `call_extern` the code
generator lowers into a runtime call that records that opcode), both built by builder.py. Their
numpy semantics live in the simulator's functional core; `tests/test_intrinsics*.py` run every
entry through all three.

Intrinsics are sized per kernel (PE-array passes of `rows x cols x depth`, vector ops over a
whole tile), so they are registered under names that carry their parameters.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Callable

import tvm
from tvm.s_tir import TensorIntrin

from cgra_sim.isa import Op

from .builder import SPAD
from .fabric import FabricBody, fabric_intrin
from .lookup import lookup_intrin
from .pe_array import depthwise_intrin, gemm_intrin
from .row_ops import reduce_intrin, vfunc_intrin
from .smooth import smooth_intrin
from .vector_unit import PoolWindow
from .epilogue_tail import epilogue_intrin
from .rope_epilogue import RotaryPattern, rope_combine_intrin, rope_rotate_intrin
from .vector_unit import accumulate_intrin, eltwise_intrin, fill_intrin, pool_intrin

__all__ = ["INTRINSICS", "SPAD", "Intrinsic", "get_intrin", "intrin_name"]


@dataclasses.dataclass(frozen=True)
class Intrinsic:
    op: Op  # the ISA command its implementation records
    factory: Callable  # (*sizes and dtypes, **flags, scope=SPAD) -> (description, implementation)


INTRINSICS = {
    "gemm": Intrinsic(Op.GEMM, gemm_intrin),
    "depthwise": Intrinsic(Op.DEPTHWISE, depthwise_intrin),
    "fill": Intrinsic(Op.FILL, fill_intrin),
    "epilogue": Intrinsic(Op.EPILOGUE, epilogue_intrin),
    "pool": Intrinsic(Op.POOL, pool_intrin),
    "eltwise": Intrinsic(Op.ELTWISE, eltwise_intrin),
    "accumulate": Intrinsic(Op.ELTWISE, accumulate_intrin),
    "fabric": Intrinsic(Op.FABRIC, fabric_intrin),
    "smooth": Intrinsic(Op.FABRIC, smooth_intrin),  # FABRIC bodies in turn (and an ELTWISE)
    "reduce": Intrinsic(Op.REDUCE, reduce_intrin),
    "vfunc": Intrinsic(Op.VFUNC, vfunc_intrin),
    "lookup": Intrinsic(Op.LOOKUP, lookup_intrin),
    "rope_rotate": Intrinsic(Op.ELTWISE, rope_rotate_intrin),  # RoPE in a GEMM's epilogue
    "rope_combine": Intrinsic(Op.ELTWISE, rope_combine_intrin),
}


def intrin_name(kind: str, *params, **flags) -> str:
    """The name `kind`'s intrinsic for these parameters is registered under: "cgra.<kind>." and
    the parameters in the factory's order, up to the last one given (a flag given by keyword
    names the same intrinsic as given by position; one left out and one given at its default
    do not)."""
    return "cgra." + kind + "." + ".".join(_param_name(p) for p in _ordered(kind, params, flags))


def _ordered(kind: str, params: tuple, flags: dict) -> list:
    """The factory's parameters bound to `params` and `flags`, in its signature's order, the
    defaults of those before the last one given filled in; a missing or unknown one raises
    TypeError naming the intrinsic."""
    signature = inspect.signature(INTRINSICS[kind].factory)
    try:
        bound = signature.bind(*params, **flags)
    except TypeError as err:
        names = [name for name in signature.parameters if name != "scope"]
        raise TypeError(f"intrinsic '{kind}' takes ({', '.join(names)}): {err}") from None
    given = [name for name in signature.parameters if name in bound.arguments and name != "scope"]
    bound.apply_defaults()
    names = list(signature.parameters)[:list(signature.parameters).index(given[-1]) + 1] if given else []
    return [bound.arguments[name] for name in names]


def _param_name(param) -> str:
    """A parameter in an intrinsic's name; a clip's (lo, hi) as "clip_lo_hi", an ELTWISE
    operand's (walks rows, walks cols) as "full_True_False", a pooling window as its fields, a
    FILL's run-time value as its expression (punctuation squeezed), a FABRIC body as its
    dtype and a digest of its nodes."""
    if isinstance(param, (PoolWindow, FabricBody, RotaryPattern)):
        return param.name
    if isinstance(param, tvm.ir.expr.Expr):
        return "value_" + re.sub(r"\W+", "_", str(param)).strip("_")
    if isinstance(param, tuple) and all(isinstance(v, bool) for v in param):
        return "full_" + "_".join(str(v) for v in param)
    if isinstance(param, tuple):
        return "clip_" + "_".join(repr(float(v)) for v in param)
    return str(param)


def get_intrin(kind: str, *params, **flags) -> str:
    """Register (once) and return the name of the `kind` intrinsic for these parameters: sizes
    and dtypes by position, flags by keyword, as the factory declares them
    (`get_intrin("epilogue", tm, tn, dtype, bias=False, relu=True)`)."""
    name = intrin_name(kind, *params, **flags)
    try:
        TensorIntrin.get(name)
    except Exception:  # not registered yet: TensorIntrin.get raises when the name is unknown
        TensorIntrin.register(name, *INTRINSICS[kind].factory(*params, **flags))
    return name
