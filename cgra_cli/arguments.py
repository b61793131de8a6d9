"""What the `cgra-sim` commands share: exit statuses, argument types, and what --record-dir,
--trace and --dump-dir make a command write.

Stage: tools (command line).
"""

from __future__ import annotations

import argparse
import os

from cgra_sim.trace import write_chrome_trace

#: 0 success, 1 a result differs from its reference, 2 bad input (a usage error), 3 `verify`'s
#: kernel did not run on the NPU (the compiler kept it on the host; the reason is printed).
EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_NOT_OFFLOADED = 0, 1, 2, 3


class UsageError(ValueError):
    """The command line asks for something malformed."""


def ints(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated integers."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None


def named(kind):
    """An argparse type: NAME=VALUE, VALUE parsed by `kind`; gives (name, value)."""
    def parse(text: str):
        name, sep, value = text.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got '{text}'")
        return name, kind(value)
    return parse


def add_observation_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--record-dir", metavar="DIR",
                        help="save every kernel launch under DIR as <index>_<kernel>.cgra, with its "
                             "inputs and outputs, for `cgra-sim replay`")
    parser.add_argument("--trace", metavar="OUT.json",
                        help="write the kernels' timeline to OUT.json as a Chrome trace "
                             "(chrome://tracing, ui.perfetto.dev)")


def record_dir(args):
    """Where launches are recorded: --record-dir, else (for `run`) <--dump-dir>/streams, since the
    command streams are the last stage of the compile flow a dump should show."""
    if args.record_dir or not getattr(args, "dump_dir", None):
        return args.record_dir
    return os.path.join(args.dump_dir, "streams")


def observe(args):
    """The profile that records launches and keeps timelines as --record-dir / --dump-dir and
    --trace ask."""
    import npu_backend

    keep = args.trace is not None or getattr(args, "report_dir", None) is not None
    return npu_backend.profile(record_dir=record_dir(args), keep_timelines=keep)


def publish(args, prof, report: dict) -> list[str]:
    """Writes the trace and the listings, adds what was written to the report; returns lines for
    the text output."""
    def launches(count: int) -> str:
        return f"{count} kernel launch{'' if count == 1 else 'es'}"

    lines = []
    if args.trace:
        write_chrome_trace(args.trace, prof.timelines)
        report["trace"] = args.trace
        lines.append(f"trace of {launches(len(prof.timelines))}: {args.trace}")
    directory = record_dir(args)
    if directory:
        report["recorded"] = list(prof.recorded)
        lines.append(f"{launches(len(prof.recorded))} recorded under {directory} (cgra-sim replay FILE)")
    if getattr(args, "dump_dir", None):
        _write_listings(prof.recorded)
        lines.append(f"compiler stages and command streams (.txt) written under {args.dump_dir}")
    return lines


def _write_listings(paths) -> None:
    """Next to each recorded launch file, its command stream as text (cgra_sim.listing)."""
    from cgra_sim.listing import format_stream
    from cgra_sim.stream_file import SUFFIX, load_launch

    for path in paths:
        launch = load_launch(path)
        with open(path[:-len(SUFFIX)] + ".txt", "w", encoding="utf-8") as out:
            out.write(format_stream(launch.commands, f"kernel {launch.kernel} ({len(launch.commands)} "
                                                     f"commands; source ops {','.join(launch.source_ops)})"))
