"""Design-space exploration: many chips x many models, each compiled and simulated, in one table.

Stage: tools (the `cgra-sim sweep` job). In: a base chip, the values to try for some of its fields
(`rows=4,8,16`, `spad_bytes=128K,256K`, `macs_per_pe.int8=1,2`, the fabric's `fabric.registers=2,4`,
`fabric.latency.alu=1,2`, `fabric.multipliers=all,checkerboard`) and of the compiler's options
(`fuse_chains=off,on`): every combination, or a seeded random sample of them; and ONNX models.
Out: one row per (chip, model): every field of the chip, its area (which does not price the
fabric's registers or multipliers: area.py's PE overhead is one figure),  the model's cycles, time, energy, the share of its MACs on the NPU, the compile and
simulation times, or the error that stopped it (results.csv and results.jsonl; pareto.py draws
and names the chips on the frontier).

Each point runs `run_onnx_model` (the `cgra-sim run` job) on the same seeded random inputs, in
worker processes (concurrent.futures, `jobs` of them; each compiles its kernels alone, so the
workers are the parallelism), or as Ray tasks (`ray_address`: "local" starts Ray on this machine,
"auto" or HOST:PORT joins a cluster whose nodes have this package installed). A finished point is
kept in the point cache (`<cache>/sweep/`, the kernel cache's store) under a hash of the model's
bytes, the chip's fingerprint, the seed and the compiler's version, so a re-run computes only
the points that changed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import itertools
import json
import multiprocessing
import os
import random
import time

from cgra_sim.arch import ArchError, HardwareDescription, load_arch
from cgra_sim.fabric import KEYS as FABRIC_KEYS
from cgra_sim.fabric import MEMORY_PORTS, MULTIPLIERS, OP_CLASSES, TOPOLOGIES
from cgra_sim.special import OPS as VFUNC_OPS

from ..env import CGRA_COMPILE_JOBS

#: The chip fields a sweep varies, with their parser; `macs_per_pe.<dtype>` is one too.
SCALAR_FIELDS = ("rows", "cols", "spad_bytes", "spad_banks", "bank_width_bytes", "dma_bytes_per_cycle",
                 "dma_latency", "config_load_cycles", "vector_lanes", "clock_mhz")
#: The function unit's lanes (0: none, every VFUNC on the vector lanes).
FUNCTION_UNIT_FIELDS = ("function_unit.lanes",)
#: The PE fabric's fields (docs/mapping.md): `fabric.<key>`, and `fabric.latency.<op class>`; every
#: one reaches the cycles through a mapping (a FABRIC body's, the systolic cell's of every GEMM).
FABRIC_FIELDS = tuple(f"fabric.{key}" for key in FABRIC_KEYS if key != "latency") + \
    tuple(f"fabric.latency.{kind}" for kind in OP_CLASSES)
#: The fabric fields whose values are names, and their choices (the others are integers).
FABRIC_CHOICES = {"fabric.topology": TOPOLOGIES, "fabric.memory_ports": MEMORY_PORTS,
                  "fabric.multipliers": MULTIPLIERS}
#: Compiler options a sweep varies beside the chip (npu_backend.compile's keyword, its values).
OPTION_FIELDS = {"fuse_chains": {"off": False, "on": True, "0": False, "1": True, "false": False, "true": True}}
_SUFFIX = {"K": 1 << 10, "M": 1 << 20}
CACHE_LIMIT_BYTES = 64 << 20
RESULT_COLUMNS = ("area_mm2", "cycles", "time_us", "energy_pj", "npu_mac_fraction", "macs", "compile_s",
                  "simulate_s", "error")


class SweepError(ValueError):
    """A sweep asks for something malformed (a field, a value, a model)."""


def parse_setting(text: str) -> tuple[str, list]:
    """`FIELD=V1,V2,...` as (field, values); sizes may end in K or M (x1024, x1048576)."""
    field, sep, values = text.partition("=")
    dtype = field.partition(".")[2]
    if not sep or not values:
        raise SweepError(f"--set {text}: expected FIELD=V1,V2,... (e.g. rows=4,8)")
    if field in OPTION_FIELDS:
        choices = OPTION_FIELDS[field]
        wrong = [value for value in values.split(",") if value.strip().lower() not in choices]
        if wrong:
            raise SweepError(f"--set {text}: '{field}' takes off or on, not {', '.join(wrong)}")
        return field, list(dict.fromkeys(choices[value.strip().lower()] for value in values.split(",")))
    if field in FABRIC_CHOICES:
        wrong = [value for value in values.split(",") if value.strip() not in FABRIC_CHOICES[field]]
        if wrong:
            raise SweepError(f"--set {text}: '{field}' is one of {', '.join(FABRIC_CHOICES[field])}, not "
                             f"{', '.join(wrong)}")
        return field, list(dict.fromkeys(value.strip() for value in values.split(",")))
    if field not in SCALAR_FIELDS + FUNCTION_UNIT_FIELDS + FABRIC_FIELDS and \
            not (field.startswith("macs_per_pe.") and dtype):
        raise SweepError(f"--set {text}: '{field}' is not a field a sweep can vary; these are: "
                         f"{', '.join(SCALAR_FIELDS + FUNCTION_UNIT_FIELDS)}, macs_per_pe.<dtype>, "
                         f"{', '.join(FABRIC_FIELDS)} and the "
                         f"compiler's {', '.join(OPTION_FIELDS)}")
    try:
        parsed = [_number(field, value.strip()) for value in values.split(",")]
    except ValueError:
        raise SweepError(f"--set {text}: the values of '{field}' must be "
                         f"{'numbers' if field == 'clock_mhz' else 'integers (K and M suffixes allowed)'}") from None
    return field, list(dict.fromkeys(parsed))


def _number(field: str, text: str):
    if field == "clock_mhz":
        return float(text)
    scale = _SUFFIX.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def grid(settings: list[tuple[str, list]], sample: int | None = None, seed: int = 0) -> list[dict]:
    """Every combination of the settings' values (field -> value), or `sample` of them drawn
    without replacement with `seed`."""
    fields = [field for field, _ in settings]
    if len(set(fields)) != len(fields):
        raise SweepError(f"--set gives a field twice: {', '.join(fields)}")
    points = [dict(zip(fields, values)) for values in itertools.product(*(values for _, values in settings))]
    if sample is not None and sample < len(points):
        points = random.Random(seed).sample(points, sample)
    return points


def chip(base: HardwareDescription, changes: dict) -> HardwareDescription:
    """`base` with `changes` (field -> value), named after them; ArchError if the chip is not valid."""
    data = base.to_dict()
    data["macs_per_pe"] = dict(data["macs_per_pe"])
    data["fabric"] = {key: dict(value) if isinstance(value, dict) else value for key, value in data["fabric"].items()}
    for field, value in changes.items():
        if field.startswith("macs_per_pe."):
            data["macs_per_pe"][field.partition(".")[2]] = value
        elif field.startswith("fabric.latency."):
            data["fabric"]["latency"][field.rpartition(".")[2]] = value
        elif field.startswith("fabric."):
            data["fabric"][field.partition(".")[2]] = value
        elif field == "function_unit.lanes":  # 0: none; else the base's functions (or all) in that many lanes
            functions = (base.function_unit or {}).get("functions", sorted(VFUNC_OPS))
            data["function_unit"] = {"lanes": value, "functions": list(functions)} if value else None
        else:
            data[field] = value
    for table in ("energy", "area"):  # the published figures for the new sizes, unless the base has its own
        if getattr(base, table) == getattr(dataclasses.replace(base, **{table: None}), table):
            data[table] = None
    data["name"] = chip_name(base, changes)
    return HardwareDescription(**data)


def chip_name(base: HardwareDescription, changes: dict) -> str:
    """The base chip's name and the changed fields: `cgra-8x8,rows=4,spad_bytes=65536`."""
    return base.name + "".join(f",{field}={value}" for field, value in changes.items())


