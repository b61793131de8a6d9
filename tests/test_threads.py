"""Kernels launched from several threads at once: each thread's profile counts its own launches,
and results stay correct (each thread runs its own VM: TVM's VM is not thread-safe)."""

from __future__ import annotations

import threading

import numpy as np
import tvm

import npu_backend
from models import assert_matches, conv2d_model, matmul_model


def _run_in_threads(jobs):
    """Runs every job (a function of a barrier) in its own thread, all released together;
    re-raises the first exception a thread saw."""
    barrier, errors, results = threading.Barrier(len(jobs)), [], [None] * len(jobs)

    def work(index, job):
        try:
            results[index] = job(barrier)
        except Exception as err:  # noqa: BLE001 (reported below, in the main thread)
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def _job(executable, inputs, ref, dtype, runs):
    def job(barrier):
        vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
        with npu_backend.profile() as prof:
            barrier.wait()
            for _ in range(runs):
                out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()
                assert_matches(out, ref, dtype)
        return prof
    return job


def test_each_thread_profile_counts_its_own_launches():
    models = [matmul_model(24, 16, 32), conv2d_model(1, 4, 10, 10, 8, 3, 3, pad=(1, 1, 1, 1)),
              matmul_model(40, 8, 16, "int8")]
    dtypes = ["float32", "float32", "int8"]
    executables = [npu_backend.compile(mod, "cgra-4x4") for mod, _, _ in models]
    runs = [1, 3, 2]
    profiles = _run_in_threads([_job(ex, inputs, ref, dtype, n) for ex, (_, inputs, ref), dtype, n
                                in zip(executables, models, dtypes, runs)])
    for prof, n in zip(profiles, runs):
        assert len(prof.kernels) == n and len({k.macs for k in prof.kernels}) == 1
    assert len({prof.kernels[0].macs for prof in profiles}) == 3  # each its own model's kernel


def test_several_vms_of_one_module_at_once_give_their_own_results_and_totals():
    mod, inputs, ref = matmul_model(32, 24, 40)
    executable = npu_backend.compile(mod, "cgra-8x8")
    profiles = _run_in_threads([_job(executable, inputs, ref, "float32", 2) for _ in range(4)])
    cycles = {prof.total_cycles for prof in profiles}
    assert len(cycles) == 1 and all(len(prof.kernels) == 2 for prof in profiles)


def test_a_profile_opened_in_the_main_thread_does_not_see_other_threads():
    mod, inputs, ref = matmul_model(16, 8, 8)
    executable = npu_backend.compile(mod, "cgra-8x8")
    with npu_backend.profile() as outer:
        _run_in_threads([_job(executable, inputs, ref, "float32", 1)])
        vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
        np.testing.assert_allclose(vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy(), ref, rtol=1e-5)
    assert len(outer.kernels) == 1


def test_an_executable_runs_as_compiled_and_exports_from_two_threads_at_once(tmp_path):
    """Nothing in it needs linking first (the kernels are an LLVM module, the host code one even
    when every operator is on the NPU), so the VM never exports it behind the user's back; two
    threads exporting it at once both get a whole library."""
    mod, inputs, ref = matmul_model(32, 24, 40, "int8")
    executable = npu_backend.compile(mod, "cgra-8x8")
    kinds = [m.kind for m in executable.mod._collect_from_import_tree(lambda m: True)]
    assert "static_library" not in kinds and "c" not in kinds and executable.jit() is executable.mod
    paths = [tmp_path / f"model{index}.so" for index in range(2)]

    def export(index):
        def job(barrier):
            barrier.wait()
            executable.export_library(str(paths[index]))
        return job

    _run_in_threads([export(0), export(1)])
    for path in paths:
        vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
        assert_matches(vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy(), ref, "int8")
