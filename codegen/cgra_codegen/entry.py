"""The exported tvm-ffi function of one kernel: argument checks, launch, body, exit (stage: codegen).

In: a lowered PrimFunc, its scratchpad plan, the hardware description. Out: the LLVM function
`__tvm_ffi_<global_symbol>` with the ABI `i32 (ptr self, ptr args, i32 num_args, ptr result)`:

1. checks that the runtime is loaded, then every argument: the runtime's `cgra_check_tensor_arg`
   (tensor, dtype, rank, static dims, compact strides, CPU), then the symbolic dims here, raising
   a Python ValueError/TypeError that names the kernel and the argument;
2. `cgra_kernel_begin` + one `cgra_kernel_bind` per parameter (slot = parameter index); a
   parameter the PrimFunc lists in READ_PARAMS_ATTR (an embedding lookup's indices) may also be
   read by the kernel's control code, which issues commands from their values (one DMA box
   per row read) and is not bound (any integer dtype; its slot stays empty); every other
   parameter is touched by device commands only;
3. the body (walker.py), every runtime call checked;
4. `cgra_kernel_end`; result = None, or with RETURNS_OUT_ATTR its last argument (a KV cache
   written in place: Relax's call_inplace_packed takes the call's result as the tensor written). Any failure after begin leaves through one error exit that
   still calls `cgra_kernel_end` (it frees the launch) and returns -1.
"""

from __future__ import annotations

import llvmlite.ir as ir
from tvm import sym, tirx

from .context import HOST_TENSOR, BufferBinding, KernelState
from .errors import CodegenError
from .exprs import ExprLowering
from .llvm_types import (ANY_VALUE_OFFSET, DL_BYTE_OFFSET, DL_NDIM, DL_SHAPE, DL_STRIDES, DL_TENSOR_BYTES,
                         FFI_FUNCTION_TYPE,
                         FFI_SYMBOL_PREFIX, I8, I32, I64, PTR, RUNTIME_ABI_VERSION, TYPE_INDEX_NONE, ModuleBuilder,
                         byte_address, cast_value, load_field, parse_dtype)
from .spad import ScratchpadPlan, handle_of
from .walker import BodyLowering

#: The PrimFunc attribute listing the parameters (positions) the control code reads.
READ_PARAMS_ATTR = "cgra.read_params"
#: The PrimFunc attribute saying the kernel returns its output tensor (kernels/layout/cache_write.py).
RETURNS_OUT_ATTR = "cgra.returns_out"
#: The first FFI type index of an object (a Tensor is 70): a returned object gets a reference.
_FIRST_OBJECT_INDEX = 64

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
        """The runtime checks the argument (cgra_check_tensor_arg: tensor, dtype, rank, static
        extents, strides, device; one call instead of the ~100 instructions per argument these
        checks took inline), then the code binds and checks its symbolic extents."""
        position = index if position is None else position
        _require_plain_layout(self.state.kernel, param)
        expected_shape = caller_shape(self.state.func, index)
        tensor = self.runtime_checked(position, param, expected_shape)
        symbolic = [d for d, extent in enumerate(expected_shape) if not isinstance(extent, tirx.IntImm)]
        if symbolic:
            where = f"argument {position} ('{_escape(param.name)}')"
            shape = load_field(self.b, tensor, DL_SHAPE, PTR, "shape")
            for d in symbolic:
                actual = self.b.load(self.b.gep(shape, [I64(d)], source_etype=I64), typ=I64)
                self.check_dim(expected_shape[d], actual, where, d)
        if is_view(self.state.func, index):
            return self.reshaped(tensor, param, index)
        return tensor

    def runtime_checked(self, position: int, param, expected_shape) -> ir.Value:
        mb, dtype = self.state.mb, parse_dtype(param.ty.dtype)
        extents = [int(e.value) if isinstance(e, tirx.IntImm) else -1 for e in expected_shape]
        text = "(" + ", ".join(str(int(e.value)) if isinstance(e, tirx.IntImm) else str(e)
                               for e in expected_shape) + ")"
        shape = mb.constant_i64s(extents) if extents else ir.Constant(PTR, None)
        tensor = self.b.call(mb.runtime("cgra_check_tensor_arg"), [
            self.args, I32(position), mb.cstring(self.state.kernel), mb.cstring(param.name),
            mb.cstring(str(param.ty.dtype)), I32(dtype.type_code), I32(dtype.bits), I32(dtype.lanes),
            I32(len(extents)), shape, mb.cstring(text)], name="dltensor")
        failed, ok = self.state.new_block("arg.error"), self.state.new_block("arg.ok")
        self.b.cbranch(self.b.icmp_unsigned("==", tensor, ir.Constant(PTR, None)), failed, ok)
        self.b.position_at_end(failed)  # the runtime has set the error
        self.b.ret(I32(-1))
        self.b.position_at_end(ok)
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
    _require_runtime(state)
    tensors = ArgumentChecks(state, fn.args[1], fn.args[2]).emit(params)
    _begin(state, arch, len(params))
    readable = {int(position) for position in (func.attrs or {}).get(READ_PARAMS_ATTR, [])}
    for slot, (param, tensor) in enumerate(zip(params, tensors)):
        state.bind_buffer(param, BufferBinding(param.name, HOST_TENSOR, str(param.ty.dtype), root=param, slot=slot,
                                               pointer=_data(state, tensor) if slot in readable else None))
        if slot in readable:
            continue  # read by the control code, never by the DMA: its slot stays unbound
        bind = state.builder.call(mb.runtime("cgra_kernel_bind"),
                                  [state.kernel_handle, I32(slot), tensor], name="bind.status")
        state.branch_on_failure(bind)
    BodyLowering(state).lower(func.body)
    _finish(state, fn.args[3], fn.args[1] if (func.attrs or {}).get(RETURNS_OUT_ATTR) else None, len(params))
    state.entry_builder.branch(prologue)
    return fn


