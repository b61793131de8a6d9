"""The partition's plan (npu_backend/partition/plans.py): a module partitioned before tries only the
patterns that made its groups and is partitioned the same; what the checks read (shapes, small
constants, the chip, the options) is in the plan's key, the weights' values are not; a damaged
plan is ignored, and a wrong one costs kernels, never results."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

import npu_backend
import zoo_models
from npu_backend.device.kernel_cache import PLAN_SUFFIX, default_kernel_cache
from npu_backend.normalise.stage import normalise
from npu_backend.options import CompileOptions
from npu_backend.partition.pattern_ops import ModuleCalls
from npu_backend.partition.plans import fingerprint, plan_payload, read_plan
from npu_backend.partition.stage import partition
from npu_backend.pipeline import KERNEL_STAGES
from npu_backend.tools.workloads import mismatch, run

RNG = np.random.default_rng(0)


@pytest.fixture
def tried(tmp_path, monkeypatch):
    """A kernel cache of the test's own; the names of the patterns each partition tried."""
    monkeypatch.setenv("CGRA_KERNEL_CACHE", str(tmp_path / "kernels"))
    seen, fuse = [], relax.transform.FuseOpsByPattern
    monkeypatch.setattr(relax.transform, "FuseOpsByPattern",
                        lambda patterns, **kw: seen.append([p.name for p in patterns]) or fuse(patterns, **kw))
    return seen


def _normalised(mod, arch, options=CompileOptions()):
    return normalise(mod, npu_backend.load_arch(arch), options)


def _partition(mod, arch="cgra-8x8", options=CompileOptions()):
    return partition(_normalised(mod, arch, options), npu_backend.load_arch(arch), options, KERNEL_STAGES)


def _conv_divide(weight, divisor):
    """conv2d (3x3, 8 -> 8 channels) -> divide by a one-element constant, float32."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 8, 12, 12), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), padding=1))
            out = bb.emit_output(relax.op.divide(conv, relax.const(np.float32(divisor))))
        bb.emit_func_output(out)
    return bb.get()


def _weight():
    return (RNG.random((8, 8, 3, 3)) - 0.5).astype(np.float32)


def test_a_module_partitioned_again_tries_only_the_patterns_that_made_its_groups(tried):
    mod = npu_backend.from_onnx(zoo_models.shufflenet_v2(64))
    first = _partition(mod)
    again = _partition(mod)
    tvm.ir.assert_structural_equal(first, again)
    assert 0 < len(tried[1]) < len(tried[0]) / 3  # ShuffleNetV2 at 64: 7 of them made groups (at 224: 5 of 35)
    assert [name for name in tried[0] if name in tried[1]] == tried[1]  # in the same order
    # Another chip, or other options, is another plan.
    _partition(mod, "cgra-4x4")
    _partition(mod, options=CompileOptions(fuse_chains=True))
    assert len(tried[2]) > len(tried[1]) and len(tried[3]) > len(tried[1])


def test_the_key_holds_the_small_constants_not_the_weights():
    def key(weight, divisor):
        mod = _conv_divide(weight, divisor)
        return fingerprint(mod, ModuleCalls(mod))

    weight = _weight()
    assert key(weight, 2.0) == key(_weight(), 2.0)  # VGG-19's weights would take 0.26 s to hash
    assert key(weight, 2.0) != key(weight, 3.0)  # a check reads a divisor
    assert key(weight, 2.0) != key(weight[:4], 2.0)  # and every shape


def _layer_norm(gamma):
    """layer_norm over (32, 128) with a constant gamma of 128 values and zero beta."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((32, 128), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(np.zeros(128, "float32")),
                                                        axes=[-1]))
        bb.emit_func_output(out)
    return bb.get()


def test_a_norm_with_weights_after_the_same_norm_with_ones_keeps_its_kernel(tried):
    """The plain norm's check reads whether gamma is all ones (128 values, more than the 64 of a
    small constant): vectors are in the key, so the plan made with ones (the plain pattern
    only) is not the weighted norm's, which stayed on the host after it."""
    ones, weights = np.ones(128, "float32"), RNG.standard_normal(128).astype(np.float32)
    assert fingerprint(_layer_norm(ones), ModuleCalls(_layer_norm(ones))) != \
        fingerprint(_layer_norm(weights), ModuleCalls(_layer_norm(weights)))
    for gamma in (ones, weights):
        placements = npu_backend.explain(_layer_norm(gamma), "cgra-8x8")
        assert all(p.where == "npu" for p in placements), [(p.op, p.reason) for p in placements]


def test_a_damaged_plan_is_ignored_and_a_wrong_one_costs_kernels_not_results(tried, tmp_path):
    mod = _conv_divide(_weight(), 4.0)
    _partition(mod)
    [plan] = (tmp_path / "kernels").glob(f"*{PLAN_SUFFIX}")
    cache = default_kernel_cache()
    assert read_plan(cache.get(plan.stem, PLAN_SUFFIX)) == {"cgra.conv2d", "cgra.eltwise_multiply"}
    assert read_plan(b"not json") is None and read_plan(b'{"grouped": [1]}') is None and read_plan(None) is None

    cache.put(plan.stem, b"not json", PLAN_SUFFIX)
    _partition(mod)
    assert tried[-1] == tried[0]  # every pattern that can match, as with no plan

    cache.put(plan.stem, plan_payload([]), PLAN_SUFFIX)  # a plan naming no pattern: everything on the host
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), [x])
    assert tried[-1] == [] and not prof.kernels
    reference = run(tvm.compile(mod, target="llvm"), [x])
    assert mismatch(out, reference, "float32") is None
