"""Kernels compiled side by side in worker processes (npu_backend/target/parallel.py): the same code,
results and cycles as one process; a worker's failure raised here with its own type; a user's
schedule runs here, where its side effects are seen; progress counts every kernel."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.relax.frontend.onnx import from_onnx

import npu_backend
from npu_backend import schedules
from npu_backend.errors import ScratchpadTooSmall
from npu_backend.progress import compile_progress
from npu_backend.target import parallel, relax_ext
from onnx_models import resnet


@pytest.fixture(scope="module")
def model():
    """A small ResNet: 9 distinct kernels (more than parallel.MIN_PARALLEL_KERNELS)."""
    onnx_model = resnet()
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    return from_onnx(onnx_model), x


def _compile_and_run(mod, x, monkeypatch, jobs, dump_dir=None):
    monkeypatch.setenv("CGRA_COMPILE_JOBS", str(jobs))
    monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")
    relax_ext.clear_kernel_cache()
    executable = npu_backend.compile(mod, "cgra-4x4", dump_dir=dump_dir)
    with npu_backend.profile() as prof:
        out = tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return out.numpy(), [(k.name, k.cycles, k.dma_load_bytes, k.num_commands) for k in prof.kernels]


def test_two_workers_build_the_same_code_results_and_cycles_as_one_process(model, monkeypatch, tmp_path):
    mod, x = model
    serial = _compile_and_run(mod, x, monkeypatch, 1, tmp_path / "one")
    workers = _compile_and_run(mod, x, monkeypatch, 2, tmp_path / "two")
    assert (serial[0] == workers[0]).all() and serial[1] == workers[1]
    assert (tmp_path / "one/llvm/kernels.ll").read_text() == (tmp_path / "two/llvm/kernels.ll").read_text()
    assert sorted(p.name for p in (tmp_path / "one/kernels").iterdir()) == \
        sorted(p.name for p in (tmp_path / "two/kernels").iterdir())


def test_a_kernel_failing_in_a_worker_is_raised_here_with_its_type(model, monkeypatch):
    mod, x = model
    compile_kernel = relax_ext.compile_kernel

    def fails_for_one(func, arch, options):
        if str(func.attrs["global_symbol"]).endswith("relu2_cgra"):
            raise ScratchpadTooSmall(f"kernel {func.attrs['global_symbol']} does not fit (a test)")
        return compile_kernel(func, arch, options)

    monkeypatch.setattr(relax_ext, "compile_kernel", fails_for_one)
    with pytest.raises(ScratchpadTooSmall, match=r"relu2_cgra does not fit \(a test\)"):
        _compile_and_run(mod, x, monkeypatch, 2)


def test_a_user_schedule_runs_in_this_process(model, monkeypatch):
    mod, x = model
    seen = []

    def recorded(sch, spec, tiling, arch):
        seen.append(spec.lhs_shape)
        schedules.builtin(sch, spec, tiling, arch)

    schedules.register_schedule("conv2d", recorded)
    try:
        _compile_and_run(mod, x, monkeypatch, 2)
    finally:
        schedules.register_schedule("conv2d", None)
    assert len(seen) >= parallel.MIN_PARALLEL_KERNELS


def test_progress_counts_every_kernel(model, monkeypatch):
    mod, x = model
    heard = []
    with compile_progress(lambda done, total, name: heard.append((done, total))):
        _compile_and_run(mod, x, monkeypatch, 2)
    total = heard[0][1]
    assert heard[-1] == (total, total) and all(0 <= done <= total for done, _ in heard)
    assert [done for done, _ in heard] == sorted(done for done, _ in heard)


def test_a_bad_number_of_jobs_is_named(monkeypatch):
    monkeypatch.setenv("CGRA_COMPILE_JOBS", "many")
    with pytest.raises(ValueError, match="CGRA_COMPILE_JOBS='many'"):
        parallel.compile_jobs()


def test_a_process_with_other_threads_compiles_in_itself(model, monkeypatch):
    import threading

    forked = []
    monkeypatch.setattr(parallel.concurrent.futures, "ProcessPoolExecutor", lambda *a, **k: forked.append(1) or 1 / 0)
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        mod, x = model
        _compile_and_run(mod, x, monkeypatch, 2)
    finally:
        release.set()
        other.join()
    assert forked == []


def test_tqdms_monitor_thread_does_not_keep_the_compile_in_one_process(model, monkeypatch):
    """Every process that built a Hugging Face model runs tqdm's monitor (a daemon that sleeps):
    its compiles fork workers all the same (another thread does not: the test above)."""
    import threading

    class TMonitor(threading.Thread):  # as tqdm._monitor names it
        pass

    TMonitor.__module__ = "tqdm._monitor"
    forked, pool = [], parallel.concurrent.futures.ProcessPoolExecutor
    monkeypatch.setattr(parallel.concurrent.futures, "ProcessPoolExecutor", lambda *a, **k: forked.append(1) or pool(*a, **k))
    release = threading.Event()
    monitor = TMonitor(target=release.wait, daemon=True)
    monitor.start()
    try:
        mod, x = model
        _compile_and_run(mod, x, monkeypatch, 2)
    finally:
        release.set()
        monitor.join()
    assert forked == [1]


def test_the_garbage_collector_pauses_for_the_compile_and_comes_back_as_it_was(model, monkeypatch):
    """collector.gc_paused: off while the stages run (in this process and its forked workers),
    restored after, a failed compile included; a collector the caller turned off stays off."""
    import gc

    from npu_backend import pipeline

    mod, _ = model
    seen = []
    stages = [("seen", lambda m, arch, options: seen.append(gc.isenabled()) or m)] + list(pipeline.STAGES)
    monkeypatch.setattr(pipeline, "STAGES", stages)
    monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")
    relax_ext.clear_kernel_cache()
    npu_backend.compile(mod, "cgra-4x4")
    assert seen == [False] and gc.isenabled()
    monkeypatch.setattr(pipeline, "STAGES", [("fails", lambda m, arch, options: 1 / 0)])
    with pytest.raises(Exception, match="division by zero"):
        npu_backend.compile(mod, "cgra-4x4")
    assert gc.isenabled()
    gc.disable()
    try:
        monkeypatch.setattr(pipeline, "STAGES", stages)
        npu_backend.compile(mod, "cgra-4x4")
        assert not gc.isenabled()
    finally:
        gc.enable()
