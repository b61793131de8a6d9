"""Test-side helpers over npu_backend.tools.workloads: the models, a runner and one assertion."""

from npu_backend.tools.workloads import (conv2d_model, conv2d_reference, matmul_model, mismatch, pool_model, relax_module,
                                   run)

__all__ = ["assert_matches", "conv2d_model", "conv2d_reference", "matmul_model", "pool_model", "relax_module", "run"]


def assert_matches(out, ref, dtype):
    """float32: relative error at most 1e-5 of the output's scale; int8 kernels: exact."""
    problem = mismatch(out, ref, dtype)
    assert problem is None, problem
