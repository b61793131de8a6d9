"""The parametric description of the CGRA NPU: the single source of truth for every stage.

Stage: shared. The compiler sizes tiles from it, the runtime receives it with every kernel
launch (as JSON embedded in the compiled code), and the simulator times commands with it.
Loaded from a preset (`presets/<name>.json`) or from a user's JSON file; always passed
explicitly, never read at import time. Pure Python, no tvm.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from importlib import resources
from typing import Mapping

from .area import check_area, chip_area, default_area
from .energy import check_energy, default_energy
from .fabric import check_fabric, default_fabric
from .function_unit import canonical as canonical_function_unit, check_function_unit
from .host import check_host, default_host
from .isa import ACC_DTYPE

DEFAULT_ARCH = "cgra-8x8"


class ArchError(ValueError):
    """A hardware description is malformed or names something unknown."""


#: The largest value each field may take. The simulator holds the scratchpad in memory (1 GiB at
#: most) and every size must stay far inside the runtime's int64 arithmetic; the others are well
#: beyond any NPU (a 1024 x 1024 PE array, 64 KiB per cycle of DMA).
MAXIMUM = {"rows": 1 << 10, "cols": 1 << 10, "spad_bytes": 1 << 30, "spad_banks": 1 << 10,
           "bank_width_bytes": 1 << 10, "dma_bytes_per_cycle": 1 << 16, "vector_lanes": 1 << 16,
           "dma_latency": 1 << 31, "config_load_cycles": 1 << 31, "macs_per_pe": 1 << 16}
#: Integer fields that must be at least 1, and those that may be 0.
POSITIVE = ("rows", "cols", "spad_bytes", "spad_banks", "bank_width_bytes", "dma_bytes_per_cycle", "vector_lanes")
NON_NEGATIVE = ("dma_latency", "config_load_cycles")
CLOCK_MHZ_BELOW = 1e6
#: Input dtypes the PE array computes on (macs_per_pe's keys).
PE_DTYPES = tuple(d.numpy_name for d in ACC_DTYPE)

#: What each field means and its unit: the reference docs/hardware-description.md and the JSON
#: Schema are generated from these (arch_doc.py), so they cannot drift from the class.
FIELD_DOCS = {
    "name": ("", "the chip's name: reports, profiles and the target tag `register_arch` makes use it"),
    "rows": ("PEs", "rows of the PE array: an output tile's rows are computed in folds of this many"),
    "cols": ("PEs", "columns of the PE array: output columns (channels) per fold"),
    "macs_per_pe": ("MACs / PE / cycle", "per input dtype the PE array computes (float32, int8, "
                                         "bfloat16, float16, int16; int8 accumulates in int32, bfloat16 and "
                                         "float16 in float32, int16 (times int8 weights) in int64): MACs "
                                         "each PE does per cycle. A dtype "
                                         "left out is one the chip cannot compute: its layers stay on the host"),
    "spad_bytes": ("bytes", "scratchpad capacity: every kernel's tiles must fit it (the compiler checks)"),
    "spad_banks": ("banks", "scratchpad banks, interleaved every `bank_width_bytes`"),
    "bank_width_bytes": ("bytes / cycle", "what one bank delivers per cycle; accesses to one bank serialise "
                                          "(docs/simulator.md, Scratchpad banks)"),
    "dma_bytes_per_cycle": ("bytes / cycle", "DMA bandwidth between host memory and the scratchpad, for each "
                                             "of the load and the store engine"),
    "dma_latency": ("cycles", "from a DMA's issue to its first byte"),
    "config_load_cycles": ("cycles", "to load a PE-array configuration of one context slot in every PE (the "
                                     "systolic cell of GEMM and DEPTHWISE takes one on the presets, a FABRIC "
                                     "body its II)"),
    "vector_lanes": ("elements / cycle", "the vector unit's width (FILL, EPILOGUE, ELTWISE, POOL, REDUCE: a lane a row, "
                                         "VFUNC: a lane runs a function's sequence one operation a cycle, unless "
                                         "the chip's `function_unit` pipelines it)"),
    "clock_mhz": ("MHz", "the clock all cycles count; turns cycles into time"),
    "energy": ("pJ", "energy per MAC and vector operation (by dtype), scratchpad byte read and written, "
                     "DMA byte, configuration load, and leakage per cycle (cgra_sim/energy.py). Optional: "
                     "without it, published 45 nm figures for this chip's sizes"),
    "area": ("µm²", "area of a MAC unit (by dtype), of the rest of a PE, of a KiB of scratchpad, of a vector "
                    "lane and of a function unit's pipeline stage (cgra_sim/area.py); `area_mm2` sums them. "
                    "Optional: without it, published 45 nm figures"),
    "fabric": ("", "the PE array as a CGRA: interconnect topology, registers per PE, which PEs reach the "
                   "scratchpad and which multiply, operation latencies, context depth (the largest II) and "
                   "configuration word size (cgra_sim/fabric.py; docs/mapping.md). Optional: without it a mesh "
                   "with this project's defaults"),
    "host": ("", "the host CPU that runs the operators left off the NPU: its clock (MHz), the arithmetic operations "
                 "and tensor bytes it sustains per cycle, and its cycles of overhead per call (cgra_sim/host.py). "
                 "Profiles add its modelled time to the NPU's cycles. Optional: without it a modest Arm "
                 "application core (Cortex-A55 class), which leaves the description's fingerprint as it was"),
    "function_unit": ("", "a pipelined datapath for VFUNC's special functions beside the vector lanes: its lanes "
                          "(pipelines, each an element a cycle) and the functions it has, one stage per operation of "
                          "a function's float32 sequence, the same bits as the lanes compute (cgra_sim/function_unit.py). "
                          "Optional: without it (or null) every VFUNC runs on the lanes one operation a cycle, "
                          "and the description keeps its fingerprint"),
    "dma_prefetch": ("", "whether the load engine may run the next kernel launch's loads of constant operands (the "
                         "weights the runtime holds, flagged in the slot table) in its idle time at the end of the "
                         "launch running, each once nothing of that launch uses its scratchpad bytes any more "
                         "(cgra_sim/prefetch.py; docs/simulator.md, Weight prefetch). Only cycles change. Optional: "
                         "false when absent, which keeps a description's JSON and fingerprint"),
}


@dataclasses.dataclass(frozen=True)
class HardwareDescription:
    """One CGRA NPU. All sizes in bytes, all times in cycles of `clock_mhz`. What each field means,
    its unit and limits: FIELD_DOCS above (docs/hardware-description.md is generated from it)."""

    name: str
    rows: int
    cols: int
    # The dicts are left out of the hash (a dict cannot be hashed); equality still compares them,
    # so equal descriptions hash equal.
    macs_per_pe: Mapping[str, int] = dataclasses.field(hash=False)
    spad_bytes: int
    spad_banks: int
    bank_width_bytes: int
    dma_bytes_per_cycle: int
    dma_latency: int
    config_load_cycles: int
    vector_lanes: int
    clock_mhz: float
    energy: Mapping | None = dataclasses.field(default=None, hash=False)  # None: energy.default_energy
    area: Mapping | None = dataclasses.field(default=None, hash=False)  # None: area.default_area
    fabric: Mapping | None = dataclasses.field(default=None, hash=False)  # None: fabric.default_fabric
    # None: host.default_host, kept None (not filled in like the tables above) so that a
    # description without it keeps the JSON and fingerprint it had before the field existed.
    host: Mapping | None = dataclasses.field(default=None, hash=False)
    # None: no function unit (VFUNC on the lanes), kept out of the JSON like `host`.
    function_unit: Mapping | None = dataclasses.field(default=None, hash=False)
    # False: kept out of the JSON, like `host`, so descriptions without it keep their fingerprint.
    dma_prefetch: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ArchError("hardware description needs a non-empty 'name'")
        for field in POSITIVE:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ArchError(f"{self.name}: '{field}' must be a positive integer, got {value!r}")
        for field in NON_NEGATIVE:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ArchError(f"{self.name}: '{field}' must be a non-negative integer, got {value!r}")
        for field, maximum in MAXIMUM.items():
            if field != "macs_per_pe" and getattr(self, field) > maximum:
                raise ArchError(f"{self.name}: '{field}' is {getattr(self, field)}, more than the {maximum} "
                                "this simulator takes (see cgra_sim.arch.MAXIMUM)")
        if not (isinstance(self.clock_mhz, (int, float)) and not isinstance(self.clock_mhz, bool)
                and 0 < self.clock_mhz < CLOCK_MHZ_BELOW):
            raise ArchError(f"{self.name}: 'clock_mhz' must be a positive number below {CLOCK_MHZ_BELOW:.0f}, "
                            f"got {self.clock_mhz!r}")
        if not isinstance(self.dma_prefetch, bool):
            raise ArchError(f"{self.name}: 'dma_prefetch' must be true or false, got {self.dma_prefetch!r}")
        if not self.macs_per_pe:
            raise ArchError(f"{self.name}: 'macs_per_pe' must name at least one dtype")
        for dtype, macs in self.macs_per_pe.items():
            if dtype not in PE_DTYPES:
                raise ArchError(f"{self.name}: macs_per_pe names '{dtype}': the PE array computes on "
                                f"{', '.join(PE_DTYPES)} inputs (int8 accumulating in int32, bfloat16 and "
                                "float16 in float32, int16 x int8 in int64)")
            if not isinstance(macs, int) or isinstance(macs, bool) or not 0 < macs <= MAXIMUM["macs_per_pe"]:
                raise ArchError(f"{self.name}: macs_per_pe['{dtype}'] must be a positive integer up to "
                                f"{MAXIMUM['macs_per_pe']}, got {macs!r}")
        if self.spad_bytes % (self.spad_banks * self.bank_width_bytes):
            raise ArchError(f"{self.name}: spad_bytes ({self.spad_bytes}) must be a multiple of "
                            f"spad_banks * bank_width_bytes ({self.spad_banks * self.bank_width_bytes})")
        # A frozen dataclass still holds the caller's dict: keep our own immutable copy.
        object.__setattr__(self, "macs_per_pe", dict(sorted(self.macs_per_pe.items())))
        self._check_tables()

    def _check_tables(self) -> None:
        """Validate the optional tables, filling in the defaults of energy, area and fabric (host
        and function_unit stay None without them), and keep our own sorted copies."""
        defaults = {"energy": lambda: default_energy(self.rows, self.cols, self.spad_bytes, self.spad_banks,
                                                     self.macs_per_pe),
                    "area": lambda: default_area(self.macs_per_pe), "fabric": default_fabric}
        checks = {"energy": lambda t: check_energy(t, self.macs_per_pe),
                  "area": lambda t: check_area(t, self.macs_per_pe), "fabric": check_fabric, "host": check_host,
                  "function_unit": lambda t: check_function_unit(t, self.vector_lanes)}
        for field, check in checks.items():
            table = getattr(self, field)
            if table is None and field in defaults:
                table = defaults[field]()
            if table is None:
                continue
            problem = check(table)
            if problem:
                raise ArchError(f"{self.name}: {problem}")
            kept = canonical_function_unit(table) if field == "function_unit" else _sorted_table(table)
            object.__setattr__(self, field, kept)

    # Derived sizes.
    @property
    def num_pes(self) -> int:
        return self.rows * self.cols

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Input dtypes the PE array computes on."""
        return tuple(self.macs_per_pe)

    def peak_macs_per_cycle(self, dtype: str) -> int:
        return self.num_pes * self.macs_per_pe[str(dtype)]

    def area_breakdown(self) -> dict:
        """mm² of the PE array, the scratchpad and the vector unit (area.py says what is counted)."""
        return chip_area(self)

    @property
    def area_mm2(self) -> float:
        return sum(chip_area(self).values())

    @property
    def host_cpu(self) -> dict:
        """The host CPU's figures (cgra_sim/host.py): the `host` table, or the default one."""
        return dict(self.host) if self.host is not None else default_host()

    # Serialisation.
    def to_dict(self) -> dict:
        """Every field; `host`, `function_unit` and `dma_prefetch` only when the description sets them
        (see the fields)."""
        data = dataclasses.asdict(self)
        for field in ("host", "function_unit", "dma_prefetch"):
            if data[field] in (None, False):
                del data[field]
        return data

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces): what compiled code embeds."""
        return self._canonical_json

    @functools.cached_property
    def _canonical_json(self) -> str:
        """to_json's text, made once: the description is frozen, and every cache key asks for its
        fingerprint (180 us a time: ResNet-50's compile asked 84 times for the JSON alone)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def fingerprint(self) -> str:
        """Hash of every parameter; enters every cache key and every compiled artifact."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: Mapping) -> "HardwareDescription":
        """A description from its JSON object; a "$schema" key (for editors) is ignored."""
        data = {key: value for key, value in data.items() if key != "$schema"}
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        missing = sorted(fields - set(data) - {"energy", "area", "fabric", "host", "function_unit", "dma_prefetch"})  # the defaults
        if unknown:
            raise ArchError(f"hardware description has unknown keys {unknown} (known: {sorted(fields)})")
        if missing:
            raise ArchError(f"hardware description is missing keys {missing}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "HardwareDescription":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ArchError(f"hardware description is not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise ArchError("hardware description must be a JSON object")
        return cls.from_dict(data)


def _sorted_table(table: Mapping) -> dict:
    """Our own copy of an energy or area table, keys sorted (a frozen dataclass still holds the
    caller's dict)."""
    return {key: dict(sorted(value.items())) if isinstance(value, dict) else value
            for key, value in sorted(table.items())}


def preset_names() -> list[str]:
    folder = resources.files(__package__).joinpath("presets")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_arch(name_or_path: "str | os.PathLike | HardwareDescription | None" = None) -> HardwareDescription:
    """A preset by name (`cgra-8x8`), a user's JSON file by path, or a description as is."""
    if isinstance(name_or_path, HardwareDescription):
        return name_or_path
    if name_or_path is None:
        name_or_path = DEFAULT_ARCH
    text = str(name_or_path)
    if text in preset_names():
        source = resources.files(__package__).joinpath("presets", text + ".json").read_text()
        return HardwareDescription.from_json(source)
    if os.path.exists(text):
        with open(text, encoding="utf-8") as handle:
            return HardwareDescription.from_json(handle.read())
    raise ArchError(f"unknown CGRA architecture '{text}': not a preset ({', '.join(preset_names())}) "
                    "and no such file. Pass a preset name or the path of a JSON description.")
