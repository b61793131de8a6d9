"""The runtime's command functions as the code generator calls them (stage: codegen).

In: `T.call_extern("int32", "cgra_*", ...)` with the TIR argument lists of the intrinsics. Out: a
call of the C function of docs/runtime-abi.md with every argument converted to its C type, its
status checked (nonzero: leave through the kernel's error exit).

`DEVICE_CALLS` is derived from the ISA's table of command functions (`isa.COMMAND_FUNCTIONS`),
which also generates the runtime's C prototypes, so the two cannot disagree. Each parameter
becomes an operand that consumes one or more TIR arguments and produces one C argument: an
integer of a given width, a host tensor slot (a parameter's data), a scratchpad byte address
(buffer data + element offset), the 28 words of a DMA box, or a value's bits.
"""

from __future__ import annotations

import dataclasses
import itertools
import struct

import llvmlite.ir as ir
from cgra_sim import isa
from tvm import tirx

from .context import HOST_TENSOR, SCRATCHPAD, KernelState
from .errors import InvalidDeviceCall, UnsupportedNode
from .exprs import ExprLowering, dtype_of, is_buffer_data
from .llvm_types import I32, I64, PTR, int_arith, is_float, is_int_constant, itemsize

BOX_WORDS = isa.BOX_WORDS  # origin[4], pad_lo[4], pad_hi[4], 4 x (extent, tdim, tstep, sstride)
#: An address is named `<parameter without _addr>.addr` in the IR (`a.addr`, `spad.addr`); FILL's
#: lone `addr` is its region's.
_ADDRESS_LABELS = {"addr": "region"}


@dataclasses.dataclass
class CallSite:
    """One device call being lowered: where operands find the other arguments and the state."""

    state: KernelState
    exprs: ExprLowering
    name: str
    args: list

    def fail(self, position: int, param: str, message: str) -> InvalidDeviceCall:
        return InvalidDeviceCall(self.state.kernel,
                                 f"{self.name} argument {position} ('{param}'): {message}")

    def binding_of(self, position: int, param: str):
        data = self.args[position]
        if not is_buffer_data(data):
            raise self.fail(position, param, f"expected a buffer's data (X.data), got {data}")
        return data.args[0], self.state.buffer_of(data.args[0])


@dataclasses.dataclass(frozen=True)
class Int:
    """An integer argument, converted to the C integer type (index dtypes arrive mixed)."""

    name: str  # the parameter's name in isa.COMMAND_FUNCTIONS, for messages
    bits: int
    arity = 1

    @property
    def c_types(self):
        return (ir.IntType(self.bits),)

    def lower(self, site: CallSite, position: int):
        return [site.exprs.lower_as(site.args[position], f"int{self.bits}")]


@dataclasses.dataclass(frozen=True)
class ValueBits:
    """A fill value as int64 bits: integers sign-extended, floats as their float32 pattern."""

    name: str  # the parameter's name in isa.COMMAND_FUNCTIONS, for messages
    arity = 1
    c_types = (I64,)

    def lower(self, site: CallSite, position: int):
        expr = site.args[position]
        if not is_float(dtype_of(expr)):
            return [site.exprs.lower_as(expr, "int64")]
        single = site.exprs.lower_as(expr, "float32")
        if isinstance(single, ir.Constant):
            return [I64(struct.unpack("<I", struct.pack("<f", single.constant))[0])]
        return [site.state.builder.zext(site.state.builder.bitcast(single, I32), I64)]


@dataclasses.dataclass(frozen=True)
class HostSlot:
    """A host tensor's data -> the runtime slot of the parameter it belongs to."""

    name: str  # the parameter's name in isa.COMMAND_FUNCTIONS, for messages
    arity = 1
    c_types = (I32,)

    def lower(self, site: CallSite, position: int):
        _, binding = site.binding_of(position, self.name)
        if binding.kind != HOST_TENSOR:
            raise site.fail(position, self.name,
                            f"expected a kernel parameter's data, got {binding.kind} "
                            f"'{binding.name}'")
        return [I32(binding.slot)]


@dataclasses.dataclass(frozen=True)
class SpadAddress:
    """(buffer data, element offset) -> scratchpad byte address.

    `gate` = (index of a flags argument, bit): the address is passed only when that bit is set,
    else 0 (the operand is then allowed to be a placeholder that is not a buffer)."""

    name: str  # the parameter's name in isa.COMMAND_FUNCTIONS, for messages
    gate: tuple[int, int] | None = None
    arity = 2
    c_types = (I64,)

    def lower(self, site: CallSite, position: int):
        if self.gate is not None and not is_buffer_data(site.args[position]):
            return [I64(0)]
        enabled = self._gate_enabled(site)
        if enabled is False:
            return [I64(0)]
        address = self._address(site, position)
        if enabled is True:
            return [address]
        return [site.state.builder.select(enabled, address, I64(0))]

    def _gate_enabled(self, site: CallSite):
        """True/False when known at compile time, else an i1 value; True without a gate."""
        if self.gate is None:
            return True
        index, bit = self.gate
        flags = site.args[index]
        if isinstance(flags, tirx.IntImm):
            return bool(int(flags.value) & bit)
        builder = site.state.builder
        masked = builder.and_(site.exprs.lower_as(flags, "int32"), I32(bit))
        return builder.icmp_unsigned("!=", masked, I32(0))

    def _address(self, site: CallSite, position: int):
        buffer_var, binding = site.binding_of(position, self.name)
        if binding.kind != SCRATCHPAD:
            raise site.fail(position, self.name,
                            f"expected a scratchpad buffer, got {binding.kind} '{binding.name}'")
        site.state.device_uses(binding)
        builder = site.state.builder
        offset = site.exprs.lower_as(site.args[position + 1], "int64")
        scaled = int_arith(builder, "mul", offset, I64(itemsize(buffer_var.ty.dtype)))
        label = _ADDRESS_LABELS.get(self.name, self.name.removesuffix("_addr"))
        return int_arith(builder, "add", I64(binding.spad_base), scaled, name=f"{label}.addr")


