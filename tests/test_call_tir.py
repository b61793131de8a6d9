"""A user's own PrimFuncs called with R.call_tir: GEMM-like and elementwise blocks are tiled and
tensorized onto the NPU (kernels/tir/tir.py), the rest stays on the host with a reason; either way
the results equal the host build of the same module (target "llvm")."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from tvm import relax, s_tir, te
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import npu_backend
from npu_backend.tools.workloads import mismatch

PRESETS = npu_backend.preset_names()


@I.ir_module
class Seed003:
    """Seed 003's example: a matmul with the right operand stored (N, K), then a relu."""

    @T.prim_func(s_tir=True)
    def tir_matmul(A: T.Buffer((96, 40), "float32"), B: T.Buffer((72, 40), "float32"),
                   C: T.Buffer((96, 72), "float32")):
        for i0, j0, k0 in T.grid(96, 72, 40):
            with T.sblock("C"):
                i, j, k = T.axis.remap("SSR", [i0, j0, k0])
                with T.init():
                    C[i, j] = T.float32(0)
                C[i, j] = C[i, j] + A[i, k] * B[j, k]

    @T.prim_func(s_tir=True)
    def tir_relu(A: T.Buffer((96, 72), "float32"), B: T.Buffer((96, 72), "float32")):
        for i, j in T.grid(96, 72):
            with T.sblock("B"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = T.max(A[vi, vj], T.float32(0))

    @R.function
    def main(x: R.Tensor((96, 40), "float32"), w: R.Tensor((72, 40), "float32")):
        cls = Seed003
        with R.dataflow():
            lv0 = R.call_tir(cls.tir_matmul, (x, w), out_ty=R.Tensor((96, 72), "float32"))
            lv1 = R.call_tir(cls.tir_relu, (lv0,), out_ty=R.Tensor((96, 72), "float32"))
            R.output(lv1)
        return lv1


def run_both(mod, inputs, arch):
    """(NPU outputs, host outputs, profile): the module built for `arch` and for "llvm"."""
    tensors = [tvm.runtime.tensor(x) for x in inputs]
    vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    with npu_backend.profile() as prof:
        out = vm["main"](*tensors).numpy()
    host = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](*tensors).numpy()
    return out, host, prof


def check(out, host, ref, dtype):
    assert out.dtype == host.dtype == ref.dtype
    for expected in (host, ref):
        problem = mismatch(out, expected, dtype)
        assert problem is None, problem


@pytest.mark.parametrize("arch", PRESETS)
def test_seed_003_matmul_and_relu_run_on_the_npu(arch):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((96, 40), "float32"), rng.standard_normal((72, 40), "float32")
    placements = npu_backend.explain(Seed003, arch)
    assert [(p.op, p.where) for p in placements] == [("call_tir tir_matmul", "npu"), ("call_tir tir_relu", "npu")]
    assert placements[0].macs == 96 * 72 * 40
    out, host, prof = run_both(Seed003, [x, w], arch)
    check(out, host, np.maximum(x @ w.T, 0), "float32")
    assert [k.source_ops for k in prof.kernels] == [("call_tir tir_matmul",), ("call_tir tir_relu",)]
    assert all(k.cycles > 0 for k in prof.kernels)


def module_of(func, inputs, out_shape, out_dtype):
    """main(*inputs) = R.call_tir(func, inputs): `func` under the name "user"."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(x.shape, str(x.dtype))) for i, x in enumerate(inputs)]
    with bb.function("main", params):
        gv = bb.add_func(func.with_attr("global_symbol", "user"), "user")
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.call_tir(gv, params, relax.TensorType(out_shape, out_dtype))))
        bb.emit_func_output(out)
    return bb.get()


def gemm_prim_func(m, n, k, dtype, a_transposed, b_transposed, order):
    """A user's GEMM written in TE, its loops in `order` (a permutation of i, j, k)."""
    acc = "int32" if dtype == "int8" else "float32"
    a = te.placeholder((k, m) if a_transposed else (m, k), dtype, "A")
    b = te.placeholder((n, k) if b_transposed else (k, n), dtype, "B")
    r = te.reduce_axis((0, k), "r")
    c = te.compute((m, n), lambda i, j: te.sum(
        (a[r, i] if a_transposed else a[i, r]).astype(acc) * (b[j, r] if b_transposed else b[r, j]).astype(acc),
        axis=r), "C")
    sch = s_tir.Schedule(te.create_prim_func([a, b, c]))
    loops = sch.get_loops(sch.get_sblock("C"))
    sch.reorder(*[loops[axis] for axis in order])
    return sch.mod["main"], acc


