"""Area: a chip's mm² from its sizes and its area table (cgra_sim/area.py).

The closed form on a made-up chip, exactly; the presets' tables are the published defaults; a
description without a table gets them, bad tables are refused naming the entry; area grows with
every size it is priced by (Hypothesis).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import load_arch
from cgra_sim.arch import ArchError, HardwareDescription
from cgra_sim.area import default_area

TABLE = {"mac_unit": {"int8": 400.0, "float32": 12000.0, "bfloat16": 6000.0, "float16": 6000.0, "int16": 800.0}, "pe_overhead": 1000.0, "spad_kib": 5000.0,
         "vector_lane": 10000.0}


def _chip(**changes) -> HardwareDescription:
    return dataclasses.replace(load_arch("cgra-8x8"), **changes)


def test_area_is_the_closed_form():
    chip = _chip(rows=6, cols=10, macs_per_pe={"int8": 4, "float32": 1}, spad_bytes=96 * 1024, spad_banks=6,
                 vector_lanes=12, area=TABLE, energy=None, function_unit=None)
    pe = 4 * 400 + 12000 + 1000
    assert chip.area_breakdown() == {"pe_array": 60 * pe / 1e6, "scratchpad": 96 * 5000 / 1e6,
                                     "vector_unit": 12 * 10000 / 1e6, "function_unit": 0.0}
    assert chip.area_mm2 == pytest.approx((60 * pe + 96 * 5000 + 12 * 10000) / 1e6, rel=1e-12)


def test_a_function_unit_is_a_stage_per_operation_of_its_longest_sequence_in_each_lane():
    unit = {"lanes": 3, "functions": ["exp", "tanh"]}
    chip = _chip(vector_lanes=12, area={**TABLE, "function_stage": 7000.0}, function_unit=unit)
    assert chip.area_breakdown()["function_unit"] == 3 * (52 + 2) * 7000 / 1e6  # tanh's 52, + scale and offset
    default = _chip(function_unit=unit)  # the presets' tables leave function_stage out
    assert default.area_breakdown()["function_unit"] == 3 * 54 * 6521 / 1e6
    assert 6521 == round((7700 + 4184) / 2 + 128 * 4.522)  # a float32 operator's mean, 128 flip-flops
    assert load_arch("cgra-8x8").area_breakdown()["function_unit"] == 1 * (85 + 2) * 6521 / 1e6  # GELU's


def test_the_presets_function_units():
    assert load_arch("cgra-4x4").function_unit is None
    assert load_arch("cgra-8x8").function_unit["lanes"] == 1
    assert load_arch("cgra-16x16").function_unit["lanes"] == 2


def test_presets_use_the_published_figures():
    for name in ("cgra-4x4", "cgra-8x8", "cgra-16x16"):
        arch = load_arch(name)
        assert arch.area == default_area(arch.macs_per_pe)
    assert default_area(["int8"])["mac_unit"] == {"int8": 282 + 137}  # Horowitz: 8-bit multiply, 32-bit add
    assert load_arch("cgra-4x4").area_mm2 < load_arch("cgra-8x8").area_mm2 < load_arch("cgra-16x16").area_mm2


def test_a_16_bit_float_mac_is_a_float16_multiplier_and_a_float32_adder():
    """Horowitz's float16 multiplier (1640 µm²) and float32 adder (4184 µm²): two such MACs take
    about one float32 MAC's area, which is why the presets give them 2 MACs a cycle to float32's 1."""
    table = default_area(["bfloat16", "float16", "float32"])["mac_unit"]
    assert table["float16"] == table["bfloat16"] == 1640 + 4184
    assert 2 * table["float16"] <= table["float32"]
    for name in ("cgra-4x4", "cgra-8x8", "cgra-16x16"):
        arch = load_arch(name)
        assert arch.macs_per_pe["bfloat16"] == arch.macs_per_pe["float16"] == 2 * arch.macs_per_pe["float32"]


def test_a_description_without_a_table_gets_the_defaults():
    data = load_arch("cgra-4x4").to_dict()
    del data["area"]
    data["macs_per_pe"] = {"int8": 2}
    data["energy"]["mac"] = {"int8": 0.3}
    arch = HardwareDescription.from_dict(data)
    assert arch.area == default_area(["int8"])


@pytest.mark.parametrize("table, message", [
    ({**TABLE, "pe_overhead": -1.0}, r"area\['pe_overhead'\] must be a non-negative number"),
    ({**TABLE, "mac_unit": {"int8": 400.0}}, r"area\['mac_unit'\] must give µm² for each of \['bfloat16', 'float16', 'float32', 'int16', 'int8'\]"),
    ({key: value for key, value in TABLE.items() if key != "spad_kib"}, r"missing \['spad_kib'\]"),
    ({**TABLE, "wires": 1.0}, r"unknown \['wires'\]"),
    ({**TABLE, "function_stage": -1.0}, r"area\['function_stage'\] must be a non-negative number"),
    ([1, 2], "'area' must be an object"),
])
def test_bad_tables_are_refused_naming_the_entry(table, message):
    with pytest.raises(ArchError, match=message):
        _chip(area=table)


@given(st.integers(1, 32), st.integers(1, 32), st.integers(1, 64), st.integers(1, 64))
def test_area_grows_with_every_size(rows, cols, spad_kib, lanes):
    chip = _chip(rows=rows, cols=cols, spad_bytes=spad_kib * 8 * 1024, spad_banks=8, vector_lanes=lanes,
                 function_unit=None)
    for bigger in (dict(rows=rows + 1), dict(cols=cols + 1), dict(spad_bytes=(spad_kib + 1) * 8 * 1024),
                   dict(vector_lanes=lanes + 1), dict(macs_per_pe={**chip.macs_per_pe, "int8": 2}),
                   dict(function_unit={"lanes": 1, "functions": ["exp"]})):
        assert dataclasses.replace(chip, **bigger).area_mm2 > chip.area_mm2