@dataclasses.dataclass(frozen=True)
class Task:
    """One point: a model on a chip (its JSON, so that it travels to a worker as text)."""

    model: str
    model_digest: str
    chip_json: str
    changes: tuple
    seed: int
    options: tuple = ()  # ((OPTION_FIELDS name, value), ...): npu_backend.compile's keywords

    @property
    def key(self) -> str:
        from ..device.kernel_cache import kernel_key

        return kernel_key(sweep_model=self.model_digest, chip=self.chip_json, seed=str(self.seed),
                          options=json.dumps(self.options))


def evaluate(task: Task) -> dict:
    """Compile and simulate one point (in a worker): the row of the table."""
    from .run_model import run_onnx_model

    arch = HardwareDescription.from_json(task.chip_json)
    options = dict(task.options)
    # A point is the chip and the compiler's options: pareto.py sums and names points by "chip".
    name = arch.name + "".join(f",{field}={'on' if value else 'off'}" for field, value in task.options)
    row = {"model": os.path.basename(task.model), "chip": name, **_fields(arch),
           **{field: "on" if value else "off" for field, value in task.options}}
    started = time.perf_counter()
    try:
        report = run_onnx_model(task.model, arch, seed=task.seed, **options)
    except Exception as err:  # a point that fails is a row that says why; the sweep goes on
        return {**row, "area_mm2": arch.area_mm2, "error": f"{type(err).__name__}: {err}".splitlines()[0]}
    elapsed = time.perf_counter() - started
    return {**row, "area_mm2": arch.area_mm2, "cycles": report["total_cycles"], "time_us": report["time_us"],
            "energy_pj": report["total_energy_pj"], "npu_mac_fraction": report["npu_mac_fraction"],
            "macs": report["total_macs"], "compile_s": report["compile_s"],
            "simulate_s": elapsed - report["compile_s"], "error": ""}


