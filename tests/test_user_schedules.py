"""User schedules and user kernels for fused patterns (npu_backend.schedules,
docs/own-kernels.md): a function registered for a cgra pattern or an op schedules the whole fused
kernel, or writes it; the rest of the flow is the built-in one. Random legal schedules match
numpy; the mistakes users make are errors that name the pattern, the block or the buffers, and
the fix."""

from __future__ import annotations

import dataclasses
import pathlib
import runpy

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import npu_backend
from npu_backend import schedules
from npu_backend.errors import ScheduleError, ScratchpadTooSmall, UnsupportedOperator
from npu_backend.kernels.gemm.gemm_estimate import gemm_footprint
from npu_backend.tools.workloads import conv2d_model, matmul_model, mismatch, run

ROOT = pathlib.Path(__file__).parent.parent


@pytest.fixture(autouse=True)
def no_user_schedules():
    """Every test starts and ends with the built-in schedules."""
    from npu_backend.kernels.registry import _USER_KERNELS, _USER_SCHEDULES

    saved = [(table, dict(table)) for table in (_USER_SCHEDULES, _USER_KERNELS)]
    for table, _ in saved:
        table.clear()
    yield
    for table, entries in saved:
        table.clear()
        table.update(entries)


def tiled(tm_steps: int, tn_steps: int, tk_div: int, channels_outer: bool, seen: list):
    """A schedule with its own output tile (multiples of the built-in's steps that divide the
    padded extents, or the built-in's when they do not) and loop order."""
    def schedule(sch, spec, tiling, arch):
        step = spec.row_step if spec.row_step > 1 else arch.rows
        tm = _dividing(tiling.mp, step, tm_steps)
        tn = _dividing(tiling.np, arch.cols, tn_steps)
        tk = _dividing(tiling.kp, 1, max(1, tiling.kp // tk_div))
        tiling = dataclasses.replace(tiling, tm=tm, tn=tn, tk=tk)
        seen.append(tiling)
        *_, row, col = sch.get_loops(sch.get_sblock("epi"))
        row_outer, row_inner = sch.split(row, [None, tm])
        col_outer, col_inner = sch.split(col, [None, tn])
        outer, inner = (col_outer, row_outer) if channels_outer else (row_outer, col_outer)
        sch.reorder(outer, inner, row_inner, col_inner)
        acc = schedules.stage_output_tile(sch, spec, inner)
        schedules.tensorize_tile(sch, spec, tiling, arch, acc, row_inner, inner)
    return schedule


def _dividing(extent: int, step: int, steps: int) -> int:
    """The largest multiple of `step`, at most steps * step, that divides `extent`."""
    for count in range(min(steps, extent // step), 0, -1):
        if extent % (count * step) == 0:
            return count * step
    return extent


# Both broke when the built-in GEMM tiling's refinements (epilogue pieces, A's panel streamed
# during the first column tile) reached a user's schedule: columns outside rows gave wrong sums,
# a one-deep reduction step a ValueError in lower/stream_panel.py.
@example(op="matmul", dtype="float32", arch="cgra-4x4", tm=1, tn=1, tk=2, channels_outer=True, seed=0)
@example(op="matmul", dtype="float32", arch="cgra-4x4", tm=1, tn=1, tk=1, channels_outer=False, seed=0)
@settings(deadline=None)
@given(op=st.sampled_from(["matmul", "conv2d"]), dtype=st.sampled_from(["float32", "int8"]),
       arch=st.sampled_from(npu_backend.preset_names()), tm=st.integers(1, 6), tn=st.integers(1, 4),
       tk=st.sampled_from([1, 2, 4]), channels_outer=st.booleans(), seed=st.integers(0, 3))
def test_a_random_legal_user_schedule_matches_numpy_and_reports_cycles(op, dtype, arch, tm, tn, tk, channels_outer,
                                                                      seed):
    if op == "matmul":
        mod, inputs, ref = matmul_model(37, 24, 40, dtype, residual=True, seed=seed)
        pattern = "cgra.matmul_bias_residual_relu"
    else:
        mod, inputs, ref = conv2d_model(1, 8, 9, 9, 16, 3, 3, (1, 1), (1, 1, 1, 1), dtype, residual=True, seed=seed)
        pattern = "cgra.conv2d_bias_residual_relu"
    seen = []
    schedules.register_schedule(pattern, tiled(tm, tn, tk, channels_outer, seen))
    try:
        executable = npu_backend.compile(mod, arch)
    except ScratchpadTooSmall:
        # Refused only when the tiles do not fit: compact, they take most of the scratchpad (the
        # schedule pads rows against bank conflicts, so a tile near the limit may not fit).
        (t,) = seen
        compact = gemm_footprint(t.tm, t.tn, t.tk, 1 if dtype == "int8" else 4, 4, True, True)
        assert compact > 0.75 * npu_backend.load_arch(arch).spad_bytes, (t, compact)
        assume(False)
    assert seen, "the user schedule was not called"
    with npu_backend.profile() as prof:
        out = run(executable, inputs)
    assert mismatch(out, ref, dtype) is None
    assert prof.kernels[0].cycles > 0


def test_the_example_runs_and_its_schedule_is_as_fast_as_the_built_in(capsys):
    example = runpy.run_path(str(ROOT / "examples" / "own_schedule.py"))
    figures = example["main"](["--arch", "cgra-8x8"])
    assert figures["scheduled"] == 1  # the user's schedule ran, on the one kernel
    assert figures["own"] <= 1.05 * figures["built_in"]
    assert "matches numpy with both schedules" in capsys.readouterr().out


def test_a_pattern_schedule_wins_over_an_op_schedule_and_unregistering_restores_the_built_in():
    mod, inputs, ref = matmul_model(16, 16, 16)
    calls = []

    def by_op(sch, spec, tiling, arch):
        calls.append("op")
        schedules.builtin(sch, spec, tiling, arch)

    def by_pattern(sch, spec, tiling, arch):
        calls.append("pattern")
        schedules.builtin(sch, spec, tiling, arch)

    schedules.register_schedule("matmul", by_op)
    run(npu_backend.compile(mod, "cgra-4x4"), inputs)
    schedules.register_schedule("cgra.matmul_bias_relu", by_pattern)
    out = run(npu_backend.compile(mod, "cgra-4x4"), inputs)  # recompiled: the schedule is in the cache key
    assert calls == ["op", "pattern"] and mismatch(out, ref, "float32") is None
    schedules.register_schedule("cgra.matmul_bias_relu", None)
    schedules.register_schedule("matmul", None)
    run(npu_backend.compile(mod, "cgra-4x4"), inputs)
    assert calls == ["op", "pattern"]


def test_a_block_left_untensorized_is_named_with_its_loops():
    mod, _, _ = matmul_model(16, 16, 16)

    def stages_nothing(sch, spec, tiling, arch):
        pass

    schedules.register_schedule("cgra.matmul_bias_relu", stages_nothing)
    with pytest.raises(ScheduleError, match=r"user schedule of cgra.matmul_bias_relu .* leaves block 'a_pad' "
                                            r"\(i in 16, r in 16\) untensorized.*tensorize its tile"):
        npu_backend.compile(mod, "cgra-4x4")


def test_a_tile_too_large_for_the_scratchpad_names_the_buffers_and_the_pattern():
    mod, _, _ = conv2d_model(1, 32, 28, 28, 64, 3, 3, (1, 1), (1, 1, 1, 1), residual=True, seed=0)
    schedules.register_schedule("cgra.conv2d_bias_residual_relu", tiled(28, 8, 1, False, []))
    with pytest.raises(ScratchpadTooSmall) as caught:
        npu_backend.compile(mod, "cgra-8x8")
    message = str(caught.value)
    for part in ("'cgra-8x8' has 262144 bytes", "'acc_global.cgra_spad' (200704 bytes)",
                 "pattern cgra.conv2d_bias_residual_relu, scheduled by a user schedule"):
        assert part in message, message


def test_tensorizing_onto_an_intrinsic_of_the_wrong_dtype_names_the_pattern():
    mod, _, _ = matmul_model(16, 16, 16)  # float32

    def wrong_dtype(sch, spec, tiling, arch):
        schedules.tensorize_tile(sch, dataclasses.replace(spec, dtype="int8", acc_dtype="int32"), tiling, arch,
                                 *_tile(sch, spec, tiling))

    schedules.register_schedule("cgra.matmul_bias_relu", wrong_dtype)
    with pytest.raises(ScheduleError, match=r"user schedule of cgra.matmul_bias_relu .* failed: .*"):
        npu_backend.compile(mod, "cgra-4x4")


def _tile(sch, spec, tiling):
    *_, row, col = sch.get_loops(sch.get_sblock("epi"))
    row_outer, row_inner = sch.split(row, [None, tiling.tm])
    col_outer, col_inner = sch.split(col, [None, tiling.tn])
    sch.reorder(row_outer, col_outer, row_inner, col_inner)
    return schedules.stage_output_tile(sch, spec, col_outer), row_inner, col_outer


def test_a_user_schedule_that_raises_keeps_its_traceback_and_names_the_pattern_and_the_layer():
    onnx = pytest.importorskip("onnx")
    model = npu_backend.from_onnx(onnx.load(str(ROOT / "examples" / "tiny_cnn.onnx")))
    pattern = next(p.kernel.split()[0] for p in npu_backend.explain(model) if p.op == "nn.conv2d")

    def buggy(sch, spec, tiling, arch):
        raise KeyError("my_block")

    schedules.register_schedule(pattern, buggy)
    with pytest.raises(ScheduleError, match=rf"user schedule of {pattern} \(kernel .*, layer .+\) raised "
                                            r"KeyError: 'my_block'") as caught:
        npu_backend.compile(model, "cgra-8x8")
    assert isinstance(caught.value.__cause__, KeyError)  # the user's own traceback


@pytest.mark.parametrize("name, fn, error, message", [
    ("cgra.conv2d_fancy", lambda sch, spec, tiling, arch: None, UnsupportedOperator,
     "neither a cgra pattern nor an op"),
    ("matmul", lambda sch: None, TypeError, r"must take \(sch, spec, tiling, arch\)"),
    ("matmul", 42, TypeError, "needs a function"),
])
def test_registering_a_bad_schedule_says_what_is_wrong(name, fn, error, message):
    with pytest.raises(error, match=message):
        schedules.register_schedule(name, fn)


def test_the_docs_list_every_intrinsic_as_the_code_defines_it():
    page = (ROOT / "docs" / "own-kernels.md").read_text()
    assert schedules.intrinsics_table() in page, "regenerate the table: python -m npu_backend.schedules"


def test_the_own_kernel_example_runs_a_tvmscript_kernel_for_a_pattern(capsys):
    example = runpy.run_path(str(ROOT / "examples" / "own_kernel.py"))
    figures = example["main"](["--arch", "cgra-4x4"])
    assert figures["own"] != figures["built_in"]  # the user's kernel ran (and matched numpy)
    assert "matches numpy with both kernels" in capsys.readouterr().out


def test_a_user_kernel_whose_parameters_differ_from_the_patterns_is_refused_with_both_signatures():
    example = runpy.run_path(str(ROOT / "examples" / "own_kernel.py"))
    mod, _, _ = matmul_model(32, 16, 64, "int8", bias=False, relu=False)

    def transposed(spec, arch):  # the weights as (n, k): not how the pattern passes them
        (k, n) = spec.rhs_shape
        return example["weights_resident_gemm"](dataclasses.replace(spec, rhs_shape=(n, k)), arch)

    schedules.register_kernel("cgra.matmul", transposed)
    with pytest.raises(ScheduleError, match=r"user kernel of cgra.matmul .* takes \(A \(32, 64\) int8, B \(64, 64\) "
                                            r"int8, C \(32, 64\) int32\), but the pattern's kernel is called with "
                                            r"\(lhs \(32, 64\) int8, rhs \(64, 16\) int8, out \(32, 16\) int32\)"):
        npu_backend.compile(mod, "cgra-4x4")
    schedules.register_kernel("cgra.matmul", lambda spec, arch: "not a kernel")
    with pytest.raises(ScheduleError, match="returned str, not a PrimFunc"):
        npu_backend.compile(mod, "cgra-4x4")
