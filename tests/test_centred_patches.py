"""A conv read only by a layer norm over its channels computes its output centred and the norm
is an RMSNorm plus beta (normalise/centred_patches.py), which the patch conv's epilogue runs
(kernels/gemm/patch_norm.py, `cgra.conv2d_post_norm_rms_beta`): Swin's and ConvNeXt's stems."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.centred_patches import centre_patches
from models import main_op_names


def _stem(channels: int, patch: int, size: int, shift: float, reshape: bool, seed: int, groups: int = 1,
          layout: str = "NCHW"):
    """main(x) -> layer_norm([reshape](conv2d(x, W, stride patch, NHWC out) + b)) over the channels;
    b's mean `shift` (a patch mean many standard deviations from 0)."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((channels, 3 // groups, patch, patch)).astype(np.float32)
    bias = (rng.standard_normal((1, 1, 1, channels)) + shift).astype(np.float32)
    gamma = rng.standard_normal(channels).astype(np.float32)
    beta = rng.standard_normal(channels).astype(np.float32)
    shape = (1, 3, size, size) if layout == "NCHW" else (1, size, size, 3)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), strides=patch, groups=groups,
                                                  data_layout=layout, out_layout="NHWC"))
            value = bb.emit(relax.op.add(conv, relax.const(bias)))
            side = size // patch
            if reshape:
                value = bb.emit(relax.op.reshape(value, (1, side * side, channels)))
            out = bb.emit_output(relax.op.nn.layer_norm(value, relax.const(gamma), relax.const(beta), axes=[-1],
                                                        epsilon=1e-5))
        bb.emit_func_output(out)
    data = rng.standard_normal(shape).astype(np.float32)
    return bb.get(), data, (weight, bias, gamma, beta)


def _reference(data, params, patch: int, reshape: bool):
    """numpy float64: the patch conv, its bias, the layer norm over the channels."""
    weight, bias, gamma, beta = (p.astype(np.float64) for p in params)
    data = data if data.shape[1] == 3 else data.transpose(0, 3, 1, 2)
    _, c, h, w = data.shape
    patches = data.astype(np.float64).reshape(c, h // patch, patch, w // patch, patch).transpose(1, 3, 0, 2, 4)
    y = np.einsum("yxcij,ocij->yxo", patches, weight)[None] + bias
    mean, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
    out = (y - mean) / np.sqrt(var + 1e-5) * gamma + beta
    return out.reshape(1, -1, weight.shape[0]) if reshape else out


@settings(max_examples=6, deadline=None)
@given(channels=st.sampled_from([8, 16, 32]), patch=st.sampled_from([2, 4]), side=st.integers(1, 4),
       shift=st.sampled_from([0.0, 20.0, -300.0]), reshape=st.booleans(), seed=st.integers(0, 1000),
       arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]))
def test_the_centred_conv_and_rms_norm_match_numpy(channels, patch, side, shift, reshape, seed, arch):
    mod, data, params = _stem(channels, patch, patch * side, shift, reshape, seed)
    centred = centre_patches(mod)
    assert "relax.nn.rms_norm" in main_op_names(centred) and "relax.nn.layer_norm" not in main_op_names(centred)
    expected = _reference(data, params, patch, reshape)
    got = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_a_grouped_conv_or_channels_not_whole_columns_keep_their_layer_norm():
    """Centring a grouped conv's output channels would mix its groups' inputs; 12 channels on
    8 columns the patch conv's epilogue refuses (the norm then runs alone, explain says why)."""
    mod, _, _ = _stem(6, 2, 4, 0.0, False, 0, groups=3)
    assert "relax.nn.layer_norm" in main_op_names(centre_patches(mod))
    mod, _, _ = _stem(12, 2, 4, 0.0, False, 0)
    assert "relax.nn.layer_norm" in main_op_names(centre_patches(mod, columns=8))


def test_swins_stem_runs_as_one_kernel_with_the_rms_norm():
    """16 x 16 patches of 16 channels (Swin's, ConvNeXt's stem) on cgra-8x8: one kernel of about
    5,300 cycles (6,540 with the layer norm), within 1e-5 of float64."""
    mod, data, params = _stem(16, 4, 64, 20.0, True, 1)
    executable = npu_backend.compile(mod, "cgra-8x8")
    with npu_backend.profile() as prof:
        out = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    expected = _reference(data, params, 4, True)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    assert len(prof.kernels) == 1 and "rms_norm" in prof.kernels[0].name
    assert prof.total_cycles < 6000
