"""How many of the project's files one conv2d layer's way through the compiler touches.

Compiles and runs one conv2d + bias + relu layer (`tvm.compile(mod, target="cgra")`, then the
VM on the simulator) under a call tracer, and prints the project's source files whose functions
ran (npu_backend, cgra_codegen, cgra_sim), by package, in the order they are first entered, and
the distinct calls from one file into another (the hops a reader makes following the flow); a
call into a file first entered before the caller was goes back against the reading order. The
runtime library is loaded and the intrinsics registered before tracing starts, so only the
layer's own compile and run count.

    python benchmarks/bench_flow_files.py [--list]
"""

from __future__ import annotations

import collections
import os
import sys

import tvm

import npu_backend
from npu_backend.tools.workloads import conv2d_model, run

ROOTS = {name: os.path.dirname(__import__(name).__file__) for name in ("npu_backend", "cgra_codegen", "cgra_sim")}


def _project_file(path: str):
    for name, root in ROOTS.items():
        if path.startswith(root + os.sep):
            return name + "/" + os.path.relpath(path, root)
    return None


def trace_layer():
    mod, inputs, _ = conv2d_model(1, 16, 28, 28, 32, 3, 3, (1, 1), (1, 1, 1, 1))
    npu_backend.compile(conv2d_model(1, 3, 8, 8, 8, 3, 3)[0], "cgra-8x8")  # warm: intrinsics, runtime
    files, edges = collections.OrderedDict(), set()

    def tracer(frame, event, arg):
        if event != "call":
            return
        callee = _project_file(frame.f_code.co_filename)
        if callee is None:
            return
        files.setdefault(callee, None)
        caller = frame.f_back
        while caller is not None and _project_file(caller.f_code.co_filename) is None:
            caller = caller.f_back  # through TVM's own frames back to the project's
        if caller is not None:
            source = _project_file(caller.f_code.co_filename)
            if source != callee:
                edges.add((source, callee))

    sys.setprofile(tracer)
    try:
        ex = tvm.compile(mod, target="cgra")
        with npu_backend.profile() as prof:
            run(ex, inputs)
    finally:
        sys.setprofile(None)
    return list(files), edges, prof.total_cycles


def main():
    files, edges, cycles = trace_layer()
    by_package = collections.Counter(name.split("/")[0] for name in files)
    opened = {name: index for index, name in enumerate(files)}
    backwards = [(a, b) for a, b in edges if opened[b] < opened[a]]
    print(f"conv2d 16x28x28 -> 32, 3x3, + bias + relu on cgra-8x8: {cycles} cycles")
    print(f"files whose functions ran: {len(files)} ({', '.join(f'{p} {n}' for p, n in sorted(by_package.items()))})")
    print(f"distinct calls from one file into another: {len(edges)}, of which {len(backwards)} go back to a file "
          "opened earlier in the flow")
    if "--list" in sys.argv:
        print("\n".join(files))


if __name__ == "__main__":
    main()
