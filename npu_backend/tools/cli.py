"""`cgra-sim`: check one kernel against numpy, compile and simulate a whole ONNX model, or replay
a recorded kernel launch.

Stage: entry (command line). It runs the same pipeline as `tvm.compile(target="cgra")`; `replay`
is the simulator's own command (cgra_sim.__main__) and needs no tvm.
Exit status: 0 on success, 1 when a result does not match its reference, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from cgra_sim.__main__ import REPLAY_DESCRIPTION, REPLAY_HELP, add_replay_arguments, run_replay
from cgra_sim.trace import write_chrome_trace

from ..progress import StatusLine

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2


class UsageError(ValueError):
    """The command line asks for something malformed."""


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cgra-sim",
        description="Compile for the CGRA NPU, run on its cycle-approximate simulator, and check "
                    "the results. Architectures are presets (cgra-4x4, cgra-8x8, cgra-16x16) or a "
                    "JSON hardware description file.")
    sub = parser.add_subparsers(dest="command", required=True)

    verify = sub.add_parser(
        "verify", help="compile one kernel, simulate it and compare with numpy (PASS/FAIL)",
        description="Compile one matmul or conv2d kernel (with bias and relu unless disabled), run it "
                    "on the simulator with random inputs, and compare with numpy: int8 must match "
                    "exactly, float32 within 1e-5 relative. Prints PASS or FAIL with cycles.")
    verify.add_argument("--op", choices=["matmul", "batch_matmul", "conv2d"], required=True)
    verify.add_argument("--shape", type=_ints, required=True,
                        help="matmul: M,N,K (x[M,K] @ w[K,N]); batch_matmul: B,M,N,K (x[B,M,K] @ "
                             "w[B,K,N]); conv2d: N,C,H,W,F,KH,KW (in this order whatever --layout)")
    verify.add_argument("--layout", default="NCHW",
                        help="conv2d: DATA[,KERNEL] layouts, e.g. NHWC or NHWC,OHWI; the output "
                             "takes the data's (default NCHW, with OIHW weights; NHWC data: HWIO)")
    verify.add_argument("--shared-weights", action="store_true",
                        help="batch_matmul: one w[K,N] for the whole batch (folds into one GEMM)")
    verify.add_argument("--dtype", choices=["float32", "int8"], default="float32",
                        help="input dtype; int8 accumulates and outputs int32 (default float32)")
    verify.add_argument("--arch", default="cgra-8x8", help="preset name or JSON file (default cgra-8x8)")
    verify.add_argument("--stride", type=_ints, default=(1, 1), help="conv2d: SH,SW (default 1,1)")
    verify.add_argument("--padding", type=_ints, default=(0, 0, 0, 0),
                        help="conv2d: top,left,bottom,right or one value for all (default 0)")
    verify.add_argument("--no-bias", action="store_true", help="leave out the bias add")
    verify.add_argument("--no-relu", action="store_true", help="leave out the relu")
    verify.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    _add_observation_arguments(verify)

    run = sub.add_parser(
        "run", help="compile an ONNX model, simulate it and report cycles per layer (ONNX node names)",
        description="Import an ONNX model, compile it for the CGRA NPU (unsupported operators stay "
                    "on the host), run it on random inputs and print a per-layer table: each kernel launch and host "
                    "operator with the ONNX nodes it came from, its ops, output, cycles, utilisation and DMA bytes.")
    run.add_argument("model", help="path of an .onnx file")
    run.add_argument("--arch", default="cgra-8x8", help="preset name or JSON file (default cgra-8x8)")
    run.add_argument("--check", action="store_true",
                     help="compare the outputs with onnxruntime (float32 within 1e-4 relative)")
    run.add_argument("--dump-dir", help="write every compiler stage's output under this directory, and "
                                        "each kernel launch's command stream under DIR/streams (a "
                                        "launch file for replay and a .txt listing)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    run.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="show progress on stderr (each kernel compiled, each kernel launch "
                          "simulated); default: only when stderr is a terminal and without --json")
    _add_observation_arguments(run)

    add_replay_arguments(sub.add_parser("replay", help=REPLAY_HELP, description=REPLAY_DESCRIPTION))
    return parser


def _add_observation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--record-dir", metavar="DIR",
                        help="save every kernel launch under DIR as <index>_<kernel>.cgra, with its "
                             "inputs and outputs, for `cgra-sim replay`")
    parser.add_argument("--trace", metavar="OUT.json",
                        help="write the kernels' timeline to OUT.json as a Chrome trace "
                             "(chrome://tracing, ui.perfetto.dev)")


def _record_dir(args):
    """Where launches are recorded: --record-dir, else (for `run`) <--dump-dir>/streams, since the
    command streams are the last stage of the compile flow a dump should show."""
    if args.record_dir or not getattr(args, "dump_dir", None):
        return args.record_dir
    return os.path.join(args.dump_dir, "streams")


def _observe(args):
    """The profile that records launches and keeps schedules as --record-dir / --dump-dir and
    --trace ask."""
    import npu_backend

    return npu_backend.profile(record_dir=_record_dir(args), keep_schedules=args.trace is not None)


def _write_listings(paths) -> None:
    """Next to each recorded launch file, its command stream as text (cgra_sim.listing)."""
    from cgra_sim.listing import format_stream
    from cgra_sim.stream_file import SUFFIX, load_launch

    for path in paths:
        launch = load_launch(path)
        with open(path[:-len(SUFFIX)] + ".txt", "w", encoding="utf-8") as out:
            out.write(format_stream(launch.commands, f"kernel {launch.kernel} ({len(launch.commands)} "
                                                     f"commands; source ops {','.join(launch.source_ops)})"))


def _publish(args, prof, report: dict) -> list[str]:
    """Writes the trace, adds what was written to the report; returns lines for the text output."""
    def launches(count: int) -> str:
        return f"{count} kernel launch{'' if count == 1 else 'es'}"

    lines = []
    if args.trace:
        write_chrome_trace(args.trace, prof.schedules)
        report["trace"] = args.trace
        lines.append(f"trace of {launches(len(prof.schedules))}: {args.trace}")
    record_dir = _record_dir(args)
    if record_dir:
        report["recorded"] = list(prof.recorded)
        lines.append(f"{launches(len(prof.recorded))} recorded under {record_dir} (cgra-sim replay FILE)")
    if getattr(args, "dump_dir", None):
        _write_listings(prof.recorded)
        lines.append(f"compiler stages and command streams (.txt) written under {args.dump_dir}")
    return lines


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _verify(args) -> int:
    import npu_backend
    from npu_backend.tools.workloads import conv2d_model, matmul_model, mismatch, run

    arch = npu_backend.load_arch(args.arch)
    bias, relu = not args.no_bias, not args.no_relu
    if args.op == "matmul":
        if len(args.shape) != 3:
            raise UsageError("--shape must be M,N,K")
        m, n, k = args.shape
        mod, inputs, ref = matmul_model(m, n, k, args.dtype, bias=bias, relu=relu)
        macs = m * n * k
    elif args.op == "batch_matmul":
        mod, inputs, ref, macs = _batch_matmul_workload(args, bias, relu)
    else:
        if len(args.shape) != 7:
            raise UsageError("--shape must be N,C,H,W,F,KH,KW")
        padding = args.padding * 4 if len(args.padding) == 1 else args.padding
        mod, inputs, ref = conv2d_model(*args.shape, stride=args.stride, pad=padding, dtype=args.dtype,
                                        bias=bias, relu=relu, layouts=_conv2d_layouts(args.layout))
        macs = int(ref.size) * args.shape[1] * args.shape[5] * args.shape[6]
    ex = npu_backend.compile(mod, arch)
    with _observe(args) as prof:
        out = run(ex, inputs)
    problem = mismatch(out, ref, args.dtype)
    ideal = -(-macs // arch.peak_macs_per_cycle(args.dtype))
    report = {"result": "PASS" if problem is None else "FAIL", "op": args.op, "shape": list(args.shape),
              "dtype": args.dtype, "arch": arch.name, "cycles": prof.total_cycles,
              "ideal_cycles": ideal, "macs": macs, "mismatch": problem,
              "kernels": [k.to_dict() for k in prof.kernels]}
    written = _publish(args, prof, report)
    if args.json:
        print(json.dumps(report))
    else:
        shape = "x".join(str(d) for d in args.shape)
        print(f"{report['result']} {args.op} {shape} {args.dtype} on {arch.name}: {prof.total_cycles} cycles "
              f"(ideal {ideal}, {ideal / max(1, prof.total_cycles):.1%} of peak)")
        if problem:
            print(f"  mismatch: {problem}")
        print("\n".join(f"  {line}" for line in written), end="\n" if written else "")
    return EXIT_OK if problem is None else EXIT_MISMATCH


def _batch_matmul_workload(args, bias: bool, relu: bool):
    from npu_backend.tools.workloads import batch_matmul_model

    if len(args.shape) != 4:
        raise UsageError("--shape must be B,M,N,K")
    b, m, n, k = args.shape
    rhs = (k, n) if args.shared_weights else (b, k, n)
    mod, inputs, ref = batch_matmul_model((b, m, k), rhs, args.dtype, bias=bias, relu=relu)
    return mod, inputs, ref, b * m * n * k


def _conv2d_layouts(text: str) -> tuple[str, str, str]:
    """--layout DATA[,KERNEL] -> (data, kernel, out) layouts; the output takes the data's."""
    data, _, kernel = text.upper().partition(",")
    kernel = kernel or ("OIHW" if data == "NCHW" else "HWIO")
    if sorted(data) != sorted("NCHW") or sorted(kernel) != sorted("OIHW"):
        raise UsageError(f"--layout {text}: expected an order of NCHW, then optionally one of OIHW "
                         "(e.g. NHWC or NHWC,OHWI)")
    return data, kernel, data


def _run(args) -> int:
    from npu_backend.tools.run_model import run_onnx_model

    show = args.progress if args.progress is not None else not args.json and sys.stderr.isatty()
    status = StatusLine(sys.stderr) if show else None
    try:
        with _observe(args) as prof:  # sees the same launches as the model runner's own profile
            report = run_onnx_model(args.model, args.arch, check=args.check, dump_dir=args.dump_dir,
                                    seed=args.seed, progress=status.show if status else None)
    finally:
        if status is not None:
            status.close()
    written = _publish(args, prof, report)
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


def _usage(message: str) -> int:
    print(f"cgra-sim: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    started = time.time()
    try:
        status = {"verify": _verify, "run": _run, "replay": run_replay}[args.command](args)
    except OSError as err:  # a missing model, an unwritable --trace or --record-dir
        where = f": '{err.filename}'" if err.filename else ""
        return _usage(f"{args.command}: {err.strerror or err}{where}")
    except ValueError as err:  # bad arguments, architecture files, unsupported models (CGRAError too)
        where = f"{args.command} --op {args.op}" if getattr(args, "op", None) else args.command
        return _usage(f"{where}: {err}")
    if not getattr(args, "json", False):
        _progress(f"done in {time.time() - started:.1f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
