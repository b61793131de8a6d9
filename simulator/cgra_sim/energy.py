"""Energy of a kernel launch: each command's work and scratchpad traffic, the DMA's host bytes,
configuration loads and leakage, priced by the chip's energy table.

Stage: simulator, beside statistics (stats.py calls `launch_energy`). In: the decoded commands,
the launch's cycles and configuration loads, and `HardwareDescription.energy`. Out: picojoules
per component (`COMPONENTS`), which `KernelStats` carries with their sum.

The table (every number in pJ; docs/simulator.md, "Energy"):

    mac[dtype]          one multiply-accumulate on the PE array, by input dtype
    vector_op[dtype]    one element operation of the vector unit (FILL, EPILOGUE, ELTWISE, a POOL tap, a
                        REDUCE step, each lane operation of a VFUNC: special.OPS, on the
                        lanes or through the function unit's stages alike),
                        and of a PE running a FABRIC body (per node per element)
    spad_read_byte      one byte read from the scratchpad
    spad_write_byte     one byte written to the scratchpad
    dram_byte           one byte moved between host memory and the scratchpad (DMA)
    config_load         one configuration slot loaded into every PE (a 64-bit word each; a
                        fabric's config_word_bits scale it)
    leakage_per_cycle   the whole chip, per cycle of the launch

What is counted: a GEMM's MACs are the PE array's (padding included: the array does that work);
it reads A once per column fold and B once per row fold (each cycle the array takes an element of
each of its rows of A and columns of B, as the timing model streams them), and reads (when
accumulating) and writes the accumulator once. Every other command reads and writes each element
of its scratchpad operands once (a window's overlapping taps once per tap), a DMA load writes its
whole box (the halo's zeros too) and a store reads it, while only the in-bounds bytes reach host
memory.

`default_energy` gives a chip without an `energy` table its figures, from Horowitz, "Computing's
energy problem (and what we can do about it)", ISSCC 2014 (45 nm, 0.9 V), the table Accelergy's
and Timeloop's examples start from: an 8-bit multiply 0.2 pJ and a 32-bit add 0.1 pJ (an int8 MAC
into int32: 0.3 pJ), a float32 multiply 3.7 pJ and add 0.9 pJ (4.6 pJ), an int32 multiply 3.1 pJ,
a float16 multiply 1.1 pJ (a float16 MAC into float32, its product exact there: 1.1 + 0.9 =
2.0 pJ; bfloat16 priced the same, an upper bound: its 8-bit significand multiplies in less than
float16's 11-bit one, and Horowitz gives no bfloat16 figure), a 16x8 integer MAC into a 48-bit
accumulator 2 * 0.2 + 1.5 * 0.1 = 0.55 pJ (this project's scaling: a 16 x 8 multiplier has twice
an 8 x 8 one's partial products, a 48-bit adder one and a half 32-bit ones; an int64 EPILOGUE
element is priced as two int32 lane operations);
a 64-bit SRAM access 10 pJ from 8 KiB and 20 pJ from 32 KiB (so 10 * sqrt(KiB / 8) pJ for one
bank of the scratchpad, per 8 bytes); DRAM 1.3 nJ per 64 bits. Two figures are this project's
assumptions, not measurements: a configuration slot loads one 64-bit word per PE from the
scratchpad (a FABRIC body's configuration is II slots), and leakage is a tenth of the PE array's
peak float32 dynamic power.
"""

from __future__ import annotations

import math

from .isa import HALF_FLOATS, DType, Op
from .special import OPS as VFUNC_OPS

COMPONENTS = ("mac", "vector", "spad", "dram", "config", "leakage")

#: pJ per MAC and per vector-unit element operation, by dtype (Horowitz, ISSCC 2014, 45 nm).
MAC_PJ = {"int8": 0.3, "float32": 4.6, "int32": 3.2, "float16": 1.1 + 0.9, "bfloat16": 1.1 + 0.9,
          "int16": 2 * 0.2 + 0.15}
