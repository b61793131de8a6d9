"""The int8 output tile of a requantising conv is padded against the scratchpad banks as its store
reads it (issue 37 item 0: the text classifier's conv1d kernels were store bound).

A conv1d (a conv2d one pixel high) keeps its pixels in the "xy" order: tile rows are output
pixels along x, and its NCHW store walks them innermost, one element of a tile row per byte of a
DMA beat. The output tile was left compact: spad_layout asked how many rows the store walks and
got the height (1), and sized the padding for the int32 accumulator rather than the int8 tile the
requantising epilogue writes. 64 int8 channels a row put a beat's 16 bytes in one bank: the store
ran at one byte a cycle (4,096 cycles for a 64 x 64 tile, the kernel's longest stream). Rows a
bank word apart leave two words a bank (the fewest 16 one-byte lanes can take over 8 banks).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from cgra_sim.banks import beat_slowdown
from cgra_sim.decode import DmaCommand, decode_stream
from cgra_sim.isa import Op
from cgra_sim.stream_file import load_launch
from npu_backend.kernels.common.spad_layout import beat_rows_slowdown, store_row_stride
from qdq_models import QdqGraph

ARCHS = {name: npu_backend.load_arch(name) for name in npu_backend.preset_names()}


@given(st.sampled_from(sorted(ARCHS)), st.sampled_from([1, 4]), st.integers(1, 300), st.integers(2, 64))
def test_store_row_stride_is_the_least_conflicted_in_a_bank_period(name, itemsize, tn, rows):
    arch = ARCHS[name]
    period = arch.spad_banks * arch.bank_width_bytes // itemsize
    stride = store_row_stride(tn, itemsize, rows, arch)
    assert tn <= stride < tn + period
    best = min(beat_rows_slowdown(s, itemsize, rows, arch) for s in range(tn, tn + period))
    assert beat_rows_slowdown(stride, itemsize, rows, arch) == best
    assert all(beat_rows_slowdown(s, itemsize, rows, arch) > best for s in range(tn, stride))


def test_an_int8_tile_of_64_channels_goes_from_one_bank_to_two_words_a_bank():
    arch = ARCHS["cgra-8x8"]  # 8 banks of 8 bytes, 16-byte DMA beats
    assert beat_rows_slowdown(64, 1, 64, arch) == 16
    stride = store_row_stride(64, 1, 64, arch)  # 68: rows half a word apart
    assert stride == 68 and beat_rows_slowdown(stride, 1, 64, arch) == 2


def _conv1d_layer(input_zero_point: int):
    """A QDQ conv over a 1 x 64 image (a conv1d as the importer widens it): 32 -> 64 channels,
    kernel 1 x 3, padding 1 along x, relu into a -128 zero point."""
    g = QdqGraph(0)
    x = g.qdq("input", 0.04, input_zero_point)
    w = g.rng.normal(0, np.sqrt(2.0 / 96), (64, 32, 1, 3)).astype(np.float32)
    weight, scales = g.weight(w, per_channel=True)
    y = g.node("Conv", [x, weight, g.bias(64, 0.04, scales)], kernel_shape=[1, 3], pads=[0, 1, 0, 1])
    out = g.qdq(g.node("Relu", [y]), 0.02, -128)
    # Requantised once more, so that the layer stores int8 (the model's last dequantize alone would
    # run in the layer's EPILOGUE, qdq_outputs.py, and the layer store float32).
    out = g.qdq(out, 0.02, -128)
    return g.model("input", [1, 32, 1, 64], out, [1, 64, 1, 64])


@pytest.mark.parametrize("input_zero_point", [-128, 5])  # 5: the border correction's residual too
def test_a_qdq_conv1d_layer_stores_two_words_a_bank_and_stays_exact(input_zero_point, tmp_path):
    arch = ARCHS["cgra-8x8"]
    model = _conv1d_layer(input_zero_point)
    x = np.random.default_rng(1).normal(0, 1.5, (1, 32, 1, 64)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    vm = relax.VirtualMachine(npu_backend.compile(npu_backend.from_onnx(model), arch), tvm.cpu())
    with npu_backend.profile(record_dir=tmp_path) as prof:
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, expected)
    stores = []
    for path in sorted(tmp_path.iterdir()):
        launch = load_launch(path)
        stores += [cmd for cmd in decode_stream(arch, launch.commands, launch.fresh_tensors())
                   if isinstance(cmd, DmaCommand) and cmd.op is Op.DMA_STORE and cmd.region.dtype.itemsize == 1]
    assert stores and [k.source_ops[-1] for k in prof.kernels] == ["quantize"] * 3  # the input's, the layer, the requantisation
    for cmd in stores:
        region = cmd.region
        assert beat_slowdown(arch.dma_bytes_per_cycle, region.shape, region.strides, 1, region.addr,
                             arch.spad_banks, arch.bank_width_bytes) <= 2
