"""A global average pool over an image whose height, width or both are known only at run time
(kernels/pool/global_pool.py): blocks summed by POOLs and ELTWISE adds, divided by the run-time
area, a FILL whose value the kernel computes from the tensor's shape."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.relax.transform import BindSymbolicVars

import npu_backend
from dynamic_models import PRESETS, check, data, module

#: name -> (input shape, NCHW or NHWC, the global average)
GLOBALS = {
    "mean NCHW": ((1, 24, "h", "w"), lambda x: relax.op.mean(x, axis=[2, 3])),
    "mean NCHW keepdims": ((1, 24, "h", "w"), lambda x: relax.op.mean(x, axis=[2, 3], keepdims=True)),
    "mean NHWC": ((1, "h", "w", 24), lambda x: relax.op.mean(x, axis=[1, 2])),
    "adaptive_avg_pool2d": ((1, 24, "h", "w"), lambda x: relax.op.nn.adaptive_avg_pool2d(x, (1, 1))),
    "mean, height symbolic": ((2, 24, "h", 5), lambda x: relax.op.mean(x, axis=[2, 3])),
    "mean, width symbolic, 300 channels": ((1, 300, 3, "w"), lambda x: relax.op.mean(x, axis=[2, 3])),
    "mean, batch and image symbolic": (("n", 24, "h", "w"), lambda x: relax.op.mean(x, axis=[2, 3])),
}


@functools.cache
def _vm(arch, name):
    shape, body = GLOBALS[name]
    return relax.VirtualMachine(npu_backend.compile(module({"x": (shape, "float32")}, body), arch), tvm.cpu()), shape


def _reference(x, name):
    axes = (1, 2) if "NHWC" in name else (2, 3)
    return x.mean(axis=axes, keepdims="keepdims" in name or name == "adaptive_avg_pool2d")


@settings(deadline=None, max_examples=40)
@given(arch=st.sampled_from(PRESETS), name=st.sampled_from(sorted(GLOBALS)), h=st.integers(1, 40),
       w=st.integers(1, 40), n=st.integers(1, 3))
def test_one_global_pool_kernel_runs_every_image_size(arch, name, h, w, n):
    """Sizes 1, a block, one more than a block, primes, and beyond the blocks of 16; the last
    block along each symbolic axis cut to the pixels that exist."""
    vm, shape = _vm(arch, name)
    sizes = {"h": h, "w": w, "n": n}
    x = data(tuple(sizes.get(d, d) for d in shape), "float32") + 2  # mostly positive: a wrong count shows
    with npu_backend.profile() as prof:
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
    check(out, _reference(x, name), "float32")
    assert len(prof.kernels) == 1


@pytest.mark.parametrize("arch", PRESETS)
def test_a_global_pool_of_symbolic_size_costs_about_what_a_static_one_does(arch):
    """Cycles of the one symbolic kernel over those of the kernel compiled for the size, at the
    sizes a global pool meets at the end of CNNs (a 224 or 448 image's 7 x 7 and 14 x 14, 56 x 56)."""
    mod = module({"x": ((1, 64, "h", "w"), "float32")}, lambda x: relax.op.mean(x, axis=[2, 3]))
    vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    ratios = {}
    for side in (7, 14, 56):
        x = tvm.runtime.tensor(data((1, 64, side, side), "float32"))
        with npu_backend.profile() as symbolic:
            vm["main"](x)
        static = relax.VirtualMachine(npu_backend.compile(BindSymbolicVars({"h": side, "w": side})(mod), arch),
                                      tvm.cpu())
        with npu_backend.profile() as reference:
            static["main"](x)
        ratios[side] = symbolic.total_cycles / reference.total_cycles
    assert max(ratios.values()) <= 1.10, ratios


def test_the_scale_is_a_fill_the_kernel_computes_from_the_shape():
    """One FILL of 1 / (h * w) per launch, its value bits from the run's shape; one POOL and one
    ELTWISE add per block; the last block cut (a 9-wide image in blocks of 8 moves 9 columns)."""
    vm, _ = _vm("cgra-8x8", "mean NCHW")
    for h, w in ((3, 5), (9, 9)):
        x = data((1, 24, h, w), "float32")
        with npu_backend.profile() as prof:
            vm["main"](tvm.runtime.tensor(x))
        (kernel,) = prof.kernels
        assert kernel.op_counts["FILL"] == kernel.op_counts["DMA_STORE"] + 1  # each tile's zero sum, the scale
        assert kernel.op_counts["POOL"] == kernel.op_counts["ELTWISE"] - kernel.op_counts["DMA_STORE"]
        assert kernel.dma_load_bytes == x.nbytes  # every pixel once, nothing past the image


def test_an_integer_global_average_of_symbolic_size_stays_on_the_host_with_the_reason():
    mod = module({"x": ((1, 8, "h", "w"), "int8")}, lambda x: relax.op.mean(x, axis=[2, 3]))
    (placement,) = npu_backend.explain(mod, "cgra-8x8")
    assert placement.where == "host" and "float32 for an average" in placement.reason, placement.reason


def test_random_data_sums_in_blocks_within_float32_rounding():
    """Blocks sum in another order than numpy's pairwise sum: large images stay within tolerance."""
    vm, _ = _vm("cgra-4x4", "mean NCHW")
    x = data((1, 24, 97, 131), "float32") * 100 + 1000
    check(vm["main"](tvm.runtime.tensor(x)).numpy(), x.astype(np.float64).mean(axis=(2, 3)), "float32")