VECTOR_OP_PJ = {"float32": 0.9, "int32": 0.1, "int8": 0.03}
DRAM_BYTE_PJ = 162.5  # 1.3 nJ per 64-bit access
SRAM_ACCESS_PJ_8KIB = 10.0  # one 64-bit access from an 8 KiB array
CONFIG_WORD_BYTES = 8  # per PE per configuration load (this project's assumption)
LEAKAGE_SHARE = 0.1  # of the PE array's peak float32 dynamic power (this project's assumption)

#: The keys of an energy table: per-dtype tables, then single figures.
PER_DTYPE = ("mac", "vector_op")
SCALARS = ("spad_read_byte", "spad_write_byte", "dram_byte", "config_load", "leakage_per_cycle")


def default_energy(rows: int, cols: int, spad_bytes: int, spad_banks: int, dtypes) -> dict:
    """The energy table of a chip whose description gives none (see the module doc)."""
    bank_kib = spad_bytes / spad_banks / 1024
    spad_byte = SRAM_ACCESS_PJ_8KIB * math.sqrt(bank_kib / 8) / 8
    pes = rows * cols
    return {
        "mac": {dtype: MAC_PJ[dtype] for dtype in sorted(dtypes)},
        "vector_op": dict(VECTOR_OP_PJ),
        "spad_read_byte": round(spad_byte, 4),
        "spad_write_byte": round(spad_byte, 4),
        "dram_byte": DRAM_BYTE_PJ,
        "config_load": round(pes * CONFIG_WORD_BYTES * spad_byte, 4),
        "leakage_per_cycle": round(LEAKAGE_SHARE * pes * MAC_PJ["float32"], 4),
    }


def check_energy(energy, dtypes) -> str | None:
    """What is wrong with an energy table (None if nothing): every key, non-negative numbers, a
    MAC figure for each dtype the PE array computes and a vector figure for each vector dtype."""
    return check_table("energy", energy, {"mac": set(dtypes), "vector_op": set(VECTOR_OP_PJ)}, SCALARS, "pJ")


def check_table(name: str, table, per_dtype: dict, scalars, unit: str) -> str | None:
    """What is wrong with a price table of the hardware description (energy, area): exactly the
    keys `per_dtype` and `scalars`; each `per_dtype[key]` a {dtype: figure} giving at least the
    dtypes it names; every figure a non-negative number of `unit`."""
    if not isinstance(table, dict):
        return f"'{name}' must be an object of {unit} figures, got {type(table).__name__}"
    expected = set(per_dtype) | set(scalars)
    if set(table) != expected:
        missing, unknown = sorted(expected - set(table)), sorted(set(table) - expected)
        return f"'{name}' must have the keys {sorted(expected)} (missing {missing}, unknown {unknown})"
    for key, needed in per_dtype.items():
        figures = table[key]
        if not isinstance(figures, dict) or not needed <= set(figures):
            return f"{name}['{key}'] must give {unit} for each of {sorted(needed)}, got {figures!r}"
        for dtype, value in figures.items():
            if not non_negative_number(value):
                return f"{name}['{key}']['{dtype}'] must be a non-negative number of {unit}, got {value!r}"
    for key in scalars:
        if not non_negative_number(table[key]):
            return f"{name}['{key}'] must be a non-negative number of {unit}, got {table[key]!r}"
    return None


def non_negative_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _elements(region) -> int:
    return math.prod(region.shape)


def _bytes(region) -> int:
    return _elements(region) * region.dtype.itemsize


