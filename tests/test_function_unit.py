"""The function unit (cgra_sim/function_unit.py): a pipelined datapath for VFUNC's functions.

A chip file's `function_unit` table is checked naming the entry; without it (or null) the
description is what it was before the field existed (its JSON, its fingerprint, VFUNC on the
lanes); with it a VFUNC takes an element a pipeline a cycle plus the fill, never more than
on the lanes, and the same bits (special.py: only time changes).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import cost, load_arch, special
from cgra_sim.arch import ArchError, HardwareDescription
from cgra_sim.function_unit import depth, stages
from cgra_sim.isa import Unit

UNIT = {"lanes": 2, "functions": ["gelu", "exp"]}


def _without_unit(name: str = "cgra-8x8") -> dict:
    data = load_arch(name).to_dict()
    data.pop("function_unit", None)
    return data


def test_without_the_table_the_description_is_what_it_was():
    data = _without_unit()
    arch = HardwareDescription.from_dict(data)
    assert arch.function_unit is None and "function_unit" not in arch.to_dict()
    assert HardwareDescription.from_dict({**data, "function_unit": None}).fingerprint == arch.fingerprint
    # A VFUNC is the lanes' sequence, one operation a cycle: GELU's 85 over 8 lanes.
    assert cost.vfunc_cycles(arch, 800, "gelu") == 800 * 85 // 8 + 2


def test_the_table_round_trips_and_enters_the_fingerprint():
    data = {**_without_unit(), "function_unit": UNIT}
    arch = HardwareDescription.from_json(json.dumps(data))
    assert arch.function_unit == {"functions": ["exp", "gelu"], "lanes": 2}  # sorted
    assert HardwareDescription.from_json(arch.to_json()) == arch
    assert arch.fingerprint != HardwareDescription.from_dict(_without_unit()).fingerprint


@pytest.mark.parametrize("table, message", [
    ({"lanes": 0, "functions": ["exp"]}, r"function_unit\['lanes'\] must be an integer from 1 to vector_lanes \(8"),
    ({"lanes": 9, "functions": ["exp"]}, r"function_unit\['lanes'\] must be an integer from 1 to vector_lanes"),
    ({"lanes": True, "functions": ["exp"]}, r"function_unit\['lanes'\]"),
    ({"lanes": 1, "functions": []}, r"function_unit\['functions'\] must be a non-empty list"),
    ({"lanes": 1, "functions": ["exp", "exp"]}, r"distinct VFUNC functions"),
    ({"lanes": 1, "functions": ["sin"]}, r"among \['erf', 'exp', 'gelu'"),
    ({"lanes": 1, "functions": [["exp"]]}, r"function_unit\['functions'\]"),
    ({"lanes": 1}, r"missing \['functions'\]"),
    ({"lanes": 1, "functions": ["exp"], "depth": 3}, r"unknown \['depth'\]"),
    ([1], r"'function_unit' must be an object"),
])
def test_bad_tables_are_refused_naming_the_entry(table, message):
    with pytest.raises(ArchError, match=message):
        HardwareDescription.from_dict({**_without_unit(), "function_unit": table})


def test_depth_and_stages_are_the_sequences_lengths():
    assert depth("exp") == 28 and depth("gelu", scale=True, offset=True) == 87
    assert stages({"lanes": 1, "functions": ["exp", "rsqrt"]}) == 30 and stages(None) == 0


@given(elements=st.integers(1, 5000), func=st.sampled_from(sorted(special.OPS)), scale=st.booleans(),
       offset=st.booleans(), lanes=st.integers(1, 8))
def test_the_unit_pipelines_its_functions_and_is_never_slower_than_the_lanes(elements, func, scale, offset, lanes):
    plain = HardwareDescription.from_dict(_without_unit())
    arch = dataclasses.replace(plain, function_unit={"lanes": lanes, "functions": ["exp", "gelu", "tanh"]})
    on_lanes = cost.vfunc_cycles(plain, elements, func, scale, offset)
    cycles = cost.vfunc_cycles(arch, elements, func, scale, offset)
    if func in ("exp", "gelu", "tanh"):
        # the lanes take a share beside the pipelines (test_function_unit_split.py): never later
        piped = -(-elements // lanes) + depth(func, scale, offset) - 1 + cost.VECTOR_OVERHEAD_CYCLES
        assert cycles <= min(on_lanes, piped)
    else:
        assert cycles == on_lanes


def test_a_presets_gelu_over_a_long_tile_takes_a_cycle_an_element_less_the_lanes_share():
    """The pipeline's element a cycle, with 8 / 85 of an element a cycle more on the lanes."""
    arch = load_arch("cgra-8x8")
    cycles = cost.vfunc_cycles(arch, 98304, "gelu") - 2
    assert 98304 / (1 + 8 / 85) <= cycles <= 98304 / (1 + 8 / 85) + 85