@dataclasses.dataclass(frozen=True)
class DmaBox:
    """28 box words -> pointer to an [28 x i64] array: a module constant when every word is known
    at compile time, else the kernel's one box alloca, filled from a constant template of the known
    words (one memcpy) and a store per computed word (most words are extents and strides: storing
    all 28 was half of a kernel's instructions)."""

    name: str  # the parameter's name in isa.COMMAND_FUNCTIONS, for messages
    arity = BOX_WORDS
    c_types = (PTR,)

    def lower(self, site: CallSite, position: int):
        values = [site.exprs.lower_as(arg, "int64") for arg in site.args[position:position + BOX_WORDS]]
        computed = [(index, value) for index, value in enumerate(values) if not is_int_constant(value)]
        template = site.state.mb.constant_i64s([v.constant if is_int_constant(v) else 0 for v in values])
        if not computed:
            return [template]
        words = ir.ArrayType(I64, BOX_WORDS)
        box = site.state.shared_alloca("dma.box", words)
        builder = site.state.builder
        memcpy = site.state.mb.module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
        builder.call(memcpy, [box, template, I64(8 * BOX_WORDS), ir.Constant(ir.IntType(1), 0)])
        for index, value in computed:
            builder.store(value, builder.gep(box, [I64(0), I64(index)], source_etype=words))
        return [box]


@dataclasses.dataclass(frozen=True)
class DeviceCall:
    """One command function: its C name and the operands its TIR arguments lower through."""

    c_name: str
    operands: tuple

    @property
    def arity(self) -> int:
        return sum(operand.arity for operand in self.operands)

    @property
    def function_type(self) -> ir.FunctionType:
        params = [PTR]  # CGRAKernel*
        for operand in self.operands:
            params += list(operand.c_types)
        return ir.FunctionType(I32, params)


_OPERAND_OF_KIND = {
    isa.ParamKind.INT32: lambda name: Int(name, 32),
    isa.ParamKind.INT64: lambda name: Int(name, 64),
    isa.ParamKind.SPAD_ADDR: SpadAddress,
    isa.ParamKind.SLOT: HostSlot,
    isa.ParamKind.BOX: DmaBox,
    isa.ParamKind.VALUE_BITS: ValueBits,
}


def _device_call(command: isa.CommandFunction) -> DeviceCall:
    """The lowering of one command function. An address that matters only with a flag bit is
    gated on it: passed as 0 without the bit (the intrinsic may then give a placeholder). Other
    such parameters are passed as given: the intrinsics give 0 for them."""
    operands = [_OPERAND_OF_KIND[param.kind](param.name) for param in command.params]
    starts = dict(zip((p.name for p in command.params),
                      itertools.accumulate((o.arity for o in operands), initial=0)))
    for index, param in enumerate(command.params):
        if param.when and param.kind is isa.ParamKind.SPAD_ADDR:
            operands[index] = dataclasses.replace(operands[index], gate=(starts["flags"], param.when))
    return DeviceCall(command.name, tuple(operands))


#: TIR call_extern name -> the C function and how each argument converts.
DEVICE_CALLS = {command.name: _device_call(command) for command in isa.COMMAND_FUNCTIONS.values()}


def lower_device_call(state: KernelState, exprs: ExprLowering, call) -> None:
    """Emit the C call for one `call_extern` statement and branch away if it fails."""
    name = str(call.args[0].value)
    spec = DEVICE_CALLS.get(name)
    if spec is None:
        raise UnsupportedNode(state.kernel, f"call_extern({name})",
                              f"known device calls: {', '.join(sorted(DEVICE_CALLS))}")
    site = CallSite(state, exprs, name, list(call.args[1:]))
    if len(site.args) != spec.arity:
        raise InvalidDeviceCall(state.kernel, f"{name} takes {spec.arity} arguments, got "
                                f"{len(site.args)}: {call}")
    c_args, position = [state.kernel_handle], 0
    for operand in spec.operands:
        c_args += operand.lower(site, position)
        position += operand.arity
    callee = state.mb.function(spec.c_name, spec.function_type)
    status = state.builder.call(callee, c_args, name=f"{spec.c_name}.status")
    state.branch_on_failure(status)
