"""The harness of the intrinsic three-ways tests (tests/test_intrinsics*.py and the tests of
intrinsics that live beside their kernels): an intrinsic's TVMScript description run on the host
(`tir_reference`), its ISA command run by the simulator's functional core on arrays laid out in
the scratchpad (`Stream`), and the device call its implementation makes (`extern_name`).
"""

from __future__ import annotations

import numpy as np
import tvm

from cgra_codegen import DEVICE_CALLS
from cgra_sim import load_arch, simulate
from cgra_sim.isa import Op, encode

ARCH = load_arch("cgra-8x8")


def tir_reference(desc, arrays):
    """Run the description (host scope) on copies of `arrays`; returns them after the call."""
    func = desc.with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    tensors = [tvm.runtime.tensor(a.copy()) for a in arrays]
    lib["main"](*tensors)
    return [t.numpy() for t in tensors]


class Stream:
    """Lays 2-D host arrays out in the scratchpad and builds the command stream around one op."""

    def __init__(self, arrays):
        self.arrays, self.commands, self.addr, self.next = arrays, [], {}, 0
        for slot, array in enumerate(arrays):
            self.addr[slot] = self.next
            self.next += -(-array.nbytes // 64) * 64

    def box(self, slot):
        array = self.arrays[slot]
        rows, cols = array.shape if array.ndim == 2 else (1, array.shape[0])
        last = array.ndim - 1
        loops = dict(extent0=rows, tdim0=0, tstep0=1 if array.ndim == 2 else 0, sstride0=cols,
                     extent1=cols, tdim1=last, tstep1=1, sstride1=1, extent2=1, extent3=1)
        return dict(slot=slot, spad_addr=self.addr[slot], **loops)

    def load(self, *slots):
        self.commands += [encode(Op.DMA_LOAD, **self.box(slot)) for slot in slots]

    def store(self, *slots):
        self.commands += [encode(Op.DMA_STORE, **self.box(slot)) for slot in slots]

    def run(self):
        arrays = [a.copy() for a in self.arrays]
        simulate(ARCH, np.array(self.commands, dtype=np.int64), arrays)
        return arrays


def random_array(rng, shape, dtype):
    if dtype == "int8":
        return rng.integers(-128, 128, shape).astype(dtype)
    if dtype == "int32":
        return rng.integers(-10000, 10000, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def record_bits(value, dtype) -> int:
    """A clip bound as record bits: the integer, or the float32 bit pattern."""
    return int(np.array([value], dtype).view(np.uint32)[0]) if dtype == "float32" else int(value)


def extern_name(impl) -> str:
    """The device call the implementation makes (the one DEVICE_CALLS entry its text names)."""
    text = impl.script()
    names = [name for name in DEVICE_CALLS if f'"{name}"' in text]
    assert len(names) == 1, names
    return names[0]
