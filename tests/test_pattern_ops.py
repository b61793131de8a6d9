"""Partition tries only the patterns whose operators the module calls (npu_backend/partition/
pattern_ops.py): what it leaves out could not have matched."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

import npu_backend
import onnx_models
import zoo_models
from npu_backend.kernels.dynamic import shape_bounds
from npu_backend.options import CompileOptions
from npu_backend.partition.pattern_ops import ops_in, required_ops
from npu_backend.pipeline import bounds_of, fusion_patterns, normalise


def test_required_ops_of_alternatives_and_calls():
    conv = is_op("relax.nn.conv2d")(wildcard(), wildcard())
    biased = is_op("relax.add")(conv, wildcard())
    act = is_op("relax.nn.relu")(biased) | is_op("relax.clip")(biased, wildcard(), wildcard())
    assert required_ops(conv) == {"relax.nn.conv2d"}
    assert required_ops(act) == {"relax.nn.conv2d", "relax.add"}  # relu or clip: neither is needed
    assert required_ops(act | conv) == {"relax.nn.conv2d"}
    assert required_ops(wildcard()) == frozenset()


@pytest.mark.parametrize("model", [
    lambda: onnx_models.mobilenet_v2(32), lambda: onnx_models.resnet(32), lambda: zoo_models.shufflenet_v2(64),
    lambda: zoo_models.squeezenet11(64), lambda: zoo_models.mobilenet_v3_small(64),
], ids=["mobilenet_v2", "resnet", "shufflenet_v2", "squeezenet", "mobilenet_v3_small"])
def test_the_patterns_left_out_match_nothing(model):
    arch = npu_backend.load_arch("cgra-8x8")
    mod = normalise(npu_backend.from_onnx(model()), arch, CompileOptions())
    patterns = fusion_patterns(arch)
    kept = [pattern for pattern in patterns if required_ops(pattern.pattern) <= ops_in(mod)]
    assert len(kept) < len(patterns)
    with shape_bounds(bounds_of(mod, CompileOptions())):
        every = relax.transform.FuseOpsByPattern(patterns, bind_constants=False, annotate_codegen=True)(mod)
        fewer = relax.transform.FuseOpsByPattern(kept, bind_constants=False, annotate_codegen=True)(mod)
    tvm.ir.assert_structural_equal(every, fewer)
