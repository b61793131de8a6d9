"""LLVM types, the tvm-ffi / DLPack memory layouts, and the runtime's kernel-lifecycle functions.

Stage: codegen (shared by the prologue and the body walker). In: TIR dtype strings. Out: llvmlite
types and values. Every pointer is opaque (`ptr`); struct fields are reached by byte offsets, which
are written down here once.
"""

from __future__ import annotations

import llvmlite.ir as ir
import tvm

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()
VOID = ir.VoidType()

#: CGRA_RUNTIME_ABI_VERSION of docs/runtime-abi.md that the generated code is compiled against.
RUNTIME_ABI_VERSION = 10

# tvm-ffi: `int f(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result)`.
FFI_FUNCTION_TYPE = ir.FunctionType(I32, [PTR, PTR, I32, PTR])
FFI_SYMBOL_PREFIX = "__tvm_ffi_"
ANY_VALUE_OFFSET = 8
TYPE_INDEX_NONE = 0

# DLTensor field offsets (bytes).
DL_NDIM = 16
DL_SHAPE = 24
DL_STRIDES = 32
DL_BYTE_OFFSET = 40
DL_TENSOR_BYTES = 48  # data, device, ndim, dtype, shape, strides, byte_offset

#: The runtime's kernel-lifecycle and error functions (device commands: see device_calls.py).
RUNTIME_FUNCTIONS = {
    "cgra_kernel_begin": ir.FunctionType(PTR, [PTR, PTR, PTR, I64, I32, I32, I64, I64]),
    "cgra_kernel_bind": ir.FunctionType(I32, [PTR, I32, PTR]),
    "cgra_kernel_end": ir.FunctionType(I32, [PTR]),
    # (args, position, kernel, parameter, dtype name, code, bits, lanes, ndim, shape, shape text)
    "cgra_check_tensor_arg": ir.FunctionType(PTR, [PTR, I32, PTR, PTR, PTR, I32, I32, I32, I32, PTR, PTR]),
    "TVMFFIErrorSetRaisedFromCStr": ir.FunctionType(VOID, [PTR, PTR]),
    "snprintf": ir.FunctionType(I32, [PTR, I64, PTR], var_arg=True),
}


def parse_dtype(dtype) -> tvm.runtime.DataType:
    return tvm.runtime.DataType(str(dtype))


def is_float(dtype) -> bool:
    return parse_dtype(dtype).type_code in (2, 4)


def is_bool(dtype) -> bool:
    return str(dtype) == "bool"


def is_signed(dtype) -> bool:
    return parse_dtype(dtype).type_code == 0


def itemsize(dtype) -> int:
    parsed = parse_dtype(dtype)
    return (parsed.bits * parsed.lanes + 7) // 8


def llvm_type(dtype) -> ir.Type:
    """The LLVM type of a scalar TIR value of `dtype` (bool is i1)."""
    text = str(dtype)
    if text == "bool":
        return I1
    if text == "handle":
        return PTR
    parsed = parse_dtype(text)
    if parsed.lanes != 1:
        raise ValueError(f"vector dtype {text}")
    if parsed.type_code in (0, 1):
        return ir.IntType(parsed.bits)
    floats = {16: ir.HalfType(), 32: ir.FloatType(), 64: ir.DoubleType()}
    if parsed.type_code == 2 and parsed.bits in floats:
        return floats[parsed.bits]
    raise ValueError(f"dtype {text}")


def cast_value(builder: ir.IRBuilder, value: ir.Value, src, dst) -> ir.Value:
    """Convert `value` of TIR dtype `src` to TIR dtype `dst` with C conversion semantics."""
    src, dst = str(src), str(dst)
    if src == dst:
        return value
    target = llvm_type(dst)
    if is_bool(dst):
        if is_float(src):
            return builder.fcmp_unordered("!=", value, ir.Constant(value.type, 0.0))
        return builder.icmp_unsigned("!=", value, ir.Constant(value.type, 0))
    if is_float(src) and is_float(dst):
        widen = _float_bits(target) > _float_bits(value.type)
        return builder.fpext(value, target) if widen else builder.fptrunc(value, target)
    if is_float(src):
        return builder.fptosi(value, target) if is_signed(dst) else builder.fptoui(value, target)
    if is_float(dst):
        return builder.sitofp(value, target) if is_signed(src) else builder.uitofp(value, target)
    if isinstance(value, ir.Constant) and isinstance(value.constant, int):
        return ir.Constant(target, wrap_int(value.constant, value.type.width, is_signed(src),
                                            target.width))
    if target.width < value.type.width:
        return builder.trunc(value, target)
    if target.width == value.type.width:
        return value
    return builder.sext(value, target) if is_signed(src) else builder.zext(value, target)


