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

TABLE = {"mac_unit": {"int8": 400.0, "float32": 12000.0}, "pe_overhead": 1000.0, "spad_kib": 5000.0,
         "vector_lane": 10000.0}


def _chip(**changes) -> HardwareDescription:
    return dataclasses.replace(load_arch("cgra-8x8"), **changes)


def test_area_is_the_closed_form():
    chip = _chip(rows=6, cols=10, macs_per_pe={"int8": 4, "float32": 1}, spad_bytes=96 * 1024, spad_banks=6,
                 vector_lanes=12, area=TABLE, energy=None)
    pe = 4 * 400 + 12000 + 1000
    assert chip.area_breakdown() == {"pe_array": 60 * pe / 1e6, "scratchpad": 96 * 5000 / 1e6,
                                     "vector_unit": 12 * 10000 / 1e6}
    assert chip.area_mm2 == pytest.approx((60 * pe + 96 * 5000 + 12 * 10000) / 1e6, rel=1e-12)


def test_presets_use_the_published_figures():
    for name in ("cgra-4x4", "cgra-8x8", "cgra-16x16"):
        arch = load_arch(name)
        assert arch.area == default_area(arch.macs_per_pe)
    assert default_area(["int8"])["mac_unit"] == {"int8": 282 + 137}  # Horowitz: 8-bit multiply, 32-bit add
    assert load_arch("cgra-4x4").area_mm2 < load_arch("cgra-8x8").area_mm2 < load_arch("cgra-16x16").area_mm2


def test_a_description_without_a_table_gets_the_defaults():
    data = load_arch("cgra-4x4").to_dict()
    del data["area"]
    data["macs_per_pe"] = {"int8": 2}
    data["energy"]["mac"] = {"int8": 0.3}
    arch = HardwareDescription.from_dict(data)
    assert arch.area == default_area(["int8"])


@pytest.mark.parametrize("table, message", [
    ({**TABLE, "pe_overhead": -1.0}, r"area\['pe_overhead'\] must be a non-negative number"),
    ({**TABLE, "mac_unit": {"int8": 400.0}}, r"area\['mac_unit'\] must give µm² for each of \['float32', 'int8'\]"),
    ({key: value for key, value in TABLE.items() if key != "spad_kib"}, r"missing \['spad_kib'\]"),
    ({**TABLE, "wires": 1.0}, r"unknown \['wires'\]"),
    ([1, 2], "'area' must be an object"),
])
def test_bad_tables_are_refused_naming_the_entry(table, message):
    with pytest.raises(ArchError, match=message):
        _chip(area=table)


@given(st.integers(1, 32), st.integers(1, 32), st.integers(1, 64), st.integers(1, 64))
def test_area_grows_with_every_size(rows, cols, spad_kib, lanes):
    chip = _chip(rows=rows, cols=cols, spad_bytes=spad_kib * 8 * 1024, spad_banks=8, vector_lanes=lanes)
    for bigger in (dict(rows=rows + 1), dict(cols=cols + 1), dict(spad_bytes=(spad_kib + 1) * 8 * 1024),
                   dict(vector_lanes=lanes + 1), dict(macs_per_pe={"int8": 2, "float32": 1})):
        assert dataclasses.replace(chip, **bigger).area_mm2 > chip.area_mm2
