"""The one table from TIR device calls to the runtime's C functions (stage: codegen).

In: `T.call_extern("int32", "cgra_*", ...)` with the TIR argument lists of the intrinsics. Out: a
call of the C function of docs/runtime-abi.md with every argument converted to its C type, its
status checked (nonzero: leave through the kernel's error exit).

Each table entry lists operands in order; an operand consumes one or more TIR arguments and
produces one C argument: an integer of a given width, a host tensor slot, a scratchpad byte
address (buffer data + element offset), the 28 words of a DMA box, or a fill value's bits. The C
prototypes are derived from the same entries, so the two cannot disagree.
"""

from __future__ import annotations

import dataclasses
import struct

import llvmlite.ir as ir
from cgra_sim import isa
from tvm import tirx

from .context import HOST_TENSOR, SCRATCHPAD, KernelState
from .errors import InvalidDeviceCall, UnsupportedNode
from .exprs import ExprLowering, dtype_of, is_buffer_data
from .llvm_types import I32, I64, PTR, int_arith, is_float, itemsize

BOX_WORDS = 28  # isa: origin[4], pad_lo[4], pad_hi[4], 4 x (extent, tdim, tstep, sstride)


@dataclasses.dataclass
class CallSite:
    """One device call being lowered: where operands find the other arguments and the state."""

    state: KernelState
    exprs: ExprLowering
    name: str
    args: list

    def fail(self, position: int, role: str, message: str) -> InvalidDeviceCall:
        return InvalidDeviceCall(self.state.kernel,
                                 f"{self.name} argument {position} ('{role}'): {message}")

    def binding_of(self, position: int, role: str):
        data = self.args[position]
        if not is_buffer_data(data):
            raise self.fail(position, role, f"expected a buffer's data (X.data), got {data}")
        return data.args[0], self.state.buffer_of(data.args[0])


@dataclasses.dataclass(frozen=True)
class Int:
    """An integer argument, converted to the C integer type (index dtypes arrive mixed)."""

    role: str
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

    role: str
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

    role: str
    arity = 1
    c_types = (I32,)

    def lower(self, site: CallSite, position: int):
        _, binding = site.binding_of(position, self.role)
        if binding.kind != HOST_TENSOR:
            raise site.fail(position, self.role,
                            f"expected a kernel parameter's data, got {binding.kind} "
                            f"'{binding.name}'")
        return [I32(binding.slot)]


@dataclasses.dataclass(frozen=True)
class SpadAddress:
    """(buffer data, element offset) -> scratchpad byte address.

    `gate` = (index of a flags argument, bit): the address is passed only when that bit is set,
    else 0 (the operand is then allowed to be a placeholder that is not a buffer)."""

    role: str
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
        buffer_var, binding = site.binding_of(position, self.role)
        if binding.kind != SCRATCHPAD:
            raise site.fail(position, self.role,
                            f"expected a scratchpad buffer, got {binding.kind} '{binding.name}'")
        site.state.device_uses(binding)
        builder = site.state.builder
        offset = site.exprs.lower_as(site.args[position + 1], "int64")
        scaled = int_arith(builder, "mul", offset, I64(itemsize(buffer_var.ty.dtype)))
        return int_arith(builder, "add", I64(binding.spad_base), scaled, name=f"{self.role}.addr")


@dataclasses.dataclass(frozen=True)
class DmaBox:
    """28 box words -> pointer to an [28 x i64] array (one per kernel, filled before each call)."""

    role: str
    arity = BOX_WORDS
    c_types = (PTR,)

    def lower(self, site: CallSite, position: int):
        words = ir.ArrayType(I64, BOX_WORDS)
        box = site.state.shared_alloca("dma.box", words)
        builder = site.state.builder
        for index in range(BOX_WORDS):
            value = site.exprs.lower_as(site.args[position + index], "int64")
            builder.store(value, builder.gep(box, [I64(0), I64(index)], source_etype=words))
        return [box]


@dataclasses.dataclass(frozen=True)
class DeviceCall:
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


def _dma(c_name: str) -> DeviceCall:
    return DeviceCall(c_name, (HostSlot("host"), SpadAddress("spad"), DmaBox("box")))


#: TIR call_extern name -> the C function and how each argument converts.
DEVICE_CALLS = {
    "cgra_dma_load": _dma("cgra_dma_load"),
    "cgra_dma_store": _dma("cgra_dma_store"),
    "cgra_gemm": DeviceCall("cgra_gemm", (
        Int("flags", 32), Int("dtype", 32), Int("m", 64), Int("n", 64), Int("k", 64),
        SpadAddress("a"), Int("a_stride", 64), SpadAddress("b"), Int("b_stride", 64),
        SpadAddress("acc"), Int("acc_stride", 64))),
    "cgra_depthwise": DeviceCall("cgra_depthwise", (
        Int("flags", 32), Int("dtype", 32), Int("oh", 64), Int("ow", 64), Int("n", 64),
        Int("kh", 64), Int("kw", 64), SpadAddress("a"), Int("a_y", 64), Int("a_x", 64),
        Int("a_ry", 64), Int("a_rx", 64), SpadAddress("b"), Int("b_ry", 64), Int("b_rx", 64),
        SpadAddress("acc"), Int("acc_y", 64), Int("acc_x", 64))),
    "cgra_pool": DeviceCall("cgra_pool", (
        Int("flags", 32), Int("dtype", 32), Int("oh", 64), Int("ow", 64), Int("n", 64),
        Int("kh", 64), Int("kw", 64), SpadAddress("a"), Int("a_row", 64), Int("a_col", 64),
        Int("stride_y", 64), Int("stride_x", 64), Int("dilation_y", 64), Int("dilation_x", 64),
        SpadAddress("out"), Int("out_y", 64), Int("out_x", 64))
        + tuple(Int(f"{rect}_{axis}_{end}", 64) for rect in ("valid", "count") for axis in "yx"
                for end in ("lo", "hi"))),
    "cgra_fill": DeviceCall("cgra_fill", (
        Int("dtype", 32), SpadAddress("region"), Int("rows", 64), Int("cols", 64),
        Int("stride", 64), ValueBits("value_bits"))),
    "cgra_epilogue": DeviceCall("cgra_epilogue", (
        Int("flags", 32), Int("acc_dtype", 32), Int("out_dtype", 32), Int("m", 64),
        Int("n", 64), SpadAddress("acc"), Int("acc_stride", 64),
        SpadAddress("bias", gate=(0, isa.EPILOGUE_BIAS)), SpadAddress("out"),
        Int("out_stride", 64), SpadAddress("residual", gate=(0, isa.EPILOGUE_RESIDUAL)),
        Int("residual_stride", 64), ValueBits("clip_lo_bits"), ValueBits("clip_hi_bits"),
        SpadAddress("scale", gate=(0, isa.EPILOGUE_REQUANTISE)), Int("out_zero_point", 64))),
    "cgra_eltwise": DeviceCall("cgra_eltwise", (
        Int("func", 32), Int("dtype", 32), Int("rows", 64), Int("cols", 64),
        SpadAddress("a"), Int("a_row", 64), Int("a_col", 64), SpadAddress("b"), Int("b_row", 64),
        Int("b_col", 64), SpadAddress("out"), Int("out_stride", 64))),
}


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
