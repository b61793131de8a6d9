"""The whole-row attention kernel built with TVM's IR builder (kernels/attention/prim_build.py,
rows.py) is the PrimFunc TVMScript's parser made of the text rows.py wrote before
(tests/attention_text_reference.py): structurally equal, over the spec's and the tiling's
parameters (Hypothesis) and the kernels the transformer benchmarks compile.
"""

from __future__ import annotations

import dataclasses

import pytest
import tvm
import tvm.script
from hypothesis import given
from hypothesis import strategies as st

from attention_text_reference import rows_script
from npu_backend.kernels.attention.attention_tiles import RowTiling, mask_in_gemm
from npu_backend.kernels.attention.rows import rows_func
from npu_backend.kernels.attention.spec import AttentionSpec


def _parsed(spec, t):
    from tvm.script import tirx
    return tvm.script.from_source(rows_script(spec, t), extra_vars={"T": tirx})


def _assert_same(spec, t) -> None:
    tvm.ir.assert_structural_equal(rows_func(spec, t), _parsed(spec, t))


def _fused(b, h, s, d):
    """q, k and v as boxes of one sequence-major (B, S, 3 H, D) tensor (a fused QKV projection)."""
    source = (b, s, 3 * h, d)
    return dict(param_roles=("lhs_src+rhs_src+value_src",), seq_major=("lhs", "rhs", "value"),
                parts=tuple((role, (0, 0, i * h, 0), source) for i, role in enumerate(("lhs", "rhs", "value"))))


@st.composite
def kernels(draw):
    """(AttentionSpec, RowTiling): any sizes, scale, mask broadcast, causal offset, layout; a
    tiling's every switch (the text does not check that it fits)."""
    b, hk, g = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4]))
    sq, sk, d = draw(st.integers(1, 40)), draw(st.integers(1, 40)), draw(st.sampled_from([8, 16]))
    mask = draw(st.sampled_from(["none", "full", "row", "column", "scalar", "heads"]))
    shapes = {"none": (), "full": (b, 1, 1, sq, sk), "row": (b, 1, 1, 1, sk), "column": (1, 1, 1, sq, 1),
              "scalar": (1, 1, 1, 1, 1), "heads": (1, hk, g, sq, sk)}
    causal = draw(st.sampled_from([None, 0, 3])) if mask in ("none", "row") else None
    layout = draw(st.sampled_from(["heads", "seq", "fused"]))
    extra = {"seq": dict(param_roles=("lhs_seq", "rhs_seq", "value_seq"), seq_major=("lhs", "rhs", "value", "out")),
             "fused": _fused(b, hk * g, max(sq, sk), d), "heads": {}}[layout]
    if layout == "fused":
        sq = sk
    roles = extra.pop("param_roles", ("lhs", "rhs", "value")) + (("mask",) if shapes[mask] else ())
    spec = AttentionSpec(b=b, hk=hk, g=g, sq=sq, sk=sk, d=d, dv=draw(st.sampled_from([d, 8])),
                         scale=draw(st.sampled_from([None, 0.125, 0.3])), mask_shape=shapes[mask],
                         safe=draw(st.booleans()), causal=causal, param_roles=roles,
                         unseen=draw(st.sampled_from([0.0, 0.25])),
                         half_out=draw(st.sampled_from([None, "bfloat16", "float16"])), **extra)
    tq = draw(st.sampled_from([1, 4, 8, 16]))
    mp = -(-sq // tq) * tq
    stack = draw(st.sampled_from([s for s in (1, 2, 4) if g % s == 0]))
    diagonal = draw(st.booleans()) and causal is not None and tq > 1
    return spec, RowTiling(tq=tq, mp=mp, mask=draw(st.sampled_from(["whole", "tile"])) if mask != "none" else "none",
                           q_stride=d + draw(st.sampled_from([0, 4])), p_stride=max(sk, tq) + draw(st.sampled_from([0, 4])),
                           kv_copies=draw(st.sampled_from([1, 2])), sums_on_pe=draw(st.booleans()), stack=stack,
                           diagonal=diagonal)


@given(kernels())
def test_built_kernel_is_the_parsed_text(kernel):
    _assert_same(*kernel)


#: Bloom's and Llama's attention in bench_transformers (cgra-8x8, 32 tokens), a mask in the GEMM.
CASES = [
    (AttentionSpec(b=1, hk=4, g=1, sq=32, sk=32, d=16, dv=16, scale=0.25, causal=0, safe=True),
     RowTiling(tq=16, mp=32, q_stride=16, p_stride=32, sums_on_pe=True)),
    (AttentionSpec(b=1, hk=2, g=2, sq=32, sk=32, d=16, dv=16, scale=0.25, causal=0, safe=True),
     RowTiling(tq=32, mp=32, q_stride=16, p_stride=32, kv_copies=1, stack=2)),
    # Bloom's with the diagonal exps (diagonal_exps.py): its ALiBi row per head, tq 8
    (AttentionSpec(b=1, hk=4, g=1, sq=32, sk=32, d=16, dv=16, scale=0.25, mask_shape=(1, 4, 1, 1, 32), causal=0,
                   safe=True, unseen=0.03125, param_roles=("lhs", "rhs", "value", "mask")),
     RowTiling(tq=8, mp=32, mask="whole", q_stride=17, p_stride=33, sums_on_pe=True, diagonal=True)),
    (AttentionSpec(b=1, hk=2, g=2, sq=32, sk=32, d=16, dv=16, scale=0.25, causal=0, safe=True),
     RowTiling(tq=8, mp=32, q_stride=16, p_stride=32, kv_copies=1, stack=2, diagonal=True)),
    (AttentionSpec(b=2, hk=2, g=1, sq=20, sk=20, d=8, dv=8, scale=0.3, mask_shape=(2, 1, 1, 20, 20),
                   param_roles=("lhs", "rhs", "value", "mask")),
     RowTiling(tq=8, mp=24, mask="whole", q_stride=8, p_stride=20)),
    # bf16 Llama's (benchmarks/bench_half.py): the output rounded to bfloat16 on store, seq-major
    (AttentionSpec(b=1, hk=2, g=2, sq=32, sk=32, d=16, dv=16, scale=0.25, causal=0, safe=True, half_out="bfloat16",
                   param_roles=("lhs_seq", "rhs_seq", "value_seq"), seq_major=("lhs", "rhs", "value", "out")),
     RowTiling(tq=32, mp=32, q_stride=16, p_stride=32, kv_copies=1, stack=2)),
]


@pytest.mark.parametrize("spec, t", CASES)
def test_built_kernel_cases(spec, t):
    assert not mask_in_gemm(spec) or t.mask != "none"
    _assert_same(spec, t)
    assert dataclasses.replace(spec) == spec