def wrap_int(value: int, width: int, signed: bool, target_width: int) -> int:
    """An integer of `width` bits (read as signed or not) converted to `target_width` bits,
    returned in two's complement (signed) form."""
    value &= (1 << width) - 1
    if signed and width > 1 and value >> (width - 1):
        value -= 1 << width
    value &= (1 << target_width) - 1
    if target_width > 1 and value >> (target_width - 1):
        value -= 1 << target_width
    return value


_FOLDABLE = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}


def int_arith(builder: ir.IRBuilder, op: str, a: ir.Value, b: ir.Value, name: str = ""):
    """Integer add/sub/mul, folded when both sides are constants (keeps the IR readable:
    most addresses and box words are compile-time constants)."""
    if is_int_constant(a) and is_int_constant(b):
        width = a.type.width
        return ir.Constant(a.type, wrap_int(_FOLDABLE[op](a.constant, b.constant), width, True,
                                            width))
    if op == "mul" and is_int_constant(b, 1) or op in ("add", "sub") and is_int_constant(b, 0):
        return a
    if op == "mul" and is_int_constant(a, 1) or op == "add" and is_int_constant(a, 0):
        return b
    return getattr(builder, op)(a, b, name=name)


def is_int_constant(value, equal_to=None) -> bool:
    if not (isinstance(value, ir.Constant) and isinstance(value.constant, int)):
        return False
    return equal_to is None or value.constant == equal_to


def _float_bits(ty: ir.Type) -> int:
    return {"half": 16, "float": 32, "double": 64}[str(ty)]


def byte_address(builder: ir.IRBuilder, base: ir.Value, offset: int) -> ir.Value:
    """`base + offset` bytes, as a pointer."""
    return builder.gep(base, [I64(offset)], source_etype=I8)


def load_field(builder: ir.IRBuilder, base: ir.Value, offset: int, ty: ir.Type, name: str = ""):
    return builder.load(byte_address(builder, base, offset), name=name, typ=ty)


class ModuleBuilder:
    """One llvmlite module plus the declarations and string constants the kernels share."""

    def __init__(self, name: str, triple: str):
        self.module = ir.Module(name)
        self.module.triple = triple
        self._constants: dict[tuple, ir.GlobalVariable] = {}  # (kind, value) -> its private global

    def function(self, name: str, fnty: ir.FunctionType) -> ir.Function:
        """The declaration of external C function `name` (created on first use). The CGRA
        runtime's functions are weak: a library loaded without the runtime (no `import
        npu_backend`) sees them as NULL, and the kernel raises an error instead of the dynamic
        loader killing the process (entry.py checks cgra_kernel_begin first)."""
        existing = self.module.globals.get(name)
        if existing is not None:
            if existing.function_type != fnty:
                raise ValueError(f"'{name}' declared twice with different C types")
            return existing
        function = ir.Function(self.module, fnty, name)
        if name.startswith("cgra_"):
            function.linkage = "extern_weak"
        return function

    def runtime(self, name: str) -> ir.Function:
        return self.function(name, RUNTIME_FUNCTIONS[name])

    def constant_i64s(self, values: list[int]) -> ir.GlobalVariable:
        """A private constant array of int64 `values` (one global per distinct list)."""
        return self._constant(("i64s", tuple(values)), ir.ArrayType(I64, len(values)), list(values), ".i64s")

    def cstring(self, text: str) -> ir.GlobalVariable:
        """A NUL-terminated private constant holding `text` (one global per distinct text)."""
        data = bytearray(text.encode("utf-8")) + b"\0"
        return self._constant(("str", text), ir.ArrayType(I8, len(data)), data, ".str")

    def _constant(self, key, ty: ir.Type, value, prefix: str) -> ir.GlobalVariable:
        if key not in self._constants:
            var = ir.GlobalVariable(self.module, ty, self.module.get_unique_name(prefix))
            var.linkage = "private"
            var.global_constant = True
            var.unnamed_addr = True
            var.initializer = ir.Constant(ty, value)
            var.type = PTR  # opaque, whatever llvmlite's typed-pointer setting
            self._constants[key] = var
        return self._constants[key]