def _fields(arch: HardwareDescription) -> dict:
    fields = {field: getattr(arch, field) for field in SCALAR_FIELDS}
    fields.update({f"macs_per_pe.{dtype}": macs for dtype, macs in arch.macs_per_pe.items()})
    fields["function_unit.lanes"] = arch.function_unit["lanes"] if arch.function_unit else 0
    fields.update({f"fabric.{key}": value for key, value in arch.fabric.items() if key != "latency"})
    fields.update({f"fabric.latency.{kind}": cycles for kind, cycles in arch.fabric["latency"].items()})
    return fields


def _digest(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError as err:
        raise SweepError(f"model {path}: {err.strerror}") from None


def tasks(base, settings, models, sample=None, seed=0) -> tuple[list[Task], list[dict]]:
    """The points to run, and a row for each chip of the grid that is not a valid chip."""
    base = load_arch(base)
    digests = {model: _digest(model) for model in models}
    todo, invalid = [], []
    for point in grid(settings, sample, seed):
        changes = {field: value for field, value in point.items() if field not in OPTION_FIELDS}
        options = tuple((field, value) for field, value in point.items() if field in OPTION_FIELDS)
        try:
            arch = chip(base, changes)
            require_systolic_cell(arch)
        except ArchError as err:
            if all(row["chip"] != chip_name(base, changes) for row in invalid):  # once per chip, whatever the options
                invalid.append({"chip": chip_name(base, changes), **changes, "error": str(err)})
            continue
        todo += [Task(model, digests[model], arch.to_json(), tuple(changes.items()), seed, options)
                 for model in models]
    return todo, invalid


def require_systolic_cell(arch: HardwareDescription) -> None:
    """ArchError when the chip's fabric cannot map the PE array's systolic cell (every GEMM and
    DEPTHWISE runs it: cgra_sim/mapping/pe_array.py), which the compiler would refuse anyway
    (pipeline.require_pe_array): refused here, before any worker imports or compiles a model.
    The mapping, or its failure, is cached on disk, so the workers do not map it again."""
    from cgra_sim.mapping import pe_array

    for dtype in arch.dtypes:
        try:
            pe_array.program(arch, dtype)
        except pe_array.PeArrayError as err:
            raise ArchError(str(err)) from None


def run_sweep(todo: list[Task], jobs: int = 1, ray_address: str | None = None, cache=None, progress=None) -> list[dict]:
    """The rows of `todo`'s points, in `todo`'s order: from `cache` where it has them, the others
    computed by `jobs` worker processes (1: in this process) or by Ray tasks."""
    rows: dict[int, dict] = {}
    for index, task in enumerate(todo):
        hit = cache.get(task.key) if cache is not None else None
        if hit is not None:
            rows[index] = json.loads(hit)
    missing = [index for index in range(len(todo)) if index not in rows]
    meter = _Meter(len(todo), len(rows), progress)
    for index, row in _compute([todo[i] for i in missing], missing, jobs, ray_address):
        rows[index] = row
        if cache is not None and not row["error"]:
            cache.put(todo[index].key, json.dumps(row).encode())
        meter.done(row)
    return [rows[index] for index in range(len(todo))]


def _compute(batch: list[Task], indices: list[int], jobs: int, ray_address: str | None):
    """(index, row) as each point finishes."""
    if not batch:
        return
    if ray_address is not None:
        yield from _compute_on_ray(batch, indices, ray_address)
    elif jobs <= 1:
        for index, task in zip(indices, batch):
            yield index, evaluate(task)
    else:
        # Spawned, not forked: the parent may hold tvm's threads and locks.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(min(jobs, len(batch)), mp_context=context,
                                                    initializer=_one_compile_job) as pool:
            futures = {pool.submit(evaluate, task): index for index, task in zip(indices, batch)}
            for future in concurrent.futures.as_completed(futures):
                yield futures[future], future.result()


