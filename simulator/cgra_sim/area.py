"""Silicon area of a chip: its PE array, scratchpad, vector unit and function unit, priced by an area table.

Stage: shared (the hardware description's derived figures; `HardwareDescription.area_mm2` and
`area_breakdown` call it). In: the chip's sizes and its `area` table; out: mm² per component
(`COMPONENTS`). Design-space sweeps (cgra-sim sweep) put it beside cycles and energy.

The table (every number in µm²; docs/hardware-description.md, "The area table"):

    mac_unit[dtype]   one MAC unit for input dtype `dtype` (its multiplier and accumulating adder);
                      a PE has macs_per_pe[dtype] of them for each dtype it computes
    pe_overhead       the rest of a PE: operand and result registers, its configuration word,
                      the links to its neighbours
    spad_kib          one KiB of scratchpad SRAM, banking included
    vector_lane       one lane of the vector unit (a float32 multiply and add, an int32 add)
    function_stage    optional: one pipeline stage of the function unit (function_unit.py), a
                      lane's; without it FUNCTION_STAGE_UM2 (and a description without it keeps
                      its JSON and fingerprint)

Chip area = PEs x (sum over dtypes of macs_per_pe x mac_unit + pe_overhead)
          + scratchpad KiB x spad_kib + vector_lanes x vector_lane
          + function_unit.lanes x stages x function_stage
(stages: the function unit's longest sequence with scale and offset, function_unit.stages).
Not counted: the DMA engines, the host interface, control and global wiring.

`default_area` gives a chip without an `area` table its figures, at 45 nm like the energy table:
Horowitz, "Computing's energy problem (and what we can do about it)", ISSCC 2014, gives an 8-bit
multiplier 282 µm², a 32-bit adder 137 µm², a 32-bit multiplier 3495 µm², a float32 multiplier
7700 µm², a float32 adder 4184 µm² and a float16 multiplier 1640 µm² (so an int8 MAC into int32 is
419 µm², a float32 MAC 11884 µm², a float16 MAC into float32 1640 + 4184 = 5824 µm²: two of them
take the area of one float32 MAC; bfloat16 priced as float16, an upper bound for its narrower
significand). The model counts each dtype's MAC units apart: a PE that computes bfloat16 and
float16 on one shared 16-bit datapath is smaller than the table's sum. A 16x8 integer MAC into a
48-bit accumulator (int16 activations times int8 weights) is priced 2 * 282 + 1.5 * 137 = 770
µm², this project's scaling of Horowitz's figures (twice an 8 x 8 multiplier's partial products,
a 48-bit adder); a PE that shares its int8 multiplier for the 16x8 mode, as Ethos-U's does, is
smaller. SRAM: Intel's 45 nm 6T cell is 0.346 µm² (Mistry et al., IEDM 2007); at an array efficiency
of one half (this project's assumption: decoders, sense amplifiers, banking) a KiB is 5669 µm².
`pe_overhead` (1000 µm²) is this project's assumption, not a measurement: about 200 bits of
flip-flops and the multiplexers in front of them.

A function unit's stage holds one float32 operator of the sequence and the values live across
it. Its figure is this project's estimate from the same sources: the operator priced as the
mean of a float32 multiplier and adder (5942 µm²: the sequences are mostly Horner steps, a
multiply then an add; the compares, selects, shifts and conversions among them are smaller,
the four stages of a divide or square root larger), and 128 flip-flops (four float32 values
live between stages) at 4.522 µm² each (NanGate's 45 nm Open Cell Library, DFF_X1): 6521 µm².
GELU's pipeline, 87 stages, is then 0.57 mm² a lane, 47 vector lanes' worth.
"""

from __future__ import annotations

from . import function_unit
from .energy import check_table, non_negative_number

COMPONENTS = ("pe_array", "scratchpad", "vector_unit", "function_unit")

#: µm² per MAC unit by input dtype (Horowitz, ISSCC 2014, 45 nm: multiplier + 32-bit accumulator adder).
MAC_UNIT_UM2 = {"int8": 282 + 137, "float32": 7700 + 4184, "int32": 3495 + 137, "float16": 1640 + 4184,
                "bfloat16": 1640 + 4184, "int16": 2 * 282 + 206}
PE_OVERHEAD_UM2 = 1000.0  # this project's assumption (see the module doc)
SRAM_CELL_UM2 = 0.346  # Intel 45 nm 6T cell (Mistry et al., IEDM 2007)
SRAM_ARRAY_EFFICIENCY = 0.5  # this project's assumption
VECTOR_LANE_UM2 = 7700 + 4184 + 137  # a float32 multiplier and adder, an int32 adder
DFF_UM2 = 4.522  # NanGate 45 nm Open Cell Library, DFF_X1
FUNCTION_STAGE_UM2 = round((7700 + 4184) / 2 + 128 * DFF_UM2)  # this project's estimate (see the module doc)

#: The keys of an area table: per-dtype tables, then single figures.
PER_DTYPE = ("mac_unit",)
SCALARS = ("pe_overhead", "spad_kib", "vector_lane")
#: Keys a table may leave out (the figure used then).
OPTIONAL = {"function_stage": float(FUNCTION_STAGE_UM2)}


def default_area(dtypes) -> dict:
    """The area table of a chip whose description gives none (see the module doc)."""
    return {
        "mac_unit": {dtype: float(MAC_UNIT_UM2[dtype]) for dtype in sorted(dtypes)},
        "pe_overhead": PE_OVERHEAD_UM2,
        "spad_kib": round(1024 * 8 * SRAM_CELL_UM2 / SRAM_ARRAY_EFFICIENCY, 1),
        "vector_lane": float(VECTOR_LANE_UM2),
    }


def check_area(area, dtypes) -> str | None:
    """What is wrong with an area table (None if nothing): every key (those of OPTIONAL may be
    left out), non-negative numbers, a MAC unit for each dtype the PE array computes."""
    if isinstance(area, dict):
        for key in OPTIONAL:
            if key in area and not non_negative_number(area[key]):
                return f"area['{key}'] must be a non-negative number of µm², got {area[key]!r}"
        area = {key: value for key, value in area.items() if key not in OPTIONAL}
    return check_table("area", area, {"mac_unit": set(dtypes)}, SCALARS, "µm²")


def chip_area(arch) -> dict:
    """mm² per component (`COMPONENTS`) of `arch` (a HardwareDescription)."""
    table = arch.area
    pe = sum(macs * table["mac_unit"][dtype] for dtype, macs in arch.macs_per_pe.items()) + table["pe_overhead"]
    return {
        "pe_array": arch.rows * arch.cols * pe / 1e6,
        "scratchpad": arch.spad_bytes / 1024 * table["spad_kib"] / 1e6,
        "vector_unit": arch.vector_lanes * table["vector_lane"] / 1e6,
        "function_unit": function_unit_um2(arch.function_unit, table) / 1e6,
    }


def function_unit_um2(unit, table) -> float:
    """µm² of a function unit `unit` (None: none) priced by the area `table`: a stage per
    operation of its longest sequence, in each lane."""
    if not unit:
        return 0.0
    stage = table.get("function_stage", OPTIONAL["function_stage"])
    return unit["lanes"] * function_unit.stages(unit) * stage

