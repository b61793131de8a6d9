"""A post-norm tile's last reduction steps run piece by piece (lower/piece_major.py, the steps chosen by
kernels/gemm/post_norm_tail.py): within 1e-5 of float64 relative to the output's largest value
on cgra-4x4 and cgra-8x8 over rows, widths and depths; bit for bit the kernel without the reorder
(each piece still adds its steps in order); and Bloom's last fc2 + residual + ln_f (32 x 64 x 256)
in fewer cycles on cgra-8x8 (10,934 -> 10,352)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.kernels.gemm import gemm_schedule
from test_post_norms import _no_plans, _post_norm, _reference


def _compiled_run(rows, hidden, depth, arch, seed, monkeypatch, reorder=True):
    """(output, cycles, the tails the schedule chose) of the post-norm kernel."""
    chosen = []

    def recorded(spec, tiling, hw):
        tail = original(spec, tiling, hw) if reorder else 0
        chosen.append(tail)
        return tail

    original = gemm_schedule.tail_steps
    monkeypatch.setattr(gemm_schedule, "tail_steps", recorded)
    mod, params = _post_norm(rows, hidden, depth, 1e-5, seed)
    rng = np.random.default_rng(seed + 1)
    h = rng.standard_normal((rows, depth)).astype(np.float32)
    x = rng.standard_normal((1, rows, hidden)).astype(np.float32)
    with _no_plans():
        vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(h), tvm.runtime.tensor(x)).numpy()
    monkeypatch.setattr(gemm_schedule, "tail_steps", original)
    return got, prof.total_cycles, chosen, _reference(h, x, 1e-5, *params)


@settings(max_examples=5, deadline=None)
@given(arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]), rows=st.sampled_from([16, 24, 32]),
       hidden=st.sampled_from([32, 64]), depth=st.sampled_from([64, 128, 256]), seed=st.integers(0, 99))
@example(arch="cgra-8x8", rows=32, hidden=64, depth=256, seed=0)
@example(arch="cgra-4x4", rows=16, hidden=32, depth=128, seed=1)
def test_a_post_norm_with_its_last_steps_piece_by_piece_matches_float64(arch, rows, hidden, depth, seed):
    with pytest.MonkeyPatch.context() as monkeypatch:
        got, _, _, ref = _compiled_run(rows, hidden, depth, arch, seed, monkeypatch)
    assert np.abs(got[0] - ref).max() <= 1e-5 * np.abs(ref).max()


def _in_a_process_of_its_own(reorder: bool, folder):
    """(output, cycles, the tail chosen) of Bloom's final norm compiled in a fresh process: this
    one would run the kernel of that spec it compiled first."""
    script = (f"import sys, numpy as np, pytest; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
              "import test_piece_major_tails as t\n"
              "with pytest.MonkeyPatch.context() as mp:\n"
              f"    got, cycles, chosen, _ = t._compiled_run(32, 64, 256, 'cgra-8x8', 0, mp, reorder={reorder})\n"
              f"np.save({str(folder / 'out.npy')!r}, got); print('CYCLES', cycles, max(chosen))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    line = [row for row in done.stdout.splitlines() if row.startswith("CYCLES")]
    assert line, done.stderr[-2000:]
    cycles, tail = map(int, line[0].split()[1:])
    return np.load(folder / "out.npy"), cycles, tail


def test_blooms_final_norm_runs_its_last_steps_piece_by_piece_in_fewer_cycles_and_the_same_bits(tmp_path):
    got, cycles, tail = _in_a_process_of_its_own(True, tmp_path)
    plain, plain_cycles, plain_tail = _in_a_process_of_its_own(False, tmp_path)
    assert tail == 2 and plain_tail == 0
    assert np.array_equal(got, plain)  # each piece adds its steps in order
    assert cycles < plain_cycles - 400, (cycles, plain_cycles)  # 10,352 against 10,934
