"""One-input elementwise ops of symbolic sizes on the NPU: relu and clip (the activation family),
FABRIC chains (leaky relu, hardswish) and the smooth activations (sigmoid, SiLU), read through
the views the eltwise family reads its operands with (kernels/common/unary.py, kernels/common/views.py): a
symbolic batch, an image's symbolic height and width, a vector of symbolic length. Until they
were, a YOLO whose image size is symbolic ran every SiLU on the host."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.relax.transform import BindSymbolicVars

import npu_backend
from dynamic_models import PRESETS, data, module


def _hardswish(x):
    return relax.op.divide(relax.op.multiply(x, relax.op.clip(relax.op.add(x, relax.const(3.0)), 0, 6)),
                           relax.const(6.0))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x.astype("float64")))


#: name -> (the Relax op, numpy's, the largest error relative to the output's magnitude)
OPS = {
    "relu": (relax.op.nn.relu, lambda x: np.maximum(x, 0), 0),
    "clip": (lambda x: relax.op.clip(x, -1, 2), lambda x: np.clip(x, -1, 2), 0),
    "leaky relu": (lambda x: relax.op.nn.leakyrelu(x, 0.1), lambda x: np.where(x > 0, x, np.float32(0.1) * x), 0),
    "hardswish": (_hardswish, lambda x: x * np.clip(x + 3, 0, 6) / 6, 1e-6),
    "sigmoid": (relax.op.sigmoid, _sigmoid, 1e-4),
    "silu": (lambda x: relax.op.multiply(x, relax.op.sigmoid(x)), lambda x: x * _sigmoid(x), 1e-4),
}
#: The shapes, "n", "h" and "w" symbolic.
SHAPES = {"image": (1, 12, "h", "w"), "batch of images": ("n", 5, "h", "w"), "batch": ("n", 7, 3, 5),
          "rows of a symbolic width": (3, "w"), "vector": ("n",)}


@functools.cache
def _vm(arch: str, op: str, shape: str):
    return relax.VirtualMachine(npu_backend.compile(module({"x": (SHAPES[shape], "float32")}, OPS[op][0]), arch),
                                tvm.cpu())


@settings(deadline=None, max_examples=30)
@given(arch=st.sampled_from(PRESETS), op=st.sampled_from(sorted(OPS)), shape=st.sampled_from(sorted(SHAPES)),
       n=st.integers(1, 4), h=st.integers(1, 30), w=st.integers(1, 70))
def test_one_kernel_runs_every_size_on_the_npu(arch, op, shape, n, h, w):
    sizes = {"n": n, "h": h, "w": w}
    x = data(tuple(sizes.get(d, d) for d in SHAPES[shape]), "float32") * 4
    with npu_backend.profile() as prof:
        out = _vm(arch, op, shape)["main"](tvm.runtime.tensor(x)).numpy()
    expected = OPS[op][1](x)
    error = np.abs(out - expected).max() / max(np.abs(expected).max(), 1)
    assert error <= OPS[op][2], (op, shape, sizes, error)
    assert len(prof.kernels) == 1 and out.shape == x.shape


@pytest.mark.parametrize("op", sorted(OPS))
def test_every_call_of_a_symbolic_chain_is_placed_on_the_npu(op):
    placements = npu_backend.explain(module({"x": ((1, 16, "h", "w"), "float32")}, OPS[op][0]), "cgra-8x8")
    assert placements and all(p.where == "npu" for p in placements), [(p.where, p.reason) for p in placements]


@pytest.mark.parametrize("op, shape", [("sigmoid", ("n", 32, 28, 28)), ("sigmoid", (1, 64, "h", "w")),
                                       ("leaky relu", ("n", 16, "h", "w"))])
def test_a_symbolic_kernel_takes_about_the_static_cycles_at_every_size(op, shape):
    """The tile is the one never far from the fastest at any size (minimax regret) and the last
    tile is cut: with the bound's tile (a 1024-row tile for a batch of 1) a sigmoid on one
    (32, 28, 28) image took 5.7 times the static kernel's cycles. The bound is 1.25 since a
    FABRIC's configuration loads while its operands arrive: both kernels got 128 cycles faster,
    the symbolic one's 78 extra cycles (its guarded tile) stayed (leaky relu on 3 images: 594 /
    516 -> 466 / 388)."""
    mod = module({"x": (shape, "float32")}, OPS[op][0])
    symbolic = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    dims = [d for d in shape if isinstance(d, str)]
    for size in (1, 3, 9, 28):
        x = tvm.runtime.tensor(data(tuple(size if d in dims else d for d in shape), "float32"))
        static = relax.VirtualMachine(npu_backend.compile(BindSymbolicVars({d: size for d in dims})(mod), "cgra-8x8"),
                                      tvm.cpu())
        cycles = []
        for vm in (symbolic, static):
            with npu_backend.profile() as prof:
                vm["main"](x)
            cycles.append(prof.total_cycles)
        assert cycles[0] <= 1.25 * cycles[1], (size, cycles)


def test_a_vector_of_symbolic_length_runs_on_the_npu():
    """An add of two (n,) vectors failed to compile: the view (1, bound) kept n as its rows'
    variable, and the code generator refused a [n] argument viewed as [1, 1024]. A vector's
    symbolic axis is now the columns of a (1, n) view, like a prime length's."""
    mod = module({"x": (("n",), "float32"), "y": (("n",), "float32")}, relax.op.add)
    (placement,) = npu_backend.explain(mod, "cgra-8x8")
    assert placement.where == "npu", placement.reason
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    for n in (1, 5, 3000):
        x, y = data((n,), "float32"), data((n,), "float32")
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy(), x + y)


def test_a_yolo_backbone_of_any_image_size_runs_its_silus_on_the_npu_and_matches_onnxruntime():
    """conv-bn-SiLU layers exported with a dim_param image size: every conv and every SiLU (x *
    Sigmoid(x)) is offloaded, one executable serves every size."""
    onnxruntime = pytest.importorskip("onnxruntime")
    from tvm.relax.frontend.onnx import from_onnx

    from onnx_models import yolo_silu_backbone

    model = yolo_silu_backbone()
    mod = from_onnx(model, keep_params_in_input=False)
    placements = npu_backend.explain(mod, "cgra-8x8")
    assert all(p.where == "npu" for p in placements), [(p.where, p.reason) for p in placements if p.where != "npu"]
    assert sum(p.op == "sigmoid" for p in placements) == 4
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for size in (17, 32, 45):
        x = data((1, 3, size, size), "float32")
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
        expected = session.run(None, {"input": x})[0]
        assert out.shape == expected.shape
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_a_symbolic_axis_the_view_cannot_take_stays_on_the_host_with_the_reason():
    (placement,) = npu_backend.explain(module({"x": ((1, "h", "w", 8), "float32")}, relax.op.sigmoid), "cgra-8x8")
    assert placement.where == "host" and "not among the last axes" in placement.reason, placement.reason
