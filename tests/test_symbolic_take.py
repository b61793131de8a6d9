"""An embedding lookup of a symbolic number of token ids runs on the NPU
(kernels/layout/symbolic_take.py): compiled once, equal to numpy at every count, ids outside the
table clipped into it as the static lookup does."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx

import npu_backend
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