def launch_energy(arch, commands, cycles: int, config_slots: int) -> dict:
    """pJ per component (`COMPONENTS`) of one launch's `commands` (decoded), `cycles` long, having
    loaded `config_slots` configuration slots into every PE (timing.Timeline.config_slots)."""
    table = arch.energy
    energy = dict.fromkeys(COMPONENTS, 0.0)
    spad_read = spad_write = 0
    parts_of = {}  # a record's first index -> its parts: a repeated record costs what its first did
    for cmd in commands:
        parts = parts_of.get(cmd.repeat_of) if cmd.repeat_of >= 0 else None
        if parts is None:
            parts = parts_of[cmd.index] = _command_energy(arch, table, cmd)
        component, picojoules, read, written = parts
        if component is not None:  # added command by command, in order: the same float sum
            energy[component] += picojoules
        spad_read += read
        spad_write += written
    energy["spad"] = spad_read * table["spad_read_byte"] + spad_write * table["spad_write_byte"]
    words = arch.fabric["config_word_bits"] / (8 * CONFIG_WORD_BYTES)  # per PE and slot, in 64-bit words
    energy["config"] = config_slots * words * table["config_load"]
    energy["leakage"] = cycles * table["leakage_per_cycle"]
    return energy


def _command_energy(arch, table, cmd) -> tuple:
    """(component or None, its pJ, scratchpad bytes read, bytes written) of one decoded command."""
    component = picojoules = None
    if cmd.op in (Op.DMA_LOAD, Op.DMA_STORE):
        component, picojoules = "dram", cmd.host_bytes * table["dram_byte"]
    elif cmd.op is Op.GEMM:
        column_folds, row_folds = -(-cmd.n // arch.cols), -(-cmd.m // arch.rows)
        read = _bytes(cmd.a) * column_folds + _bytes(cmd.b) * row_folds
        read += _bytes(cmd.acc) if cmd.accumulate else 0
        return "mac", cmd.macs * table["mac"][cmd.dtype.numpy_name], read, _bytes(cmd.acc)
    elif cmd.op is Op.DEPTHWISE:
        component, picojoules = "mac", cmd.macs * table["mac"][cmd.dtype.numpy_name]
    elif cmd.op is Op.POOL:
        # An int16 max pool's compare is charged as an int32 one (the table has no int16 column).
        dtype = "int32" if cmd.dtype is DType.INT16 else cmd.dtype.numpy_name
        component, picojoules = "vector", cmd.taps * table["vector_op"][dtype]
    elif cmd.op is Op.REDUCE:  # one lane operation per element folded (two for a sum of squares)
        component = "vector"
        picojoules = cmd.elements * (1 + (cmd.func.name == "SUM_SQUARES")) * table["vector_op"]["float32"]
    elif cmd.op is Op.VFUNC:  # the lane operations of the function's sequence per element
        ops = VFUNC_OPS[cmd.func.name.lower()] + (cmd.scale is not None) + (cmd.offset is not None)
        component, picojoules = "vector", cmd.elements * ops * table["vector_op"]["float32"]
    elif cmd.op is Op.FABRIC:  # a PE's ALU operation costs what a vector lane's does
        component = "vector"
        picojoules = cmd.elements * len(cmd.body) * table["vector_op"][cmd.dtype.numpy_name]
    elif cmd.writes:  # FILL, EPILOGUE, ELTWISE: one operation per element written
        out = cmd.writes[0]
        dtype = _vector_dtype(cmd, out)
        lanes = 2 if dtype == "int64" else 1  # an int64 accumulator's element: two int32 lane operations
        component = "vector"
        picojoules = _elements(out) * lanes * table["vector_op"]["int32" if lanes == 2 else dtype]
    return (component, picojoules, sum(_bytes(r) for r in cmd.reads), sum(_bytes(r) for r in cmd.writes))


def _vector_dtype(cmd, out) -> str:
    """The dtype a vector command computes in: an EPILOGUE's accumulator (a widening one's float32
    output), a 16-bit float ELTWISE's float32, else its output's."""
    if cmd.op is Op.EPILOGUE:
        return "float32" if cmd.widen is not None else cmd.acc.dtype.name
    if cmd.op is Op.ELTWISE and cmd.dtype in HALF_FLOATS:
        return "float32"
    return out.dtype.name
