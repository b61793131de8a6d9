"""Launch files: round trip, refusals with the right message, recording real kernels, replay.

A launch recorded from a compiled kernel must replay on its own chip with the recorded cycles and
results, on a chip with more DMA bandwidth never slower and with the same results, and from
`python -m cgra_sim` without tvm.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import (HardwareDescription, Launch, StreamFileError, load_arch, load_launch, replay,
                      save_launch, simulate, streams)
from cgra_sim import __main__ as sim_cli
from cgra_sim import stream_file
from cgra_sim.isa import EPILOGUE_BIAS, EPILOGUE_RELU, FIELDS, RECORD_WORDS, STREAM_VERSION, UNIT_OF, Op

ARCH = load_arch("cgra-4x4")
DOCS = os.path.join(os.path.dirname(__file__), "..", "docs", "command-stream.md")
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "tiny_cnn.onnx")


# Helpers.

def _random_tensor(rng, shape, dtype):
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    return rng.integers(-100, 100, size=shape).astype(dtype)


@st.composite
def tiled_gemm_launches(draw):
    """A small tiled GEMM stream (cgra_sim.streams) with its tensors, run to get real outputs."""
    m, n, k = (draw(st.integers(1, 20)) for _ in range(3))
    dtype = draw(st.sampled_from(["int8", "float32"]))
    tile = tuple(draw(st.integers(1, 12)) for _ in range(3))
    flags = draw(st.sampled_from([None, 0, EPILOGUE_RELU, EPILOGUE_BIAS | EPILOGUE_RELU]))
    records = streams.tiled_gemm(ARCH, m, n, k, dtype, tile=tile, epilogue_flags=flags)
    acc = "int32" if dtype == "int8" else "float32"
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = [_random_tensor(rng, (m, k), dtype), _random_tensor(rng, (k, n), dtype), np.zeros((m, n), acc)]
    if flags is not None and flags & EPILOGUE_BIAS:
        inputs.append(_random_tensor(rng, (n,), acc))
    outputs = [a.copy() for a in inputs]
    stats = simulate(ARCH, records, outputs, name="k")
    keep_inputs, keep_outputs = draw(st.booleans()), draw(st.booleans())
    return Launch.from_tensors(draw(st.text(min_size=1, max_size=20)),
                               draw(st.lists(st.text(max_size=10), max_size=3)), ARCH.to_json(), records,
                               inputs, outputs if keep_outputs else None,
                               stats.to_dict() if draw(st.booleans()) else None), keep_inputs


def _assert_same_arrays(got, want):
    assert (got is None) == (want is None)
    for a, b in zip(got or (), want or ()):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _small_launch(**changes) -> Launch:
    records = streams.tiled_gemm(ARCH, 6, 5, 7, "int8")
    rng = np.random.default_rng(1)
    inputs = [_random_tensor(rng, (6, 7), "int8"), _random_tensor(rng, (7, 5), "int8"), np.zeros((6, 5), "int32")]
    outputs = [a.copy() for a in inputs]
    stats = simulate(ARCH, records, outputs, name="small")
    launch = Launch.from_tensors("small", ("matmul",), ARCH.to_json(), records, inputs, outputs, stats.to_dict())
    return dataclasses.replace(launch, **changes)


def _rewrite(path, header_text=None, drop=(), **header_changes):
    """Rewrites the launch file at `path` with a changed header.json or without some members."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist() if name not in drop}
    header = json.loads(members[stream_file.HEADER])
    header.update(header_changes)
    members[stream_file.HEADER] = header_text if header_text is not None else json.dumps(header)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


# Round trip.

@given(tiled_gemm_launches())
def test_save_load_round_trip(tmp_path_factory, case):
    launch, keep_inputs = case
    if not keep_inputs:
        launch = dataclasses.replace(launch, inputs=None, outputs=None)
    path = tmp_path_factory.mktemp("round") / "k.cgra"
    save_launch(path, launch)
    loaded = load_launch(path)
    assert (loaded.kernel, loaded.source_ops, loaded.tensors, loaded.recorded_stats) == \
           (launch.kernel, launch.source_ops, launch.tensors, launch.recorded_stats)
    assert HardwareDescription.from_json(loaded.arch_json) == ARCH and loaded.arch_json == ARCH.to_json()
    assert loaded.commands.dtype == np.int64 and np.array_equal(loaded.commands, launch.commands)
    _assert_same_arrays(loaded.inputs, launch.inputs)
    _assert_same_arrays(loaded.outputs, launch.outputs)


