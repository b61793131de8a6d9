"""Chrome traces of simulated timelines: one event per command, per-unit tracks, launches end to
end, stall events in the gaps a unit waited for a dependency; kept by
`profile(keep_timelines=True)` and written by `--trace` on run, verify and replay."""

from __future__ import annotations

import dataclasses
import json
import os
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import load_arch, simulate_detailed, streams
from cgra_sim.isa import EPILOGUE_BIAS, EPILOGUE_RELU, GEMM_ACCUMULATE, DType, Op, Unit, encode
from cgra_sim.trace import TID_OF, TracedLaunch, chrome_trace, write_chrome_trace

ARCH = load_arch("cgra-4x4")
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "tiny_cnn.onnx")


def _gemm_launch(m, n, k, dtype="int8", tile=None, flags=EPILOGUE_RELU, name="gemm") -> TracedLaunch:
    records = streams.tiled_gemm(ARCH, m, n, k, dtype, tile=tile, epilogue_flags=flags)
    acc = "int32" if dtype == "int8" else "float32"
    tensors = [np.ones((m, k), dtype), np.ones((k, n), dtype), np.zeros((m, n), acc)]
    if flags is not None and flags & EPILOGUE_BIAS:
        tensors.append(np.ones(n, acc))
    result = simulate_detailed(ARCH, records, tensors, name=name)
    return TracedLaunch(name, result.timeline, ARCH.clock_mhz, records)


def _complete_events(trace: dict) -> list[dict]:
    """The commands' events (not the stalls)."""
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "stall"]


def _stall_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "stall"]


def check_trace(trace: dict, launches: list[TracedLaunch]) -> None:
    """What every trace must satisfy: JSON, one event per command with its unit's track and its
    timeline's times, one stall event per stalled command, no overlap on a track, launches laid
    end to end."""
    trace = json.loads(json.dumps(trace))
    events = _complete_events(trace)
    check_stalls(_stall_events(trace), launches)
    assert len(events) == sum(len(t.timeline.ops) for t in launches)
    offset = 0.0
    for pid, launch in enumerate(launches, start=1):
        mine = sorted((e for e in events if e["pid"] == pid), key=lambda e: e["args"]["index"])
        s = launch.timeline
        assert [e["args"]["index"] for e in mine] == list(range(len(s.ops)))
        for e in mine:
            i = e["args"]["index"]
            assert e["name"] == e["args"]["op"] == Op(int(s.ops[i])).name
            assert e["tid"] == TID_OF[Unit(int(s.units[i]))] and e["dur"] >= 0 and e["ts"] >= offset
            assert e["ts"] == pytest.approx(offset + s.starts[i] / launch.clock_mhz)
            assert e["dur"] == pytest.approx(s.occupancy[i] / launch.clock_mhz)
            assert e["args"]["end_cycle"] == s.ends[i] and e["args"]["start_cycle"] == s.starts[i]
        offset += s.cycles / launch.clock_mhz
    tracks = defaultdict(list)
    for e in events + _stall_events(trace):
        tracks[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        assert all(end <= next_start + 1e-9 for (_, end), (next_start, _) in zip(spans, spans[1:]))


def check_stalls(stalls: list[dict], launches: list[TracedLaunch]) -> None:
    """Each stall event ends where its command starts, on the command's track, lasts the cycles
    the unit waited (KernelStats' stall_cycles in total) and names the command waited for."""
    for pid, launch in enumerate(launches, start=1):
        s, mine = launch.timeline, [e for e in stalls if e["pid"] == pid]
        waited = s.stalls()
        assert sorted(e["args"]["waiting"] for e in mine) == list(np.flatnonzero(waited > 0))
        for e in mine:
            i, blocker = e["args"]["waiting"], e["args"]["waits_for"]
            assert e["tid"] == TID_OF[Unit(int(s.units[i]))]
            assert e["args"]["stall_cycles"] == waited[i] == s.starts[i] - e["args"]["start_cycle"]
            assert e["dur"] == pytest.approx(waited[i] / launch.clock_mhz)
            assert 0 <= blocker < i
            assert e["name"] == f"stall: waits for {Unit(int(s.units[blocker])).name} cmd #{blocker}"
        for unit in Unit:
            spans = sum(e["args"]["stall_cycles"] for e in mine if e["tid"] == TID_OF[unit])
            assert spans == s.stall_cycles(unit)


@st.composite
def gemm_launches(draw):
    m, n, k = (draw(st.integers(1, 24)) for _ in range(3))
    tile = tuple(draw(st.integers(1, 12)) for _ in range(3))
    flags = draw(st.sampled_from([None, EPILOGUE_RELU, EPILOGUE_BIAS | EPILOGUE_RELU]))
    return _gemm_launch(m, n, k, draw(st.sampled_from(["int8", "float32"])), tile, flags)


@given(st.lists(gemm_launches(), min_size=1, max_size=3))
def test_trace_has_one_event_per_command_on_its_units_track(launches):
    check_trace(chrome_trace(launches), launches)


def test_tracks_and_processes_are_named():
    launches = [_gemm_launch(20, 12, 9, name="first"), _gemm_launch(8, 8, 8, name="second")]
    meta = [e for e in chrome_trace(launches)["traceEvents"] if e["ph"] == "M"]
    names = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "process_name"}
    assert names == {(1, "0: first"), (2, "1: second")}
    threads = {(e["pid"], e["tid"], e["args"]["name"]) for e in meta if e["name"] == "thread_name"}
    assert threads == {(pid, TID_OF[unit], unit.name) for pid in (1, 2) for unit in Unit}
    order = sorted((e["args"]["sort_index"], e["tid"]) for e in meta
                   if e["name"] == "thread_sort_index" and e["pid"] == 1)
    top_to_bottom = [Unit.LOAD, Unit.COMPUTE, Unit.VECTOR, Unit.STORE]
    assert [tid for _, tid in order] == [TID_OF[unit] for unit in top_to_bottom]


