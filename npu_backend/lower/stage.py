"""The lowered stage's body: a scheduled kernel through the lowering passes to plain TIR.

Stage: lowered (pipeline.KERNEL_STAGES' last; pipeline.lowering_passes lists the passes, each with
its reason). `func_pass` makes a PrimFunc -> PrimFunc function of this folder one of them.
"""

from __future__ import annotations

import dataclasses

import tvm

from ..kernels.stage import Kernel


def lower(kernel: Kernel, passes: list) -> Kernel:
    """Plain TIR, what the code generator walks: the scheduled PrimFunc, named and given the
    kernel's attributes, through `passes` (pipeline.lowering_passes)."""
    func = kernel.func.with_attr("global_symbol", kernel.symbol)
    for key, value in kernel.attrs.items():
        func = func.with_attr(key, value)
    mod = tvm.IRModule({kernel.symbol: func})
    for lowering_pass in passes:
        mod = lowering_pass(mod)
    return dataclasses.replace(kernel, func=mod[kernel.symbol])


def func_pass(fn, name: str):
    """`fn` (PrimFunc -> PrimFunc) as a TIR pass named `name`, for a lowering pass list."""
    @tvm.tirx.transform.prim_func_pass(opt_level=0, name=name)
    def run(func, _mod, _ctx):
        return fn(func)
    return run
