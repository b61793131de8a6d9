"""Bad input gets one line that names the cause and the fix, and exit status 2: never a traceback,
never an exit status that means "mismatch". Each case once crashed or printed a traceback."""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import npu_backend
from cgra_sim.arch import load_arch
from models import matmul_model, relax_module, run
from npu_backend.tools.cli import main
from tvm import relax

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "tiny_cnn.onnx")


def _relu_model(path, input_shape, reads="x"):
    graph = helper.make_graph([helper.make_node("Relu", [reads], ["y"], name="r")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, input_shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, path)
    return str(path)


def _arch_file(tmp_path, **changes):
    arch = load_arch("cgra-4x4").to_dict()
    arch.update(changes)
    path = tmp_path / "arch.json"
    path.write_text(json.dumps(arch))
    return str(path)


def _one_line_error(capsys, *words):
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("cgra-sim: error: "), err
    for word in words:
        assert word in err, err
    return err


def test_a_text_file_named_onnx(tmp_path, capsys):
    path = tmp_path / "notes.onnx"
    path.write_text("not a model\n")
    assert main(["run", str(path)]) == 2
    _one_line_error(capsys, "cannot read", "as an ONNX model", "is it an .onnx file?")


def test_a_node_reading_a_value_nothing_produces(tmp_path, capsys):
    assert main(["run", _relu_model(tmp_path / "m.onnx", [1, 4], reads="missing")]) == 2
    _one_line_error(capsys, "node 'r' (Relu) reads 'missing'")


def test_an_input_too_large_to_make_is_refused_before_compiling(tmp_path, capsys):
    assert main(["run", _relu_model(tmp_path / "m.onnx", [20000, 20000])]) == 2
    _one_line_error(capsys, "1.5 GiB", "smaller input shapes")


@pytest.mark.parametrize("spad_bytes", [2**40, 2**70])
def test_a_scratchpad_the_simulator_cannot_hold(tmp_path, capsys, spad_bytes):
    assert main(["verify", "--op", "matmul", "--shape", "4,4,4", "--arch", _arch_file(tmp_path, spad_bytes=spad_bytes)]) == 2
    _one_line_error(capsys, "'spad_bytes'", str(spad_bytes))


def test_a_launch_file_declaring_a_huge_tensor(tmp_path, capsys):
    mod, inputs, _ = matmul_model(8, 8, 8)
    with npu_backend.profile(record_dir=tmp_path / "rec") as prof:
        run(npu_backend.compile(mod, "cgra-4x4"), inputs)
    with zipfile.ZipFile(prof.recorded[0]) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    header = json.loads(members.pop("header.json"))
    header["tensors"][0]["shape"] = [200000, 200000]
    header.update(has_inputs=False, has_outputs=False, outputs_equal_inputs=[])
    bad = tmp_path / "bad.cgra"
    with zipfile.ZipFile(bad, "w") as archive:
        archive.writestr("header.json", json.dumps(header))
        archive.writestr("commands.npy", members["commands.npy"])
    assert main(["replay", str(bad)]) == 2
    _one_line_error(capsys, "larger than the 1 GiB")


def test_from_onnx_takes_a_path_and_refuses_what_is_not_a_model(tmp_path):
    assert "main" in [g.name_hint for g in npu_backend.from_onnx(EXAMPLE).get_global_vars()]
    path = tmp_path / "notes.onnx"
    path.write_text("not a model\n")
    with pytest.raises(npu_backend.InvalidModel, match="cannot read .* as an ONNX model"):
        npu_backend.from_onnx(str(path))


def test_zero_size_dimensions_stay_on_the_host_and_compile():
    """An empty tensor once reached the scheduler and failed there; now the partitioner keeps
    the op on the host, with the reason, and the model compiles and runs."""
    mod = relax_module([("x", (0, 4), "float32"), ("w", (4, 3), "float32")],
                       lambda bb, x, w: bb.emit(relax.op.matmul(x, w)))
    (placement,) = npu_backend.explain(mod, "cgra-8x8")
    assert placement.where == "host" and "is empty" in placement.reason
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), __import__("tvm").cpu())
    out = vm["main"](*[__import__("tvm").runtime.tensor(np.zeros(s, "float32")) for s in ((0, 4), (4, 3))])
    assert out.numpy().shape == (0, 3)


def test_a_machine_without_a_c_compiler_is_told_what_to_install(monkeypatch):
    """The kernels are linked into a shared library with the host's C compiler (relax_ext.py)."""
    from npu_backend.target import relax_ext

    monkeypatch.setattr(relax_ext.shutil, "which", lambda name: None)
    monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")
    mod, _, _ = matmul_model(8, 8, 8)
    with pytest.raises(npu_backend.CGRAError, match=r"needs a C compiler \(cc, gcc or clang on PATH, or CC\)"):
        npu_backend.compile(mod, "cgra-4x4")