def _one_compile_job() -> None:
    os.environ[CGRA_COMPILE_JOBS] = "1"  # the sweep's workers are the parallelism


def _compute_on_ray(batch, indices, address: str):
    try:
        import ray
    except ImportError:
        raise SweepError("--ray needs Ray: pip install 'npu-backend[ray]' (or pip install ray)") from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=None if address == "local" else address, log_to_driver=False,
                 runtime_env={"env_vars": {CGRA_COMPILE_JOBS: "1"}})
    try:
        remote = ray.remote(num_cpus=1)(evaluate)
        pending = {remote.remote(task): index for index, task in zip(indices, batch)}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            yield pending.pop(ready[0]), ray.get(ready[0])
    finally:
        if started_here:
            ray.shutdown()


class _Meter:
    """Progress: points done of all, cached, failed, elapsed time and the time still to go."""

    def __init__(self, total: int, cached: int, say):
        self.total, self.cached, self.computed, self.failed = total, cached, 0, 0
        self.say, self.started = say, time.perf_counter()
        if say:
            say(f"sweep: {total} points, {cached} from the cache, {total - cached} to compute")

    def done(self, row: dict) -> None:
        self.computed += 1
        self.failed += bool(row["error"])
        if not self.say:
            return
        elapsed = time.perf_counter() - self.started
        left = self.total - self.cached - self.computed
        eta = elapsed / self.computed * left
        self.say(f"sweep: {self.cached + self.computed}/{self.total} points ({self.cached} cached, "
                 f"{self.failed} failed), {_clock(elapsed)} elapsed, ETA {_clock(eta)}: {row['chip']} {row['model']}")


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes}:{seconds:02d}"


def point_cache(directory: str | None):
    """The store of finished points: `directory`, else `<runtime cache>/sweep`."""
    from pathlib import Path

    from ..device.runtime_lib import default_cache_dir
    from ..device.kernel_cache import KernelCache

    return KernelCache(Path(directory) if directory else default_cache_dir() / "sweep", CACHE_LIMIT_BYTES)


def write_table(rows: list[dict], folder: str) -> list[str]:
    """results.csv and results.jsonl in `folder`: one row per point, the same columns in both."""
    import csv

    os.makedirs(folder, exist_ok=True)
    columns = list(dict.fromkeys(key for row in rows for key in row if key not in RESULT_COLUMNS))
    columns += list(RESULT_COLUMNS)
    table = os.path.join(folder, "results.csv")
    with open(table, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    lines = os.path.join(folder, "results.jsonl")
    with open(lines, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps({column: row.get(column, "") for column in columns}) + "\n" for row in rows)
    return [table, lines]
