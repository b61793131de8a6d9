"""Weight prefetch across kernel launches (cgra_sim/prefetch.py, the description's `dma_prefetch`).

Random pairs of tiled GEMM launches, the second's weights (and sometimes its activations) flagged
constant: the prefetched launch is never slower, its moved loads use only the previous launch's
idle load-engine time, never write bytes a command of the previous launch still uses, and change
no result. A model (a small ResNet, ONNX) runs faster end to end with identical outputs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cgra_sim import load_arch, preset_names, simulate_detailed, streams
from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType, Op, Unit, encode
from cgra_sim.prefetch import plan_prefetch
from cgra_sim.validate import validate_stream

ACC = {"int8": np.int32, "float32": np.float32}


@st.composite
def gemm_launches(draw):
    """(records, tensors) of a random tiled GEMM on cgra-8x8, its inputs random."""
    arch = load_arch("cgra-8x8")
    dtype = draw(st.sampled_from(["int8", "float32"]))
    m, n, k = (draw(st.integers(1, 80)) for _ in range(3))
    tile = (draw(st.integers(-(-m // 5), 32)), draw(st.integers(-(-n // 5), 32)), draw(st.integers(-(-k // 5), 64)))
    records = np.array(streams.tiled_gemm(arch, m, n, k, dtype, tile=tile), dtype=np.int64)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    tensors = [rng.integers(-5, 5, (m, k)).astype(dtype), rng.integers(-5, 5, (k, n)).astype(dtype),
               np.zeros((m, n), ACC[dtype])]
    return records, tensors


def _run(arch, launch, previous=None, constants=()):
    records, tensors = launch
    tensors = [t.copy() for t in tensors]
    return simulate_detailed(arch, records, tensors, previous=previous, constant_slots=constants), tensors


@settings(max_examples=60, deadline=None)
@given(gemm_launches(), gemm_launches(), st.sampled_from([(1,), (0, 1)]))
def test_prefetch_is_never_slower_and_never_overwrites_a_buffer_in_use(first, second, constants):
    arch = load_arch("cgra-8x8")
    assert arch.dma_prefetch
    before, _ = _run(arch, first)
    alone, out_alone = _run(arch, second)
    tail_board_copy = _accesses(arch, first[0], first[1], before.timeline)
    prefetched, out_prefetched = _run(arch, second, before.tail, constants)
    assert prefetched.timeline.cycles <= alone.timeline.cycles
    assert (prefetched.timeline.ends <= alone.timeline.ends).all()
    assert all(a.tobytes() == b.tobytes() for a, b in zip(out_alone, out_prefetched))
    previous = before.timeline
    load_busy = [(s, s + o) for s, o, u in zip(previous.starts, previous.occupancy, previous.units)
                 if u == Unit.LOAD]
    decoded = validate_stream(arch, second[0], second[1])
    for index, (start, end, free) in sorted(prefetched.prefetch.loads.items()):
        cmd = decoded[index]
        assert cmd.op is Op.DMA_LOAD and cmd.slot in constants
        start, free = start + previous.cycles, free + previous.cycles  # the previous launch's frame
        head = all(i in prefetched.prefetch.loads for i in range(index) if decoded[i].op is Op.DMA_LOAD)
        assert start < previous.cycles and (head or free <= previous.cycles)  # the previous launch's time
        assert all(free <= lo or start >= hi for lo, hi in load_busy)  # only idle load-engine time
        for lo, hi in (iv for region in cmd.writes for iv in region.intervals):
            for a_lo, a_hi, a_end in tail_board_copy:
                if a_lo < hi and lo < a_hi:
                    assert a_end <= start  # the previous launch was done with these bytes
        # and no earlier command of its own launch touched them
        for earlier in decoded[:index]:
            for region in earlier.reads + earlier.writes:
                assert all(not (e_lo < hi and lo < e_hi) for e_lo, e_hi in region.intervals
                           for lo, hi in (iv for r in cmd.writes for iv in r.intervals))


def _accesses(arch, records, tensors, timeline):
    """(lo, hi, end) of every scratchpad access of a launch."""
    decoded = validate_stream(arch, records, tensors)
    return [(lo, hi, int(timeline.ends[cmd.index])) for cmd in decoded
            for region in cmd.reads + cmd.writes for lo, hi in region.intervals]


@settings(max_examples=20, deadline=None)
@given(gemm_launches(), gemm_launches())
def test_nothing_moves_without_the_capability_constants_or_a_previous_launch(first, second):
    arch = load_arch("cgra-8x8")
    without = dataclasses.replace(arch, dma_prefetch=False)
    before, _ = _run(arch, first)
    alone, _ = _run(arch, second)
    decoded = validate_stream(arch, second[0], second[1])
    assert not plan_prefetch(arch, None, decoded, (1,)).loads
    assert not plan_prefetch(arch, before.tail, decoded, ()).loads
    assert not plan_prefetch(without, before.tail, decoded, (1,)).loads
    assert _run(without, first)[0].tail is None
    assert (_run(arch, second, before.tail, ())[0].timeline.ends == alone.timeline.ends).all()


def test_prefetch_hides_a_weight_load_in_the_previous_launchs_idle_time():
    """A compute-bound launch, then one whose weights sit above the first one's buffers: the
    second's weight tile loads while the first computes, and it starts computing sooner."""
    arch = load_arch("cgra-8x8")
    first = (np.array(streams.tiled_gemm(arch, 64, 64, 64, "float32", tile=(64, 64, 64)), np.int64),
             [np.ones((64, 64), np.float32), np.ones((64, 64), np.float32), np.zeros((64, 64), np.float32)])
    weights = 100_000  # above every buffer of the first launch
    records = [streams.matrix_dma(Op.DMA_LOAD, 1, weights, 0, 0, 64, 64, 64),
               streams.matrix_dma(Op.DMA_LOAD, 0, 0, 0, 0, 8, 64, 64),
               encode(Op.GEMM, dtype=DType.FLOAT32, m=8, n=64, k=64, a_addr=0, a_stride=64, b_addr=weights,
                      b_stride=64, acc_addr=200_000, acc_stride=64)]
    second = (np.array(records, np.int64), [np.ones((64, 64), np.float32), np.ones((64, 64), np.float32)])
    before, _ = _run(arch, first)
    alone, _ = _run(arch, second)
    prefetched, _ = _run(arch, second, before.tail, (1,))
    assert list(prefetched.prefetch.loads) == [0]
    assert prefetched.prefetch.transfer_cycles == 64 * 64 * 4 // arch.dma_bytes_per_cycle
    assert prefetched.prefetch.load_free == 0
    assert prefetched.timeline.cycles < alone.timeline.cycles
    stats = prefetched.stats
    for unit in ("load", "compute", "vector", "store"):  # the units' split still adds up
        assert stats.busy_cycles[unit] + stats.stall_cycles[unit] + stats.idle_cycles[unit] == stats.cycles