def test_events_carry_the_commands_key_fields():
    launch = _gemm_launch(20, 12, 9, flags=EPILOGUE_BIAS | EPILOGUE_RELU)
    events = _complete_events(chrome_trace([launch]))
    gemm = next(e for e in events if e["name"] == "GEMM")["args"]
    assert {"m", "n", "k", "dtype", "accumulate"} <= set(gemm) and gemm["dtype"] == "int8"
    epilogue = next(e for e in events if e["name"] == "EPILOGUE")["args"]
    assert epilogue["bias"] and epilogue["relu"]
    load = next(e for e in events if e["name"] == "DMA_LOAD")["args"]
    assert {"slot", "spad_addr", "origin", "box"} <= set(load)
    bare = _complete_events(chrome_trace([(launch.name, launch.timeline, launch.clock_mhz)]))
    assert set(bare[0]["args"]) == {"index", "op", "start_cycle", "end_cycle", "busy_cycles"}


def test_times_are_microseconds_at_the_arch_clock(tmp_path):
    launch = _gemm_launch(16, 16, 16)
    trace = write_chrome_trace(tmp_path / "t.json", [launch, launch._replace(clock_mhz=2 * launch.clock_mhz)])
    assert json.loads((tmp_path / "t.json").read_text()) == trace
    cycles = launch.timeline.cycles
    assert trace["otherData"]["total_us"] == pytest.approx(cycles / ARCH.clock_mhz * 1.5)
    last = max(e["ts"] + e["dur"] for e in _complete_events(trace) if e["pid"] == 1)
    assert last <= cycles / ARCH.clock_mhz + 1e-9
    with pytest.raises(ValueError, match="clock_mhz must be positive"):
        chrome_trace([launch._replace(clock_mhz=0)])


def test_an_empty_profile_gives_an_empty_timeline():
    assert _complete_events(chrome_trace([])) == []


def test_stall_events_name_the_command_waited_for():
    # 8x8x8 in one tile: LOAD A, LOAD B, GEMM, EPILOGUE, STORE; each later unit waits for the
    # previous step, so COMPUTE, VECTOR and STORE each stall once, from the kernel's start.
    launch = _gemm_launch(8, 8, 8, tile=(8, 8, 8))
    s = launch.timeline
    stalls = {e["tid"]: e for e in _stall_events(chrome_trace([launch]))}
    assert set(stalls) == {TID_OF[Unit.COMPUTE], TID_OF[Unit.VECTOR], TID_OF[Unit.STORE]}
    ops = [Op(int(op)) for op in s.ops]
    gemm, epilogue, last_load = ops.index(Op.GEMM), ops.index(Op.EPILOGUE), ops.index(Op.GEMM) - 1
    assert stalls[TID_OF[Unit.COMPUTE]]["name"] == f"stall: waits for LOAD cmd #{last_load}"
    assert stalls[TID_OF[Unit.VECTOR]]["name"] == f"stall: waits for COMPUTE cmd #{gemm}"
    assert stalls[TID_OF[Unit.STORE]]["name"] == f"stall: waits for VECTOR cmd #{epilogue}"
    assert all(e["ts"] == 0 for e in stalls.values())
    bare = chrome_trace([(launch.name, dataclasses.replace(s, waits_for=None), launch.clock_mhz)])
    assert {e["name"] for e in _stall_events(bare)} == {"stall"}


# Timelines kept by the profile, and --trace on the command line.

@pytest.fixture(scope="module")
def matmul_executable():
    import npu_backend
    from npu_backend.tools.workloads import matmul_model

    mod, inputs, _ = matmul_model(40, 24, 30, "int8")
    return npu_backend.compile(mod, "cgra-8x8"), inputs