@given(arch=st.sampled_from(PRESETS), m=st.integers(1, 70), n=st.integers(1, 70), k=st.integers(1, 70),
       dtype=st.sampled_from(["float32", "int8"]), a_transposed=st.booleans(), b_transposed=st.booleans(),
       order=st.permutations([0, 1, 2]), seed=st.integers(0, 2**16))
def test_a_users_gemm_in_any_layout_and_loop_order_runs_on_the_pe_array(arch, m, n, k, dtype, a_transposed,
                                                                         b_transposed, order, seed):
    func, acc = gemm_prim_func(m, n, k, dtype, a_transposed, b_transposed, order)
    rng = np.random.default_rng(seed)
    make = (lambda shape: rng.integers(-128, 128, shape).astype("int8")) if dtype == "int8" else \
        (lambda shape: rng.standard_normal(shape).astype("float32"))
    a, b = make((k, m) if a_transposed else (m, k)), make((n, k) if b_transposed else (k, n))
    mod = module_of(func, [a, b], (m, n), acc)
    placement, = npu_backend.explain(mod, arch)
    assert placement.where == "npu", placement.reason
    out, host, prof = run_both(mod, [a, b], arch)
    ref = (a.T if a_transposed else a).astype(acc) @ (b.T if b_transposed else b).astype(acc)
    check(out, host, ref, dtype)
    assert prof.kernels[0].macs >= m * n * k


def binary_prim_func(shape, rhs_shape, func, dtype):
    a, b = te.placeholder(shape, dtype, "A"), te.placeholder(rhs_shape, dtype, "B")
    pick = {"add": lambda x, y: x + y, "subtract": lambda x, y: x - y, "multiply": lambda x, y: x * y,
            "maximum": tvm.tirx.max, "minimum": tvm.tirx.min}[func]

    def at(tensor, index):
        return tensor[tuple(i if extent != 1 else 0 for i, extent in zip(index, tensor.shape))]

    out = te.compute(shape, lambda *index: pick(a[index], at(b, index)), "Out")
    return te.create_prim_func([a, b, out])


@given(arch=st.sampled_from(PRESETS), shape=st.lists(st.integers(1, 24), min_size=2, max_size=3),
       func=st.sampled_from(["add", "subtract", "multiply", "maximum", "minimum"]),
       dtype=st.sampled_from(["float32", "int32", "int8"]), broadcast=st.lists(st.booleans(), min_size=3, max_size=3),
       seed=st.integers(0, 2**16))
def test_a_users_elementwise_prim_func_runs_on_the_vector_unit(arch, shape, func, dtype, broadcast, seed):
    rhs_shape = tuple(1 if flag else extent for extent, flag in zip(shape, broadcast))
    rng = np.random.default_rng(seed)
    make = (lambda s: rng.standard_normal(s).astype("float32")) if dtype == "float32" else \
        (lambda s: rng.integers(-50, 50, s).astype(dtype))
    a, b = make(tuple(shape)), make(rhs_shape)
    mod = module_of(binary_prim_func(tuple(shape), rhs_shape, func, dtype), [a, b], tuple(shape), dtype)
    placement, = npu_backend.explain(mod, arch)
    assert placement.where == "npu", placement.reason
    out, host, _ = run_both(mod, [a, b], arch)
    ref = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
           "minimum": np.minimum}[func](a, b).astype(dtype)
    check(out, host, ref, dtype)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("clip", [None, (-3, 5)])