def test_the_unit_changes_time_not_bits():
    """functional.py computes VFUNC from special.py whatever the chip: the same outputs with and
    without the unit (the snapshot's hashes say so for whole models)."""
    from cgra_sim import simulate
    from cgra_sim.isa import DType, Op, VFunc, encode
    from test_sim_functional import dma_record

    x = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    outputs = []
    for arch in (load_arch("cgra-8x8"), HardwareDescription.from_dict(_without_unit())):
        arrays = [x.copy(), np.zeros(256, np.float32)]
        records = [dma_record(Op.DMA_LOAD, 0, 0, [(256, 0, 1, 1)]),
                   encode(Op.VFUNC, func=VFunc.GELU, dtype=DType.FLOAT32, rows=16, cols=16, a_addr=0,
                          a_row_stride=16, a_col_stride=1, out_addr=4096, out_stride=16),
                   dma_record(Op.DMA_STORE, 1, 4096, [(256, 0, 1, 1)])]
        simulate(arch, np.array(records, dtype=np.int64), arrays)
        outputs.append(arrays[1])
    assert outputs[0].tobytes() == outputs[1].tobytes() == special.gelu(x).tobytes()


def test_a_compiled_gelu_and_softmax_run_faster_through_the_unit_with_the_same_bits():
    """The whole path: the kernels compiled for cgra-8x8 and for it without its unit (the tile
    searches price VFUNC with cost.vfunc_cycles) give the same bytes, the unit in fewer cycles."""
    import tvm
    from tvm import relax

    import npu_backend
    from models import relax_module

    x = np.random.default_rng(1).standard_normal((32, 256)).astype(np.float32) * 3
    for op in (relax.op.nn.gelu, relax.op.nn.softmax):
        mod = relax_module([("x", x.shape, "float32")], lambda bb, v: bb.emit(op(v)))
        results = []
        for arch in (load_arch("cgra-8x8"), HardwareDescription.from_dict(_without_unit())):
            vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
            with npu_backend.profile() as prof:
                out = vm["main"](tvm.runtime.tensor(x)).numpy()
            assert len(prof.kernels) == 1
            results.append((out.tobytes(), prof.kernels[0].cycles))
        (unit_bytes, unit_cycles), (lanes_bytes, lanes_cycles) = results
        assert unit_bytes == lanes_bytes and unit_cycles < lanes_cycles, (op, unit_cycles, lanes_cycles)


def _vfuncs(arch, chained: bool):
    """Two GELU VFUNCs over 256 elements each, the second reading the first's output (chained)
    or its own input; returns their timeline."""
    from cgra_sim import simulate_detailed
    from cgra_sim.isa import DType, Op, VFunc, encode
    from test_sim_functional import dma_record

    x = np.random.default_rng(2).standard_normal(512).astype(np.float32)
    arrays = [x.copy(), np.zeros(256, np.float32)]
    vfunc = dict(func=VFunc.GELU, dtype=DType.FLOAT32, rows=16, cols=16, a_row_stride=16, a_col_stride=1,
                 out_stride=16)
    records = [dma_record(Op.DMA_LOAD, 0, 0, [(512, 0, 1, 1)]),
               encode(Op.VFUNC, a_addr=0, out_addr=4096, **vfunc),
               encode(Op.VFUNC, a_addr=4096 if chained else 1024, out_addr=8192, **vfunc),
               dma_record(Op.DMA_STORE, 1, 8192, [(256, 0, 1, 1)])]
    result = simulate_detailed(arch, np.array(records, dtype=np.int64), arrays)
    expected = special.gelu(special.gelu(x[:256]) if chained else x[256:])
    assert arrays[1].tobytes() == expected.tobytes()
    return result.timeline


def test_the_units_fill_delays_results_not_the_next_vfunc():
    """A pipelined unit takes the next VFUNC's elements while the last one's are still in its
    stages: the vector unit is busy for the issue (the lanes' share of the 256 elements beside
    the pipeline's, no longer than the pipeline's 256 alone), the results come up to depth - 1
    later; a VFUNC reading them waits for them."""
    arch = load_arch("cgra-8x8")
    issue, cycles = cost.vfunc_issue_cycles(arch, 256, "gelu"), cost.vfunc_cycles(arch, 256, "gelu")
    assert issue <= 256 + cost.VECTOR_OVERHEAD_CYCLES < cycles <= issue + depth("gelu") - 1
    independent, chained = _vfuncs(arch, chained=False), _vfuncs(arch, chained=True)
    assert independent.starts[2] - independent.starts[1] == issue  # back to back
    assert independent.ends[2] - independent.starts[1] == issue + cycles
    assert chained.starts[2] - chained.starts[1] == cycles  # waits for the results
    assert independent.busy_cycles(Unit.VECTOR) == chained.busy_cycles(Unit.VECTOR) == 2 * issue
    # without the unit (cgra-4x4's case) a VFUNC keeps the lanes for its whole sequence
    plain = HardwareDescription.from_dict(_without_unit())
    assert cost.vfunc_issue_cycles(plain, 256, "gelu") == cost.vfunc_cycles(plain, 256, "gelu")
    lanes = _vfuncs(plain, chained=False)
    assert lanes.starts[2] - lanes.starts[1] == cost.vfunc_cycles(plain, 256, "gelu")
