"""lower/stream_panel.py streams A's row panel only through a loop nest it recognises: a
reduction-step loop annotated STREAM_PANEL whose A load does not depend on the loop around it
(the column tiles). Any other nest is left unstreamed, A loaded every step, which is right.

The user schedules of tests/test_user_schedules.py reach the pass with the built-in tiling's
refinements kept (kernels/stage.py's `_plain` bypassed), so that the annotation sits on nests the
built-in schedule never makes: columns outside rows (the loop around the step loop walks rows;
streamed, the sums were wrong: 0.0 against 17.4) and a reduction of one step (the step loop elided;
the pass raised a ValueError).
"""

from __future__ import annotations

import pytest

import npu_backend
from npu_backend import schedules
from npu_backend.kernels import stage
from npu_backend.tools.workloads import matmul_model, mismatch, run
from test_user_schedules import no_user_schedules, tiled  # noqa: F401 (the fixture)


@pytest.mark.parametrize("tm, tn, tk, channels_outer", [(1, 1, 2, True), (1, 1, 1, False), (2, 2, 2, True)])
def test_a_user_nest_the_pass_does_not_recognise_is_left_unstreamed_and_right(tm, tn, tk, channels_outer,
                                                                            monkeypatch):
    monkeypatch.setattr(stage, "_plain", lambda tiling: tiling)
    mod, inputs, ref = matmul_model(37, 24, 40, "float32", residual=True, seed=0)
    seen = []
    schedules.register_schedule("cgra.matmul_bias_residual_relu", tiled(tm, tn, tk, channels_outer, seen))
    out = run(npu_backend.compile(mod, "cgra-4x4"), inputs)
    assert seen and seen[0].stream_panel  # the annotation reached the user's nest
    assert mismatch(out, ref, "float32") is None
