"""The codegen stage's body: every offloaded function compiled for the NPU and replaced with a
call to its kernel, the kernels' weights and the host's copies handed to the runtime.

Stage: codegen (pipeline.STAGES' last). In and out: a Relax IRModule. RunCodegen calls
`relax.ext.cgra` (relax_ext.py: every kernel through pipeline.KERNEL_STAGES, then LLVM IR) with
the chip and the options as target options; what follows moves work out of the VM executable.
"""

from __future__ import annotations

import dataclasses

from tvm import relax

from ..device.host_averages import host_averages_as_typed
from ..device.host_ops import host_ops_to_runtime
from ..device.in_place import cache_write_symbols, writes_in_place
from ..device.weights import hold_weights
from ..partition.call_tir import drop_unused_prim_funcs, offloaded_prim_funcs
from ..partition.stage import bounds_of


def codegen(mod, arch, options):
    """`mod` with its offloaded functions as NPU kernel calls, their weights in the runtime's
    weights module, host concatenations, splits and transposes as the runtime's copies, integer
    averages on the host in their declared dtype."""
    options = dataclasses.replace(options, shape_bounds=bounds_of(mod, options))
    target_options = {"cgra": {"arch": arch.to_json(), "options": options.to_json()}}
    offloaded = offloaded_prim_funcs(mod)
    cache_writes = cache_write_symbols(mod)
    mod = relax.transform.RunCodegen(target_options=target_options)(mod)
    # A KV cache's new row is written into the cache the step was given, not a copy of it
    # (device/in_place.py): the cache stays where it is from one decode step to the next.
    mod = writes_in_place(mod, cache_writes)
    # The kernels' weights go to the runtime's weights module, out of the VM executable, whose
    # code generation would hash every byte of them (device/weights.py).
    mod = hold_weights(mod)
    # Concatenations, splits and transposes left on the host run as the runtime's copies, not
    # host code TVM compiles for each model (device/host_ops.py).
    mod = host_ops_to_runtime(mod)
    # An integer average left on the host returns the dtype Relax gives it, which the NPU
    # kernels reading it were compiled for, not TOPI's int64 (device/host_averages.py).
    mod = host_averages_as_typed(mod)
    # A user's PrimFunc that now runs only as an NPU kernel is not built for the host too.
    return drop_unused_prim_funcs(mod, offloaded)
