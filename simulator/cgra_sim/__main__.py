"""`python -m cgra_sim replay FILE`: re-simulate a recorded kernel launch, without tvm.

Stage: entry (the simulator's own command line). In: a launch file (stream_file.py) and
optionally another hardware description. Out: cycles, utilisation, DMA bytes and per-unit busy
cycles on stdout (text or JSON), optionally a Chrome trace; exit status 0 on success, 1 when the
replayed results differ from the recorded ones, 2 on bad input. `cgra-sim replay` (npu_backend's
CLI) uses the same arguments and code: `add_replay_arguments` and `run_replay`.
"""

from __future__ import annotations

import argparse
import json
import sys

from .errors import SimulatorError
from .replay import replay
from .stream_file import StreamFileError, load_launch
from .trace import TracedLaunch, write_chrome_trace

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2

REPLAY_HELP = "re-simulate a recorded kernel launch (.cgra file), optionally on another chip"
REPLAY_DESCRIPTION = (
    "Re-simulate the command stream of one recorded kernel launch on the hardware description it "
    "was recorded with, or on another one (--arch), without recompiling. Prints cycles, "
    "utilisation, DMA bytes and busy cycles per unit. When the file holds the inputs, the kernel "
    "also runs functionally, and its results are compared bit for bit with the recorded outputs "
    "(timing never changes results). Exit status: 0 on success, 1 when the results differ, 2 on "
    "bad input (unreadable file, unknown architecture, a stream that does not fit that chip). "
    "Record launches with `cgra-sim run/verify --record-dir DIR` or npu_backend.profile(record_dir=DIR).")


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """The replay command's arguments, shared by `python -m cgra_sim` and `cgra-sim`."""
    parser.add_argument("file", help="a launch file written by a recording (.cgra)")
    parser.add_argument("--arch", help="replay on this preset name or JSON hardware description file "
                                       "instead of the recorded one")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--trace", metavar="OUT.json",
                        help="write the replay's timeline as a Chrome trace (chrome://tracing, ui.perfetto.dev)")


def _error(message: str) -> int:
    print(f"cgra-sim: error: replay: {message}", file=sys.stderr)
    return EXIT_USAGE


def run_replay(args: argparse.Namespace) -> int:
    """Loads, replays, prints and (with --trace) writes the trace; returns the exit status."""
    try:
        launch = load_launch(args.file)
        result = replay(launch, args.arch)
    except FileNotFoundError as err:
        return _error(f"{err.strerror}: '{err.filename}'")
    except StreamFileError as err:  # names the file itself
        return _error(str(err))
    except (SimulatorError, ValueError, OSError) as err:
        # A stream that does not fit the other chip arrives here as a CommandError.
        where = args.file if args.arch is None else f"{args.file} on {args.arch}"
        return _error(f"{where}: {err}")
    if args.trace:
        try:
            write_chrome_trace(args.trace, [TracedLaunch(launch.kernel, result.timeline,
                                                         result.arch.clock_mhz, launch.commands)])
        except OSError as err:
            return _error(f"cannot write the trace: {err.strerror}: '{err.filename}'")
    if args.json:
        print(json.dumps({"file": str(args.file), "trace": args.trace, **result.to_dict()}))
    else:
        print(f"replay of {args.file}")
        print(result.describe())
        if args.trace:
            print(f"  trace        {args.trace}")
    return EXIT_MISMATCH if result.verdict == "mismatch" else EXIT_OK


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cgra_sim",
        description="The CGRA NPU simulator on its own (no tvm). The full command line, with "
                    "compile-and-run commands, is `cgra-sim`.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_replay_arguments(sub.add_parser("replay", help=REPLAY_HELP, description=REPLAY_DESCRIPTION))
    args = parser.parse_args(argv)
    return run_replay(args)


if __name__ == "__main__":
    sys.exit(main())
