"""An embedding lookup of a symbolic number of token ids runs on the NPU
(kernels/layout/symbolic_take.py): compiled once, equal to numpy at every count, ids outside the
table clipped into it as the static lookup does."""

from __future__ import annotations

import functools

import numpy as np
import tvm
from hypothesis import example, given, settings, strategies as st
from tvm import relax, tirx

import npu_backend
from npu_backend.kernels.layout.copy_kernel import Gather
from npu_backend.kernels.layout.symbolic_take import symbolic_gather_rows
from npu_backend.tools.explain import explain

ARCH = "cgra-8x8"


def _lookup(table: np.ndarray):
    s = tirx.Var("s", "int64")
    ids = relax.Var("ids", relax.TensorType([1, s], "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [ids], attrs={"tir_var_upper_bound": {"s": 512}}):
        with bb.dataflow():
            flat = bb.emit(relax.op.reshape(ids, relax.ShapeExpr([s])))
            out = bb.emit_output(relax.op.take(relax.const(table), flat, axis=0, mode="fast"))
        bb.emit_func_output(out)
    return bb.get()


def test_an_embedding_of_symbolic_length_is_an_npu_lookup_at_every_length():
    table = np.random.default_rng(0).standard_normal((50, 64)).astype("float32")
    mod = _lookup(table)
    (take,) = [p for p in explain(mod, ARCH, dims={"s": 9}) if p.op == "take"]
    assert take.where == "npu", take.reason
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    rng = np.random.default_rng(1)
    for n in (1, 3, 4, 17, 40):  # one id, ragged tiles, whole tiles
        ids = rng.integers(0, 50, (1, n)).astype("int64")
        with npu_backend.profile() as prof:
            out = vm["main"](tvm.runtime.tensor(ids)).numpy()
        np.testing.assert_array_equal(out, table[ids[0]], err_msg=f"s = {n}")
        assert len(prof.kernels) == 1 and prof.host_cycles < 1000, n


@functools.lru_cache(maxsize=None)
def _compiled_lookup(arch: str):
    table = np.random.default_rng(2).standard_normal((50, 64)).astype("float32")
    return relax.VirtualMachine(npu_backend.compile(_lookup(table), arch), tvm.cpu()), table


def test_a_short_prompt_starts_with_a_small_tile():
    """symbolic_gather_rows' first tile (8 rows, then 32 on cgra-8x8): a 16-token lookup costs what
    the kernel compiled for 16 does (544 cycles, not 16 rows' 672)."""
    rows, head, _ = symbolic_gather_rows(npu_backend.load_arch(ARCH), Gather((1, 100, 64), 2048), 4)
    assert (rows, head) == (32, 8)


@settings(max_examples=10, deadline=None)
@given(arch=st.sampled_from(["cgra-8x8", "cgra-16x16"]), n=st.integers(1, 512), seed=st.integers(0, 99))
@example(arch="cgra-8x8", n=8, seed=0)  # the first tile exactly
@example(arch="cgra-8x8", n=9, seed=0)  # one row into the tiles after it
@example(arch="cgra-8x8", n=41, seed=0)  # one row past the first full tile after it
@example(arch="cgra-8x8", n=512, seed=0)  # the bound
def test_the_first_tile_and_the_tiles_after_it_look_up_every_row_once(arch, n, seed):
    """Equal to numpy at any count, and the stores write the output's bytes and no more (nothing
    past the buffer at either ragged tile)."""
    vm, table = _compiled_lookup(arch)
    ids = np.random.default_rng(seed).integers(0, 50, (1, n)).astype("int64")
    with npu_backend.profile() as prof:
        out = vm["main"](tvm.runtime.tensor(ids)).numpy()
    np.testing.assert_array_equal(out, table[ids[0]], err_msg=f"s = {n}")
    (kernel,) = prof.kernels
    assert kernel.dma_store_bytes == kernel.dma_load_bytes == out.nbytes, \
        (kernel.dma_store_bytes, kernel.dma_load_bytes, out.nbytes)
