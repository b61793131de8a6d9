"""The persistent kernel cache (npu_backend/device/kernel_cache.py): a kernel compiled once is read
back from disk by the next compile, in this process or another, with the same code, results and
cycles; what its code depends on is in the key; a damaged entry is compiled again; the folder
stays under its size limit; two processes can fill one folder at the same time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import pytest

import npu_backend
from models import assert_matches, conv2d_model, run
from npu_backend.device import kernel_cache
from npu_backend.target import relax_ext


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty persistent cache of the test's own, an empty in-process one, and the symbols the
    kernel stages ran for (a kernel read from disk runs none)."""
    folder = tmp_path / "kernels"
    monkeypatch.setenv("CGRA_KERNEL_CACHE", str(folder))
    monkeypatch.setenv("CGRA_COMPILE_JOBS", "1")  # the stages run here, where they are counted
    monkeypatch.setattr(relax_ext, "_KERNEL_CACHE", type(relax_ext._KERNEL_CACHE)())
    runs, run_stages = [], relax_ext.run_kernel_stages
    monkeypatch.setattr(relax_ext, "run_kernel_stages", lambda *a: runs.append(a[0].symbol) or run_stages(*a))
    return types.SimpleNamespace(dir=folder, runs=runs)


def _model():
    return conv2d_model(1, 8, 12, 12, 16, 3, 3, (1, 1), (1, 1, 1, 1), "int8")


def _compile_and_run(mod, inputs, arch="cgra-4x4", **options):
    relax_ext.clear_kernel_cache()  # only the disk may remember
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch, **options), inputs)
    return out, [(k.name, k.cycles, k.dma_load_bytes, k.num_commands) for k in prof.kernels]


def test_a_second_compile_reads_every_kernel_from_disk_with_the_same_results_and_cycles(cache):
    mod, inputs, ref = _model()
    first, first_cycles = _compile_and_run(mod, inputs)
    assert len(cache.runs) == 1 and len(list(cache.dir.glob("*.kernel"))) == 1
    assert len(list(cache.dir.glob("*.linked"))) == 1  # the module's kernels, linked
    second, second_cycles = _compile_and_run(mod, inputs)
    assert len(cache.runs) == 1  # nothing scheduled, lowered or emitted the second time
    assert_matches(second, ref, "int8")
    assert (first == second).all() and first_cycles == second_cycles
    # The linked entry alone gives the module: no kernel is read, linked or compiled.
    for entry in cache.dir.glob("*.kernel"):
        entry.unlink()
    third, third_cycles = _compile_and_run(mod, inputs)
    assert len(cache.runs) == 1 and (third == first).all() and third_cycles == first_cycles
    assert not list(cache.dir.glob("*.kernel"))


def test_the_chip_the_options_and_the_compiler_are_in_the_key(cache, monkeypatch):
    mod, inputs, ref = _model()
    for arch, opt in (("cgra-4x4", 0), ("cgra-8x8", 0), ("cgra-4x4", 2), ("cgra-4x4", 0)):
        assert_matches(_compile_and_run(mod, inputs, arch, host_opt_level=opt)[0], ref, "int8")
    assert len(cache.runs) == 3
    monkeypatch.setattr(kernel_cache, "compiler_version", lambda: "another compiler")
    _compile_and_run(mod, inputs)
    assert len(cache.runs) == 4


def _damage(entry) -> bytes:
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0xFF
    entry.write_bytes(bytes(data))
    return bytes(data)


def test_a_damaged_entry_is_compiled_again_and_replaced(cache):
    mod, inputs, ref = _model()
    _compile_and_run(mod, inputs)
    (linked,) = cache.dir.glob("*.linked")
    damaged = _damage(linked)  # linked again from the kernel's entry
    assert_matches(_compile_and_run(mod, inputs)[0], ref, "int8")
    assert len(cache.runs) == 1 and linked.read_bytes() != damaged
    linked.unlink()
    (entry,) = cache.dir.glob("*.kernel")
    damaged = _damage(entry)  # compiled again
    assert_matches(_compile_and_run(mod, inputs)[0], ref, "int8")
    assert len(cache.runs) == 2 and entry.read_bytes() != damaged


def test_a_dump_shows_every_stage_even_when_the_kernel_is_cached(cache, tmp_path):
    mod, inputs, _ = _model()
    _compile_and_run(mod, inputs)
    _compile_and_run(mod, inputs, dump_dir=str(tmp_path / "dump"))
    (kernel,) = (tmp_path / "dump" / "kernels").iterdir()
    assert len(list(kernel.iterdir())) == len(relax_ext.KERNEL_STAGES)


def test_off_keeps_nothing(cache, monkeypatch):
    monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")
    mod, inputs, _ = _model()
    _compile_and_run(mod, inputs)
    assert not cache.dir.exists()


def test_a_bad_size_limit_is_named(monkeypatch):
    monkeypatch.setenv("CGRA_KERNEL_CACHE_MB", "lots")
    with pytest.raises(ValueError, match="CGRA_KERNEL_CACHE_MB='lots'"):
        kernel_cache.default_kernel_cache()


def test_eviction_removes_the_least_recently_used_down_to_three_quarters(tmp_path):
    store = kernel_cache.KernelCache(tmp_path, max_bytes=10 * 200)
    for index in range(14):
        store.put(f"k{index}", bytes(200 - len(kernel_cache.MAGIC) - kernel_cache.DIGEST_BYTES))
        os.utime(tmp_path / f"k{index}.kernel", (1000 + index, 1000 + index))
    os.utime(tmp_path / "k0.kernel", (5000, 5000))  # used last
    (tmp_path / ".tmp-dead.kernel").write_bytes(b"x")
    os.utime(tmp_path / ".tmp-dead.kernel", (0, 0))
    removed = sorted(p.name for p in store.evict())
    assert removed == sorted(f"k{i}.kernel" for i in range(1, 8))  # 14 -> 7 entries (<= 1500 bytes)
    assert store.get("k0") is not None and store.get("k1") is None
    assert not (tmp_path / ".tmp-dead.kernel").exists()
    # Another process's entries push the folder over the limit: a compile that only read the
    # cache does not walk it; the next one that stores a kernel does.
    for index in range(20, 30):
        (tmp_path / f"k{index}.kernel").write_bytes(bytes(200))
    assert store.evict() == []
    store.put("k99", b"x")
    assert len(store.evict()) > 0


_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    import npu_backend
    from models import conv2d_model, run
    mod, inputs, ref = conv2d_model(1, 8, 12, 12, 16, 3, 3, (1, 1), (1, 1, 1, 1), "int8")
    out = run(npu_backend.compile(mod, "cgra-4x4"), inputs)
    assert (out == ref).all()
    print("ok")
""")


def test_two_processes_fill_one_folder_at_once(tmp_path):
    env = dict(os.environ, CGRA_KERNEL_CACHE=str(tmp_path / "kernels"))
    script = _SCRIPT.format(tests=os.path.dirname(__file__))
    workers = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [worker.communicate(timeout=300) for worker in workers]
    assert [w.returncode for w in workers] == [0, 0], results
    entries = sorted((tmp_path / "kernels").iterdir(), key=lambda path: path.suffix)
    assert [entry.suffix for entry in entries] == [".kernel", ".linked", ".plan"]  # no temporary file left
    store = kernel_cache.KernelCache(tmp_path / "kernels", 1 << 20)
    assert all(store.get(entry.stem, entry.suffix) is not None for entry in entries)  # whole, checksums intact
