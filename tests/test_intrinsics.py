"""Every registered intrinsic, checked three ways against each other.

1. Its TVMScript description, built for the host by TVM's llvm backend: the TIR semantics.
2. Its ISA command, run by the simulator's functional core: the hardware semantics.
3. Its implementation's extern call, which the code generator lowers to the runtime function
   that records that ISA opcode.

The harness is tests/three_ways.py; the checks are grouped by the unit that runs the intrinsic:
test_intrinsics_pe_array.py (GEMM, DEPTHWISE), test_intrinsics_vector_unit.py (FILL, accumulate,
ELTWISE, POOL, LOOKUP), test_intrinsics_epilogue.py (EPILOGUE's forms), test_intrinsics_row_ops.py
(REDUCE, VFUNC), test_intrinsics_fabric.py (FABRIC bodies, sigmoid and its kin) and, beside their
kernel, test_rope_epilogues.py (rope_rotate, rope_combine). This module keeps the registry's own tests.
"""

from __future__ import annotations

import pathlib

import pytest

from npu_backend.kernels.intrinsics import INTRINSICS, SPAD, get_intrin, intrin_name
from npu_backend.kernels.intrinsics.fabric import FabricBody
from npu_backend.kernels.intrinsics.vector_unit import PoolWindow
# The harness's names as this module exported them before the split (tests written against
# them still import them from here); new tests import three_ways.
import three_ways

CHECKS = ["test_intrinsics_pe_array.py", "test_intrinsics_vector_unit.py", "test_intrinsics_epilogue.py",
          "test_intrinsics_row_ops.py", "test_intrinsics_fabric.py", "test_rope_epilogues.py"]
_Stream, _tir_reference, _extern_name = three_ways.Stream, three_ways.tir_reference, three_ways.extern_name
_random, _bits = three_ways.random_array, three_ways.record_bits


def test_every_intrinsic_is_checked_here():
    assert set(INTRINSICS) == {"gemm", "depthwise", "fill", "epilogue", "eltwise", "pool", "accumulate", "fabric",
                               "smooth", "reduce", "vfunc", "lookup", "rope_rotate", "rope_combine"}
    # ... and each one's description is run on the host by one of the family modules.
    text = "".join((pathlib.Path(__file__).parent / name).read_text() for name in CHECKS)
    assert [kind for kind in INTRINSICS if f'INTRINSICS["{kind}"].factory(' not in text] == []


def test_intrinsics_compute_in_the_scratchpad():
    for kind, params, flags in [
            ("gemm", (8, 8, 4, "int8", "int32"), {}), ("depthwise", (2, 8, 8, (3, 3, 1, 1, 1, 1), "int8", "int32"), {}),
            ("fill", (8, 8, "int32"), {}), ("accumulate", (1, 8, "float32"), {}),
            ("epilogue", (8, 8, "int32"), {"bias": True, "relu": True}),
            ("epilogue", (8, 8, "int32"), {"bias": True, "relu": True, "residual": True, "clip": (0, 100), "zero_point": -3}),
            ("eltwise", (8, 8, "add", "float32"), {"a_full": (True, True), "b_full": (False, True)}),
            ("pool", (2, 2, 8, PoolWindow("max", (3, 3), valid=(1, 4, 1, 4)), "float32"), {}),
            ("fabric", (4, 8, FabricBody((("max", "a", 0.0),), "float32")), {}), ("smooth", (4, 8, "silu"), {}),
            ("reduce", (4, 8, "max"), {}), ("vfunc", (4, 8, "exp"), {"scale": 0.5, "offset": 1.0})]:
        desc, impl = INTRINSICS[kind].factory(*params, **flags)
        assert SPAD in desc.script() and SPAD in impl.script()


def test_flags_are_keywords_and_name_the_intrinsic_as_before():
    """An intrinsic's flags are keyword-only (a positional True could be any of five); the name
    it is registered under lists the parameters in the factory's order, as positional calls
    named it (snapshots and schedules refer to these names)."""
    assert intrin_name("epilogue", 4, 8, "float32", bias=False, relu=True, residual=False, clip=None,
                       zero_point=None) == "cgra.epilogue.4.8.float32.False.True.False.None.None"
    assert intrin_name("epilogue", 4, 8, "int32", relu=True, bias=True) == "cgra.epilogue.4.8.int32.True.True"
    assert intrin_name("eltwise", 2, 8, "add", "int8", a_full=(True, True), b_full=(False, True)) == \
        "cgra.eltwise.2.8.add.int8.full_True_True.full_False_True"
    assert intrin_name("fill", 4, 4, "int32") == "cgra.fill.4.4.int32"
    with pytest.raises(TypeError, match="epilogue"):
        get_intrin("epilogue", 4, 8, "float32", False, True)
    with pytest.raises(TypeError, match="eltwise"):
        intrin_name("eltwise", 2, 8, "add", "int8", a_full=(True, True))
