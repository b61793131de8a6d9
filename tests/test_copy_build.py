"""The layout family's copy kernel of static shapes built with TVM's IR builder
(kernels/layout/copy_build.py) is the PrimFunc TVMScript's parser makes of copy_kernel.copy_script's
text: structurally equal over pieces (any rank, permuted, strided, broadcast and padded walks,
origins and offsets, folded output axes), tilings and lookups (indices read, constant, scalar).
"""

from __future__ import annotations

import tvm
import tvm.script
from hypothesis import given
from hypothesis import strategies as st

from npu_backend.kernels.layout.copy_build import copy_func
from npu_backend.kernels.layout.copy_kernel import Gather, LayoutTiling, Piece, copy_script, splits


def _parsed(*args, **kwargs):
    from tvm.script import tirx
    return tvm.script.from_source(copy_script(*args, **kwargs), extra_vars={"T": tirx})


@st.composite
def copies(draw):
    """(params, out shape, dtype, pieces, tiling, groups): one or two pieces of any walks."""
    dtype = draw(st.sampled_from(["float32", "int8"]))
    rank = draw(st.integers(1, 4))
    extent = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    count = draw(st.integers(1, 2))
    out_shape = list(extent)
    out_shape[0] *= count
    pieces, params = [], []
    for p in range(count):
        order = draw(st.permutations(range(rank)))
        walks = tuple((order[a], draw(st.sampled_from([0, 1, 2]))) for a in range(rank))
        source = tuple(extent[a] * 2 + 3 for a in range(rank))
        origin = tuple(draw(st.integers(-1, 2)) for _ in range(rank))
        guarded = tuple(d for d in range(rank) if draw(st.booleans()))
        offset = (p * extent[0],) + (0,) * (rank - 1)
        role = f"in{p}"
        params.append((role, source, dtype))
        pieces.append(Piece(role, offset, extent, walks, origin, guarded))
    options = [list(splits(piece.extent, 4, 1 << 20)) for piece in pieces]
    chosen = tuple(draw(st.sampled_from(o))[:2] for o in options)
    groups = ()
    if rank >= 3 and draw(st.booleans()):
        groups = (2,) + (1,) * (rank - 2)
        out_shape = [out_shape[0] * out_shape[1]] + out_shape[2:]
    return params, tuple(out_shape), dtype, pieces, LayoutTiling(splits=chosen), groups


@given(copies())
def test_built_copy_is_the_parsed_text(copy):
    params, out_shape, dtype, pieces, tiling, groups = copy
    tvm.ir.assert_structural_equal(copy_func(params, out_shape, dtype, pieces, tiling, groups=groups),
                                   _parsed(params, out_shape, dtype, pieces, tiling, groups=groups))


@given(p=st.integers(1, 3), v=st.integers(1, 9), q=st.integers(1, 8), n=st.integers(1, 8),
       kind=st.sampled_from(["read", "scalar", "constant"]), rows=st.sampled_from([1, 2, 4, 8]), data=st.data())
def test_built_lookup_is_the_parsed_text(p, v, q, n, kind, rows, data):
    n = 1 if kind == "scalar" else n
    rows = rows if n % rows == 0 else 1
    constants = tuple(data.draw(st.lists(st.integers(0, v - 1), min_size=n, max_size=n))) if kind == "constant" else None
    gather = Gather((p, v, q), n, scalar=kind == "scalar", constants=constants)
    params = [("lhs", (p, v, q), "float32")] + ([] if constants else [("rhs", () if kind == "scalar" else (n,), "int64")])
    tiling = LayoutTiling(rows=rows)
    tvm.ir.assert_structural_equal(copy_func(params, (p, n, q), "float32", (), tiling, gather),
                                   _parsed(params, (p, n, q), "float32", (), tiling, gather))