def test_profile_keeps_timelines_only_when_asked(matmul_executable):
    import npu_backend
    from npu_backend.tools.workloads import run

    ex, inputs = matmul_executable
    with npu_backend.profile(keep_timelines=True) as kept, npu_backend.profile() as plain:
        run(ex, inputs)
        run(ex, inputs)
    assert [k.to_dict() for k in kept.kernels] == [k.to_dict() for k in plain.kernels]
    assert [t.timeline.cycles for t in kept.timelines] == [k.cycles for k in kept.kernels]
    assert all(len(t.commands) == k.num_commands for t, k in zip(kept.timelines, kept.kernels))
    check_trace(kept.chrome_trace(), kept.timelines)
    assert plain.timelines == []
    with pytest.raises(ValueError, match="keep_timelines=True"):
        plain.chrome_trace()


def test_the_old_schedule_names_still_work_with_a_warning(matmul_executable):
    """The timing result was a `Schedule` until the s_tir meaning kept the word: the old names
    warn for one release and give the same objects."""
    import cgra_sim
    import npu_backend
    from npu_backend.tools.workloads import run

    ex, inputs = matmul_executable
    with pytest.warns(DeprecationWarning, match="keep_timelines"):
        with npu_backend.profile(keep_schedules=True) as prof:
            run(ex, inputs)
    with pytest.warns(DeprecationWarning, match="Profile.timelines"):
        assert prof.schedules is prof.timelines and len(prof.timelines) == 1
    launch = prof.timelines[0]
    with pytest.warns(DeprecationWarning, match="TracedLaunch.timeline"):
        assert launch.schedule is launch.timeline
    with pytest.warns(DeprecationWarning, match="cgra_sim.Timeline"):
        assert cgra_sim.Schedule is cgra_sim.Timeline
    records = streams.tiled_gemm(ARCH, 8, 8, 8, "float32", epilogue_flags=None)
    tensors = [np.ones((8, 8), np.float32), np.ones((8, 8), np.float32), np.zeros((8, 8), np.float32)]
    result = simulate_detailed(ARCH, records, tensors)
    with pytest.warns(DeprecationWarning, match="SimulationResult.timeline"):
        assert result.schedule is result.timeline


def test_verify_and_replay_write_traces(tmp_path, capsys):
    from npu_backend.tools.cli import main

    assert main(["verify", "--op", "matmul", "--shape", "40,24,30", "--dtype", "int8",
                 "--trace", str(tmp_path / "verify.json"), "--record-dir", str(tmp_path / "rec"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    commands = report["kernels"][0]["num_commands"]
    assert report["trace"] == str(tmp_path / "verify.json")
    verify_trace = json.loads((tmp_path / "verify.json").read_text())
    assert len(_complete_events(verify_trace)) == commands
    assert main(["replay", report["recorded"][0], "--trace", str(tmp_path / "replay.json")]) == 0
    replay_trace = json.loads((tmp_path / "replay.json").read_text())
    assert _complete_events(replay_trace) == _complete_events(verify_trace)  # same arch: same timeline


def test_run_trace_lays_the_kernels_end_to_end(tmp_path, capsys):
    from npu_backend.tools.cli import main

    assert main(["run", EXAMPLE, "--trace", str(tmp_path / "model.json")]) == 0
    assert f"trace of 4 kernel launches: {tmp_path / 'model.json'}" in capsys.readouterr().out
    trace = json.loads((tmp_path / "model.json").read_text())
    events = _complete_events(trace)
    pids = (1, 2, 3, 4)  # two convs, the global average pool, the classifier
    assert {e["pid"] for e in events} == set(pids)
    ends = {pid: max(e["ts"] + e["dur"] for e in events if e["pid"] == pid) for pid in pids}
    starts = {pid: min(e["ts"] for e in events if e["pid"] == pid) for pid in pids}
    assert starts[1] == 0 and all(ends[pid] <= starts[pid + 1] for pid in pids[:-1])
    assert any(e["name"] == "POOL" for e in events if e["pid"] == 3)
    assert trace["otherData"]["total_cycles"] > 0


def test_an_unwritable_trace_exits_2(tmp_path, capsys):
    from npu_backend.tools.cli import main

    status = main(["verify", "--op", "matmul", "--shape", "8,8,8", "--trace", str(tmp_path / "no" / "t.json")])
    assert status == 2 and "No such file or directory" in capsys.readouterr().err


def test_stream_listing_names_each_command_and_its_key_fields():
    from cgra_sim.listing import format_stream

    records = np.array([encode(Op.GEMM, flags=GEMM_ACCUMULATE, dtype=int(DType.INT8), m=8, n=16, k=4,
                               a_addr=64, b_addr=128, acc_addr=256),
                        encode(Op.FILL, dtype=int(DType.INT32), addr=512, rows=2, cols=3), [99] + [0] * 31])
    assert format_stream(records, "kernel k").splitlines() == [
        "kernel k",
        "     0  GEMM       m=8 n=16 k=4 a_addr=64 b_addr=128 acc_addr=256 dtype=int8 accumulate=True",
        "     1  FILL       addr=512 rows=2 cols=3 dtype=int32",
        "     2  opcode 99  opcode=99",
    ]
