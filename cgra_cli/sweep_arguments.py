"""`cgra-sim sweep`: its arguments and what it prints.

Stage: tools (command line). The job is npu_backend/tools/sweep.py; the frontier and its
picture npu_backend/tools/pareto.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .arguments import EXIT_OK, UsageError

HELP = "compile and simulate models on many chips (a grid over hardware fields): table, CSV, Pareto picture"
DESCRIPTION = (
    "Compile and simulate each ONNX model on each chip of a grid over hardware fields (every "
    "combination of the --set values, or --sample of them) and write one tidy table: every field of "
    "the chip, its area, the model's cycles, time, energy, share of MACs on the NPU, compile and "
    "simulation time (OUT/results.csv, OUT/results.jsonl), and with matplotlib (the plots extra) "
    "OUT/pareto.png: cycles against energy against area, the Pareto frontier ringed. Points run in "
    "worker processes (--jobs) or on Ray (--ray); finished points are cached by (model, chip, "
    "compiler version), so a re-run computes only what changed. Example: cgra-sim sweep "
    "examples/tiny_cnn.onnx --set rows=4,8,16 --set cols=4,8 --set spad_bytes=128K,256K --out sweep/")


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="+", metavar="MODEL.onnx", help="the models every chip runs")
    parser.add_argument("--arch", default="cgra-8x8",
                        help="the chip the grid starts from: a preset or a JSON file (default cgra-8x8)")
    parser.add_argument("--set", action="append", default=[], dest="settings", metavar="FIELD=V1,V2,...",
                        help="values to try for a field (repeat for several fields): rows, cols, spad_bytes, "
                             "spad_banks, bank_width_bytes, dma_bytes_per_cycle, dma_latency, config_load_cycles, "
                             "vector_lanes, clock_mhz, macs_per_pe.<dtype>, function_unit.lanes (0: none); sizes take K "
                             "and M (spad_bytes=128K); the PE "
                             "fabric's fabric.topology (mesh, torus, hycube), fabric.hops_per_cycle, fabric.registers, "
                             "fabric.memory_ports (left, border, all), fabric.multipliers (all, checkerboard), "
                             "fabric.context_depth, fabric.config_word_bits and fabric.latency.alu / .mul / .mem "
                             "(their mappings set GEMM's and FABRIC's cycles); and the "
                             "compiler's fuse_chains=off,on (elementwise chains inside the conv / matmul kernels: "
                             "fewer DRAM bytes and less energy for a few percent more cycles; a point is then named "
                             "'<chip>,fuse_chains=on'). A combination that is not a valid chip is reported and skipped")
    parser.add_argument("--sample", type=int, metavar="N", help="run N combinations drawn at random (--seed) "
                                                                "instead of all of them")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample and of the random inputs (default 0)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for results.csv, results.jsonl, pareto.png")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="worker processes (default: the machine's cores; 1 runs every point in this process)")
    parser.add_argument("--ray", metavar="ADDRESS", help="run the points as Ray tasks: 'local' starts Ray on this "
                                                         "machine, 'auto' or HOST:PORT joins a cluster whose nodes "
                                                         "have npu-backend installed (the ray extra)")
    parser.add_argument("--cache-dir", metavar="DIR", help="where finished points are kept (default: the "
                                                           "runtime's cache folder, sweep/)")
    parser.add_argument("--no-cache", action="store_true", help="compute every point, keep nothing")
    parser.add_argument("--json", action="store_true", help="print one JSON object (rows, frontier, files)")


def run_sweep_command(args) -> int:
    from npu_backend.progress import StatusLine
    from npu_backend.tools import pareto, sweep

    if args.jobs < 1 or (args.sample is not None and args.sample < 1):
        raise UsageError("--jobs and --sample must be at least 1")
    if not args.settings:
        raise UsageError("give at least one --set FIELD=V1,V2,... (the fields the sweep varies)")
    todo, invalid = sweep.tasks(args.arch, [sweep.parse_setting(s) for s in args.settings], args.models,
                                args.sample, args.seed)
    status = StatusLine(sys.stderr) if not args.json else None
    started = time.perf_counter()
    try:
        rows = sweep.run_sweep(todo, args.jobs, args.ray, None if args.no_cache else sweep.point_cache(args.cache_dir),
                               status.show if status else None)
    finally:
        if status:
            status.close()
    wall = time.perf_counter() - started
    files = sweep.write_table(rows + invalid, args.out)
    summaries = pareto.chip_summaries(rows)
    best = pareto.frontier(summaries)
    notes = []
    try:
        files.append(pareto.plot_pareto(summaries, os.path.join(args.out, "pareto.png")))
    except ImportError as err:
        notes.append(f"no pareto.png: {err}")
    if args.json:
        print(json.dumps({"rows": rows, "invalid_chips": invalid, "frontier": [s["chip"] for s in best],
                          "files": files, "wall_s": wall}))
        return EXIT_OK
    failed = [row for row in rows if row["error"]]
    print(_table(summaries, {s["chip"] for s in best}, failed, invalid))
    print(f"{len(rows)} points ({len(summaries)} chips x {len(args.models)} models) in {wall:.1f} s; "
          f"{len(failed)} failed, {len(invalid)} chips not valid (the table says why)")
    print("\n".join([f"wrote {', '.join(files)}"] + notes))
    return EXIT_OK


def _table(summaries: list[dict], best: set, failed: list[dict] = (), invalid: list[dict] = ()) -> str:
    """One line per chip that ran every model, cycles first; then each failed point (its chip,
    model and error) and each chip the sweep refused (not valid, or a fabric that cannot map the
    PE array's cell), with the reason."""
    from npu_backend.tools.pareto import short_name

    lines = [f"{'chip':48} {'area mm2':>9} {'cycles':>12} {'energy uJ':>10} {'on NPU':>7}  frontier"]
    for s in sorted(summaries, key=lambda s: s["cycles"]):
        lines.append(f"{short_name(s['chip'])[:48]:48} {s['area_mm2']:9.3f} {s['cycles']:12,} "
                     f"{s['energy_pj'] / 1e6:10.2f} {s['npu_mac_fraction']:7.1%}  {'*' if s['chip'] in best else ''}")
    for row in failed:
        lines.append(f"{short_name(row['chip'])[:48]:48} failed on {row['model']}: {row['error']}")
    for row in invalid:
        lines.append(f"{short_name(row['chip'])[:48]:48} not run: {row['error'].removeprefix(row['chip'] + ': ')}")
    return "\n".join(lines)
