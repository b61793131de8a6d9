"""The cgra-sim command line: exit status, PASS/FAIL lines, JSON, and errors that say the fix."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from npu_backend.tools.cli import main
from npu_backend.progress import StatusLine

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "tiny_cnn.onnx")


def test_verify_matmul_int8_passes(capsys):
    assert main(["verify", "--op", "matmul", "--shape", "40,24,30", "--dtype", "int8", "--arch", "cgra-4x4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PASS matmul 40x24x30 int8 on cgra-4x4:") and "cycles" in out


def test_verify_conv2d_json(capsys):
    status = main(["verify", "--op", "conv2d", "--shape", "1,3,10,9,5,3,3", "--padding", "1",
                   "--stride", "2,1", "--arch", "cgra-8x8", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and report["result"] == "PASS" and report["cycles"] > 0
    assert report["cycles"] >= report["mac_bound_cycles"] > 0


@pytest.mark.parametrize("argv", [
    ["--op", "conv2d", "--shape", "1,6,9,8,10,3,3", "--padding", "1", "--layout", "NHWC"],
    ["--op", "conv2d", "--shape", "2,5,7,7,4,3,1", "--layout", "nhwc,ohwi", "--dtype", "int8"],
    ["--op", "batch_matmul", "--shape", "3,20,12,9", "--dtype", "int8"],
    ["--op", "batch_matmul", "--shape", "3,20,12,9", "--shared-weights"],
])
def test_verify_layouts_and_batches(argv, capsys):
    assert main(["verify", *argv, "--arch", "cgra-4x4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["result"] == "PASS" and len(report["kernels"]) == 1
    assert report["cycles"] >= report["mac_bound_cycles"]


def test_verify_user_arch_file(tmp_path, capsys):
    from cgra_sim.arch import load_arch

    arch = load_arch("cgra-4x4").to_dict()
    arch.update(name="my-chip", rows=2, cols=6)
    path = tmp_path / "chip.json"
    path.write_text(json.dumps(arch))
    assert main(["verify", "--op", "matmul", "--shape", "13,14,15", "--arch", str(path)]) == 0
    assert "on my-chip" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["--op", "pool", "--shape", "1,6,9,9", "--window", "3,3", "--stride", "2", "--padding", "1"],
    ["--op", "pool", "--shape", "2,4,7,6", "--window", "2", "--pool", "avg", "--ceil-mode", "--count-include-pad"],
    ["--op", "pool", "--shape", "1,8,6,6", "--window", "3,3", "--dilation", "2", "--dtype", "int8", "--layout", "NHWC"],
    ["--op", "eltwise", "--shape", "2,5,7", "--rhs-shape", "5,1", "--func", "maximum", "--dtype", "int32"],
    ["--op", "eltwise", "--shape", "3,8", "--func", "multiply", "--dtype", "int8", "--seed", "7"],
    ["--op", "conv2d", "--shape", "1,8,9,9,8,3,3", "--groups", "8", "--padding", "2", "--dilation", "2"],
    ["--op", "conv2d", "--shape", "1,6,8,8,4,3,3", "--groups", "2", "--stride", "2", "--seed", "3"],
])
def test_verify_pools_elementwise_groups_and_dilation(argv, capsys):
    assert main(["verify", *argv, "--arch", "cgra-4x4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["result"] == "PASS" and len(report["kernels"]) == 1 and report["cycles"] > 0


def test_verify_fails_when_nothing_ran_on_the_npu(tmp_path, capsys):
    """A chip whose scratchpad cannot hold one tile: the compiler keeps the matmul on the host, so
    verify must not say PASS (it once printed 'PASS ... 0 cycles' with exit status 0)."""
    from cgra_sim.arch import load_arch

    arch = load_arch("cgra-8x8").to_dict()
    arch.update(name="tiny-spad", spad_bytes=512, spad_banks=8, bank_width_bytes=8)
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(arch))
    assert main(["verify", "--op", "matmul", "--shape", "64,64,64", "--arch", str(path)]) == 3
    out = capsys.readouterr().out
    assert out.startswith("FAIL matmul 64x64x64 float32 on tiny-spad: not run on the NPU:")
    assert "scratchpad" in out
    assert main(["verify", "--op", "matmul", "--shape", "64,64,64", "--arch", str(path), "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["result"] == "NOT OFFLOADED" and report["kernels"] == [] and "scratchpad" in report["reason"]


@pytest.mark.parametrize("argv, message", [
    (["verify", "--op", "conv2d", "--shape", "1,3,8,8,4,3,3", "--stride", "0,0"], "--stride 0,0: give one value or two"),
    (["verify", "--op", "conv2d", "--shape", "1,3,8,8,4,3,3", "--stride", "2,2,2"], "--stride 2,2,2"),
    (["verify", "--op", "conv2d", "--shape", "1,3,8,8,4,3,3", "--padding", "-1"], "none negative"),
    (["verify", "--op", "conv2d", "--shape", "1,3,2,2,4,5,5"], "a window of 5 (dilation 1) does not fit H = 2"),
    (["verify", "--op", "conv2d", "--shape", "1,6,8,8,4,3,3", "--groups", "4"], "--groups 4: the input channels"),
    (["verify", "--op", "matmul", "--shape", "0,4,4"], "--shape 0,4,4: every dimension must be at least 1"),
    (["verify", "--op", "pool", "--shape", "1,2,8,8"], "--op pool needs --window KH,KW"),
    (["verify", "--op", "pool", "--shape", "1,2,8,8", "--window", "2,2", "--pool", "avg", "--dtype", "int8"],
     "a avg pool takes float32"),
    (["verify", "--op", "eltwise", "--shape", "3,4", "--rhs-shape", "5"], "do not broadcast"),
    (["verify", "--op", "matmul", "--shape", "4,4,4", "--dtype", "int32"], "--dtype int32 is for --op eltwise"),
    (["verify", "--op", "matmul", "--shape", "3,4"], "--shape must be M,N,K"),
    (["verify", "--op", "batch_matmul", "--shape", "3,4,5"], "--shape must be B,M,N,K"),
    (["verify", "--op", "conv2d", "--shape", "1,2,5,5,2,3,3", "--layout", "NHWC,HWI"], "--layout NHWC,HWI"),
    (["verify", "--op", "matmul", "--shape", "3,4,5", "--arch", "nope"], "unknown CGRA architecture 'nope'"),
    (["run", "missing.onnx"], "No such file"),
])
def test_bad_input_exits_2_with_the_reason(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_run_example_model_checks_against_onnxruntime(capsys):
    assert main(["run", EXAMPLE, "--check", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["check"]["passed"] and report["check"]["max_rel_error"] <= 1e-4
    assert len(report["kernels"]) == 4 and report["total_cycles"] > 0  # 2 conv, the pool, the gemm
    assert report["host_ops"] == ["reshape"]
    assert captured.err == ""  # no progress: stderr is not a terminal and --json was given


def test_run_writes_the_layer_table_as_csv(tmp_path, capsys):
    import csv

    path = tmp_path / "layers.csv"
    assert main(["run", EXAMPLE, "--json", "--csv", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert report["csv"] == str(path) and len(rows) == len(report["layers"])
    npu = [row for row in rows if row["where"] == "npu"]
    assert len(npu) == 4 and sum(int(row["cycles"]) for row in npu) == report["total_cycles"]
    assert sum(int(row["macs"]) for row in npu) == report["total_macs"] <= report["total_padded_macs"]
    assert report["total_energy_pj"] > 0
    assert sum(float(row["energy_pj"]) for row in npu) == pytest.approx(report["total_energy_pj"])
    host = [row for row in rows if row["where"] == "host"]
    assert host and all(row["cycles"] == "0" and row["ops"] == "reshape" for row in host)  # a view: no call
    assert report["host_cycles"] == 0 and report["crossings"] == 0 and report["npu_share"] == 1.0
    assert all(row["nodes"] for row in rows)  # every layer names its ONNX nodes


@pytest.mark.parametrize("option", ["--csv", "--trace"])
def test_run_refuses_an_output_in_a_missing_folder_before_compiling(option, tmp_path, capsys):
    path = tmp_path / "missing" / "out"
    assert main(["run", EXAMPLE, option, str(path)]) == 2
    err = capsys.readouterr().err
    assert f"run: {option} {path}: the folder {path.parent} does not exist" in err and "done in" not in err


def test_run_progress_on_request_goes_to_stderr_only(capsys, monkeypatch):
    monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")  # every kernel compiled, whatever ran before
    assert main(["run", EXAMPLE, "--json", "--progress", "--arch", "cgra-4x4"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout stays one JSON object
    lines = captured.err.splitlines()  # not a terminal: one line per message, no \r
    assert "\r" not in captured.err
    compiled = [line for line in lines if line.startswith("compiling for cgra-4x4: kernel ")]
    assert [line.split()[4] for line in compiled] == ["1/4", "2/4", "3/4", "4/4"]
    assert "compiling for cgra-4x4: 4 kernels compiled, building the host code" in lines
    launches = [line for line in lines if line.startswith("simulating: kernel launch ")]
    assert [line.split()[3] for line in launches] == ["1/4", "2/4", "3/4", "4/4"]
    last = report["kernels"][-1]
    assert launches[-1].endswith(f"({last['num_commands']} commands, {report['total_cycles']:,} "
                                 f"cycles so far) {last['name']} [fc]")  # with its ONNX node


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_status_line_rewrites_one_line_on_a_terminal(monkeypatch):
    monkeypatch.setattr("shutil.get_terminal_size", lambda: os.terminal_size((24, 10)))
    terminal = _Terminal()
    status = StatusLine(terminal)
    status.show("compiling 1/2")
    status.show("compiling 2/2: a long kernel name")
    status.show("done")
    status.close()
    status.close()  # a second close adds nothing
    assert terminal.getvalue() == ("\rcompiling 1/2" "\rcompiling 2/2: a lon..." + "\rdone" + " " * 19 + "\n")


def test_run_dump_dir_writes_every_stage(tmp_path):
    assert main(["run", EXAMPLE, "--dump-dir", str(tmp_path), "--json"]) == 0
    written = {os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs}
    assert {"0_input.py", "2_partition.py", "3_codegen.py", "llvm/kernels.ll"} <= written
    kernel_files = {os.path.basename(p) for p in written if p.startswith("kernels/")}
    assert {"2_s_tir.py", "3_scheduled.py", "4_lowered.py"} <= kernel_files
    # The command streams, last stage of the flow: a launch file and a listing per launch.
    streams = sorted(p for p in written if p.startswith("streams/"))
    launch_files = [p for p in streams if p.endswith(".cgra")]
    assert launch_files and len(streams) == 2 * len(launch_files)
    listing = (tmp_path / launch_files[0].replace(".cgra", ".txt")).read_text().splitlines()
    assert listing[0].startswith("kernel ") and listing[1].split()[:2] == ["0", "DMA_LOAD"]
    assert any(line.split()[1] == "GEMM" and "accumulate=" in line for line in listing[1:])


def test_a_kernel_whose_symbol_is_longer_than_a_file_name_is_dumped_under_a_short_one(tmp_path):
    """Llama's attention kernel's symbol names its 26 ops (over 400 characters): `--dump-dir` failed
    with "File name too long". Long components keep their start and a digest of the whole."""
    from npu_backend.options import CompileOptions, dump

    options = CompileOptions(dump_dir=str(tmp_path))
    names = ["fused_relax_" + "relax_strided_slice_" * 20 + tail for tail in ("a_cgra", "b_cgra")]
    for name in names:
        dump(options, f"kernels/{name}/1_s_tir.py", "text")
    folders = os.listdir(tmp_path / "kernels")
    assert len(folders) == 2 and all(len(folder) <= 120 and folder.startswith("fused_relax_") for folder in folders)
    assert all((tmp_path / "kernels" / folder / "1_s_tir.py").read_text() == "text" for folder in folders)


def test_a_second_model_dumped_in_the_same_folder_replaces_the_first(tmp_path, capsys):
    import onnx

    from onnx_models import resnet

    other = tmp_path / "resnet.onnx"
    onnx.save(resnet(size=8, stages=(8,)), str(other))
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "notes.txt").write_text("mine")  # not the compiler's: stays
    for model in (EXAMPLE, str(other)):
        assert main(["run", model, "--dump-dir", str(dump), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
    dumped = {p.name for p in (dump / "kernels").iterdir()}
    assert dumped == {k["name"] for k in report["kernels"]}  # the resnet's kernels only
    assert len(list((dump / "streams").glob("*.cgra"))) == len(report["kernels"])
    assert (dump / "notes.txt").read_text() == "mine"


def test_verify_refuses_a_dtype_the_chip_does_not_compute(tmp_path, capsys):
    from cgra_sim.arch import load_arch

    arch = load_arch("cgra-4x4").to_dict()
    arch.update(name="float-only", macs_per_pe={"float32": 1})
    path = tmp_path / "float.json"
    path.write_text(json.dumps(arch))
    assert main(["verify", "--op", "matmul", "--shape", "8,8,8", "--dtype", "int8", "--arch", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--dtype int8: architecture 'float-only' computes float32" in err and len(err.splitlines()) == 1


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("cgra-sim (npu-backend) ")


@pytest.mark.parametrize("argv, expected", [
    (["--help"], "usage: cgra-sim"),
    (["--version"], "cgra-sim (npu-backend) "),
    (["replay", "--help"], "usage: cgra-sim replay"),
    (["verify", "--help"], "--op {matmul,"),
    (["sweep", "--help"], "--set FIELD=V1,V2,..."),
    (["serve", "--help"], "usage: cgra-sim serve"),
    (["patterns", "--help"], "usage: cgra-sim patterns"),
    (["map", "--intrinsic", "relu", "--arch", "cgra-4x4"], "II 1, MII 1 (ResMII 1, RecMII 1)"),
])
def test_help_version_and_replay_start_without_the_compiler(argv, expected):
    """The `cgra-sim` entry point (cgra_cli) answers these without importing tvm or npu_backend
    (1.9 s when it did, on the machine this was written on; now about 0.3 s)."""
    script = ("import json, runpy, sys\n"
              f"sys.argv = ['cgra-sim'] + {argv!r}\n"
              "try:\n    runpy.run_module('cgra_cli', run_name='__main__', alter_sys=True)\n"
              "except SystemExit as exit:\n    status = exit.code\n"
              "leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('tvm', 'tvm_ffi', 'npu_backend'))\n"
              "print(json.dumps({'status': status, 'leaked': leaked}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    *text, check = done.stdout.strip().splitlines()
    assert json.loads(check) == {"status": 0, "leaked": []}, done.stderr
    assert expected in "\n".join(text)


def test_run_fuse_chains_runs_an_activation_inside_the_conv(tmp_path, capsys):
    """`cgra-sim run --fuse-chains`: the hard-swish after a conv runs in the conv's kernel, one
    launch fewer and fewer DMA bytes, the same numbers as onnxruntime."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("HardSwish", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12])], initializer=[w])
    path = tmp_path / "conv_hardswish.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    reports = {}
    for flags in ([], ["--fuse-chains"]):
        assert main(["run", str(path), "--check", "--json", *flags]) == 0
        reports[bool(flags)] = json.loads(capsys.readouterr().out)
    assert reports[True]["fuse_chains"] and not reports[False]["fuse_chains"]
    assert len(reports[True]["kernels"]) == len(reports[False]["kernels"]) - 1
    assert all(report["check"]["passed"] for report in reports.values())


