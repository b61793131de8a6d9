"""The symbolic-shape tests' models and helpers (test_dynamic_shapes.py, test_dynamic_images.py):
a Relax module from named shapes with symbolic axes, random data, one compile per model and chip,
the ONNX tests' common start."""

from __future__ import annotations

import functools

import numpy as np
import tvm
from tvm import relax

import npu_backend
from npu_backend.tools.workloads import mismatch

PRESETS = npu_backend.preset_names()
RNG = np.random.default_rng(0)


def module(params: dict, body):
    """main(**params) = body(*vars): params name -> (shape with "n"/"b"/"s" symbolic, dtype)."""
    dims = {}

    def dim(d):
        return dims.setdefault(d, tvm.tirx.Var(d, "int64")) if isinstance(d, str) else d

    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType([dim(d) for d in shape], dtype)) for name, (shape, dtype) in params.items()]
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(body(*args)))
        bb.emit_func_output(out)
    return bb.get()


def data(shape, dtype):
    if dtype == "int8":
        return RNG.integers(-128, 128, shape).astype("int8")
    if dtype == "int32":
        return RNG.integers(-1000, 1000, shape).astype("int32")
    return RNG.standard_normal(shape).astype("float32")


@functools.cache
def compiled(key, arch):
    """One executable per model and chip, shared by every size a test runs it at."""
    mod = MODELS[key]()
    return relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu()), mod


def run(key, arch, inputs):
    vm, _ = compiled(key, arch)
    with npu_backend.profile() as prof:
        out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    return out, prof


def check(out, ref, dtype):
    problem = mismatch(out, ref, dtype)
    assert problem is None, problem


MODELS = {
    "dense_f32": lambda: module({"x": (("n", 64), "float32"), "w": ((64, 40), "float32"), "b": ((40,), "float32")},
                                lambda x, w, b: relax.op.nn.relu(relax.op.add(relax.op.matmul(x, w), b))),
    "dense_int8_residual": lambda: module(
        {"x": (("n", 48), "int8"), "w": ((48, 24), "int8"), "r": (("n", 24), "int32")},
        lambda x, w, r: relax.op.clip(relax.op.add(relax.op.matmul(x, w, out_dtype="int32"), r), -500, 9000)),
    "linear_seq": lambda: module(
        {"x": (("b", "s", 32), "float32"), "w": ((24, 32), "float32")},
        lambda x, w: relax.op.matmul(x, relax.op.permute_dims(w))),
}


def onnx_model_run(model, dims: dict):
    """(placements explain gives at `dims`, the model compiled once for cgra-8x8 as a VM, an
    onnxruntime session of it): the ONNX tests' common start."""
    import onnxruntime
    from npu_backend.frontend.onnx_import import from_onnx

    mod = from_onnx(model)
    placements = npu_backend.explain(mod, "cgra-8x8", dims=dims)
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    return placements, vm, onnxruntime.InferenceSession(model.SerializeToString())


def npu_and_host(mod: tvm.IRModule, arch) -> tuple:
    """`mod` compiled for `arch` and for the host (target llvm), each in a VirtualMachine."""
    return (relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu()),
            relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu()))
