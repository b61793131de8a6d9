"""The per-process kernel cache of the target hook: a kernel with the same KernelSpec, chip and
options goes through KERNEL_STAGES once; each still has its own exported symbol, source_ops
attribute and dump files, and computes the right thing."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

import npu_backend
from models import assert_matches, relax_module, run
from cgra_codegen import build
from npu_backend.target import relax_ext


def _two_identical_layers():
    """relu(relu(x @ w1 + b1) @ w2 + b2): two kernels with the same KernelSpec."""
    specs = [("x", (12, 16), "float32"), ("w1", (16, 16), "float32"), ("b1", (16,), "float32"),
             ("w2", (16, 16), "float32"), ("b2", (16,), "float32")]

    def body(bb, x, w1, b1, w2, b2):
        h = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w1)), b1))))
        return bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(relax.op.matmul(h, w2)), b2))))

    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(shape).astype("float32") for _, shape, _ in specs]
    x, w1, b1, w2, b2 = inputs
    ref = np.maximum(np.maximum(x @ w1 + b1, 0) @ w2 + b2, 0)
    return relax_module(specs, body), inputs, ref


def _offloaded_function(mod, arch):
    """The one function partitioning hands to the target hook."""
    for name, stage in npu_backend.STAGES[:2]:  # normalise, partition
        mod = stage(mod, arch, npu_backend.CompileOptions())
    funcs = [f for _, f in mod.functions.items() if (f.attrs or {}).get("Codegen") == "cgra"]
    assert len(funcs) == 1  # partitioning already shares one function between identical layers
    return funcs[0]


def _counting_runs(monkeypatch):
    """An empty cache (and no persistent one), and the symbols the kernel stages actually ran for."""
    monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")
    monkeypatch.setenv("CGRA_COMPILE_JOBS", "1")  # the stages run here, where they are counted
    runs, run_stages = [], relax_ext.run_kernel_stages
    monkeypatch.setattr(relax_ext, "run_kernel_stages", lambda *a: runs.append(a[0].symbol) or run_stages(*a))
    monkeypatch.setattr(relax_ext, "_KERNEL_CACHE", type(relax_ext._KERNEL_CACHE)())
    return runs


def test_identical_kernels_compile_once_and_keep_their_own_symbols(monkeypatch, tmp_path):
    runs = _counting_runs(monkeypatch)
    arch, options = npu_backend.load_arch("cgra-4x4"), npu_backend.CompileOptions(dump_dir=str(tmp_path))
    first = _offloaded_function(_two_identical_layers()[0], arch)
    second = first.with_attr("global_symbol", "cgra_same_layer_again")
    lowered = [relax_ext.compile_kernel(f, arch, options) for f in (first, second)]

    assert len(runs) == 1
    symbols = [str(f.attrs["global_symbol"]) for f in lowered]
    assert symbols == [str(first.attrs["global_symbol"]), "cgra_same_layer_again"]
    assert all(str(f.attrs["cgra.source_ops"]) == "matmul,add,nn.relu" for f in lowered)
    # The second kernel is the first one under its own name: nothing else differs.
    tvm.ir.assert_structural_equal(lowered[0].with_attr("global_symbol", symbols[1]), lowered[1])
    assert build(lowered, arch).symbols == symbols
    for symbol in symbols:
        stages = sorted(p.name for p in (tmp_path / "kernels" / symbol).iterdir())
        assert stages == [f"{i + 1}_{name}.py" for i, (name, _) in enumerate(relax_ext.KERNEL_STAGES)]
        assert symbol in (tmp_path / "kernels" / symbol / stages[-1]).read_text()


def test_a_cached_kernel_equals_a_fresh_compile(monkeypatch):
    runs = _counting_runs(monkeypatch)
    arch, options = npu_backend.load_arch("cgra-4x4"), npu_backend.CompileOptions()
    func = _offloaded_function(_two_identical_layers()[0], arch)
    cached = [relax_ext.compile_kernel(func, arch, options) for _ in range(2)]
    monkeypatch.setattr(relax_ext, "_KERNEL_CACHE", type(relax_ext._KERNEL_CACHE)())
    fresh = relax_ext.compile_kernel(func, arch, options)
    assert len(runs) == 2  # once per empty cache
    tvm.ir.assert_structural_equal(cached[1], fresh)


def test_recompiling_from_the_cache_gives_the_same_results_and_the_chip_is_in_the_key(monkeypatch):
    runs = _counting_runs(monkeypatch)
    mod, inputs, ref = _two_identical_layers()
    for arch in ("cgra-4x4", "cgra-8x8", "cgra-4x4"):
        assert_matches(run(npu_backend.compile(mod, arch), inputs), ref, "float32")
    assert len(runs) == 2