def _cgra_sim(argv, env=None, before=""):
    """`cgra-sim ARGV` in a fresh process (`before`: Python run first): (exit status, stdout, stderr)."""
    script = f"import sys\n{before}\nfrom cgra_cli.cli import main\nsys.exit(main({argv!r}))\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    return done.returncode, done.stdout, done.stderr


EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def test_a_chip_file_given_as_the_model_is_one_line():
    """`cgra-sim run examples/my_chip.json` (issue 35): onnx reads a .json path as a ModelProto in
    JSON form, and protobuf's ParseError ended the command in 43 lines of traceback, exit 1."""
    status, out, err = _cgra_sim(["run", os.path.join(EXAMPLES, "my_chip.json")])
    assert status == 2 and out == "" and len(err.splitlines()) == 1, err
    assert "as an ONNX model" in err and "goes to --arch" in err


def test_map_png_without_matplotlib_prints_the_mapping_then_one_line(tmp_path):
    """Without matplotlib, `cgra-sim map --png` printed 15 lines of traceback and no mapping."""
    picture = tmp_path / "map.png"
    status, out, err = _cgra_sim(["map", "--intrinsic", "relu", "--arch", "cgra-4x4", "--png", str(picture)],
                                 before="sys.modules['matplotlib'] = None  # as if not installed")
    assert status == 2 and "II 1, MII 1 (ResMII 1, RecMII 1)" in out and not picture.exists()
    assert err.splitlines() == ["cgra-sim: error: map --png needs matplotlib (the plots extra): "
                                "pip install 'npu-backend[plots]'"]


def test_no_cmake_to_build_the_runtime_with_is_one_line(tmp_path):
    """A fresh runtime cache and no cmake on PATH: 24 lines of traceback, exit 1. The runtime is
    built on first use (device/runtime_lib.py), which looks for cmake before building anything."""
    empty = tmp_path / "bin"
    empty.mkdir()
    cache = tmp_path / "runtime-cache"
    status, out, err = _cgra_sim(["verify", "--op", "matmul", "--shape", "4,4,4"],
                                 env={"PATH": str(empty), "CGRA_RUNTIME_CACHE": str(cache)})
    assert status == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("cgra-sim: error: verify --op matmul: cmake was not found on PATH")
    assert not any(cache.glob("runtime-*"))  # nothing was built
