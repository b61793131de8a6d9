"""`cgra-sim`: check one kernel against numpy (npu_backend/tools/verify.py), compile and simulate a
whole ONNX model (npu_backend/tools/run_model.py), sweep chips x models (npu_backend/tools/sweep.py),
replay a recorded kernel launch, map an intrinsic onto the PE fabric (cgra_sim/mapping), list the
patterns a schedule can be registered for (npu_backend/tools/patterns.py), or serve compiled models
over TVM RPC (npu_backend/tools/remote.py).

Stage: tools (command line). `verify` and `run` run the same pipeline as
`tvm.compile(target="cgra")` and import the compiler when they start; `--help`, `--version`,
`replay` and `map` (the simulator's own commands) never import tvm, so they answer at
once. Exit status: 0 on success, 1 when a result does not match its reference, 2 on bad input,
3 when `verify`'s kernel did not run on the NPU (arguments.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from cgra_sim.__main__ import REPLAY_DESCRIPTION, REPLAY_HELP, add_replay_arguments, run_replay
from cgra_sim.mapping.command import DESCRIPTION as MAP_DESCRIPTION
from cgra_sim.mapping.command import HELP as MAP_HELP
from cgra_sim.mapping.command import add_map_arguments, run_map

from .arguments import (EXIT_MISMATCH, EXIT_OK, EXIT_USAGE, UsageError, add_observation_arguments, ints, named,
                        observe, publish)
from .sweep_arguments import DESCRIPTION as SWEEP_DESCRIPTION
from .sweep_arguments import HELP as SWEEP_HELP
from .sweep_arguments import add_sweep_arguments, run_sweep_command
from .verify_arguments import add_verify_arguments

__all__ = ["UsageError", "main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cgra-sim",
        description="Compile for the CGRA NPU, run on its cycle-approximate simulator, and check "
                    "the results. Architectures are presets (cgra-4x4, cgra-8x8, cgra-16x16) or a "
                    "JSON hardware description file. Exit status: 0 success, 1 a result differs from "
                    "its reference, 2 bad input, 3 (verify) the kernel did not run on the NPU.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)

    add_verify_arguments(sub.add_parser(
        "verify", help="compile one kernel, simulate it and compare with numpy (PASS/FAIL)",
        description="Compile one kernel (matmul or conv2d with bias and relu unless disabled, a "
                    "batched matmul, a pool or an elementwise op), run it on the simulator with "
                    "random inputs and compare with numpy: integers must match exactly, float32 "
                    "within 1e-5 relative. Prints PASS or FAIL with cycles; FAIL with exit status 3 "
                    "and the reason when the compiler keeps the operator on the host."))

    run = sub.add_parser(
        "run", help="compile an ONNX model, simulate it and report cycles per layer (ONNX node names)",
        description="Import an ONNX model, compile it for the CGRA NPU (unsupported operators stay "
                    "on the host), run it on random inputs and print a per-layer table: each kernel launch and "
                    "host operator with the ONNX nodes it came from, its ops, output, cycles, utilisation and "
                    "DMA bytes.")
    run.add_argument("model", help="path of an .onnx file")
    run.add_argument("--arch", default="cgra-8x8", help="preset name or JSON file (default cgra-8x8)")
    run.add_argument("--check", action="store_true",
                     help="compare the outputs with onnxruntime (float32 within 1e-4 relative)")
    run.add_argument("--dump-dir", help="write every compiler stage's output under this directory, and "
                                        "each kernel launch's command stream under DIR/streams (a "
                                        "launch file for replay and a .txt listing)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    run.add_argument("--shape", action="append", default=[], type=named(ints), metavar="NAME=D1,D2,...",
                     help="the size to run input NAME at (repeat for several inputs). An input with "
                          "dynamic dimensions (an ONNX dim_param such as a batch or a width) needs it: "
                          "those dimensions stay symbolic, the model is compiled once and runs at this "
                          "size, e.g. --shape x=1,3,48,320")
    run.add_argument("--input", action="append", default=[], type=named(str), metavar="NAME=FILE.npy",
                     help="run input NAME on the array in FILE.npy (numpy.save) instead of random data "
                          "(repeat for several inputs); its dtype must be the input's, its shape fit the "
                          "input's declaration")
    run.add_argument("--fuse-chains", action="store_true",
                     help="run an elementwise chain after a conv or matmul (a leaky relu, a hard-swish) inside "
                          "that kernel, on each output tile, instead of as a kernel of its own: less DRAM "
                          "traffic and energy, a few percent more cycles (npu_backend.compile's fuse_chains)")
    run.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    run.add_argument("--csv", metavar="FILE.csv",
                     help="also write the per-layer table to FILE.csv: layer, nodes, ops, output, where (npu or "
                          "host), kernel, cycles (a host layer's modelled at the NPU clock), macs (the model's), "
                          "padded_macs (the PE array's), utilisation, dma_bytes, energy_pj (the kernel's energy in "
                          "pJ), seconds (a host layer's measured wall time)")
    run.add_argument("--report-dir", metavar="DIR",
                     help="also write the run's report to DIR: layers.txt, layers.csv, report.json, trace.json, "
                          "and with matplotlib (the plots extra) roofline.png (each layer against the chip's "
                          "compute and DMA roofs) and utilisation.png (PE array, vector unit and DMA busy over time)")
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="show progress on stderr (each kernel compiled, each kernel launch "
                          "simulated); default: only when stderr is a terminal and without --json")
    add_observation_arguments(run)

    add_replay_arguments(sub.add_parser("replay", help=REPLAY_HELP, description=REPLAY_DESCRIPTION))

    add_sweep_arguments(sub.add_parser("sweep", help=SWEEP_HELP, description=SWEEP_DESCRIPTION))
    add_map_arguments(sub.add_parser("map", help=MAP_HELP, description=MAP_DESCRIPTION))

    patterns = sub.add_parser(
        "patterns", help="list every pattern and op a schedule or kernel can be registered for",
        description="List the names npu_backend.schedules.register_schedule and register_kernel accept: "
                    "each fusion pattern with its family and the Relax ops a match calls in data-flow "
                    "order (docs/patterns.md holds the same table), then the ops.")
    patterns.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    serve = sub.add_parser(
        "serve", help="serve compiled models over TVM RPC, as a board with the NPU would",
        description="Start TVM's RPC server with the NPU runtime loaded (the simulator as the device). A "
                    "host then connects with tvm.rpc.connect(HOST, PORT), uploads an exported library "
                    "(ex.export_library) and runs it in a VM on the remote device; "
                    "npu_backend.tools.remote.run_remote does those steps and returns the outputs and the "
                    "remote profile (cycles per kernel). Anyone who can connect can run code here: use a "
                    "trusted network. Needs psutil (the remote extra). Ctrl-C stops it.")
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0: all)")
    serve.add_argument("--port", type=int, default=9091, help="first port to try (default 9091)")
    serve.add_argument("--port-end", type=int, default=9199, help="last port to try (default 9199)")
    return parser


def _version() -> str:
    from importlib import metadata

    try:
        return f"cgra-sim (npu-backend) {metadata.version('npu-backend')}"
    except metadata.PackageNotFoundError:
        return "cgra-sim 0+unknown (npu-backend, not installed)"  # npu_backend.__version__ says the same


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _verify(args) -> int:
    from npu_backend.tools.verify import run_verify

    return run_verify(args)


def _run(args) -> int:
    from npu_backend.progress import StatusLine
    from npu_backend.tools.run_model import run_onnx_model

    import numpy as np

    for option, path in (("--csv", args.csv), ("--trace", args.trace)):  # --report-dir is made
        folder = os.path.dirname(os.path.abspath(path)) if path else ""
        if path and not os.path.isdir(folder):  # before the compile, not after it
            raise UsageError(f"{option} {path}: the folder {folder} does not exist")
    shapes = _by_name("--shape", args.shape)
    inputs = {name: np.load(path, allow_pickle=False) for name, path in _by_name("--input", args.input).items()}
    show = args.progress if args.progress is not None else not args.json and sys.stderr.isatty()
    status = StatusLine(sys.stderr) if show else None
    try:
        with observe(args) as prof:  # sees the same launches as the model runner's own profile
            report = run_onnx_model(args.model, args.arch, check=args.check, dump_dir=args.dump_dir,
                                    seed=args.seed, progress=status.show if status else None,
                                    shapes=shapes, inputs=inputs, fuse_chains=args.fuse_chains)
    finally:
        if status is not None:
            status.close()
    written = publish(args, prof, report)
    if args.csv:
        from npu_backend.tools.layers import write_layers_csv

        write_layers_csv(report["layers"], args.csv)
        report["csv"] = args.csv
        written.append(f"per-layer table: {args.csv}")
    if args.report_dir:
        import npu_backend
        from npu_backend.tools.report import write_report

        files = write_report(args.report_dir, report, prof.timelines, npu_backend.load_arch(args.arch))
        report["report_dir"] = args.report_dir
        written.append(f"report in {args.report_dir}: {', '.join(files)}")
    if args.json:
        print(json.dumps(report))
    else:
        print(report["table"])
        print(f"{report['npu_mac_fraction']:.2%} of the model's MACs run on the NPU; on the host: "
              f"{', '.join(report['host_ops']) or 'nothing'}")
        print("\n".join(written), end="\n" if written else "")
        if args.check:
            verdict = "PASS" if report["check"]["passed"] else "FAIL"
            print(f"{verdict} against onnxruntime: max relative error {report['check']['max_rel_error']:.2e}")
    return EXIT_OK if not args.check or report["check"]["passed"] else EXIT_MISMATCH


def _map(args) -> int:
    """`run_map`; without matplotlib, `--png` prints the mapping first, then says what is missing."""
    if args.png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            run_map(argparse.Namespace(**{**vars(args), "png": None}))
            return _usage("map --png needs matplotlib (the plots extra): pip install 'npu-backend[plots]'")
    return run_map(args)


def _patterns(args) -> int:
    from npu_backend.tools.patterns import patterns_json, patterns_text

    print(json.dumps(patterns_json()) if args.json else patterns_text())
    return EXIT_OK


def _serve(args) -> int:
    from npu_backend.tools.remote import serve

    return serve(args.host, args.port, args.port_end, say=lambda message: print(message, flush=True))


def _by_name(option: str, pairs: list) -> dict:
    """NAME=VALUE arguments as a dict; a name given twice is a usage error."""
    result = {}
    for name, value in pairs:
        if name in result:
            raise UsageError(f"{option} gives '{name}' twice")
        result[name] = value
    return result


def _usage(message: str) -> int:
    print(f"cgra-sim: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _runtime_build_error() -> type:
    """RuntimeBuildError once npu_backend is imported (a command that needs the runtime imports
    it), else a class nothing raises: replay and map never import tvm."""
    module = sys.modules.get("npu_backend.device.runtime_lib")
    return module.RuntimeBuildError if module is not None else _NeverRaised


class _NeverRaised(Exception):
    pass


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    started = time.time()
    try:
        status = {"verify": _verify, "run": _run, "replay": run_replay, "serve": _serve,
                  "sweep": run_sweep_command, "map": _map, "patterns": _patterns}[args.command](args)
    except ImportError as err:  # an optional extra that is not installed (onnx, matplotlib, ...)
        return _usage(f"{args.command}: {err}")
    except OSError as err:  # a missing model, an unwritable --trace or --record-dir
        where = f": '{err.filename}'" if err.filename else ""
        return _usage(f"{args.command}: {err.strerror or err}{where}")
    except (ValueError, _runtime_build_error()) as err:  # bad arguments, chip files, unsupported models
        # (CGRAError too), no cmake to build the runtime with
        where = f"{args.command} --op {args.op}" if getattr(args, "op", None) else args.command
        return _usage(f"{where}: {err}")
    if not getattr(args, "json", False) and status != EXIT_USAGE:  # a usage error is one line
        _progress(f"done in {time.time() - started:.1f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
