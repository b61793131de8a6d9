"""The exported tvm-ffi function of one kernel: argument checks, launch, body, exit (stage: codegen).

In: a lowered PrimFunc, its scratchpad plan, the hardware description. Out: the LLVM function
`__tvm_ffi_<global_symbol>` with the ABI `i32 (ptr self, ptr args, i32 num_args, ptr result)`:

1. checks every argument (tensor, dtype, rank, static and symbolic dims, compact strides, CPU),
   raising a Python ValueError/TypeError that names the kernel and the argument;
2. `cgra_kernel_begin` + one `cgra_kernel_bind` per parameter (slot = parameter index);
3. the body (walker.py), every runtime call checked;
4. `cgra_kernel_end`; result = None. Any failure after begin leaves through one error exit that
   still calls `cgra_kernel_end` (it frees the launch) and returns -1.
"""

from __future__ import annotations

import functools

import llvmlite.ir as ir
from tvm import sym, tirx

from .context import HOST_TENSOR, BufferBinding, KernelState
from .errors import CodegenError
from .exprs import ExprLowering
from .llvm_types import (ANY_SIZE, ANY_VALUE_OFFSET, DL_DEVICE_CPU, DL_DEVICE_TYPE, DL_TENSOR_BYTES,
                         DL_DTYPE_BITS, DL_DTYPE_CODE, DL_DTYPE_LANES, DL_NDIM, DL_SHAPE,
                         DL_STRIDES, DL_TYPE_CODE_NAMES, FFI_FUNCTION_TYPE, FFI_SYMBOL_PREFIX, I8,
                         I16, I32, I64, PTR, RUNTIME_ABI_VERSION, TENSOR_DLTENSOR_OFFSET,
                         TYPE_INDEX_DLTENSOR_PTR, TYPE_INDEX_NONE, TYPE_INDEX_TENSOR, ModuleBuilder,
                         byte_address, cast_value, int_arith, load_field, parse_dtype)
from .spad import ScratchpadPlan, handle_of
from .walker import BodyLowering

MESSAGE_BYTES = 512


def _escape(text: str) -> str:
    """Static text inside a printf format."""
    return str(text).replace("%", "%%")


