"""Compiling a model's kernels side by side: distinct kernels in worker processes.

Stage: codegen (the target hook, relax_ext.py). In: the offloaded functions whose kernels the
caches did not have, and the function that compiles one. Out: their LLVM modules, in the order
given. Each kernel's scheduling, lowering and code generation is independent of the others' and
holds the GIL, so processes, not threads: forked from the compiling process, a worker inherits
the loaded compiler, the registered patterns and user schedules, and the functions (nothing is
serialised on the way in; only bitcode comes back). Workers start per compile and exit with it.

A kernel that fails in a worker is compiled again here, so that its error is raised in this
process with its own type, message and traceback. CGRA_COMPILE_JOBS sets the number of
processes (default: the cores this process may use; 1 compiles everything here). Fewer than
MIN_PARALLEL_KERNELS kernels are not worth the workers' start; a process running other threads
compiles everything itself, unless those are threads known to be harmless (see `_may_fork`).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import threading

from ..env import CGRA_COMPILE_JOBS

MIN_PARALLEL_KERNELS = 4

# The work a forked worker reads (copy-on-write): set by compile_all before the pool starts.
_WORK: list = []


def compile_jobs() -> int:
    """Worker processes a compile may use: CGRA_COMPILE_JOBS, else this process's cores."""
    setting = os.environ.get(CGRA_COMPILE_JOBS, "")
    if setting:
        try:
            jobs = int(setting)
        except ValueError:
            jobs = 0
        if jobs < 1:
            raise ValueError(f"{CGRA_COMPILE_JOBS}={setting!r}: give a positive number of processes "
                             "(1 compiles every kernel in the compiling process)")
        return jobs
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def compile_all(items: list, compile_one, on_progress=None) -> list:
    """[compile_one(item) for item in items], in worker processes when that pays.
    `on_progress(done, item)` hears about it here: before each item compiled in this process; with
    workers at their start and each time one finishes an item but the last (`item` None: which
    comes next is not known)."""
    jobs = min(compile_jobs(), len(items))
    if jobs < 2 or len(items) < MIN_PARALLEL_KERNELS or not _may_fork():
        return [_compile_here(compile_one, item, index, on_progress) for index, item in enumerate(items)]
    _WORK[:] = [compile_one, items]
    results: list = [None] * len(items)
    try:
        context = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
            if on_progress is not None:
                on_progress(0, None)
            futures = {pool.submit(_compile_in_worker, index): index for index in range(len(items))}
            for done, future in enumerate(concurrent.futures.as_completed(futures)):
                results[futures[future]] = future.result()
                if on_progress is not None and done + 1 < len(items):
                    on_progress(done + 1, None)
    except concurrent.futures.process.BrokenProcessPool:
        pass  # a worker died (out of memory, a signal): what is missing is compiled here
    finally:
        _WORK.clear()
    # A worker's failure: compile it here, where its error keeps its type and traceback.
    return [result if result is not None else compile_one(item) for item, result in zip(items, results)]


# Threads a fork may leave behind: their locks are never taken by a compile. tqdm's monitor
# (a daemon that wakes every 10 s to check its progress bars) runs in every process that built a
# Hugging Face model, whose compiles would otherwise never use a second core.
HARMLESS_THREADS = frozenset({("tqdm._monitor", "TMonitor")})


def _may_fork() -> bool:
    """Fork only a process whose other threads are harmless to its child: a child gets a copy of
    every lock, and one that another thread held when it forked would stay held forever."""
    others = [thread for thread in threading.enumerate() if thread is not threading.current_thread()]
    return "fork" in multiprocessing.get_all_start_methods() and \
        all((type(thread).__module__, type(thread).__name__) in HARMLESS_THREADS for thread in others)


def _compile_here(compile_one, item, index: int, on_progress):
    if on_progress is not None:
        on_progress(index, item)
    return compile_one(item)


def _compile_in_worker(index: int):
    """In a worker: the item's result, or None when it raised (the parent compiles it again)."""
    compile_one, items = _WORK
    try:
        return compile_one(items[index])
    except Exception:  # noqa: BLE001  (re-raised by the parent's own attempt)
        return None
