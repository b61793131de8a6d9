"""Helpers of the simulator's functional tests (tests/test_sim_functional.py, test_sim_validation.py
and the tests of single units that build streams record by record): DMA records and their points
by brute force, random arrays, int32 wrap-around, random DMA boxes."""

import itertools

import numpy as np
from hypothesis import strategies as st

from cgra_sim.isa import Op, encode


DTYPES = ["int8", "int32", "float32"]


def dma_record(op, slot, spad_addr, loops, origin=(), pad_lo=(), pad_hi=(), flags=0):
    """loops: (extent, tdim, tstep, sstride) each; unused loops are (1, 0, 0, 0)."""
    fields = {"flags": flags, "slot": slot, "spad_addr": spad_addr}
    for name, values in (("origin", origin), ("pad_lo", pad_lo), ("pad_hi", pad_hi)):
        fields.update({f"{name}{d}": v for d, v in enumerate(values)})
    for loop, (extent, tdim, tstep, sstride) in enumerate(list(loops) + [(1, 0, 0, 0)] * (4 - len(loops))):
        fields.update({f"extent{loop}": extent, f"tdim{loop}": tdim, f"tstep{loop}": tstep,
                       f"sstride{loop}": sstride})
    return encode(op, **fields)


def box_points(loops, origin, rank):
    """(coordinate tuple, scratchpad element offset) of every box point, by brute force."""
    for index in itertools.product(*(range(extent) for extent, *_ in loops)):
        coord = list(origin[:rank])
        offset = 0
        for i, (_, tdim, tstep, sstride) in zip(index, loops):
            coord[tdim] += tstep * i
            offset += sstride * i
        yield tuple(coord), offset


def inside(coord, shape):
    return all(0 <= c < s for c, s in zip(coord, shape))


def random_array(rng, shape, dtype):
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)


def wrap_int32(values):
    return ((np.asarray(values, dtype=np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


@st.composite
def boxes(draw, for_store):
    """A random tensor and DMA box; a store's box never visits a tensor element twice."""
    dtype = draw(st.sampled_from(DTYPES))
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(rank))
    loops = [[draw(st.integers(1, 4)), draw(st.integers(0, rank - 1)), draw(st.integers(-2, 3)), 0]
             for _ in range(4)]
    if for_store:  # nest the loops that walk one dimension, so coordinates never repeat
        for dim in range(rank):
            span = 1
            for loop in (l for l in loops if l[1] == dim):
                loop[2] = span * draw(st.sampled_from([1, -1, 2]))
                span = abs(loop[2]) * loop[0]
    stride = 1  # scratchpad layout: loops nested in a random order, with gaps and signs
    for loop in draw(st.permutations(loops)):
        loop[3] = stride * draw(st.sampled_from([1, -1]))
        stride *= loop[0] + draw(st.integers(0, 2))
        if for_store and draw(st.booleans()) and draw(st.booleans()):
            loop[3] = 0  # a store may read one scratchpad element many times
    origin = tuple(draw(st.integers(-3, size + 1)) for size in shape)
    pad_lo, pad_hi = [], []
    for dim, size in enumerate(shape):
        coords = [c[dim] for c, _ in box_points(loops, origin, rank)]
        pad_lo.append(max(0, -min(coords)) + draw(st.integers(0, 1)))
        pad_hi.append(max(0, max(coords) - size + 1) + draw(st.integers(0, 1)))
    itemsize = np.dtype(dtype).itemsize
    lowest = min(offset for _, offset in box_points(loops, origin, rank))
    spad_addr = -lowest * itemsize + draw(st.integers(0, 9))
    return dict(dtype=dtype, shape=shape, loops=[tuple(l) for l in loops], origin=origin,
                pad_lo=tuple(pad_lo), pad_hi=tuple(pad_hi), spad_addr=spad_addr,
                seed=draw(st.integers(0, 2**32 - 1)))


def matrix_load(slot, addr, rows, cols, stride):
    return dma_record(Op.DMA_LOAD, slot, addr, [(rows, 0, 1, stride), (cols, 1, 1, 1)])


def matrix_store(slot, addr, rows, cols, stride):
    return dma_record(Op.DMA_STORE, slot, addr, [(rows, 0, 1, stride), (cols, 1, 1, 1)])
