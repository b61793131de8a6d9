"""Whole ONNX models: import, compile for the NPU, run on random inputs, compare with onnxruntime.

Stage: entry (the `cgra-sim run` job). Input: an .onnx file and an architecture. Output: a report
dict (per-kernel statistics, the per-layer report with each layer's ONNX node names and its
printable table, and with `check` the comparison against onnxruntime). Needs the `onnx` extra
(`pip install -e ".[onnx]"`).
"""

from __future__ import annotations

import os
import time

import numpy as np
import tvm

from ..device.profile import profile
from ..errors import UnsupportedOperator
from .explain import dimension_names
from .layers import format_layers, model_layers
from ..progress import compile_progress

_ONNX_DTYPES = {1: "float32", 3: "int8", 6: "int32", 7: "int64", 2: "uint8", 10: "float16"}
#: --check's bound on a float output's error, relative to its largest magnitude: float16 models'
#: 4 ulps of the format (2 ** -10 each; the NPU rounds once where onnxruntime may round per op).
CHECK_TOLERANCE = {"float16": 4 * 2.0 ** -10}
#: The most random input data `run` makes (all inputs together).
MAX_INPUT_BYTES = 1 << 30


def _require_onnx():
    try:
        import onnx
        import onnxruntime
    except ImportError as err:
        raise UnsupportedOperator(f"running ONNX models needs the onnx extra ({err.name} is missing): "
                                  "pip install -e \".[onnx]\"") from None
    return onnx, onnxruntime


def model_inputs(model, seed: int, shapes: dict | None = None, given: dict | None = None) -> dict:
    """The data every graph input runs with: `given[name]` (an array, e.g. from --input), else
    random data (seeded) of the input's static shape or of `shapes[name]` (--shape), which a
    dynamic input needs. Every shape and dtype is checked against the model's declaration, a
    dimension named in several inputs must agree, and random data is refused past
    MAX_INPUT_BYTES before any is made."""
    shapes, given = dict(shapes or {}), dict(given or {})
    specs = _input_specs(model)
    for option, names in (("--shape", shapes), ("--input", given)):
        unknown = sorted(set(names) - set(specs))
        if unknown:
            raise ValueError(f"{option} names {', '.join(repr(n) for n in unknown)}, which is not an input of the "
                             f"model (its inputs: {', '.join(specs) or 'none'})")
    resolved, bound = {}, {}
    for name, (dims, dtype) in specs.items():
        if name in given:
            given[name] = np.asarray(given[name])
            if given[name].dtype != np.dtype(dtype):
                raise ValueError(f"--input {name}: the data is {given[name].dtype}, the model's input is {dtype}")
            shape = given[name].shape
        elif name in shapes:
            shape = tuple(shapes[name])
        elif all(isinstance(d, int) for d in dims):
            shape = tuple(dims)
        else:
            example = ",".join(str(d) if isinstance(d, int) else "1" for d in dims)
            raise ValueError(f"input '{name}' has a dynamic shape {_show(dims)}: give the size to run with "
                             f"--shape {name}={example} (or real data with --input {name}=FILE.npy)")
        resolved[name] = (_check_shape(name, dims, shape, bound), dtype)
    total = sum(int(np.prod(dims, dtype=np.int64)) * np.dtype(dtype).itemsize
                for name, (dims, dtype) in resolved.items() if name not in given)
    if total > MAX_INPUT_BYTES:
        listed = ", ".join(f"{name} {dims} {dtype}" for name, (dims, dtype) in resolved.items())
        raise ValueError(f"the model's inputs ({listed}) take {total / 2**30:.1f} GiB; random inputs are made up "
                         f"to {MAX_INPUT_BYTES >> 30} GiB: give the model smaller input shapes")
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, (dims, dtype) in resolved.items():
        if name in given:
            inputs[name] = given[name]
        elif dtype.startswith("float"):
            inputs[name] = rng.standard_normal(dims).astype(dtype)
        else:
            info = np.iinfo(dtype)
            inputs[name] = rng.integers(max(info.min, -128), min(info.max, 127) + 1, size=dims).astype(dtype)
    return inputs


def input_dims(model, inputs: dict) -> dict:
    """The size of each named dynamic dimension (ONNX dim_param) in `inputs`."""
    return {want: int(got) for name, (dims, _) in _input_specs(model).items() if name in inputs
            for want, got in zip(dims, inputs[name].shape) if isinstance(want, str)}


def _check_shape(name: str, dims: list, shape: tuple, bound: dict) -> tuple:
    """`shape` if it fits the declared `dims` (ints, dimension names, None for unnamed); `bound`
    collects each named dimension's size, which every input naming it must share."""
    if len(shape) != len(dims) or any(not isinstance(d, (int, np.integer)) or d < 1 for d in shape):
        raise ValueError(f"input '{name}' is declared {_show(dims)}; {tuple(shape)} does not fit it "
                         f"(give {len(dims)} positive sizes)")
    for axis, (want, got) in enumerate(zip(dims, shape)):
        if isinstance(want, int) and want != got:
            raise ValueError(f"input '{name}' is declared {_show(dims)}; {tuple(shape)} differs on axis {axis} "
                             f"({got}, not {want}): only its dynamic dimensions can change")
        if isinstance(want, str):
            seen = bound.setdefault(want, (int(got), name))
            if seen[0] != got:
                raise ValueError(f"dimension '{want}' is {seen[0]} in input '{seen[1]}' but {got} in input "
                                 f"'{name}': inputs that share a dimension name must agree on its size")
    return tuple(int(d) for d in shape)


