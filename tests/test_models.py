"""Whole networks from ONNX: a ResNet-style and a MobileNetV2-style model on the NPU.

Batch norm is folded into the convolutions, depthwise convolutions run as DEPTHWISE kernels, the
classifier as a matmul; residual adds, relu and relu6 (ONNX Clip) are fused into the kernels'
epilogues, max pooling and the global average pool (a mean over H, W) run as POOL kernels, so only
the classifier's reshape stays on the host. The results must match onnxruntime and at least 99%
of the multiply-accumulates must run on the NPU.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from tvm.relax.frontend.onnx import from_onnx

import npu_backend
from npu_backend.tools.run_model import run_onnx_model
from onnx_models import mobilenet_v2, resnet, resnet18

MODELS = {"resnet": resnet, "mobilenet_v2": mobilenet_v2}
#: What stays on the host, the NPU kernels' epilogues (residual blocks: 2 in each model) and the
#: pooling kernels (one POOL command per channel tile each).
HOST_OPS = {"resnet": ["reshape"], "mobilenet_v2": ["reshape"]}
RESIDUAL_KERNELS = {"resnet": 2, "mobilenet_v2": 2}
POOL_KERNELS = {"resnet": [("nn.max_pool2d",), ("mean",)], "mobilenet_v2": [("mean",)]}


@pytest.mark.parametrize("name", MODELS)
def test_network_matches_onnxruntime_with_its_macs_on_the_npu(name, tmp_path):
    path = tmp_path / f"{name}.onnx"
    onnx.save(MODELS[name](), str(path))
    report = run_onnx_model(str(path), "cgra-8x8", check=True)
    assert report["check"]["passed"], report["check"]
    assert report["check"]["max_rel_error"] <= 1e-4
    assert report["npu_mac_fraction"] >= 0.99
    assert not {"nn.conv2d", "matmul", "nn.batch_norm"} & set(report["host_ops"])
    assert report["host_ops"] == HOST_OPS[name]  # residual adds, relu and clip are fused
    ops = [k["source_ops"] for k in report["kernels"]]  # a bias add per conv2d / matmul; one more: a residual
    residual_kernels = [k for k in ops if k.count("add") > k.count("nn.conv2d") + k.count("matmul")]
    assert len(residual_kernels) == RESIDUAL_KERNELS[name]
    pools = [k for k in report["kernels"] if k["op_counts"]["POOL"]]
    assert [tuple(k["source_ops"]) for k in pools] == POOL_KERNELS[name]
    assert all(k["op_counts"]["GEMM"] == k["op_counts"]["DEPTHWISE"] == 0 for k in pools)
    assert report["total_cycles"] == sum(k["cycles"] for k in report["kernels"]) > 0


def test_explain_counts_the_macs_of_each_operator():
    placements = npu_backend.explain(from_onnx(resnet(size=16, width=8)), "cgra-4x4")
    convs = [p for p in placements if p.op == "nn.conv2d"]
    # The stem: 3 -> 8 channels, 3x3, on a 16x16 image.
    assert convs[0].macs == 8 * 16 * 16 * 3 * 3 * 3 and convs[0].where == "npu"
    assert all(p.macs == 0 for p in placements if p.op not in ("nn.conv2d", "matmul"))
    assert npu_backend.npu_mac_fraction(placements) == 1.0
    assert "MACs run on the NPU" in npu_backend.format_placements(placements)


def test_resnet18_builder_has_the_published_layers_and_parameters():
    """The benchmark's ResNet-18 (benchmarks/bench_network.py) is the real one: 20 convs (16 in
    the blocks, the stem, 3 projections), 8 residual adds, 11.69 M parameters."""
    model = resnet18()
    ops = [node.op_type for node in model.graph.node]
    assert (ops.count("Conv"), ops.count("BatchNormalization"), ops.count("Add")) == (20, 20, 8)
    assert (ops.count("MaxPool"), ops.count("GlobalAveragePool"), ops.count("Gemm")) == (1, 1, 1)
    weights = {init.name: init for init in model.graph.initializer}
    params = sum(int(np.prod(init.dims)) for name, init in weights.items()
                 if not name.endswith(("_mean", "_var")))
    assert params == 11_689_512  # torchvision's resnet18: conv and fc weights, BN scale and shift, fc bias
