"""Elementwise ops whose symbolic axes are not only axis 0: an NCHW map of symbolic height and
width against a per-channel operand or one of its own shape (kernels/elementwise/eltwise.py: the trailing
symbolic axes are the view's last axis, its column tiles' last one cut to what exists)."""

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
from dynamic_models import PRESETS, check, data, module

#: name -> (operands' shapes, the op)
CASES = {
    "per-channel scale of an NCHW map": ({"a": ((1, 24, "h", "w"), "f"), "b": ((1, 24, 1, 1), "f")}, "multiply"),
    "two maps of batch, height and width": ({"a": (("n", 6, "h", "w"), "f"), "b": (("n", 6, "h", "w"), "f")}, "add"),
    "a static height joins the width": ({"a": ((1, 5, 7, "w"), "f"), "b": ((5, 1, 1), "f")}, "maximum"),
    "a shorter operand of the map's size": ({"a": ((1, 3, "h", "w"), "f"), "b": (("h", "w"), "f")}, "subtract"),
    "two maps of one image (a residual add)": ({"a": ((1, 16, "h", "w"), "f"), "b": ((1, 16, "h", "w"), "f")}, "add"),
}


@functools.cache
def _vm(arch, name, dtype):
    shapes, func = CASES[name]
    params = {role: (shape, dtype) for role, (shape, _) in shapes.items()}
    return relax.VirtualMachine(npu_backend.compile(module(params, getattr(relax.op, func)), arch), tvm.cpu())


@settings(deadline=None, max_examples=40)
@given(arch=st.sampled_from(PRESETS), name=st.sampled_from(sorted(CASES)),
       dtype=st.sampled_from(["float32", "int8"]), h=st.integers(1, 40), w=st.integers(1, 70), n=st.integers(1, 3))
def test_one_elementwise_kernel_runs_every_map_size(arch, name, dtype, h, w, n):
    shapes, func = CASES[name]
    sizes = {"h": h, "w": w, "n": n}
    inputs = [data(tuple(sizes.get(d, d) for d in shape), dtype) for shape, _ in shapes.values()]
    with npu_backend.profile() as prof:
        out = _vm(arch, name, dtype)["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    with np.errstate(over="ignore"):
        expected = getattr(np, func)(*inputs, dtype=dtype)
    check(out, expected, dtype)
    assert len(prof.kernels) == 1


@pytest.mark.parametrize("shapes, reason", [
    ({"a": ((1, "h", "w", 8), "float32"), "b": ((8,), "float32")}, "not among the last axes"),
    ({"a": ((1, 4, "h", "w"), "float32"), "b": ((1, 4, "h", 1), "float32")}, "walks some of the symbolic axes"),
    ({"a": ((1, 4, "h", "w"), "float32"), "b": ((1, 4, "w", "h"), "float32")}, "different symbolic sizes"),
])
def test_symbolic_axes_an_elementwise_kernel_cannot_take_stay_on_the_host_with_the_reason(shapes, reason):
    (placement,) = npu_backend.explain(module(shapes, relax.op.add), "cgra-8x8")
    assert placement.where == "host" and reason in placement.reason, placement.reason


def test_two_maps_of_one_symbolic_image_take_about_the_static_cycles():
    """(1, 64, h, w) + (1, 64, h, w) is viewed (64, hw): channels as the ELTWISE tile's rows. It
    was viewed (1, 64hw), one row that the tile padded to two: twice the static cycles at every
    size (cgra-8x8, 4 x 4 to 56 x 56)."""
    mod = module({"a": ((1, 64, "h", "w"), "float32"), "b": ((1, 64, "h", "w"), "float32")}, relax.op.add)
    dynamic = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    for size in (9, 14, 28):
        inputs = [tvm.runtime.tensor(data((1, 64, size, size), "float32")) for _ in range(2)]
        static = relax.VirtualMachine(npu_backend.compile(BindSymbolicVars({"h": size, "w": size})(mod), "cgra-8x8"),
                                      tvm.cpu())
        cycles = []
        for vm in (dynamic, static):
            with npu_backend.profile() as prof:
                vm["main"](*inputs)
            cycles.append(prof.total_cycles)
        assert cycles[0] <= 1.10 * cycles[1], (size, cycles)
