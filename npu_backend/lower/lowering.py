"""Lowering: scheduled s_tir -> the plain TIR the code generator walks.

Stage: lowering. Input: a scheduled, tensorized PrimFunc. Output: a flat PrimFunc made of loops,
scratchpad allocations, `cgra_*` extern calls and address arithmetic (see
`cgra_codegen`), with the kernel's metadata in its attributes.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from .dma import lower_copies_to_dma
from .double_buffer import double_buffer
from .fold_init import fold_accumulator_init


def _func_pass(fn, name):
    @tvm.tirx.transform.prim_func_pass(opt_level=0, name=name)
    def run(func, _mod, _ctx):
        return fn(func)
    return run


def lowering_passes():
    """The ordered pass list; each line says why the pass is there."""
    return [
        s_tir.transform.LowerInitBlock(),  # reduction inits are already FILLs; lower leftovers
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),  # allocate tiles inside their loops
        s_tir.transform.ConvertBlocksToOpaque(),  # block iter vars -> loop expressions
        s_tir.transform.CompactBufferAllocation(),  # scratchpad buffers shrink to one tile
        s_tir.transform.LowerMatchBuffer(),  # intrinsic operands -> base + elem_offset
        s_tir.transform.LowerOpaqueBlock(),  # blocks -> loops, predicates -> if
        # Host <-> scratchpad copies -> DMA boxes. Before any simplifier: it needs N-d buffers
        # and the guards as written (a simplifier may rewrite "2*ox + rx < 12" as "ox < 6",
        # which is equivalent on the loop's range but no longer reads as an in-bounds test).
        _func_pass(lower_copies_to_dma, "cgra.LowerCopiesToDMA"),
        # The accumulator's zero-fill becomes the first reduction step's overwriting GEMM.
        _func_pass(fold_accumulator_init, "cgra.FoldAccumulatorInit"),
        # Two copies of each scratchpad tile reused by a loop, so DMA overlaps compute.
        _func_pass(double_buffer, "cgra.DoubleBuffer"),
        s_tir.transform.StmtSimplify(),  # fold the index arithmetic of the remaining calls
        tirx.transform.FlattenBuffer(),  # N-d buffers -> 1-d, for the code generator
        tirx.transform.StmtSimplify(),
        tirx.transform.RemoveNoOp(),
    ]


def lower_kernel(func: tirx.PrimFunc, symbol: str, attrs: dict) -> tirx.PrimFunc:
    func = func.with_attr("global_symbol", symbol)
    for key, value in attrs.items():
        func = func.with_attr(key, value)
    mod = tvm.IRModule({symbol: func})
    for lowering_pass in lowering_passes():
        mod = lowering_pass(mod)
    return mod[symbol]
