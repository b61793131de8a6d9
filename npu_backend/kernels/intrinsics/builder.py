"""One generator for every CGRA tensor intrinsic: tiles in, (description, implementation) out.

Stage: schedule and tensorize. A TensorIntrin is a pair of PrimFuncs over the same scratchpad
tiles: the description says in TIR what the hardware computes (one block over the output tile,
which `sch.tensorize` matches against the kernel's block), the implementation is the one device
call that does it (the `call_extern` the code generator lowers into a runtime call recording
the command). `intrinsic` builds both with TVM's IR builder from a list of `Tile`s, so that an
intrinsic with optional operands (an EPILOGUE with or without bias, residual, requantisation
scale) is one function with parameters, the way TVM's `get_wmma_sync_intrin` is, not a copy
per variant.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as IB

from cgra_codegen import SPAD_SCOPE as SPAD


@dataclasses.dataclass(frozen=True)
class Tile:
    """One operand of an intrinsic: a scratchpad tile of `shape` and `dtype`, named for both
    PrimFuncs' buffers and for the description and call functions, which get the buffers by name."""

    name: str
    shape: tuple
    dtype: str

    @property
    def region(self) -> tuple:
        return tuple(slice(0, extent) for extent in self.shape)


#: `value(buffers, *iterators) -> PrimExpr`: one output element, buffers by tile name.
ValueFn = Callable[..., object]
#: `call(buffers, strides) -> PrimExpr`: the device call; strides by tile name, one symbolic
#: stride per axis but the last (elements; the last axis is contiguous).
CallFn = Callable[[dict, dict], object]  # the device call (or a list of them) of the implementation


def intrinsic(inputs: list[Tile], output: Tile, block: str, value: ValueFn, call: CallFn, *,
              grid: tuple | None = None, kinds: str | None = None, accumulate: bool = False,
              combine: Callable | None = None, scope: str = SPAD, block_reads: Callable | None = None):
    """(description, implementation) of an intrinsic reading `inputs` and writing `output`.

    The description's block `block` runs over `grid` (default: the output's shape; `kinds` the
    block iterators' kinds, default all spatial) and stores `value(buffers, *iterators)` into
    the output at the first len(output.shape) iterators, added to it with `accumulate` (or
    folded into it with `combine(old, value)`, e.g. a max: a reduction's update). Axes of
    extent 1 are not block iterators (index 0): tensorize's blockize moves such axes out of a
    kernel's tile, so the tile it matches has them as 0 too. `scope` exists so tests can build
    a description for the host and run it as the TIR reference. `block_reads(buffers, *iterators)`
    declares the block's reads in an order of its own (tensorize matches them in order; TVM
    infers them in the order the value's expression reads them)."""
    tiles = list(inputs) + [output]
    reads = ([output] if accumulate else []) + list(inputs)
    grid = tuple(output.shape if grid is None else grid)
    kinds = kinds or "S" * len(grid)
    with IRBuilder() as desc:
        with IB.prim_func(s_tir=True):
            IB.func_name("desc")
            buffers, _ = _match_buffers(tiles, scope, strided=False)
            with IB.sblock("root"):
                _declare_access(buffers, reads, output)
                with IB.grid(*grid) as loops:
                    with IB.sblock(block):
                        iterators = _iterators(grid, kinds, _as_list(loops))
                        index = iterators[:len(output.shape)]
                        if block_reads is not None:
                            IB.reads(*block_reads(buffers, *iterators))
                            IB.writes(buffers[output.name][tuple(index)])
                        result = value(buffers, *iterators)
                        if accumulate:
                            old = buffers[output.name][tuple(index)]
                            result = old + result if combine is None else combine(old, result)
                        IB.buffer_store(buffers[output.name], result, list(index))
    with IRBuilder() as impl:
        with IB.prim_func(s_tir=True):
            IB.func_name("impl")
            buffers, strides = _match_buffers(tiles, scope, strided=True)
            with IB.sblock("root"):
                _declare_access(buffers, reads, output)
                calls = call(buffers, strides)  # one device call, or a list of them run in order
                for device_call in calls if isinstance(calls, list) else [calls]:
                    IB.evaluate(device_call)
    return desc.get(), impl.get()


def _match_buffers(tiles, scope: str, strided: bool):
    """One parameter and buffer per tile; with `strided`, a symbolic stride per axis but the last."""
    buffers, strides = {}, {}
    for tile in tiles:
        param = IB.arg(tile.name.lower(), IB.handle())
        layout = {}
        if strided and len(tile.shape) > 1:
            strides[tile.name] = [IRBuilder.name(f"s{tile.name.lower()}{axis}", IB.int32())
                                  for axis in range(len(tile.shape) - 1)]
            layout["strides"] = strides[tile.name] + [1]
        buffer = IB.match_buffer(param, tile.shape, tile.dtype, offset_factor=1, scope=scope, **layout)
        buffers[tile.name] = IRBuilder.name(tile.name, buffer)
    return buffers, strides


def _declare_access(buffers, reads, output) -> None:
    """The root block's reads (the input tiles; the output too when accumulating) and writes."""
    IB.reads(*[buffers[tile.name][tile.region] for tile in reads])
    IB.writes(buffers[output.name][output.region])


def _iterators(grid, kinds: str, loops) -> list:
    """Block iterators bound to the loops of extent > 1 (remapped with their kinds), 0 elsewhere."""
    bound = [(axis, kind) for axis, (extent, kind) in enumerate(zip(grid, kinds)) if extent > 1]
    values = [0] * len(grid)
    if bound:
        remapped = IB.axis.remap("".join(kind for _, kind in bound), [loops[axis] for axis, _ in bound])
        for (axis, _), var in zip(bound, _as_list(remapped)):
            values[axis] = var
    return values


def _as_list(values) -> list:
    """The IR builder gives one Var for one loop or iterator, an array for several."""
    return [values] if isinstance(values, tirx.Var) else list(values)