def test_outputs_equal_to_inputs_are_stored_once(tmp_path):
    launch = _small_launch()
    save_launch(tmp_path / "k.cgra", launch)
    with zipfile.ZipFile(tmp_path / "k.cgra") as archive:
        names = set(archive.namelist())
        header = json.loads(archive.read("header.json"))
    assert header["outputs_equal_inputs"] == [0, 1]  # A and B are only read
    assert "outputs/2.npy" in names and "outputs/0.npy" not in names and "inputs/0.npy" in names
    _assert_same_arrays(load_launch(tmp_path / "k.cgra").outputs, launch.outputs)


def test_an_empty_stream_round_trips(tmp_path):
    launch = Launch("empty", (), ARCH.to_json(), np.zeros((0, RECORD_WORDS), np.int64), ())
    save_launch(tmp_path / "e.cgra", launch)
    loaded = load_launch(tmp_path / "e.cgra")
    assert loaded.commands.shape == (0, RECORD_WORDS) and replay(loaded).stats.cycles == 0


def test_launch_refuses_contents_that_do_not_fit_the_slots():
    launch = _small_launch()
    with pytest.raises(ValueError, match=r"inputs\[2\] is .*int8.*the slot is .*int32"):
        dataclasses.replace(launch, inputs=launch.inputs[:2] + (np.zeros((6, 5), np.int8),))
    with pytest.raises(ValueError, match="2 arrays for 3 tensor slots"):
        dataclasses.replace(launch, outputs=launch.outputs[:2])


# Refusals.

@pytest.mark.parametrize("changes, message", [
    ({"magic": "something else"}, "not a cgra-sim launch file (magic 'something else', expected 'cgra-sim launch')"),
    ({"format_version": stream_file.FORMAT_VERSION + 1},
     f"written by a newer cgra-sim: file format version {stream_file.FORMAT_VERSION + 1}, this cgra-sim "
     f"reads versions up to {stream_file.FORMAT_VERSION}"),
    ({"stream_version": STREAM_VERSION + 1},
     f"command stream of version {STREAM_VERSION + 1} ({RECORD_WORDS}-word records), but this simulator "
     f"runs stream versions 2 to {STREAM_VERSION}"),
    ({"stream_version": 1}, f"command stream of version 1 ({RECORD_WORDS}-word records)"),
    ({"record_words": 16}, f"this simulator runs stream versions 2 to {STREAM_VERSION} ({RECORD_WORDS}-word records)"),
    ({"tensors": "x"}, "damaged launch file (header.json: 'tensors' is missing or not a JSON array)"),
    ({"num_commands": 3}, "damaged launch file (ValueError: commands.npy is int64"),
    ({"tensors": [{"dtype": "int8", "shape": [6, 7]}] * 3}, "damaged launch file (ValueError: inputs[1]"),
])
def test_refuses_a_bad_header_naming_file_and_versions(tmp_path, changes, message):
    path = tmp_path / "k.cgra"
    save_launch(path, _small_launch())
    _rewrite(path, **changes)
    with pytest.raises(StreamFileError) as info:
        load_launch(path)
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value)


def test_reads_a_version_2_stream_which_never_sets_version_3s_flag(tmp_path):
    path = tmp_path / "k.cgra"
    save_launch(path, _small_launch())
    _rewrite(path, stream_version=2)
    np.testing.assert_array_equal(load_launch(path).commands, _small_launch().commands)


@pytest.mark.parametrize("header_text, drop, message", [
    ("{not json", (), "damaged launch file (header.json is not valid JSON"),
    ("[1, 2]", (), "not a cgra-sim launch file (magic None"),
    (None, ("commands.npy",), "damaged launch file (KeyError"),
    (None, ("inputs/1.npy",), "damaged launch file (KeyError"),
])
def test_refuses_a_damaged_member(tmp_path, header_text, drop, message):
    path = tmp_path / "k.cgra"
    save_launch(path, _small_launch())
    _rewrite(path, header_text=header_text, drop=drop)
    with pytest.raises(StreamFileError, match=f"^{path}: ") as info:
        load_launch(path)
    assert message in str(info.value)


@pytest.mark.parametrize("keep", [0.0, 0.001, 0.01, 0.5, 0.95, -1])
def test_refuses_a_truncated_file(tmp_path, keep):
    path = tmp_path / "k.cgra"
    save_launch(path, _small_launch())
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 1] if keep == -1 else data[:int(len(data) * keep)])
    with pytest.raises(StreamFileError, match=f"^{path}: damaged launch file"):
        load_launch(path)


