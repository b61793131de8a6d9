"""Timeline export: simulated timelines as a Chrome trace (chrome://tracing, ui.perfetto.dev).

Stage: simulator tooling. In: per kernel launch its name, `Timeline` (timing.py), the clock of the
hardware description it ran on and optionally its command records (for the key fields of each
command). Out: a dict in the Trace Event Format's JSON object form, ready for `json.dump`.

Layout: one process per launch, the launches laid end to end on one timeline (launch i starts
where launch i-1 ended: the host work between them is not simulated); one track (thread) per unit,
top to bottom LOAD, COMPUTE, VECTOR, STORE; one complete ("X") event per command. Times are in
microseconds at the arch's clock (ts = cycle / clock_mhz). An event spans the cycles the command
kept its unit busy, so events on one track never overlap; a DMA's completion, `dma_latency`
later, is in its args as `end_cycle`. Where a unit sat free waiting for its next command's
dependency, a "stall" event (category "stall", named after the command waited for, e.g.
"stall: waits for LOAD cmd #3") fills the gap before that command, so each track shows busy,
stalled and idle (empty) time as in `KernelStats`.
"""

from __future__ import annotations

import json
import os
from typing import Iterable, NamedTuple

import numpy as np

from .isa import (BOX_DIMS, EPILOGUE_BIAS, EPILOGUE_CLIP, EPILOGUE_DEQUANTISE, EPILOGUE_RELU, EPILOGUE_REQUANTISE,
                  EPILOGUE_RESIDUAL, FIELDS, GEMM_ACCUMULATE, POOL_AVERAGE, DType, EltwiseFunc, Op, ReduceFunc, Unit, VFunc)
from .renamed import renamed_property
from .timing import Timeline

#: Track order, top to bottom, and each unit's thread id (1-based: some viewers treat 0 specially).
UNIT_TRACKS = (Unit.LOAD, Unit.COMPUTE, Unit.VECTOR, Unit.STORE)
TID_OF = {unit: position + 1 for position, unit in enumerate(UNIT_TRACKS)}


class TracedLaunch(NamedTuple):
    """One kernel launch on the timeline."""

    name: str
    timeline: Timeline
    clock_mhz: float
    commands: np.ndarray | None = None  # int64 records (n, RECORD_WORDS): adds key fields to args

    schedule = renamed_property("schedule", "timeline")


def _fields(op: Op, record, *names: str) -> dict:
    return {name: int(record[FIELDS[op].index(name)]) for name in names}


def _dtype_name(code: int) -> str:
    try:
        return DType(code).numpy_name
    except ValueError:  # records straight from a caller, not validated: show the raw code
        return str(code)


def _dma_args(op: Op, record) -> dict:
    args = _fields(op, record, "slot", "spad_addr")
    args["origin"] = [int(record[FIELDS[op].index(f"origin{d}")]) for d in range(BOX_DIMS)]
    args["box"] = [int(record[FIELDS[op].index(f"extent{loop}")]) for loop in range(BOX_DIMS)]
    return args


def _gemm_args(op: Op, record) -> dict:
    args = _fields(op, record, "m", "n", "k", "a_addr", "b_addr", "acc_addr")
    args["dtype"] = _dtype_name(int(record[FIELDS[op].index("dtype")]))
    args["accumulate"] = bool(record[1] & GEMM_ACCUMULATE)
    return args


def _fill_args(op: Op, record) -> dict:
    args = _fields(op, record, "addr", "rows", "cols")
    args["dtype"] = _dtype_name(int(record[FIELDS[op].index("dtype")]))
    return args


def _epilogue_args(op: Op, record) -> dict:
    args = _fields(op, record, "m", "n", "acc_addr", "out_addr")
    args.update(bias=bool(record[1] & EPILOGUE_BIAS), relu=bool(record[1] & EPILOGUE_RELU),
                residual=bool(record[1] & EPILOGUE_RESIDUAL), clip=bool(record[1] & EPILOGUE_CLIP),
                requantise=bool(record[1] & EPILOGUE_REQUANTISE), dequantise=bool(record[1] & EPILOGUE_DEQUANTISE))
    return args


def _eltwise_args(op: Op, record) -> dict:
    args = _fields(op, record, "rows", "cols", "a_addr", "b_addr", "out_addr")
    func = int(record[FIELDS[op].index("func")])
    args["func"] = EltwiseFunc(func).name.lower() if func in EltwiseFunc._value2member_map_ else str(func)
    args["dtype"] = _dtype_name(int(record[FIELDS[op].index("dtype")]))
    return args


def _func_args(enum):
    def args_of(op: Op, record) -> dict:
        args = _fields(op, record, "rows", "cols", "a_addr", "out_addr")
        func = int(record[FIELDS[op].index("func")])
        args["func"] = enum(func).name.lower() if func in enum._value2member_map_ else str(func)
        return args
    return args_of


def _fabric_args(op: Op, record) -> dict:
    args = _fields(op, record, "rows", "cols", "a_addr", "b_addr", "out_addr", "nodes")
    args["dtype"] = _dtype_name(int(record[FIELDS[op].index("dtype")]))
    return args