def test_a_users_relu_or_clip_runs_on_the_epilogue(dtype, clip):
    a = te.placeholder((12, 20), dtype, "A")
    lo, hi = (tvm.tirx.const(v, dtype) for v in clip) if clip else (None, None)
    out = te.compute((12, 20), lambda i, j: tvm.tirx.max(a[i, j], tvm.tirx.const(0, dtype)) if clip is None
                     else tvm.tirx.min(tvm.tirx.max(a[i, j], lo), hi), "Out")
    x = np.arange(-120, 120).reshape(12, 20).astype(dtype)
    mod = module_of(te.create_prim_func([a, out]), [x], (12, 20), dtype)
    placement, = npu_backend.explain(mod, "cgra-8x8")
    assert (placement.where, placement.kernel.split()[0]) == ("npu", "vector"), placement.reason
    out_np, host, prof = run_both(mod, [x], "cgra-8x8")
    check(out_np, host, np.maximum(x, 0) if clip is None else np.clip(x, *clip), dtype)
    assert prof.kernels[0].op_counts.get("EPILOGUE", 0) >= 1


_FABRIC_BODIES = {
    # a user's leaky relu, hard-swish and affine clamp, as anyone writes them in TE or TVMScript
    "leaky": lambda x, c: tvm.tirx.max(x, c(0.1) * x),
    "hard-swish": lambda x, c: x * tvm.tirx.min(tvm.tirx.max(x + c(3.0), c(0.0)), c(6.0)) * c(1 / 6),
    "affine-clamp": lambda x, c: tvm.tirx.min(tvm.tirx.max(c(2.0) * x - c(0.5), c(-1.0)), c(1.0)),
}


@pytest.mark.parametrize("arch", ["cgra-4x4", "cgra-16x16"])
@pytest.mark.parametrize("name", sorted(_FABRIC_BODIES))
def test_a_users_elementwise_expression_runs_on_the_fabric(name, arch):
    """An expression of one input the vector unit has no command for becomes one FABRIC body
    (the constant first in `0.1 * x` is kept as written for tensorize, and run as x * 0.1)."""
    a = te.placeholder((10, 24), "float32", "A")
    out = te.compute((10, 24), lambda i, j: _FABRIC_BODIES[name](a[i, j], lambda v: tvm.tirx.const(v, "float32")),
                     "Out")
    x = (np.random.default_rng(0).standard_normal((10, 24)) * 4).astype("float32")
    mod = module_of(te.create_prim_func([a, out]), [x], (10, 24), "float32")
    placement, = npu_backend.explain(mod, arch)
    assert placement.where == "npu", placement.reason
    out_np, host, prof = run_both(mod, [x], arch)
    check(out_np, host, host, "float32")
    assert prof.kernels[0].op_counts.get("FABRIC", 0) >= 1


def test_a_constant_minus_x_stays_on_the_host_with_the_reason():
    a = te.placeholder((4, 8), "float32", "A")
    out = te.compute((4, 8), lambda i, j: tvm.tirx.const(1.0, "float32") - a[i, j] * a[i, j], "Out")
    mod = module_of(te.create_prim_func([a, out]), [np.ones((4, 8), "float32")], (4, 8), "float32")
    placement, = npu_backend.explain(mod, "cgra-8x8")
    assert placement.where == "host" and "a constant minus x excepted" in placement.reason