def _data(state: KernelState, tensor) -> ir.Value:
    """The address of a tensor's first element (its DLTensor's data + byte_offset): what the
    kernel's control code reads an index tensor through (READ_PARAMS_ATTR)."""
    b = state.builder
    data = load_field(b, tensor, 0, PTR, "data")
    return b.gep(data, [load_field(b, tensor, DL_BYTE_OFFSET, I64, "byte_offset")], source_etype=I8)


def _require_runtime(state: KernelState) -> None:
    """The runtime's functions are weak symbols: NULL when the library was loaded on its own."""
    mb, b = state.mb, state.builder
    check = mb.runtime("cgra_check_tensor_arg")
    missing, present = state.new_block("runtime.missing"), state.new_block("runtime.present")
    b.cbranch(b.icmp_unsigned("==", b.ptrtoint(check, I64), I64(0)), missing, present)
    b.position_at_end(missing)
    state.set_error("RuntimeError", mb.cstring(
        f"kernel '{state.kernel}' needs the CGRA runtime, which is not loaded: `import npu_backend` "
        "before loading or running this library (it loads the runtime and the simulator)"))
    b.ret(I32(-1))
    b.position_at_end(present)


def _begin(state: KernelState, arch, num_slots: int) -> None:
    """%k = cgra_kernel_begin(...); NULL returns -1 (the runtime has set the error)."""
    mb, b = state.mb, state.builder
    begin = mb.runtime("cgra_kernel_begin")
    source_ops = str(state.func.attrs.get("cgra.source_ops") or "")
    macs_per_output = state.func.attrs.get("cgra.macs_per_output")
    handle = b.call(begin, [
        mb.cstring(state.kernel), mb.cstring(source_ops), mb.cstring(arch.to_json()),
        I64(arch.spad_bytes), I32(RUNTIME_ABI_VERSION), I32(num_slots),
        I64(-1 if macs_per_output is None else int(macs_per_output)),
        I64(int(state.func.attrs.get("cgra.macs_divisor", 1)))], name="k")
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


def _finish(state: KernelState, result: ir.Value, args: ir.Value | None = None, count: int = 0) -> None:
    """status = cgra_kernel_end(%k); on success result = None (with `args`: the last of the
    `count` arguments, an object given one more reference), return 0."""
    b = state.builder
    status = b.call(state.mb.runtime("cgra_kernel_end"), [state.kernel_handle], name="end.status")
    failed, done = state.new_block("end.failed"), state.new_block("done")
    b.cbranch(b.icmp_signed("!=", status, I32(0)), failed, done)
    b.position_at_end(failed)
    b.ret(I32(-1))
    b.position_at_end(done)
    if args is not None:
        _return_argument(state, result, byte_address(b, args, (count - 1) * 16))
        return
    b.store(I32(TYPE_INDEX_NONE), result)
    b.store(I32(0), byte_address(b, result, 4))
    b.store(I64(0), byte_address(b, result, ANY_VALUE_OFFSET))
    b.ret(I32(0))


def _return_argument(state: KernelState, result: ir.Value, argument: ir.Value) -> None:
    """result = the TVMFFIAny at `argument`, an object's reference count raised (the caller
    then owns one reference more, as for any returned object); return 0."""
    b = state.builder
    type_index = b.load(argument, typ=I32, name="out.type_index")
    value = load_field(b, argument, ANY_VALUE_OFFSET, I64, "out.value")
    b.store(type_index, result)
    b.store(I32(0), byte_address(b, result, 4))
    b.store(value, byte_address(b, result, ANY_VALUE_OFFSET))
    counted, done = state.new_block("out.counted"), state.new_block("out.done")
    b.cbranch(b.icmp_signed(">=", type_index, I32(_FIRST_OBJECT_INDEX)), counted, done)
    b.position_at_end(counted)
    b.call(state.mb.function("TVMFFIObjectIncRef", ir.FunctionType(I32, [PTR])), [b.inttoptr(value, PTR)])
    b.branch(done)
    b.position_at_end(done)
    b.ret(I32(0))
