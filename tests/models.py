"""Test-side helpers over npu_backend.tools.workloads: the models, a runner and one assertion."""

from npu_backend.tools.workloads import (conv2d_model, conv2d_reference, matmul_model, mismatch, pool_model, relax_module,
                                   run)

import tvm
from tvm import relax

__all__ = ["assert_matches", "conv2d_model", "conv2d_reference", "conv_stack", "host_output", "main_op_names",
           "matmul_model", "pool_model", "relax_module", "run"]


def assert_matches(out, ref, dtype):
    """float32: relative error at most 1e-5 of the output's scale; int8 kernels: exact."""
    problem = mismatch(out, ref, dtype)
    assert problem is None, problem


def conv_stack(x_shape, conv, layers, dtype="float32") -> tvm.IRModule:
    """main(x): each layer in turn, `conv(y, weights, **how)` [+ bias] [relu]; `layers`:
    [(weights, bias or None, relu, how)], the arrays numpy's (constants of the module)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for weights, bias, relu, how in layers:
                y = bb.emit(conv(y, relax.const(weights), **how))
                if bias is not None:
                    y = bb.emit(relax.op.add(y, relax.const(bias)))
                if relu:
                    y = bb.emit(relax.op.nn.relu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def host_output(mod: tvm.IRModule, x):
    """main(x) of `mod` compiled for the host (target llvm) alone, as numpy: a rewrite's reference."""
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def main_op_names(mod: tvm.IRModule) -> list:
    """The operators main calls, in post order (names as normalise.rewrite.op_name gives them)."""
    from npu_backend.normalise.rewrite import op_name
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(op_name(e)) if op_name(e) else None)
    return found