def _conv_prim_func():
    x = te.placeholder((1, 4, 10, 10), "float32", "X")
    w = te.placeholder((8, 4, 3, 3), "float32", "W")
    c, ry, rx = te.reduce_axis((0, 4), "c"), te.reduce_axis((0, 3), "ry"), te.reduce_axis((0, 3), "rx")
    y = te.compute((1, 8, 8, 8), lambda n, f, i, j: te.sum(x[n, c, i + ry, j + rx] * w[f, c, ry, rx],
                                                          axis=[c, ry, rx]), "Y")
    return te.create_prim_func([x, w, y]), [np.ones((1, 4, 10, 10), "float32"), np.ones((8, 4, 3, 3), "float32")], \
        (1, 8, 8, 8), "float32"


def _row_sum():
    a = te.placeholder((8, 16), "float32", "A")
    r = te.reduce_axis((0, 16), "r")
    b = te.compute((8,), lambda i: te.sum(a[i, r], axis=r), "B")
    return te.create_prim_func([a, b]), [np.ones((8, 16), "float32")], (8,), "float32"


def _two_blocks():
    a = te.placeholder((8, 8), "float32", "A")
    b = te.compute((8, 8), lambda i, j: a[i, j] + 1, "B")
    c = te.compute((8, 8), lambda i, j: b[i, j] * b[i, j], "C")
    return te.create_prim_func([a, c]), [np.ones((8, 8), "float32")], (8, 8), "float32"


def _exp():
    a = te.placeholder((8, 8), "float32", "A")
    b = te.compute((8, 8), lambda i, j: te.exp(a[i, j]), "B")
    return te.create_prim_func([a, b]), [np.ones((8, 8), "float32")], (8, 8), "float32"


def _rank_one():
    a, b = te.placeholder((40,), "float32", "A"), te.placeholder((40,), "float32", "B")
    c = te.compute((40,), lambda i: a[i] + b[i], "C")
    return te.create_prim_func([a, b, c]), [np.ones(40, "float32"), np.ones(40, "float32")], (40,), "float32"


@pytest.mark.parametrize("make, reason", [
    (_conv_prim_func, "a sliding window"),
    (_row_sum, "does not map onto"),
    (_two_blocks, "has 2 blocks"),
    (_exp, "the vector unit runs"),
    (_rank_one, "rank 2 or more"),
])
def test_what_the_npu_cannot_take_stays_on_the_host_with_its_reason(make, reason):
    func, inputs, out_shape, dtype = make()
    mod = module_of(func, inputs, out_shape, dtype)
    placement, = npu_backend.explain(mod, "cgra-8x8")
    assert placement.where == "host" and reason in placement.reason, placement.reason
    out, host, prof = run_both(mod, inputs, "cgra-8x8")
    np.testing.assert_array_equal(out, host)
    assert prof.kernels == []


def test_the_own_tensorir_example_runs(capsys):
    import runpy

    example = runpy.run_path(str(__import__("pathlib").Path(__file__).parent.parent / "examples" / "own_tensorir.py"))
    example["main"](["--arch", "cgra-4x4"])
    printed = capsys.readouterr().out
    assert "matches the host build" in printed and "matches numpy" in printed


@I.ir_module
class GatherKernel:
    @T.prim_func
    def gather(A: T.Buffer((64,), "float32"), B: T.Buffer((8,), "float32")):
        T.func_attr({"cgra.kernel": True})
        A_s = T.alloc_buffer((8,), "float32", scope="global.cgra_spad")
        for i in range(8):
            A_s[i] = A[i * i]  # not a box: no DMA moves it
        for i in range(8):
            B[i] = A_s[i]

    @R.function
    def main(a: R.Tensor((64,), "float32")):
        cls = GatherKernel
        with R.dataflow():
            b = R.call_tir(cls.gather, (a,), out_ty=R.Tensor((8,), "float32"))
            R.output(b)
        return b


def test_a_kernel_written_for_the_npu_that_does_not_compile_is_an_error_not_a_host_call():
    """It calls device functions (or moves data only DMA can), so it has no host version."""
    with pytest.raises(npu_backend.UnsupportedOperator, match="PrimFunc .gather. is marked cgra.kernel.*not affine"):
        npu_backend.compile(GatherKernel, "cgra-8x8")
