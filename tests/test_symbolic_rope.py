"""RoPE over a symbolic number of positions (kernels/elementwise/rope_length.py): one kernel for
every length up to the bound, equal bit for bit to numpy's float32 arithmetic, its ragged last
tile cut so that each length costs what a compile for exactly that length costs."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

import tvm
from tvm import relax, tirx

import npu_backend

BOUND = 96


def _module(heads: int, width: int, table_rank: int, transposed: bool, swapped: bool, length=None, sliced=False):
    """HF's rotary embedding after normalise/rotations.py, positions `length` (an int) or symbolic;
    `sliced`: x the middle third of the heads of y (1, s, 3 heads, d), a merged q / k / v projection's
    part (normalise/qkv_merges.py)."""
    s = tirx.Var("s", "int64") if length is None else length
    y_shape = (1, s, heads * (3 if sliced else 1), width) if transposed else (1, heads, s, width)
    table = (s, width) if table_rank == 2 else (1, 1, s, width)
    params = [relax.Var("y", relax.TensorType(y_shape, "float32"))] + \
        [relax.Var(name, relax.TensorType(table, "float32")) for name in ("cos", "sin")]
    bb = relax.BlockBuilder()
    attrs = {"tir_var_upper_bound": {"s": BOUND}} if length is None else None
    with bb.function("main", params, attrs=attrs):
        with bb.dataflow():
            y, cos, sin = params
            part = bb.emit(relax.op.strided_slice(y, [2], [heads], [2 * heads])) if sliced else y
            x = bb.emit(relax.op.permute_dims(part, [0, 2, 1, 3])) if transposed else y
            lo = bb.emit(relax.op.strided_slice(x, [3], [0], [width // 2]))
            hi = bb.emit(relax.op.strided_slice(x, [3], [width // 2], [width]))
            plain = bb.emit(relax.op.multiply(x, cos))
            turned = bb.emit(relax.op.multiply(relax.op.concat([hi, lo], axis=-1), sin))
            out = bb.emit_output(relax.op.add(turned, plain) if swapped else relax.op.add(plain, turned))
        bb.emit_func_output(out)
    return bb.get()


@functools.lru_cache(maxsize=None)
def _vm(arch: str, *form):
    return relax.VirtualMachine(npu_backend.compile(_module(*form), arch), tvm.cpu())


def _inputs(n: int, heads: int, width: int, table_rank: int, transposed: bool, sliced=False):
    rng = np.random.default_rng(n * 31 + heads)
    y = rng.standard_normal((1, n, heads * (3 if sliced else 1), width) if transposed else (1, heads, n, width))
    y = y.astype("float32")
    table = (n, width) if table_rank == 2 else (1, 1, n, width)
    return [y] + [rng.standard_normal(table).astype("float32") for _ in range(2)]


def _expected(y, cos, sin, transposed, sliced=False):
    if sliced:
        third = y.shape[2] // 3
        y = y[:, :, third:2 * third]
    x = np.transpose(y, (0, 2, 1, 3)) if transposed else y
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([x[..., half:], x[..., :half]], axis=-1) * sin


def _run(vm, inputs):
    with npu_backend.profile() as prof:
        out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()
    return out, prof


@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, BOUND), heads=st.integers(1, 3), width=st.sampled_from([4, 16]), table_rank=st.sampled_from([2, 4]),
       transposed=st.booleans(), swapped=st.booleans(), arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]),
       sliced=st.booleans())
@example(n=BOUND, heads=2, width=16, table_rank=4, transposed=True, swapped=False, arch="cgra-4x4", sliced=True)
@example(n=1, heads=1, width=4, table_rank=2, transposed=False, swapped=True, arch="cgra-8x8", sliced=False)
def test_symbolic_rope_is_one_kernel_equal_to_numpy(n, heads, width, table_rank, transposed, swapped, arch, sliced):
    """Any length up to the bound, the last tile ragged, x whole or a merged projection's part:
    numpy's float32 result bit for bit, one kernel, no host op."""
    sliced = sliced and transposed
    form = (heads, width, table_rank, transposed, swapped, None, sliced)
    inputs = _inputs(n, heads, width, table_rank, transposed, sliced)
    out, prof = _run(_vm(arch, *form), inputs)
    np.testing.assert_array_equal(out, _expected(*inputs, transposed, sliced))
    assert len(prof.kernels) == 1 and prof.host_calls == [], (prof.kernels, prof.host_calls)
    assert "concat" in prof.kernels[0].name


@pytest.mark.parametrize("n", [5, 16, 64])
def test_symbolic_rope_costs_what_a_static_compile_costs(n):
    """The ragged tile's commands are cut to the length: cycles and DMA bytes within 2% of a compile
    for exactly n positions (the static kernel's tile divides n, the symbolic one's is a power of
    two)."""
    form = (4, 16, 4, True, False)
    inputs = _inputs(n, 4, 16, 4, True)
    sym_out, sym = _run(_vm("cgra-8x8", *form), inputs)
    static = relax.VirtualMachine(npu_backend.compile(_module(*form, length=n), "cgra-8x8"), tvm.cpu())
    static_out, fixed = _run(static, inputs)
    np.testing.assert_array_equal(sym_out, static_out)
    assert sym.total_cycles <= 1.02 * fixed.total_cycles, (sym.total_cycles, fixed.total_cycles)
