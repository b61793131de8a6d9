"""The host's side of a profile (npu_backend/device/host_calls.py, host_costs.py): host calls with
modelled cycles and measured time, host/NPU crossings with their bytes, the NPU's share of the run;
the same from a library exported and loaded in a fresh process."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from tvm import relax
from tvm.script import relax as R

import npu_backend
from cgra_sim.host import default_host, host_call_cycles
from npu_backend.device.host_costs import TRANSCENDENTAL_OPS, host_ops_per_element
from npu_backend.device.profile import elide
from npu_backend.tools.layers import format_layers, model_layers
from npu_backend.tools.workloads import relax_module

SHAPES = [(16, 32), (32, 16), (32, 8)]


def _bounce(bb, x, w1, w2):
    """matmul (NPU) -> softmax over axis 0 (host: the NPU's takes the last axis) -> reshape (a
    view) -> concat (the runtime's host copy) ->
    matmul (NPU). By hand: the first matmul's 16x16 float32 output crosses to the host (1024
    bytes), the concat's 32x32 output crosses back (2048 bytes); the reshape is the softmax's
    memory seen anew, on the host already. 2 crossings, 3072 bytes."""
    y = bb.emit(relax.op.matmul(x, w1))
    s = bb.emit(relax.op.nn.softmax(y, axis=0))
    r = bb.emit(relax.op.reshape(s, (8, 32)))
    c = bb.emit(relax.op.concat([r, r], axis=0))
    return bb.emit(relax.op.matmul(c, w2))


def _inputs():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(shape).astype("float32") for shape in SHAPES]


def _bounce_module():
    return relax_module([(name, shape, "float32") for name, shape in zip(("x", "w1", "w2"), SHAPES)], _bounce)


def _profiled(ex, inputs):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    with npu_backend.profile() as prof:
        vm["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return prof


@pytest.fixture(scope="module")
def bounce():
    return npu_backend.compile(_bounce_module())


def test_host_calls_crossings_and_share_counted_by_hand(bounce):
    prof = _profiled(bounce, _inputs())
    assert [call.name for call in prof.host_calls] == ["softmax", "cgra.host.concat"]
    softmax, concat = prof.host_calls
    # softmax: max, subtract, exp, add, divide per element; reads and writes 16x16 float32.
    assert softmax.ops == 16 * 16 * (4 + TRANSCENDENTAL_OPS) and softmax.bytes == 2 * 1024
    # concat: the runtime's copy, no arithmetic; reads the view once, writes 32x32.
    assert concat.ops == 0 and concat.bytes == 1024 + 2048
    host, arch = default_host(), npu_backend.load_arch("cgra-8x8")
    for call in prof.host_calls:
        modelled = host_call_cycles(host, call.ops, call.bytes)
        assert call.host_clock_cycles == round(modelled)
        assert call.cycles == round(modelled * arch.clock_mhz / host["clock_mhz"]) and call.seconds > 0
    assert prof.host_cycles == softmax.cycles + concat.cycles > 0
    assert prof.host_op_seconds == pytest.approx(softmax.seconds + concat.seconds)
    assert [(c.source, c.destination, c.reader, c.bytes) for c in prof.crossing_records] == [
        ("npu", "host", "softmax", 1024), ("host", "npu", prof.kernels[1].name, 2048)]
    assert prof.crossings == 2 and prof.crossing_bytes == 3072
    assert prof.npu_share == pytest.approx(prof.total_cycles / (prof.total_cycles + prof.host_cycles))
    report = json.loads(prof.to_json())
    assert {key: report[key] for key in ("host_cycles", "crossings", "crossing_bytes")} == \
        {"host_cycles": prof.host_cycles, "crossings": 2, "crossing_bytes": 3072}
    assert report["total_cycles"] == prof.total_cycles and len(report["host_calls"]) == 2
    assert "2 host/NPU crossings, 3072 bytes" in prof.table().splitlines()[-1]


def test_the_layer_table_gives_host_layers_their_modelled_cycles(bounce):
    prof = _profiled(bounce, _inputs())
    layers = model_layers(npu_backend.explain(_bounce_module()), prof.kernels, prof.host_calls)
    softmax, concat = prof.host_calls
    assert [(layer["ops"], layer["where"], layer["kernel"], layer["cycles"]) for layer in layers] == [
        (["matmul"], "npu", prof.kernels[0].name, prof.kernels[0].cycles),
        (["nn.softmax"], "host", "softmax", softmax.cycles),
        (["reshape"], "host", "", 0),  # a view: no call
        (["concat"], "host", "cgra.host.concat", concat.cycles),
        (["matmul"], "npu", prof.kernels[1].name, prof.kernels[1].cycles)]
    assert layers[1]["seconds"] == softmax.seconds
    table = format_layers(layers).splitlines()
    assert table[-3].split()[-2] == str(prof.total_cycles)  # the NPU's total, as before
    assert table[-2].split()[-1] == str(prof.host_cycles)
    assert table[-1].split() == ["whole", "run", str(prof.total_cycles + prof.host_cycles)]


def test_a_second_run_counts_the_same_and_a_run_outside_a_profile_nothing(bounce):
    vm = relax.VirtualMachine(bounce, tvm.cpu())
    inputs = [tvm.runtime.tensor(a) for a in _inputs()]
    vm["main"](*inputs)  # no profile open: the instrument returns at once
    with npu_backend.profile() as prof:
        vm["main"](*inputs)
        vm["main"](*inputs)
    assert prof.crossings == 4 and prof.crossing_bytes == 6144 and len(prof.host_calls) == 4


@pytest.mark.parametrize("rows", [16, tvm.tirx.Var("n", "int64")], ids=["static", "symbolic"])
def test_an_all_npu_model_has_no_host_cycles_and_no_crossings(rows):
    """Symbolic rows make the VM call a shape function TVM made: bookkeeping, not a host call."""
    mod = relax_module([("x", (rows, 32), "float32"), ("w", (32, 16), "float32")],
                       lambda bb, x, w: bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(x, w)))))
    rng = np.random.default_rng(1)
    prof = _profiled(npu_backend.compile(mod), [rng.standard_normal(s).astype("float32") for s in ((16, 32), (32, 16))])
    assert prof.total_cycles > 0 and prof.host_calls == [] and prof.host_cycles == 0
    assert prof.crossings == 0 and prof.npu_share == 1.0


def test_the_chip_files_host_table_sets_the_modelled_cycles():
    arch = npu_backend.load_arch("cgra-8x8")
    slow = dict(default_host(), clock_mhz=750.0, call_overhead_cycles=0.0)
    slow_arch = dataclasses.replace(arch, name="slow-host", host=slow)
    ex = npu_backend.compile(_bounce_module(), slow_arch)
    prof = _profiled(ex, _inputs())
    softmax = prof.host_calls[0]
    modelled = host_call_cycles(slow, softmax.ops, softmax.bytes)
    assert softmax.host_clock_cycles == round(modelled) and softmax.cycles == round(modelled * 800 / 750)


def test_a_symbolic_size_counts_at_the_size_that_ran_and_shape_functions_are_not_host_calls():
    """matmul (NPU), softmax (host), split (the runtime's), add (NPU), concat (the runtime's),
    matmul (NPU), with n rows: crossings of n x 16 float32 to the softmax, two n x 8 halves to the
    add, its n x 8 output to the concat and the concat's n x 16 to the last matmul."""
    n = tvm.tirx.Var("n", "int64")
    params = [relax.Var(name, relax.TensorType(shape, "float32"))
              for name, shape in (("x", (n, 32)), ("w1", (32, 16)), ("w2", (16, 8)))]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            s = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.matmul(params[0], params[1])), axis=0))  # host
            parts = bb.emit(relax.op.split(s, 2, axis=1))
            c = bb.emit(relax.op.add(bb.emit(relax.TupleGetItem(parts, 0)), bb.emit(relax.TupleGetItem(parts, 1))))
            out = bb.emit_output(bb.emit(relax.op.matmul(bb.emit(relax.op.concat([c, c], axis=1)), params[2])))
        bb.emit_func_output(out)
    ex = npu_backend.compile(bb.get())
    rng = np.random.default_rng(3)
    for rows in (16, 40):
        shapes = ((rows, 32), (32, 16), (16, 8))
        prof = _profiled(ex, [rng.standard_normal(shape).astype("float32") for shape in shapes])
        assert [call.name for call in prof.host_calls] == ["softmax", "cgra.host.split", "cgra.host.concat"]
        assert [c.bytes // (rows * 4) for c in prof.crossing_records] == [16, 8, 8, 8, 16]
        assert prof.host_calls[0].ops == rows * 16 * (4 + TRANSCENDENTAL_OPS)


@tvm.script.ir_module
class _Softmax:
    @R.function
    def main(x: R.Tensor(("n", 4), "float32")):
        return R.nn.softmax(x)


def test_operations_per_element_are_counted_from_the_tir():
    """A symbolic extent counts at a representative size; the ratio does not depend on it."""
    built = relax.get_pipeline("default_build")(_Softmax)
    assert host_ops_per_element(built) == {"softmax": 4 + TRANSCENDENTAL_OPS}


FRESH_PROCESS = """
import json, sys
import numpy as np, tvm, npu_backend
vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())
data = np.load(sys.argv[2])
with npu_backend.profile() as prof:
    vm["main"](*[tvm.runtime.tensor(data[f"arr_{i}"]) for i in range(len(data.files))])
print(json.dumps([prof.total_cycles, [(c.name, c.cycles, c.ops, c.bytes) for c in prof.host_calls],
                  prof.crossings, prof.crossing_bytes]))
"""


def test_an_exported_library_reports_the_same_in_a_fresh_process(bounce, tmp_path):
    prof = _profiled(bounce, _inputs())
    bounce.export_library(str(tmp_path / "model.so"))
    np.savez(tmp_path / "inputs.npz", *_inputs())
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(tmp_path / "model.so"),
                           str(tmp_path / "inputs.npz")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    total, calls, crossings, crossing_bytes = json.loads(done.stdout.strip().splitlines()[-1])
    assert total == prof.total_cycles and crossings == 2 and crossing_bytes == 3072
    assert [tuple(call) for call in calls] == [(c.name, c.cycles, c.ops, c.bytes) for c in prof.host_calls]


def test_host_calls_match_the_operators_they_ran_fused_ones_on_the_first():
    from npu_backend.device.host_calls import HostCall
    from npu_backend.tools.layers import HostMatcher

    calls = [HostCall(name, cycles, cycles, 1e-6, 64, 0) for name, cycles in
             (("fused_layer_norm_add", 30), ("softmax", 10), ("softmax1", 11), ("cast", 5), ("mystery", 7))]
    matcher = HostMatcher(calls)
    got = [(layer["kernel"], layer["cycles"]) for layer in
           map(matcher.layer, ["nn.layer_norm", "add", "nn.softmax", "reshape", "nn.softmax", "astype", "tanh"])]
    assert got == [("fused_layer_norm_add", 30), ("fused_layer_norm_add", 0), ("softmax", 10), ("", 0),
                   ("softmax1", 11), ("cast", 5), ("", 0)]
    assert [call.name for call in matcher.unmatched()] == ["mystery"]


def test_cgra_sim_run_json_and_table_carry_the_host_side(tmp_path, capsys):
    """An ONNX MatMul -> Softmax -> MatMul: the softmax on the host, two crossings (16x16 and 16x16
    float32, 1024 bytes each), its layer with its modelled cycles."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from cgra_cli.cli import main

    rng = np.random.default_rng(2)
    weights = [numpy_helper.from_array(rng.standard_normal((32, 16)).astype("float32"), "w1"),
               numpy_helper.from_array(rng.standard_normal((16, 8)).astype("float32"), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["y"], name="mm1"),
             helper.make_node("Softmax", ["y"], ["s"], name="sm", axis=0),  # host: the NPU's takes the last axis
             helper.make_node("MatMul", ["s", "w2"], ["out"], name="mm2")]
    graph = helper.make_graph(nodes, "bounce", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 32])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [16, 8])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = tmp_path / "bounce.onnx"
    onnx.save(model, str(path))
    assert main(["run", str(path), "--json", "--check"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["check"]["passed"] and report["crossings"] == 2 and report["crossing_bytes"] == 2048
    (call,) = report["host_calls"]
    assert report["host_cycles"] == call["cycles"] > 0 and report["host_op_seconds"] > 0
    assert report["npu_share"] == pytest.approx(report["total_cycles"] / (report["total_cycles"] + call["cycles"]))
    softmax = next(layer for layer in report["layers"] if layer["nodes"] == ["sm"])
    assert softmax["where"] == "host" and softmax["cycles"] == call["cycles"]
    assert "2 host/NPU crossings, 2048 bytes" in report["table"]


def test_threads_each_count_their_own_host_side(bounce):
    import threading

    results, errors = {}, []

    def work(index):
        try:
            vm = relax.VirtualMachine(bounce, tvm.cpu())
            inputs = [tvm.runtime.tensor(a) for a in _inputs()]
            with npu_backend.profile() as prof:
                for _ in range(index + 1):
                    vm["main"](*inputs)
            results[index] = (len(prof.host_calls), prof.crossings, prof.crossing_bytes)
        except Exception as err:  # noqa: BLE001  (reported below, in the test's thread)
            errors.append(err)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and results == {0: (2, 2, 3072), 1: (4, 4, 6144)}


@given(st.text(alphabet="abcdefghij_0123456789", min_size=1, max_size=300), st.integers(8, 80))
def test_long_kernel_names_keep_their_start_and_end_in_the_table(name, width):
    """A fused kernel's symbol runs past 400 characters (Llama's attention names 26 ops); the
    profile table's column keeps its start and its end (what tells its copies apart: "_cgra_3")."""
    shown = elide(name, width)
    assert len(shown) <= width
    if len(name) <= width:
        assert shown == name
    else:
        head, tail = shown.split("~")
        assert name.startswith(head) and name.endswith(tail) and len(tail) >= width // 3