class ArgumentChecks:
    """Emits the checks of the packed arguments; yields each parameter's DLTensor*."""

    def __init__(self, state: KernelState, args: ir.Value, num_args: ir.Value):
        self.state = state
        self.args = args
        self.num_args = num_args
        self.exprs = ExprLowering(state)
        self.origins: dict = {}  # symbolic Var handle -> "argument i ('x') dimension d"

    @property
    def b(self) -> ir.IRBuilder:
        return self.state.builder

    def raise_if(self, condition, kind: str, fmt: str, *values) -> None:
        """If `condition`: format the message (printf `fmt`), set the FFI error, return -1."""
        text = f"cgra kernel '{_escape(self.state.kernel)}': {fmt}"
        self.raise_with_format(condition, kind, lambda: (self.state.mb.cstring(text), values))

    def raise_with_format(self, condition, kind: str, message_parts) -> None:
        """Like `raise_if`; `message_parts()` emits (format, values) inside the error block."""
        failed, ok = self.state.new_block("arg.error"), self.state.new_block("arg.ok")
        self.b.cbranch(condition, failed, ok)
        self.b.position_at_end(failed)
        fmt, values = message_parts()
        message = self.state.shared_alloca("error.message", ir.ArrayType(I8, MESSAGE_BYTES))
        self.b.call(self.state.mb.runtime("snprintf"), [message, I64(MESSAGE_BYTES), fmt, *values])
        self.state.set_error(kind, message)
        self.b.ret(I32(-1))
        self.b.position_at_end(ok)

    def emit(self, params) -> list:
        """Check every argument; returns the parameters' DLTensor pointers. Arguments at the
        positions of attribute `cgra.shape_args` are shape values the caller passes beside the
        tensors (Relax's tir_vars): skipped, the kernel binds its sizes from the tensors."""
        skipped = {int(i) for i in (self.state.func.attrs or {}).get("cgra.shape_args", [])}
        total = len(params) + len(skipped)
        positions = [i for i in range(total) if i not in skipped]
        names = ", ".join(f"'{_escape(p.name)}'" for p in params)
        self.raise_if(self.b.icmp_signed("!=", self.num_args, I32(total)), "TypeError",
                      f"expected {total} arguments ({names}"
                      f"{' and ' + str(len(skipped)) + ' shape values' if skipped else ''}), got %d", self.num_args)
        return [self.check_tensor(index, param, positions[index]) for index, param in enumerate(params)]

    def check_tensor(self, index: int, param, position: int | None = None) -> ir.Value:
        position = index if position is None else position
        where = f"argument {position} ('{_escape(param.name)}')"
        _require_plain_layout(self.state.kernel, param)
        tensor = self.dltensor(position, where)
        self.check_dtype(tensor, param, where)
        ndim = load_field(self.b, tensor, DL_NDIM, I32, "ndim")
        expected_shape = caller_shape(self.state.func, index)
        rank = len(expected_shape)
        self.raise_if(self.b.icmp_signed("!=", ndim, I32(rank)), "ValueError",
                      f"{where}: expected {rank} dimensions, got %d", ndim)
        shape = load_field(self.b, tensor, DL_SHAPE, PTR, "shape")
        dims = [self.b.load(self.b.gep(shape, [I64(d)], source_etype=I64), typ=I64)
                for d in range(rank)]
        self.check_static_dims(expected_shape, dims, where)
        for d, (extent, actual) in enumerate(zip(expected_shape, dims)):
            if not isinstance(extent, tirx.IntImm):
                self.check_dim(extent, actual, where, d)
        self.check_strides(tensor, dims, where)
        device = load_field(self.b, tensor, DL_DEVICE_TYPE, I32, "device_type")
        self.raise_if(self.b.icmp_signed("!=", device, I32(DL_DEVICE_CPU)), "ValueError",
                      f"{where}: expected a CPU tensor, got device type %d", device)
        if is_view(self.state.func, index):
            return self.reshaped(tensor, param, index)
        return tensor

    def reshaped(self, tensor, param, index: int) -> ir.Value:
        """A DLTensor on the stack that views the (compact, checked) argument with the
        parameter's shape: same data, device, dtype and offset; its own shape, no strides."""
        rank = len(param.ty.shape)
        view = self.state.alloca(ir.ArrayType(I64, DL_TENSOR_BYTES // 8), f"view{index}")
        dims = self.state.alloca(ir.ArrayType(I64, rank), f"view{index}.shape")
        for word in range(DL_TENSOR_BYTES // 8):
            value = self.b.load(byte_address(self.b, tensor, 8 * word), typ=I64)
            self.b.store(value, byte_address(self.b, view, 8 * word))
        for d, extent in enumerate(param.ty.shape):  # symbolic extents: bound by the caller's dims
            value = I64(int(extent)) if isinstance(extent, tirx.IntImm) else self.exprs.lower_as(extent, "int64")
            self.b.store(value, byte_address(self.b, dims, 8 * d))
        self.b.store(I32(rank), byte_address(self.b, view, DL_NDIM))
        self.b.store(dims, byte_address(self.b, view, DL_SHAPE))
        self.b.store(ir.Constant(PTR, None), byte_address(self.b, view, DL_STRIDES))
        return view

    def dltensor(self, index: int, where: str) -> ir.Value:
        """DLTensor* of argument `index`: an ffi Tensor object or a raw DLTensor*."""
        cell = byte_address(self.b, self.args, index * ANY_SIZE)
        type_index = self.b.load(cell, typ=I32, name="type_index")
        is_object = self.b.icmp_signed("==", type_index, I32(TYPE_INDEX_TENSOR))
        is_raw = self.b.icmp_signed("==", type_index, I32(TYPE_INDEX_DLTENSOR_PTR))
        self.raise_if(self.b.not_(self.b.or_(is_object, is_raw)), "TypeError",
                      f"{where}: expected a tensor, got an FFI value of type index %d",
                      type_index)
        pointer = load_field(self.b, cell, ANY_VALUE_OFFSET, PTR)
        inside_object = byte_address(self.b, pointer, TENSOR_DLTENSOR_OFFSET)
        return self.b.select(is_object, inside_object, pointer, name="dltensor")

    def check_dtype(self, tensor, param, where: str) -> None:
        expected = parse_dtype(param.ty.dtype)
        code = load_field(self.b, tensor, DL_DTYPE_CODE, I8, "dtype.code")
        bits = load_field(self.b, tensor, DL_DTYPE_BITS, I8, "dtype.bits")
        lanes = load_field(self.b, tensor, DL_DTYPE_LANES, I16, "dtype.lanes")
        wrong = self.b.or_(self.b.icmp_unsigned("!=", code, I8(expected.type_code)),
                           self.b.icmp_unsigned("!=", bits, I8(expected.bits)))
        wrong = self.b.or_(wrong, self.b.icmp_unsigned("!=", lanes, I16(expected.lanes)))
        text = (f"cgra kernel '{_escape(self.state.kernel)}': {where}: expected dtype "
                f"{param.ty.dtype}, got %s%d")

        def message_parts():
            """'got float32': the name of the type code, the bits, the lanes if not 1."""
            mb = self.state.mb
            prefix = mb.cstring("(unknown type code)")
            for value, name in DL_TYPE_CODE_NAMES.items():
                match = self.b.icmp_unsigned("==", code, I8(value))
                prefix = self.b.select(match, mb.cstring(name), prefix)
            single = self.b.icmp_unsigned("==", lanes, I16(1))
            fmt = self.b.select(single, mb.cstring(text), mb.cstring(text + "x%d"))
            return fmt, (prefix, self.b.zext(bits, I32), self.b.zext(lanes, I32))

        self.raise_with_format(wrong, "ValueError", message_parts)

    def check_static_dims(self, expected_shape, dims: list, where: str) -> None:
        """Every static dimension in one check (one error exit per tensor, not one per
        dimension: the checks are most of a kernel's code), the message with both shapes."""
        static = [(int(extent.value), actual) for extent, actual in zip(expected_shape, dims)
                  if isinstance(extent, tirx.IntImm)]
        if not static:
            return
        wrong = functools.reduce(self.b.or_, [self.b.icmp_signed("!=", actual, I64(extent)) for extent, actual in static])
        shape = ", ".join(str(int(e.value)) if isinstance(e, tirx.IntImm) else _escape(e) for e in expected_shape)
        got = ", ".join("%lld" for _ in dims)
        self.raise_if(wrong, "ValueError", f"{where}: expected shape ({shape}), got ({got})", *dims)

    def check_dim(self, extent, actual: ir.Value, where: str, d: int) -> None:
        what = f"{where} dimension {d}"
        if isinstance(extent, tirx.Var) and handle_of(extent) not in self.origins:
            self.origins[handle_of(extent)] = what
            bits = parse_dtype(str(extent.ty)).bits
            if bits < 64:  # the kernel indexes this dimension with a narrower integer
                self.raise_if(self.b.icmp_signed(">", actual, I64((1 << (bits - 1)) - 1)), "ValueError",
                              f"{what}: %lld is more than the kernel's {bits}-bit index of '{_escape(extent)}' "
                              "takes", actual)
            self.state.bind_value(extent, cast_value(self.b, actual, "int64", str(extent.ty)))
            return
        expected = self.exprs.lower_as(extent, "int64")
        origin = self.origins.get(handle_of(extent), "the symbolic dimensions bound earlier")
        self.raise_if(self.b.icmp_signed("!=", actual, expected), "ValueError",
                      f"{what}: expected %lld (the value of '{_escape(extent)}' from "
                      f"{_escape(origin)}), got %lld", expected, actual)

    def check_strides(self, tensor, dims: list, where: str) -> None:
        """Strides NULL (compact) or exactly row-major; dims of extent 1 take any stride."""
        strides = load_field(self.b, tensor, DL_STRIDES, PTR, "strides")
        has_strides = self.b.icmp_unsigned("!=", strides, ir.Constant(PTR, None))
        check, done = self.state.new_block("strides.check"), self.state.new_block("strides.ok")
        self.b.cbranch(has_strides, check, done)
        self.b.position_at_end(check)
        expected, wrong, found = I64(1), ir.Constant(ir.IntType(1), 0), [None] * len(dims)
        for d in reversed(range(len(dims))):
            found[d] = self.b.load(self.b.gep(strides, [I64(d)], source_etype=I64), typ=I64)
            wrong = self.b.or_(wrong, self.b.and_(self.b.icmp_signed("!=", found[d], expected),
                                                  self.b.icmp_signed("!=", dims[d], I64(1))))
            expected = int_arith(self.b, "mul", expected, dims[d])
        if dims:
            self.raise_if(wrong, "ValueError", f"{where}: expected a compact row-major tensor, got strides "
                          f"({', '.join('%lld' for _ in dims)})", *found)
        self.b.branch(done)
        self.b.position_at_end(done)


def is_view(func, index: int) -> bool:
    views = (func.attrs or {}).get("cgra.arg_shapes")
    return views is not None and len(views[index]) > 0


def caller_shape(func, index: int):
    """The shape the caller passes for parameter `index`: the parameter's own, unless the
    kernel reads that argument through a view (attribute `cgra.arg_shapes`, e.g. a grouped
    conv2d reads its (N, C, H, W) data as (N * G, C / G, H, W); both are compact, one size)."""
    param = func.params[index]
    if not is_view(func, index):
        return param.ty.shape
    shape = [tirx.IntImm("int64", int(extent)) if isinstance(extent, (int, tirx.IntImm)) else extent
             for extent in func.attrs["cgra.arg_shapes"][index]]
    if not sym.Analyzer().can_prove_equal(_product(param.ty.shape), _product(shape)):
        raise CodegenError(str(func.attrs.get("global_symbol", "")), f"parameter '{param.name}' "
                           f"views a {list(shape)} argument as {list(param.ty.shape)}: the sizes differ")
    return shape


def _product(extents):
    """The number of elements, in the kernels' int32 index arithmetic (symbolic extents are
    int32 variables), so that products of the same variables compare equal."""
    total = tirx.IntImm("int32", 1)
    for extent in extents:
        if isinstance(extent, tirx.IntImm):
            extent = tirx.IntImm("int32", int(extent.value))
        elif str(extent.ty) != "int32":
            extent = tirx.Cast("int32", extent)
        total = total * extent
    return total


def _require_plain_layout(kernel: str, param) -> None:
    ty = param.ty
    if len(ty.strides) or not (isinstance(ty.elem_offset, tirx.IntImm)
                               and int(ty.elem_offset.value) == 0):
        raise CodegenError(kernel, f"parameter '{param.name}' declares strides or an element "
                           "offset; the CGRA runtime binds compact tensors only")


def emit_kernel(mb: ModuleBuilder, func, kernel: str, arch, plan: ScratchpadPlan) -> ir.Function:
    """Add `__tvm_ffi_<kernel>` for `func` to the module."""
    fn = ir.Function(mb.module, FFI_FUNCTION_TYPE, FFI_SYMBOL_PREFIX + kernel)
    for arg, name in zip(fn.args, ("self", "args", "num_args", "result")):
        arg.name = name
    entry = fn.append_basic_block("entry")  # only allocas, then a branch to the prologue
    prologue = fn.append_basic_block("prologue")
    state = KernelState(kernel, func, plan, mb, fn, ir.IRBuilder(prologue), ir.IRBuilder(entry))
    params = list(func.params)
    tensors = ArgumentChecks(state, fn.args[1], fn.args[2]).emit(params)
    _begin(state, arch, len(params))
    for slot, (param, tensor) in enumerate(zip(params, tensors)):
        state.bind_buffer(param, BufferBinding(param.name, HOST_TENSOR, str(param.ty.dtype),
                                               root=param, slot=slot))
        bind = state.builder.call(mb.runtime("cgra_kernel_bind"),
                                  [state.kernel_handle, I32(slot), tensor], name="bind.status")
        state.branch_on_failure(bind)
    BodyLowering(state).lower(func.body)
    _finish(state, fn.args[3])
    state.entry_builder.branch(prologue)
    return fn


def _begin(state: KernelState, arch, num_slots: int) -> None:
    """%k = cgra_kernel_begin(...); NULL returns -1 (the runtime has set the error)."""
    mb, b = state.mb, state.builder
    begin = mb.runtime("cgra_kernel_begin")
    missing, present = state.new_block("runtime.missing"), state.new_block("runtime.present")
    b.cbranch(b.icmp_unsigned("==", b.ptrtoint(begin, I64), I64(0)), missing, present)
    b.position_at_end(missing)  # a weak symbol left NULL: the library was loaded on its own
    state.set_error("RuntimeError", mb.cstring(
        f"kernel '{state.kernel}' needs the CGRA runtime, which is not loaded: `import npu_backend` "
        "before loading or running this library (it loads the runtime and the simulator)"))
    b.ret(I32(-1))
    b.position_at_end(present)
    source_ops = str(state.func.attrs.get("cgra.source_ops") or "")
    macs_per_output = state.func.attrs.get("cgra.macs_per_output")
    handle = b.call(begin, [
        mb.cstring(state.kernel), mb.cstring(source_ops), mb.cstring(arch.to_json()),
        I64(arch.spad_bytes), I32(RUNTIME_ABI_VERSION), I32(num_slots),
        I64(-1 if macs_per_output is None else int(macs_per_output))], name="k")
    state.kernel_handle = handle
    failed, started = state.new_block("begin.failed"), state.new_block("launch")
    b.cbranch(b.icmp_unsigned("==", handle, ir.Constant(PTR, None)), failed, started)
    b.position_at_end(failed)
    b.ret(I32(-1))
    state.fail_block = state.new_block("launch.failed")
    b.position_at_end(state.fail_block)
    b.call(mb.runtime("cgra_kernel_end"), [handle])  # frees the launch, keeps the first error
    b.ret(I32(-1))
    b.position_at_end(started)


def _finish(state: KernelState, result: ir.Value) -> None:
    """status = cgra_kernel_end(%k); on success result = None, return 0."""
    b = state.builder
    status = b.call(state.mb.runtime("cgra_kernel_end"), [state.kernel_handle], name="end.status")
    failed, done = state.new_block("end.failed"), state.new_block("done")
    b.cbranch(b.icmp_signed("!=", status, I32(0)), failed, done)
    b.position_at_end(failed)
    b.ret(I32(-1))
    b.position_at_end(done)
    b.store(I32(TYPE_INDEX_NONE), result)
    b.store(I32(0), byte_address(b, result, 4))
    b.store(I64(0), byte_address(b, result, ANY_VALUE_OFFSET))
    b.ret(I32(0))
