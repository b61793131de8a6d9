"""The simulator's timing of DEPTHWISE: configuration, latency and the slower of folds and
bandwidth; the configuration reloads between GEMM and DEPTHWISE; more resources never slower."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import load_arch
from cgra_sim.isa import GEMM_ACCUMULATE, DType, Op, encode
from timing_cases import PRESETS, ceil_div, durations, gemm, load, run


def depthwise(dtype, oh, ow, n, kh, kw, a, b, acc, accumulate=False):
    """A stride-1 DEPTHWISE over a compact (in_h, in_w, n) window at `a`."""
    in_w = ow + kw - 1
    return encode(Op.DEPTHWISE, flags=GEMM_ACCUMULATE if accumulate else 0, dtype=DType.from_name(dtype),
                  oh=oh, ow=ow, n=n, kh=kh, kw=kw, a_addr=a, a_y_stride=in_w * n, a_x_stride=n,
                  a_ry_stride=in_w * n, a_rx_stride=n, b_addr=b, b_ry_stride=kw * n, b_rx_stride=n,
                  acc_addr=acc, acc_y_stride=ow * n, acc_x_stride=n)


def depthwise_case(dtype, oh, ow, n, kh, kw):
    """Records loading the window and the weights, their tensors, and the three addresses."""
    in_h, in_w = oh + kh - 1, ow + kw - 1
    window, weights = np.ones((in_h * in_w, n), dtype), np.ones((kh * kw, n), dtype)
    b_addr = window.nbytes
    acc_addr = -(-(b_addr + weights.nbytes) // 64) * 64
    return [load(0, 0, in_h * in_w, n), load(1, b_addr, kh * kw, n)], [window, weights], 0, b_addr, acc_addr


def depthwise_cycles(arch, dtype, oh, ow, n, kh, kw):
    """config + latency + max(folds x taps, scratchpad traffic / bandwidth), from docs/simulator.md."""
    size = np.dtype(dtype).itemsize
    folds = ceil_div(oh * ow, arch.rows) * ceil_div(n, arch.cols)
    compute = folds * ceil_div(kh * kw, arch.macs_per_pe[dtype])
    traffic = (oh + kh - 1) * (ow + kw - 1) * n * size + kh * kw * n * size + oh * ow * n * 4
    return arch.config_load_cycles + 2 + max(compute, ceil_div(traffic, arch.spad_banks * arch.bank_width_bytes))


@given(arch=st.sampled_from(PRESETS), oh=st.integers(1, 12), ow=st.integers(1, 12), n=st.integers(1, 40),
       kh=st.integers(1, 5), kw=st.integers(1, 5), dtype=st.sampled_from(["int8", "float32"]))
def test_single_depthwise_pays_config_latency_and_the_slower_of_folds_and_bandwidth(arch, oh, ow, n, kh, kw,
                                                                                      dtype):
    records, tensors, a, b, acc = depthwise_case(dtype, oh, ow, n, kh, kw)
    stats, timeline = run(arch, records + [depthwise(dtype, oh, ow, n, kh, kw, a, b, acc)], tensors)
    assert durations(timeline)[2] == depthwise_cycles(arch, dtype, oh, ow, n, kh, kw)
    assert stats.macs == oh * ow * n * kh * kw
    assert stats.cycles >= stats.ideal_cycles


def test_int8_depthwise_is_compute_bound_and_float32_bandwidth_bound_on_the_presets():
    """What the model says about the presets: 3x3 int8 keeps the PEs busy; float32 moves 4x the
    bytes through the same scratchpad bandwidth and waits for it."""
    arch = load_arch("cgra-8x8")
    records, tensors, a, b, acc = depthwise_case("int8", 8, 16, 8, 3, 3)
    _, timeline = run(arch, records + [depthwise("int8", 8, 16, 8, 3, 3, a, b, acc)], tensors)
    assert durations(timeline)[2] == arch.config_load_cycles + 2 + 16 * 9  # 16 folds x 9 taps
    records, tensors, a, b, acc = depthwise_case("float32", 8, 16, 8, 3, 3)
    _, timeline = run(arch, records + [depthwise("float32", 8, 16, 8, 3, 3, a, b, acc)], tensors)
    assert durations(timeline)[2] > arch.config_load_cycles + 2 + 16 * 9


@pytest.mark.parametrize("contexts", [1, 32])
def test_switching_between_gemm_and_depthwise_reloads_the_configuration(contexts):
    arch = load_arch("cgra-8x8")
    arch = dataclasses.replace(arch, fabric={**arch.fabric, "context_depth": contexts})
    records, tensors, a, b, acc = depthwise_case("int8", 4, 8, 8, 3, 3)
    dw = depthwise("int8", 4, 8, 8, 3, 3, a, b, acc)
    gemm_on_window = gemm("int8", 8, 8, 8, a, a, acc + 4096)
    stats, timeline = run(arch, records + [dw, dw, gemm_on_window, dw], tensors)
    # DEPTHWISE, GEMM, and DEPTHWISE again when one context holds only one configuration; the
    # repeat reuses its own
    assert stats.config_loads == (3 if contexts == 1 else 2)
    assert durations(timeline)[3] == depthwise_cycles(arch, "int8", 4, 8, 8, 3, 3) - arch.config_load_cycles - 2


@given(arch=st.sampled_from(PRESETS), scale=st.sampled_from([(2, 1), (1, 2), (2, 2)]),
       bandwidth=st.sampled_from([1, 2, 4]), oh=st.integers(1, 12), ow=st.integers(1, 12), n=st.integers(1, 40),
       dtype=st.sampled_from(["int8", "float32"]))
def test_more_pes_or_scratchpad_bandwidth_never_slow_a_depthwise(arch, scale, bandwidth, oh, ow, n, dtype):
    records, tensors, a, b, acc = depthwise_case(dtype, oh, ow, n, 3, 3)
    records.append(depthwise(dtype, oh, ow, n, 3, 3, a, b, acc))
    bigger = dataclasses.replace(arch, rows=arch.rows * scale[0], cols=arch.cols * scale[1],
                                 spad_banks=arch.spad_banks * bandwidth)
    assert run(bigger, records, tensors)[0].cycles <= run(arch, records, tensors)[0].cycles
