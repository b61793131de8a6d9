"""The reference of the hardware description, generated from the class: a Markdown page and a
JSON Schema that editors validate chip files against.

Stage: docs. In: `HardwareDescription`'s fields, `arch.FIELD_DOCS`, the limits `arch.py` checks
(MAXIMUM, POSITIVE, NON_NEGATIVE), the energy and area tables' keys (energy.py, area.py), and the presets. Out:
docs/hardware-description.md and docs/hardware-description.schema.json; tests check the committed
files are what this writes, so the docs cannot drift from the code.

    python -m cgra_sim.arch_doc [--write DOCS_DIR]   # print the Markdown, or write both files
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from .arch import (CLOCK_MHZ_BELOW, FIELD_DOCS, MAXIMUM, NON_NEGATIVE, PE_DTYPES, POSITIVE, HardwareDescription,
                   load_arch, preset_names)
from . import area as area_table
from . import fabric as fabric_table
from . import function_unit as function_unit_table
from . import host as host_table
from .energy import PER_DTYPE, SCALARS, VECTOR_OP_PJ
from .isa import DType
from .special import OPS as VFUNC_OPS

SCHEMA_FILE = "hardware-description.schema.json"
MARKDOWN_FILE = "hardware-description.md"
DTYPES = [d.numpy_name for d in DType]
OPTIONAL = ("energy", "area", "fabric", "host", "function_unit")  # tables with defaults (or none)
#: What each number format costs on the presets, and what those figures rest on.
NUMBER_FORMATS = (
    "## Number formats",
    "",
    "The PE array multiplies float32, int8 (accumulating in int32), bfloat16 and float16 (both",
    "accumulating in float32: a product of two 16-bit floats is exact in float32, the sum rounds as",
    "float32's does, and the EPILOGUE rounds the result to the 16-bit format, to nearest even, when",
    "it stores it). A dtype missing from `macs_per_pe` is one the chip lacks: its layers stay on",
    "the host. The vector unit's ELTWISE takes them too (widened, computed in float32, rounded, as",
    "a host computes them) and the DMA moves them (the layout copies: transposes, slices, concats,",
    "lookups); the EPILOGUE converts (float32 rounded to nearest even into either, either widened",
    "exactly to float32: stream v12), which is the cast kernel (kernels/elementwise/cast.py) and",
    "lets an RMSNorm or a layer norm write bfloat16 (kernels/rows/half_norms.py); a VFUNC reads",
    "and writes them (stream v14: widened on the way in, its float32 result rounded to nearest even",
    "on the way out, or either operand kept float32: a 16-bit GELU or SiLU in one pass,",
    "docs/transformer-ops.md); the vector",
    "unit's other commands and the fabric compute float32, int32 and int8 only, so a bfloat16 / float16 model's other",
    "elementwise operators run in float32 between casts or on the host.",
    "",
    "The presets give bfloat16 and float16 2 MACs per PE per cycle where float32 has 1: two 16-bit",
    "products accumulate into one float32 sum a cycle, as Arm's BFDOT / BFMMLA (each float32 lane",
    "takes two bfloat16 products per instruction, twice FMLA's float32 MACs) and Intel's AMX-BF16",
    "(TDPBF16PS: pairs of bfloat16 products into each float32 element) do; per Horowitz (ISSCC",
    "2014, 45 nm, the source of the float32 and int8 figures) such a MAC, a float16 multiplier",
    "(1640 µm², 1.1 pJ) and a float32 adder (4184 µm², 0.9 pJ), is 5824 µm² and 2.0 pJ, so two",
    "fit in one float32 MAC's 11884 µm² and cost 0.87x its 4.6 pJ a cycle. bfloat16 is priced as",
    "float16 (Horowitz has no bfloat16 figure; its 8-bit significand needs the smaller",
    "multiplier, so this is an upper bound). The area model counts each dtype's MAC units apart",
    "(a PE sharing one 16-bit datapath between the two formats is smaller than the sum): the",
    "presets' area grew by their four 16-bit MAC units a PE.",
    "",
    "int16 is the PE array's 16x8 integer mode, Arm Ethos-U's: int16 activations times int8",
    "weights (a GEMM's A and B), accumulated exactly in int64 (a product is below 2**22, so 48",
    "bits, Ethos-U's accumulator, hold any reduction shorter than 2**25; the simulator keeps 64),",
    "then requantised by the EPILOGUE to int16 as int8 is (float32 scale row, rounded half to",
    "even; `cgra_sim/int16.py`). The presets give it 1 MAC per PE per cycle, int8's rate there;",
    "a chip that packs int8 MACs (`macs_per_pe.int8 = 4`) does half as many 16x8 ones",
    "(`macs_per_pe.int16 = 2`): a 16x8 product is two 8x8 ones, as Ethos-U's 16x8 runs at half",
    "its 8x8 rate. Priced from Horowitz's figures by this project's scaling: twice an 8-bit",
    "multiplier and a 48-bit adder (1.5 x 32-bit), 770 µm² and 0.55 pJ a MAC. DEPTHWISE, the",
    "vector unit and the fabric have no int16 mode: those layers stay on the host.",
)


def _field_schema(name: str) -> dict:
    unit, doc = FIELD_DOCS[name]
    description = f"{doc} ({unit})" if unit else doc
    if name == "name":
        return {"type": "string", "minLength": 1, "description": description}
    if name == "clock_mhz":
        return {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": CLOCK_MHZ_BELOW,
                "description": description}
    if name == "macs_per_pe":
        return {"type": "object", "minProperties": 1, "propertyNames": {"enum": list(PE_DTYPES)},
                "additionalProperties": {"type": "integer", "minimum": 1, "maximum": MAXIMUM["macs_per_pe"]},
                "description": description}
    if name == "energy":
        per_dtype = {"type": "object", "additionalProperties": {"type": "number", "minimum": 0},
                     "propertyNames": {"enum": DTYPES}}
        properties = {key: dict(per_dtype) for key in PER_DTYPE}
        properties["vector_op"]["required"] = sorted(VECTOR_OP_PJ)
        properties.update({key: {"type": "number", "minimum": 0} for key in SCALARS})
        return {"type": "object", "additionalProperties": False, "required": sorted(properties),
                "properties": properties, "description": description}
    if name == "area":
        per_dtype = {"type": "object", "additionalProperties": {"type": "number", "minimum": 0},
                     "propertyNames": {"enum": DTYPES}}
        properties = {key: dict(per_dtype) for key in area_table.PER_DTYPE}
        properties.update({key: {"type": "number", "minimum": 0} for key in area_table.SCALARS})
        required = sorted(properties)
        properties.update({key: {"type": "number", "minimum": 0} for key in area_table.OPTIONAL})
        return {"type": "object", "additionalProperties": False, "required": required,
                "properties": properties, "description": description}
    if name == "fabric":
        whole = {"type": "integer", "minimum": 1}
        properties = {"topology": {"enum": list(fabric_table.TOPOLOGIES)},
                      "memory_ports": {"enum": list(fabric_table.MEMORY_PORTS)},
                      "multipliers": {"enum": list(fabric_table.MULTIPLIERS)},
                      "latency": {"type": "object", "additionalProperties": False,
                                  "required": list(fabric_table.OP_CLASSES),
                                  "properties": {op: {**whole, "maximum": fabric_table.MAX_LATENCY}
                                                 for op in fabric_table.OP_CLASSES}},
                      **{key: dict(whole) for key in ("hops_per_cycle", "registers", "context_depth",
                                                      "config_word_bits")}}
        return {"type": "object", "additionalProperties": False, "required": sorted(properties),
                "properties": properties, "description": description}
    if name == "host":
        properties = {key: {"type": "number", **({"exclusiveMinimum": 0} if key in host_table.POSITIVE_KEYS
                                                 else {"minimum": 0})} for key in host_table.KEYS}
        return {"type": "object", "additionalProperties": False, "required": list(host_table.KEYS),
                "properties": properties, "description": description}
    if name == "function_unit":
        properties = {"lanes": {"type": "integer", "minimum": 1, "maximum": MAXIMUM["vector_lanes"]},
                      "functions": {"type": "array", "minItems": 1, "uniqueItems": True,
                                    "items": {"enum": sorted(VFUNC_OPS)}}}
        return {"type": ["object", "null"], "additionalProperties": False,
                "required": list(function_unit_table.KEYS), "properties": properties, "description": description}
    if name == "dma_prefetch":
        return {"type": "boolean", "description": description}
    minimum = 1 if name in POSITIVE else 0
    assert name in POSITIVE or name in NON_NEGATIVE, name
    return {"type": "integer", "minimum": minimum, "maximum": MAXIMUM[name], "description": description}


def json_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a hardware description file."""
    names = [f.name for f in dataclasses.fields(HardwareDescription)]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "CGRA NPU hardware description",
        "description": "A chip for npu_backend and cgra_sim (docs/hardware-description.md). Also: spad_bytes "
                       "must be a multiple of spad_banks * bank_width_bytes, energy.mac and area.mac_unit "
                       "must price every dtype of macs_per_pe, and function_unit.lanes is at most vector_lanes.",
        "type": "object",
        "properties": {"$schema": {"type": "string"}, **{name: _field_schema(name) for name in names}},
        "required": [name for name in names if name not in OPTIONAL + ("dma_prefetch",)],
        "additionalProperties": False,
    }