def _show(dims: list) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _input_specs(model) -> dict:
    """name -> (dims, dtype) of every graph input that is not an initializer; a dynamic dimension
    is its ONNX name (dim_param) or None when it has none."""
    initializers = {init.name for init in model.graph.initializer}
    specs = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
        dtype = _ONNX_DTYPES.get(tensor.elem_type)
        if dtype is None:
            raise UnsupportedOperator(f"input '{value.name}' has ONNX element type {tensor.elem_type}, "
                                      f"which this runner cannot generate (supported: {sorted(_ONNX_DTYPES.values())})")
        specs[value.name] = (dims, dtype)
    return specs


class _KernelCount:
    """Progress messages: kernels compiled (of how many), then kernel launches simulated."""

    def __init__(self):
        self.total = 0  # kernels compiled: each normally runs once per inference
        self.launches = 0
        self.cycles = 0

    def compiling(self, say, arch_name: str):
        def callback(done: int, total: int, name: str) -> None:
            self.total = total
            if done < total:
                say(f"compiling for {arch_name}: kernel {done + 1}/{total} {name}")
            else:
                say(f"compiling for {arch_name}: {total} kernels compiled, building the host code")
        return callback

    def simulated(self, say):
        def callback(stats) -> None:
            self.launches += 1
            self.cycles += stats.cycles
            of = f"/{self.total}" if self.launches <= self.total else ""
            say(f"simulating: kernel launch {self.launches}{of} ({stats.num_commands} commands, "
                f"{self.cycles:,} cycles so far) {stats.name}{_nodes(stats)}")
        return callback


def _nodes(stats) -> str:
    return f" [{','.join(stats.model_nodes)}]" if stats.model_nodes else ""


def run_onnx_model(path: str, arch, check: bool = False, dump_dir: str | None = None, seed: int = 0,
                   progress=None, shapes: dict | None = None, inputs: dict | None = None,
                   fuse_chains: bool = False) -> dict:
    """Imports, compiles and simulates the model at `path`; the report as described in the module
    docstring. It runs on `inputs` (name -> array) where given, else on random data (seeded) of
    the input's shape, or of `shapes[name]` for an input with dynamic dimensions: those stay
    symbolic in the compiled model, which runs at any size. `progress(message)`, if given, hears
    each step, each kernel compiled and each kernel launch simulated."""
    import npu_backend
    _, onnxruntime = _require_onnx()
    from ..frontend.onnx_import import from_onnx, load_model  # TVM's importer, keeping the node names

    say = progress or (lambda message: None)
    arch = npu_backend.load_arch(arch)
    if not os.path.exists(path):
        raise FileNotFoundError(2, "No such file", path)
    model = load_model(path)
    inputs = model_inputs(model, seed, shapes, inputs)  # before compiling: refuse bad or too large inputs
    say(f"importing {path}")
    mod = from_onnx(model)
    # MACs at the sizes that run; an input's named dimension the import left out of the module
    # (an input nothing reads) sizes nothing, and explain would refuse its name.
    dims = {name: size for name, size in input_dims(model, inputs).items() if name in dimension_names(mod)}
    placements = npu_backend.explain(mod, arch, dims=dims, fuse_chains=fuse_chains)
    say(f"compiling for {arch.name}")
    kernels = _KernelCount()
    started = time.perf_counter()
    with compile_progress(kernels.compiling(say, arch.name)):
        executable = npu_backend.compile(mod, arch, dump_dir=dump_dir, fuse_chains=fuse_chains)
    compile_s = time.perf_counter() - started
    say("running on the simulator")
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    with profile(on_launch=kernels.simulated(say)) as prof:
        outputs = vm["main"](*[tvm.runtime.tensor(a) for a in inputs.values()])
    outputs = [outputs] if not isinstance(outputs, (list, tuple, tvm.ir.Array)) else list(outputs)
    outputs = [o.numpy() for o in outputs]
    report = {"model": path, "arch": arch.name, "fuse_chains": fuse_chains,
              "input_shapes": {name: list(a.shape) for name, a in inputs.items()},
              "total_cycles": prof.total_cycles,
              "total_macs": prof.total_macs, "total_padded_macs": prof.total_padded_macs,
              "total_energy_pj": prof.total_energy_pj,
              "time_us": prof.total_cycles / arch.clock_mhz, "area_mm2": arch.area_mm2, "compile_s": compile_s,
              "npu_mac_fraction": npu_backend.npu_mac_fraction(placements),
              "host_ops": sorted({p.op for p in placements if p.where == "host"}),
              "kernels": [k.to_dict() for k in prof.kernels], **prof.host_side()}
    report["layers"] = model_layers(placements, prof.kernels, prof.host_calls)
    report["table"] = format_layers(report["layers"]) + "\n" + prof.host_footer()
    if check:
        say("checking against onnxruntime")
        model.ir_version = min(model.ir_version, 10)  # onnxruntime refuses newer IR versions
        session = onnxruntime.InferenceSession(model.SerializeToString())
        expected = session.run(None, inputs)
        report["check"] = _compare(outputs, expected)
    return report


def _compare(outputs, expected) -> dict:
    worst = 0.0
    passed = len(outputs) == len(expected)
    for out, ref in zip(outputs, expected):
        if out.shape != ref.shape:
            passed = False
            continue
        if np.issubdtype(ref.dtype, np.integer):
            passed &= bool(np.array_equal(out, ref))
            continue
        scale = max(1e-30, float(np.abs(ref).max()))
        error = float(np.abs(out.astype(np.float64) - ref).max() / scale)
        worst = max(worst, error)
        passed &= error <= CHECK_TOLERANCE.get(str(ref.dtype), 1e-4)
    return {"passed": bool(passed), "max_rel_error": worst}