def test_refuses_a_corrupted_byte(tmp_path):
    path = tmp_path / "k.cgra"
    save_launch(path, _small_launch())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("commands.npy")
    data = bytearray(path.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + info.compress_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(StreamFileError, match=f"^{path}: damaged launch file"):
        load_launch(path)


def test_refuses_a_file_of_another_kind(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07\x12\x04onnx")
    with pytest.raises(StreamFileError, match="not a cgra-sim launch file"):
        load_launch(path)
    np.savez(tmp_path / "arrays.npz", a=np.zeros(3))  # a zip, but not a launch file
    with pytest.raises(StreamFileError, match="a zip archive without header.json"):
        load_launch(tmp_path / "arrays.npz")


def test_the_format_document_names_every_header_key_and_record_layout():
    text = open(DOCS, encoding="utf-8").read()
    for key in stream_file._header(_small_launch()):
        assert f"| `{key}` |" in text, key
    for op, fields in FIELDS.items():
        assert f"| `{op.name}` | {int(op)} | {UNIT_OF[op].name} |" in text
        if op not in (Op.DMA_LOAD, Op.DMA_STORE):
            assert ", ".join(f"{i} `{name}`" for i, name in enumerate(fields) if i >= 2) in text


# Recording a compiled kernel, and replaying it.

@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A compiled int8 matmul + bias + relu run once with recording: (profile, output, launch path)."""
    import npu_backend
    from npu_backend.tools.workloads import matmul_model, run

    mod, inputs, _ = matmul_model(40, 24, 30, "int8")
    ex = npu_backend.compile(mod, "cgra-8x8")
    folder = tmp_path_factory.mktemp("recorded")
    with npu_backend.profile(record_dir=folder) as prof:
        out = run(ex, inputs)
    return prof, out, inputs, prof.recorded[0]


def test_recording_saves_each_launch_with_its_contents(recorded):
    prof, out, inputs, path = recorded
    kernel = prof.kernels[0]
    assert len(prof.recorded) == 1 and os.path.basename(path) == f"0000_{kernel.name}.cgra"
    launch = load_launch(path)
    assert (launch.kernel, launch.source_ops) == (kernel.name, ("matmul", "add", "nn.relu"))
    assert launch.arch == load_arch("cgra-8x8") and launch.recorded_stats == kernel.to_dict()
    assert launch.macs_per_output == 30 and kernel.macs == 40 * 24 * 30  # the model's MACs, kept for replay
    assert len(launch.commands) == kernel.num_commands
    for before, given_input in zip(launch.inputs, inputs):  # x, w, b as passed to the model
        assert np.array_equal(before, given_input)
    assert np.array_equal(launch.outputs[-1], out)


def test_replay_on_the_recorded_arch_repeats_cycles_and_results(recorded):
    prof, out, _, path = recorded
    result = replay(load_launch(path))
    assert result.stats == prof.kernels[0]
    assert result.verdict == "match" and result.mismatches == ()
    assert np.array_equal(result.outputs[-1], out)


@pytest.mark.parametrize("bandwidth, latency", [(2, 1), (4, 1), (64, 1), (2, 0.5), (1, 0)])
def test_replay_with_more_dma_bandwidth_is_never_slower(recorded, bandwidth, latency):
    prof, out, _, path = recorded
    launch = load_launch(path)
    faster = dataclasses.replace(launch.arch, name="faster-dma",
                                 dma_bytes_per_cycle=launch.arch.dma_bytes_per_cycle * bandwidth,
                                 dma_latency=int(launch.arch.dma_latency * latency))
    result = replay(launch, faster)
    assert result.stats.arch == "faster-dma" and result.stats.cycles <= prof.kernels[0].cycles
    assert result.verdict == "match"  # timing never changes results


def test_python_m_cgra_sim_replay_imports_no_tvm(recorded):
    prof, _, _, path = recorded
    script = ("import json, runpy, sys\n"
              f"sys.argv = ['cgra_sim', 'replay', {str(path)!r}, '--json']\n"
              "try:\n    runpy.run_module('cgra_sim', run_name='__main__', alter_sys=True)\n"
              "except SystemExit as exit:\n    status = exit.code\n"
              "leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('tvm', 'tvm_ffi', 'npu_backend'))\n"
              "print(json.dumps({'status': status, 'leaked': leaked}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    report, check = (json.loads(line) for line in done.stdout.strip().splitlines())
    assert done.returncode == 0, done.stderr
    assert check == {"status": 0, "leaked": []}
    assert report["stats"]["cycles"] == prof.kernels[0].cycles and report["outputs"] == "match"


def test_python_m_cgra_sim_replay_text(recorded):
    prof, _, _, path = recorded
    done = subprocess.run([sys.executable, "-m", "cgra_sim", "replay", str(path), "--arch", "cgra-16x16"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "on cgra-16x16" in done.stdout and f"recorded {prof.kernels[0].cycles} on cgra-8x8" in done.stdout
    assert f"{40 * 24 * 30} model MACs" in done.stdout  # the same on another chip; the executed ones differ
    assert "busy cycles" in done.stdout and "match the recording" in done.stdout


# Command line exit statuses (the same code behind `cgra-sim replay` and `python -m cgra_sim replay`).

@pytest.fixture(params=["cgra-sim", "python -m cgra_sim"])
def replay_main(request):
    if request.param == "cgra-sim":
        from npu_backend.tools.cli import main
        return main
    return sim_cli.main


def test_replay_exit_0_on_success(replay_main, recorded, capsys):
    assert replay_main(["replay", str(recorded[3])]) == 0
    assert "match the recording" in capsys.readouterr().out


def test_replay_exit_1_when_the_results_differ(replay_main, recorded, tmp_path, capsys):
    launch = load_launch(recorded[3])
    wrong = launch.outputs[-1].copy()
    wrong[3, 4] += 1
    save_launch(tmp_path / "wrong.cgra", dataclasses.replace(launch, outputs=launch.outputs[:-1] + (wrong,)))
    assert replay_main(["replay", str(tmp_path / "wrong.cgra"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["outputs"] == "mismatch"
    assert report["mismatches"][0].startswith("slot 3: 1 of 960 elements differ, first at (3, 4)")


def test_replay_without_contents_checks_timing_only(replay_main, recorded, tmp_path, capsys):
    launch = load_launch(recorded[3])
    save_launch(tmp_path / "bare.cgra", dataclasses.replace(launch, inputs=None, outputs=None))
    assert replay_main(["replay", str(tmp_path / "bare.cgra")]) == 0
    out = capsys.readouterr().out
    assert "not checked: the file holds no input contents" in out
    assert f"cycles       {launch.recorded_stats['cycles']} " in out


def _small_spad_arch(tmp_path) -> str:
    arch = load_arch("cgra-8x8").to_dict()
    arch.update(name="tiny-spad", spad_bytes=512)
    (tmp_path / "tiny.json").write_text(json.dumps(arch))
    return str(tmp_path / "tiny.json")


@pytest.mark.parametrize("argv, message", [
    (["replay", "{tmp}/missing.cgra"], "No such file or directory: '{tmp}/missing.cgra'"),
    (["replay", "{tmp}/bad.cgra"], "{tmp}/bad.cgra: not a cgra-sim launch file"),
    (["replay", "{file}", "--arch", "nope"], "unknown CGRA architecture 'nope'"),
    (["replay", "{file}", "--arch", "{tiny}"], "on {tiny}: command "),
])
def test_replay_exit_2_on_bad_input(replay_main, recorded, tmp_path, capsys, argv, message):
    (tmp_path / "bad.cgra").write_text("hello")
    names = {"tmp": str(tmp_path), "file": str(recorded[3]), "tiny": _small_spad_arch(tmp_path)}
    assert replay_main([part.format(**names) for part in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cgra-sim: error: replay: ") and message.format(**names) in err


def test_run_records_every_launch_for_replay(tmp_path, capsys):
    from npu_backend.tools.cli import main

    assert main(["run", EXAMPLE, "--record-dir", str(tmp_path / "rec"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["recorded"]) == len(report["kernels"]) == 4  # the global average pool's too
    assert sorted(os.listdir(tmp_path / "rec")) == sorted(os.path.basename(p) for p in report["recorded"])
    tail = None  # replayed in order, each after the last: the weight prefetch the run had
    for index, (path, kernel) in enumerate(zip(report["recorded"], report["kernels"])):
        assert os.path.basename(path).startswith(f"{index:04d}_")
        result = replay(load_launch(path), previous=tail)
        tail = result.tail
        assert result.stats.cycles == kernel["cycles"] and result.verdict == "match"
        assert replay(load_launch(path)).stats.cycles >= kernel["cycles"]  # alone: on an idle chip


def test_verify_record_dir_then_cgra_sim_replay(tmp_path, capsys):
    from npu_backend.tools.cli import main

    assert main(["verify", "--op", "conv2d", "--shape", "1,3,9,8,5,3,3", "--padding", "1",
                 "--arch", "cgra-4x4", "--record-dir", str(tmp_path)]) == 0
    assert "1 kernel launch recorded under" in capsys.readouterr().out
    (path,) = tmp_path.iterdir()
    assert main(["replay", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"] == "match"