def _allowed(name: str) -> str:
    if name == "name":
        return "non-empty text"
    if name == "clock_mhz":
        return f"0 < value < {CLOCK_MHZ_BELOW:.0f}"
    if name == "macs_per_pe":
        return f"{{dtype: 1..{MAXIMUM['macs_per_pe']}}}, dtypes {', '.join(PE_DTYPES)}"
    if name in OPTIONAL:
        return "optional; see below"
    if name == "dma_prefetch":
        return "optional: true or false (false)"
    return f"{1 if name in POSITIVE else 0}..{MAXIMUM[name]}"


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_value(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(map(_value, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def markdown() -> str:
    """docs/hardware-description.md."""
    names = [f.name for f in dataclasses.fields(HardwareDescription)]
    presets = [load_arch(p) for p in preset_names()]
    lines = [
        "# Describing your own chip",
        "",
        "<!-- Generated by `python -m cgra_sim.arch_doc --write docs` from simulator/cgra_sim/arch.py;",
        "     edit FIELD_DOCS there, not this file (tests/test_arch_doc.py checks they agree). -->",
        "",
        "One JSON object describes a chip for the compiler, the runtime and the simulator (the presets in",
        "`simulator/cgra_sim/presets/` are three of them). Pass its path wherever a preset name goes",
        "(`npu_backend.compile(mod, arch=\"my_chip.json\")`, `cgra-sim verify|run --arch my_chip.json`,",
        "`cgra-sim replay --arch`), or register it as a `tvm.compile` target with",
        "`npu_backend.register_arch(\"my_chip.json\")`. Editors validate it against",
        f"[`{SCHEMA_FILE}`]({SCHEMA_FILE}) when the file says",
        f"`\"$schema\": \"<path to>/docs/{SCHEMA_FILE}\"` (that key is ignored when loading).",
        "A worked example: [`examples/my_chip.json`](../examples/my_chip.json).",
        "",
        "| field | unit | allowed | what it is |",
        "|---|---|---|---|",
    ]
    for name in names:
        unit, doc = FIELD_DOCS[name]
        lines.append(f"| `{name}` | {unit or '-'} | {_allowed(name)} | {doc} |")
    lines += [
        "",
        "Across fields: `spad_bytes` must be a multiple of `spad_banks * bank_width_bytes`; `energy.mac`",
        "and `area.mac_unit` must price every dtype of `macs_per_pe`; `function_unit.lanes` is at most",
        "`vector_lanes`. Every key is required except `energy`, `area`, `fabric`, `host`,",
        "`function_unit` and `dma_prefetch`; an unknown key is an error naming it.",
        "",
        "## The energy table",
        "",
        "All in pJ, none negative (`simulator/cgra_sim/energy.py` says what each command is charged,",
        "and where the default figures come from):",
        "",
        "| key | per |",
        "|---|---|",
        "| `mac` | multiply-accumulate on the PE array, by input dtype (every dtype of `macs_per_pe`) |",
        f"| `vector_op` | element operation of the vector unit, by dtype ({', '.join(sorted(VECTOR_OP_PJ))} required) |",
        "| `spad_read_byte`, `spad_write_byte` | byte read from / written to the scratchpad |",
        "| `dram_byte` | byte moved between host memory and the scratchpad by DMA |",
        "| `config_load` | configuration slot loaded into every PE (per 64 bits of `config_word_bits`) |",
        "| `leakage_per_cycle` | cycle of the launch, the whole chip |",
        "",
        "## The area table",
        "",
        "All in µm², none negative (`simulator/cgra_sim/area.py` has the sources of the defaults). The",
        "chip's area (`HardwareDescription.area_mm2`, the `area_mm2` of `cgra-sim sweep`) is",
        "PEs x (sum over dtypes of `macs_per_pe` x `mac_unit` + `pe_overhead`) + scratchpad KiB x",
        "`spad_kib` + `vector_lanes` x `vector_lane` + `function_unit.lanes` x stages x `function_stage`",
        "(stages: the function unit's longest sequence, with VFUNC's scale and offset; below); DMA",
        "engines, control and global wiring are not counted.",
        "",
        "| key | per |",
        "|---|---|",
        "| `mac_unit` | MAC unit (multiplier and accumulating adder), by input dtype (every dtype of `macs_per_pe`) |",
        "| `pe_overhead` | PE, besides its MAC units: registers, configuration word, links to its neighbours |",
        "| `spad_kib` | KiB of scratchpad SRAM |",
        "| `vector_lane` | lane of the vector unit |",
        f"| `function_stage` | pipeline stage of a function unit's lane; optional: without it "
        f"{area_table.OPTIONAL['function_stage']:g} (a float32 operator and its pipeline registers) |",
        "",
        "## The fabric table",
        "",
        "The PE array as a CGRA, for the mapper (`cgra-sim map`; `simulator/cgra_sim/fabric.py` and",
        "[mapping.md](mapping.md) say how each field is used). Every field reaches the cycles through a",
        "mapping: a FABRIC body's, and the systolic cell's that GEMM and DEPTHWISE run as",
        "(`cgra-sim map --intrinsic mac` prints a MAC every how many cycles a cell; simulator.md): an",
        "`alu` latency of 2, two `registers` or a `checkerboard` of multipliers make every GEMM slower,",
        "and a fabric that cannot map the cell at all (one register) is refused before compiling.",
        "",
        "| key | what |",
        "|---|---|",
        f"| `topology` | {', '.join(fabric_table.TOPOLOGIES)}: links to the 4 neighbours, wrapping around at the "
        "edges (torus), or passing a value up to `hops_per_cycle` PEs along a row or column in a cycle (hycube) |",
        "| `hops_per_cycle` | PEs a value travels in one cycle (above 1 only on a hycube) |",
        "| `registers` | registers in each PE's register file |",
        f"| `memory_ports` | PEs that load and store: {', '.join(fabric_table.MEMORY_PORTS)} |",
        f"| `multipliers` | PEs with a multiplier: {', '.join(fabric_table.MULTIPLIERS)} |",
        f"| `latency` | cycles per operation class ({', '.join(fabric_table.OP_CLASSES)}), 1 to "
        f"{fabric_table.MAX_LATENCY} |",
        "| `context_depth` | configuration slots per PE: the largest initiation interval (II) a mapping may use; "
        "the configurations that fit stay resident and switch for free (the systolic cell's takes its step, 1 on the "
        "presets; a FABRIC body's its II) |",
        "| `config_word_bits` | bits of one PE's configuration for one time slot |",
        "",
        "## The host table",
        "",
        "The CPU that runs what stays off the NPU (`simulator/cgra_sim/host.py`). A profile",
        "(`npu_backend.profile()`, `cgra-sim run`) models every host call from it: max(arithmetic operations",
        "/ `ops_per_cycle`, tensor bytes / `bytes_per_cycle`) plus `call_overhead_cycles` cycles of the host",
        "clock, converted to cycles of the NPU's `clock_mhz`. Those modelled cycles are the totals' (the same",
        "on every machine); the wall time the calls took on the machine that ran them is reported beside",
        "them. Without the table, the presets' figures below (a modest Arm application core, Cortex-A55",
        "class: this project's assumption); a description without it keeps its fingerprint.",
        "",
        "| key | what |",
        "|---|---|",
        "| `clock_mhz` | the host core's clock, MHz (above 0) |",
        "| `ops_per_cycle` | arithmetic operations (add, multiply, max, exp, ...) sustained per cycle (above 0) |",
        "| `bytes_per_cycle` | bytes of the call's tensors read and written per cycle (above 0) |",
        "| `call_overhead_cycles` | cycles every call costs besides its work (0 or more) |",
        "",
        "## The function unit",
        "",
        "VFUNC's special functions (exp, tanh, erf, GELU, rsqrt, reciprocal, identity, sigmoid, SiLU, GELU's",
        "tanh form: `cgra_sim/special.py`)",
        "are fixed sequences of float32 operations. Without a function unit a vector lane runs an",
        "element's sequence one operation a cycle (GELU 85 cycles an element a lane). A function unit",
        "pipelines them (`simulator/cgra_sim/function_unit.py`): each of its `lanes` is one stage per",
        "operation of the sequence (a divide or square root 4, VFUNC's scale and offset one each),",
        "and takes one element a cycle once full. A VFUNC of n elements then costs",
        "ceil(n / `lanes`) + depth - 1 + 2 cycles (depth: its sequence's length) instead of",
        "ceil(n x depth / `vector_lanes`) + 2; the vector unit issues it to whichever ends first, so",
        "a short column still runs on the lanes. On the unit the vector unit is busy only for the",
        "issue, ceil(n / `lanes`) + 2 cycles: the next command, a VFUNC into the same pipelines too,",
        "starts while the last elements fill the stages. The lanes' ALUs, idle while the pipelines",
        "stream, take a share m of a long VFUNC's elements beside them (`function_unit.split`):",
        "max(ceil(m x depth / `vector_lanes`), ceil((n - m) / `lanes`) + depth - 1) + 2 cycles, m",
        "the largest share that keeps the vector unit busy the fewest cycles, never more nor later",
        "than the pipelines alone (GELU 1 + 8 / 85 elements a cycle on cgra-8x8, exp 1 + 8 / 28).",
        "The results are the same bits wherever an element runs; the",
        "energy is the same operations per element (`vector_op`). Its area is a stage per operation",
        "of its longest sequence in each lane (`area.function_stage`): a function no longer than that",
        "(sigmoid's 36, SiLU's 37, GELU tanh's 41 against GELU's 85) adds a stage's configuration, not",
        "a stage.",
        "",
        "The presets: cgra-4x4 has none (a one-lane unit, 0.57 mm² at 45 nm, would nearly double a",
        "0.62 mm² chip; NPUs of 16 MACs, the Ethos-U55 class, give activations a lookup table, not",
        "a float32 datapath); cgra-8x8 one lane (a quarter more area, GELU at 1 cycle an element",
        "instead of 10.6); cgra-16x16 two (its PE array does 4x the MACs a cycle of cgra-8x8's, its",
        "scratchpad and DMA twice the bytes). Leave the table out, or set it to null, for VFUNC on",
        "the lanes only.",
        "",
        "| key | what |",
        "|---|---|",
        "| `lanes` | function pipelines, each an element a cycle (1 to `vector_lanes`: the lanes' read port feeds them) |",
        f"| `functions` | the VFUNC functions it pipelines, among {', '.join(sorted(VFUNC_OPS))}; the others run on the lanes |",
        "",
        "## What each number format costs",
        "",
        "A PE has `macs_per_pe[dtype]` MAC units for each input dtype it computes: a GEMM or DEPTHWISE",
        "of that dtype takes ceil(k / `macs_per_pe[dtype]`) MAC steps a fold (`cgra_sim/cost.py`), its",
        "operands (rows + cols) x `macs_per_pe[dtype]` elements a cycle from the scratchpad; each MAC",
        "costs `energy.mac[dtype]`, each unit `area.mac_unit[dtype]`. The presets give int8 one MAC a",
        "PE a cycle, as float32: they are the chips the SCALE-Sim comparisons (an int8 GEMM and",
        "ResNet-18's conv2_x, `benchmarks/bench_compile.py`; SCALE-Sim models one MAC a PE a cycle) and",
        "every recorded figure were measured on, so they stay as they are. A real PE that does one",
        "float32 MAC a cycle does about four int8 ones: the operand ports that bring a float32 MAC its",
        "two 32-bit operands a cycle bring four int8 pairs (the scratchpad's bytes a cycle are the",
        "same), and four int8 MAC units (4 x 419 µm² at 45 nm, `area.py`) are a seventh of one float32",
        "MAC's 11884 µm², at 0.3 pJ a MAC against 4.6. Describe such a chip with",
        "`\"macs_per_pe\": {\"float32\": 1, \"int8\": 4}`, or change a preset with",
        "`--set macs_per_pe.int8=4` (`cgra-sim sweep`, `benchmarks/bench_quantized.py`): cgra-8x8 then",
        "grows from 4.46 to 4.54 mm², and its int8 GEMMs take a quarter of the MAC steps.",
        "",
        *NUMBER_FORMATS[2:],
        "",
        "## The presets",
        "",
        "| field | " + " | ".join(p.name for p in presets) + " |",
        "|---|" + "---|" * len(presets),
    ]
    for name in names[1:]:
        values = [p.host_cpu if name == "host" else getattr(p, name) for p in presets]
        if name == "function_unit":
            for key in function_unit_table.KEYS:
                lines.append(f"| `{name}.{key}` | " + " | ".join(_value(v[key]) if v else "-" for v in values) + " |")
        elif name in OPTIONAL:
            for key in values[0]:
                lines.append(f"| `{name}.{key}` | " + " | ".join(_value(v[key]) for v in values) + " |")
        else:
            lines.append(f"| `{name}` | " + " | ".join(_value(v) for v in values) + " |")
    lines.append("| area (mm²) | " + " | ".join(f"{p.area_mm2:.2f}" for p in presets) + " |")
    lines.append("| of it the function unit | " + " | ".join(f"{p.area_breakdown()['function_unit']:.2f}"
                                                              for p in presets) + " |")
    return "\n".join(lines) + "\n"


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cgra_sim.arch_doc", description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="DOCS_DIR", help=f"write {MARKDOWN_FILE} and {SCHEMA_FILE} there")
    args = parser.parse_args(argv)
    if args.write is None:
        print(markdown(), end="")
        return 0
    for name, text in ((MARKDOWN_FILE, markdown()), (SCHEMA_FILE, schema_text())):
        with open(os.path.join(args.write, name), "w", encoding="utf-8") as handle:
            handle.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
