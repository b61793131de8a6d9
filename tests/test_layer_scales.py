"""A layer scale folded into the linear layer before it (normalise/layer_scales.py): ConvNeXt's
`x + gamma * linear(h)` keeps no multiply, matches the unrewritten module on the host, and a scale
of a tensor something else reads stays."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

from npu_backend.normalise.layer_scales import fold_layer_scales


def _block(rows: int, k: int, n: int, seed: int, transposed: bool, also_read: bool = False):
    """main(x (1, rows, k), r (1, rows, n)) -> r + gamma * reshape(x @ W + b) [, x @ W + b]."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float32)
    b, gamma = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    x = relax.Var("x", relax.TensorType((rows, k), "float32"))
    r = relax.Var("r", relax.TensorType((1, rows, n), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, r]):
        with bb.dataflow():
            weight = bb.emit(relax.op.permute_dims(relax.const(w))) if transposed else relax.const(w)
            y = bb.emit(relax.op.add(relax.const(b), bb.emit(relax.op.matmul(x, weight))))
            scaled = bb.emit(relax.op.multiply(relax.const(gamma), bb.emit(relax.op.reshape(y, (1, rows, n)))))
            out = bb.emit(relax.op.add(r, scaled))
            out = bb.emit_output(relax.Tuple([out, y]) if also_read else out)
        bb.emit_func_output(out)
    return bb.get()


def _multiplies(mod) -> int:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(e, relax.Call) and
                                    e.op.same_as(tvm.ir.Op.get("relax.multiply")) else None)
    return len(found)


def _host(mod, *args):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


@settings(max_examples=5, deadline=None)
@given(rows=st.integers(1, 20), k=st.integers(1, 40), n=st.integers(1, 40), seed=st.integers(0, 2 ** 16),
       transposed=st.booleans())
def test_the_folded_block_matches_the_unrewritten_one_on_the_host(rows, k, n, seed, transposed):
    mod = _block(rows, k, n, seed, transposed)
    folded = fold_layer_scales(mod)
    assert _multiplies(folded) == 0
    rng = np.random.default_rng(seed + 1)
    x, r = rng.standard_normal((rows, k)).astype(np.float32), rng.standard_normal((1, rows, n)).astype(np.float32)
    expected, out = _host(mod, x, r), _host(folded, x, r)
    # the GEMM's own rounding: (k + 2) ulps of the sum of the terms' magnitudes, plus the residual's
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float64)
    w = w.T if transposed else w
    b, gamma = (rng.standard_normal(n) for _ in range(2))
    bound = (k + 4) * 2.0 ** -24 * (np.abs(x) @ np.abs(w * gamma) + np.abs(b * gamma) + np.abs(r[0]))
    assert np.all(np.abs(out - expected)[0] <= bound + 1e-30)


def test_a_scale_of_an_output_read_elsewhere_stays():
    mod = _block(4, 8, 8, 0, True, also_read=True)
    assert _multiplies(fold_layer_scales(mod)) == 1