def test_the_capability_is_a_field_of_the_description():
    for name in preset_names():
        assert load_arch(name).dma_prefetch
    data = load_arch("cgra-8x8").to_dict()
    del data["dma_prefetch"]
    plain = HardwareDescription.from_dict(data)
    assert not plain.dma_prefetch and "dma_prefetch" not in plain.to_json()
    with pytest.raises(Exception, match="dma_prefetch"):
        HardwareDescription.from_dict({**data, "dma_prefetch": 1})


def test_a_model_runs_faster_with_identical_outputs():
    """A small ResNet (ONNX): its kernels' weights prefetched during the kernel before; the run
    takes fewer cycles, no launch more, and every output is bit for bit the same."""
    import tvm
    import npu_backend
    from onnx_models import resnet
    mod = npu_backend.from_onnx(resnet(32, width=16, stages=(16, 32, 64)))
    x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32"))
    arch = load_arch("cgra-8x8")
    runs = []
    for chip in (dataclasses.replace(arch, dma_prefetch=False), arch):
        vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, chip), tvm.cpu())
        with npu_backend.profile() as prof:
            out = vm["main"](x).numpy()
        runs.append((out, [k.cycles for k in prof.kernels]))
    (out_off, off), (out_on, on) = runs
    assert out_off.tobytes() == out_on.tobytes()
    assert len(off) == len(on) and all(b <= a for a, b in zip(off, on))
    assert sum(on) < sum(off)
