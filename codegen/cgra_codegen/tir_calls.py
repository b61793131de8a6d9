"""Device calls as TIR: what the compiler's intrinsics and passes build and read (stage: shared by
scheduling and lowering; codegen lowers the result through `device_calls.DEVICE_CALLS`).

In: a command function's name (`"cgra_gemm"`) and its operands by parameter name, the names of
`isa.COMMAND_FUNCTIONS` (which are the record's field names). Out: `T.call_extern("int32", name,
...)` with the TIR arguments in the order the code generator lowers them, and, for passes that
rewrite such calls, where each parameter's arguments sit in them.

A scratchpad address is two TIR arguments, the buffer's data and an element offset: give the
Buffer (its `elem_offset` is taken) or a `(data, offset)` pair; an address that matters only with
a flag bit (EPILOGUE's bias_addr) may be 0 when that bit is off. A host tensor slot is a
parameter's data: give the Buffer or its data. The DMA box is its 28 words.
"""

from __future__ import annotations

import itertools

import tvm
from cgra_sim import isa
from tvm import tirx

from .device_calls import DEVICE_CALLS
from .errors import DeviceCallError

_COMMANDS = {command.name: command for command in isa.COMMAND_FUNCTIONS.values()}


def device_call(name: str, **operands) -> tvm.ir.Call:
    """`T.call_extern("int32", name, ...)` with `operands` (by parameter name) in table order.

    Raises DeviceCallError for an unknown call, an unknown or missing parameter, or an operand
    that does not fit its parameter's kind."""
    command = _command(name)
    expected = [param.name for param in command.params]
    unknown = [key for key in operands if key not in expected]
    missing = [key for key in expected if key not in operands]
    if unknown or missing:
        problems = [f"unknown {', '.join(unknown)}" if unknown else "",
                    f"missing {', '.join(missing)}" if missing else ""]
        raise DeviceCallError(f"{name}: {'; '.join(p for p in problems if p)} (its parameters, in "
                              f"order: {', '.join(expected)})")
    args = []
    for param, operand in zip(command.params, DEVICE_CALLS[name].operands):
        args += _arguments(name, param, operand.arity, operands[param.name])
    return tirx.call_extern("int32", name, *args)


def device_call_positions(name: str) -> dict[str, tuple[int, ...]]:
    """Where each parameter's TIR arguments sit in `call.args` of a device call `name` (args[0]
    is the callee's name), e.g. for cgra_gemm: m -> (3,), acc_addr -> (12, 13) (data, offset)."""
    command = _command(name)
    arities = [operand.arity for operand in DEVICE_CALLS[name].operands]
    starts = itertools.accumulate(arities, initial=1)
    return {param.name: tuple(range(start, start + arity))
            for param, start, arity in zip(command.params, starts, arities)}


def _command(name: str) -> isa.CommandFunction:
    command = _COMMANDS.get(name)
    if command is None:
        raise DeviceCallError(f"'{name}' is not a device call (known: {', '.join(_COMMANDS)})")
    return command


def _is_buffer(value) -> bool:
    return isinstance(value, tvm.ir.Var) and isinstance(value.ty, tirx.BufferType)


def _arguments(name: str, param: isa.Param, arity: int, value) -> list:
    """The TIR arguments of one operand."""
    kind = param.kind
    if kind is isa.ParamKind.SPAD_ADDR:
        if _is_buffer(value):
            return [value.data, value.elem_offset]
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return list(value)
        if param.when and isinstance(value, int) and value == 0:
            return [0, 0]  # a disabled operand's placeholder
        gated = " or 0 when its flag is off" if param.when else ""
        raise DeviceCallError(f"{name}: {param.name} is a scratchpad address: give a Buffer or "
                              f"(data, elem_offset){gated}, not {value!r}")
    if kind is isa.ParamKind.SLOT:
        return [value.data if _is_buffer(value) else value]
    if kind is isa.ParamKind.BOX:
        if not isinstance(value, (tuple, list)) or len(value) != arity:
            raise DeviceCallError(f"{name}: {param.name} takes the DMA box's {arity} words as a "
                                  f"list, not {value!r}")
        return list(value)
    if _is_buffer(value) or isinstance(value, (tuple, list)):
        raise DeviceCallError(f"{name}: {param.name} is one {kind.value} value, not {value!r}")
    return [value]
