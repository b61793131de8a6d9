"""docs/architecture.md's "Add an operator" holds: its code block, run as written, is a family
that compiles a Relax `abs` for the chip and matches numpy on the NPU; a family that leaves a
required field out fails when it is made, registered or its kernel compiled, naming what is
missing, never at run time or as a wrong host reason."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import sys
import types

import numpy as np
import pytest
from tvm import relax, te

import npu_backend
from npu_backend.errors import FamilyError
from npu_backend.kernels import registry
from npu_backend.kernels.family import OpFamily
from npu_backend.kernels.common.operands import padded, prim_func
from npu_backend.tools.workloads import run

DOC = pathlib.Path(__file__).parent.parent / "docs" / "architecture.md"


def walkthrough_code() -> str:
    """The python blocks of the "Add an operator" section, as the page shows them."""
    text = DOC.read_text()
    section = text[text.index("## Add an operator"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the walkthrough shows no code"
    return "\n".join(blocks)


@pytest.fixture(scope="module")
def walkthrough() -> dict:
    """The page's code run as a module of its own (its dataclass needs one to be importable)."""
    module = types.ModuleType("walkthrough_family")
    sys.modules[module.__name__] = module
    try:
        exec(compile(walkthrough_code(), str(DOC), "exec"), module.__dict__)  # noqa: S102 - the page's code
        yield module.__dict__
    finally:
        del sys.modules[module.__name__]


def abs_module(shape, dtype):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.abs(x))
        bb.emit_func_output(out)
    return bb.get()


def test_the_walkthrough_family_runs_on_the_npu(walkthrough):
    code = walkthrough_code()
    assert len(code.splitlines()) <= 75, "the walkthrough's family should stay short"
    family = walkthrough["ABS"]
    rng = np.random.default_rng(0)
    with registry.registered(family):
        assert "cgra.abs" in {entry.name for entry in registry.pattern_table()}
        for shape, dtype, arch in (((5, 7), "float32", "cgra-4x4"), ((2, 3, 9), "int32", "cgra-8x8")):
            mod = abs_module(shape, dtype)
            assert [p.where for p in npu_backend.explain(mod, arch)] == ["npu"]
            x = rng.integers(-100, 100, shape).astype(dtype) if dtype == "int32" else \
                rng.standard_normal(shape).astype(dtype)
            with npu_backend.profile() as prof:
                out = run(npu_backend.compile(mod, arch), [x])
            np.testing.assert_array_equal(out, np.abs(x))
            assert [k.source_ops for k in prof.kernels] == [("abs",)]
            assert prof.kernels[0].op_counts["FABRIC"] >= 1
        reason = npu_backend.explain(abs_module((4, 4), "int8"), "cgra-4x4")[0].reason
        assert reason == "abs on int8: the PE fabric computes float32 or int32"
    assert "cgra.abs" not in {entry.name for entry in registry.pattern_table()}  # undone
    assert family not in registry.FAMILIES and registry.pattern_table()  # undone, the table sound


def _fields(family: OpFamily) -> dict:
    return {field.name: getattr(family, field.name) for field in dataclasses.fields(family)}


def test_a_family_without_checks_pe_dtype_fails_when_made(walkthrough):
    fields = _fields(walkthrough["ABS"])
    del fields["checks_pe_dtype"]
    with pytest.raises(FamilyError, match="'abs': checks_pe_dtype is unset"):
        OpFamily(**fields)


@pytest.mark.parametrize("field, value, message", [
    ("spec_from_match", None, "spec_from_match is unset but the family has patterns"),
    ("ops", (), "ops: must be a non-empty tuple|ops must be a non-empty tuple"),
    ("patterns", [], "patterns must be a function"),
])
def test_a_family_missing_a_required_field_fails_when_made(walkthrough, field, value, message):
    with pytest.raises(FamilyError, match=message):
        OpFamily(**{**_fields(walkthrough["ABS"]), field: value})


def test_registering_a_taken_op_or_pattern_fails(walkthrough):
    family = walkthrough["ABS"]
    with pytest.raises(FamilyError, match="ops: 'activation' is built by the 'activation' family"):
        registry.registered(dataclasses.replace(family, ops=("activation",))).__enter__()
    with pytest.raises(FamilyError, match="pattern 'cgra.relu' is the 'activation' family's too"):
        registry.registered(dataclasses.replace(
            family, patterns=lambda: [("cgra.relu", *family.patterns()[0][1:])])).__enter__()
    assert family not in registry.FAMILIES


def test_a_kernel_without_its_views_fails_at_compile_time(walkthrough):
    """The family's compute reads a (2, 3, 9) tensor as (6, 9) but builds its PrimFunc without
    `views`: the code generator's argument check would fail at run time; the compiler says so."""
    ns = walkthrough

    class NoViewSpec(ns["AbsSpec"]):
        op = "abs_without_views"

    def compute(spec, tiling):
        extents, whole = (spec.rows, spec.cols), (tiling.mp, tiling.np)
        x = te.placeholder(extents, spec.dtype, name="lhs")
        a_pad = te.compute(whole, lambda *i: padded(x, extents, i), name="a_pad")
        body = ns["FabricBody"](ns["BODY"], spec.dtype)
        result = te.compute(whole, lambda *i: ns["body_value"](body, a_pad(*i)), name="abs")
        out = te.compute(extents, lambda *i: result(*i), name="out")
        return prim_func(spec.param_roles, {"lhs": x}, out)  # views left out

    def spec_from_match(name, annotated):
        spec = ns["abs_spec"](name, annotated)
        return NoViewSpec(spec.dtype, spec.operand)

    family = dataclasses.replace(ns["ABS"], name="abs_without_views", ops=("abs_without_views",),
                                 spec_from_match=spec_from_match, compute=compute)
    with registry.registered(family):
        npu_backend.compile(abs_module((6, 9), "float32"), "cgra-4x4")  # a 2-D tensor needs no view
        with pytest.raises(FamilyError, match=r"parameter 'lhs' of the abs_without_views kernel is \(6, 9\) "
                                              r"but the caller passes \(2, 3, 9\).*views="):
            npu_backend.compile(abs_module((2, 3, 9), "float32"), "cgra-4x4")


def test_a_registered_familys_kernels_stay_out_of_the_persistent_cache(walkthrough):
    """The persistent kernel cache's key sees a spec, not a family's code: kernels of a family
    being tried out compile in every process, as those of a user's schedule do."""
    from npu_backend.kernels.elementwise.activation import ActivationSpec
    from npu_backend.kernels.common.unary import UnaryOperand

    operand = UnaryOperand((5, 7), 5, 7)
    with registry.registered(walkthrough["ABS"]):
        assert not registry.packaged(walkthrough["AbsSpec"]("float32", operand))
        assert registry.packaged(ActivationSpec("float32", operand, relu=True))