def _pool_args(op: Op, record) -> dict:
    args = _fields(op, record, "oh", "ow", "n", "kh", "kw", "a_addr", "out_addr")
    args["dtype"] = _dtype_name(int(record[FIELDS[op].index("dtype")]))
    args["average"] = bool(record[1] & POOL_AVERAGE)
    return args


#: The fields worth seeing in a trace viewer, per opcode.
_KEY_ARGS = {
    Op.DMA_LOAD: _dma_args,
    Op.DMA_STORE: _dma_args,
    Op.GEMM: _gemm_args,
    Op.FILL: _fill_args,
    Op.EPILOGUE: _epilogue_args,
    Op.DEPTHWISE: _gemm_args,
    Op.POOL: _pool_args,
    Op.ELTWISE: _eltwise_args,
    Op.FABRIC: _fabric_args,
    Op.REDUCE: _func_args(ReduceFunc),
    Op.VFUNC: _func_args(VFunc),
    Op.UNPACK4: lambda op, record: _fields(op, record, "rows", "cols", "group", "a_addr", "out_addr"),
    Op.LOOKUP: lambda op, record: _fields(op, record, "rows", "cols", "a_addr", "table_addr", "out_addr"),
}


def command_args(record) -> dict:
    """The key fields of one command record, by name (unknown opcodes: just the code)."""
    code = int(record[0])
    if code not in Op._value2member_map_:
        return {"opcode": code}
    op = Op(code)
    return _KEY_ARGS[op](op, record)


def _metadata(pid: int, launch: TracedLaunch) -> list[dict]:
    events = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"{pid - 1}: {launch.name}"}},
              {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}}]
    for unit, tid in TID_OF.items():
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": unit.name}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                       "args": {"sort_index": tid}})
    return events


def _command_events(pid: int, launch: TracedLaunch, offset_us: float) -> list[dict]:
    timeline, clock = launch.timeline, float(launch.clock_mhz)
    events = []
    for index in range(len(timeline.ops)):
        op, unit = Op(int(timeline.ops[index])), Unit(int(timeline.units[index]))
        start, end, busy = (int(timeline.starts[index]), int(timeline.ends[index]),
                            int(timeline.occupancy[index]))
        args = {"index": index, "op": op.name, "start_cycle": start, "end_cycle": end, "busy_cycles": busy}
        if launch.commands is not None:
            args.update(_KEY_ARGS[op](op, launch.commands[index]))
        events.append({"name": op.name, "cat": unit.name.lower(), "ph": "X", "pid": pid,
                       "tid": TID_OF[unit], "ts": offset_us + start / clock, "dur": busy / clock,
                       "args": args})
    return events


def _stall_name(timeline: Timeline, blocker: int) -> str:
    if blocker < 0:  # a timeline built without its causes
        return "stall"
    return f"stall: waits for {Unit(int(timeline.units[blocker])).name} cmd #{blocker}"


def _stall_events(pid: int, launch: TracedLaunch, offset_us: float) -> list[dict]:
    """One event per stalled command, spanning the cycles its unit waited for it."""
    timeline, clock = launch.timeline, float(launch.clock_mhz)
    stalls = timeline.stalls()
    events = []
    for index in np.flatnonzero(stalls > 0):
        index, stall, start = int(index), int(stalls[index]), int(timeline.starts[index])
        blocker = -1 if timeline.waits_for is None else int(timeline.waits_for[index])
        unit = Unit(int(timeline.units[index]))
        events.append({"name": _stall_name(timeline, blocker), "cat": "stall", "ph": "X",
                       "pid": pid, "tid": TID_OF[unit], "ts": offset_us + (start - stall) / clock,
                       "dur": stall / clock,
                       "args": {"waiting": index, "waits_for": blocker, "stall_cycles": stall,
                                "start_cycle": start - stall}})
    return events


def chrome_trace(launches: Iterable["TracedLaunch | tuple"]) -> dict:
    """The trace of `launches` (TracedLaunch or tuples of its fields), in order, end to end."""
    events, offset_us, total_cycles = [], 0.0, 0
    for pid, launch in enumerate(launches, start=1):
        launch = TracedLaunch(*launch)
        if not launch.clock_mhz > 0:
            raise ValueError(f"launch {pid - 1} ({launch.name}): clock_mhz must be positive, "
                             f"got {launch.clock_mhz!r}")
        events += _metadata(pid, launch)
        events += _command_events(pid, launch, offset_us)
        events += _stall_events(pid, launch, offset_us)
        offset_us += launch.timeline.cycles / float(launch.clock_mhz)
        total_cycles += launch.timeline.cycles
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"generator": "cgra_sim.trace", "time_unit": "us at each launch's clock_mhz",
                          "total_cycles": total_cycles, "total_us": offset_us}}


def write_chrome_trace(path, launches: Iterable["TracedLaunch | tuple"]) -> dict:
    """Writes `chrome_trace(launches)` to `path` as JSON; returns the trace."""
    trace = chrome_trace(launches)
    with open(os.fspath(path), "w", encoding="utf-8") as out:
        json.dump(trace, out)
    return trace
