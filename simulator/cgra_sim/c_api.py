"""The runtime's C sources, generated from the instruction set so the two never disagree.

Stage: shared; run at build time by CMakeLists.txt as `python -m cgra_sim.c_api GEN_DIR`. In: the
tables of `cgra_sim.isa` (the record layouts and `COMMAND_FUNCTIONS`). Out, into GEN_DIR
(`GENERATED_FILES`): `cgra_isa.h` (opcodes, flags, dtypes, every field's word index),
`cgra_commands.h` (the command functions' prototypes, with their documentation) and
`cgra_commands.inc` (their definitions: each packs its parameters into a record and hands it to
the recorder with its opcode's check, `cgra::Check<Op>` in runtime/src/checks.h). Pure Python.
"""

from __future__ import annotations

import os
import sys
import textwrap

from .isa import (BODY_FIRST_NODE, BODY_IMMEDIATE, BODY_INPUT_A, BODY_INPUT_B, BODY_MAX_NODES, BOX_DIMS,
                  BOX_WORDS, COMMAND_FUNCTIONS, DMA_FILL_LOWEST, EPILOGUE_BIAS, EPILOGUE_CLIP, EPILOGUE_RELU,
                  EPILOGUE_DEQUANTISE, EPILOGUE_REQUANTISE, EPILOGUE_RESIDUAL, FABRIC_INPUT_B, FABRIC_INT8, FIELDS, GEMM_ACCUMULATE, POOL_AVERAGE,
                  RECORD_WORDS, SLOT_FIELDS, SLOT_FLAG_CONSTANT, SLOT_WORDS, STREAM_VERSION, BodyOp, CommandFunction, DType,
                  EltwiseFunc, Op, ParamKind, ReduceFunc, VFunc, VFUNC_FLOAT32_IN, VFUNC_FLOAT32_OUT, VFUNC_OFFSET, VFUNC_SCALE,
                  UNPACK4_INT8, UNPACK4_ZERO_POINTS)


def c_header() -> str:
    """gen/cgra_isa.h: the stream's constants and every record field's word index."""
    lines = [
        _GENERATED,
        "#ifndef CGRA_ISA_H_",
        "#define CGRA_ISA_H_",
        f"#define CGRA_STREAM_VERSION {STREAM_VERSION}",
        f"#define CGRA_RECORD_WORDS {RECORD_WORDS}",
        f"#define CGRA_BOX_DIMS {BOX_DIMS}",
        f"#define CGRA_BOX_WORDS {BOX_WORDS}",
        f"#define CGRA_SLOT_WORDS {SLOT_WORDS}",
        f"#define CGRA_DMA_FILL_LOWEST {DMA_FILL_LOWEST}",
        f"#define CGRA_GEMM_ACCUMULATE {GEMM_ACCUMULATE}",
        f"#define CGRA_EPILOGUE_BIAS {EPILOGUE_BIAS}",
        f"#define CGRA_EPILOGUE_RELU {EPILOGUE_RELU}",
        f"#define CGRA_EPILOGUE_RESIDUAL {EPILOGUE_RESIDUAL}",
        f"#define CGRA_EPILOGUE_CLIP {EPILOGUE_CLIP}",
        f"#define CGRA_POOL_AVERAGE {POOL_AVERAGE}",
        f"#define CGRA_EPILOGUE_REQUANTISE {EPILOGUE_REQUANTISE}",
        f"#define CGRA_EPILOGUE_DEQUANTISE {EPILOGUE_DEQUANTISE}",
        f"#define CGRA_FABRIC_INPUT_B {FABRIC_INPUT_B}",
        f"#define CGRA_FABRIC_INT8 {FABRIC_INT8}",
        f"#define CGRA_VFUNC_SCALE {VFUNC_SCALE}",
        f"#define CGRA_VFUNC_OFFSET {VFUNC_OFFSET}",
        f"#define CGRA_VFUNC_FLOAT32_IN {VFUNC_FLOAT32_IN}",
        f"#define CGRA_VFUNC_FLOAT32_OUT {VFUNC_FLOAT32_OUT}",
        f"#define CGRA_UNPACK4_ZERO_POINTS {UNPACK4_ZERO_POINTS}",
        f"#define CGRA_UNPACK4_INT8 {UNPACK4_INT8}",
        f"#define CGRA_BODY_INPUT_A {BODY_INPUT_A}",
        f"#define CGRA_BODY_INPUT_B {BODY_INPUT_B}",
        f"#define CGRA_BODY_FIRST_NODE {BODY_FIRST_NODE}",
        f"#define CGRA_BODY_IMMEDIATE {BODY_IMMEDIATE}",
        f"#define CGRA_BODY_MAX_NODES {BODY_MAX_NODES}",
    ]
    lines += [f"#define CGRA_OP_{op.name} {int(op)}" for op in Op]
    lines.append("#define CGRA_OPS(X) " + " ".join(f"X({op.name})" for op in Op))  # X-macro
    lines += [f"#define CGRA_DTYPE_{dt.name} {int(dt)}" for dt in DType]
    lines += [f"#define CGRA_ELTWISE_{func.name} {int(func)}" for func in EltwiseFunc]
    lines += [f"#define CGRA_REDUCE_{func.name} {int(func)}" for func in ReduceFunc]
    lines += [f"#define CGRA_VFUNC_{func.name} {int(func)}" for func in VFunc]
    lines += [f"#define CGRA_BODY_{op.name} {int(op)}" for op in BodyOp]
    lines += [f"#define CGRA_DTYPE_{dt.name}_BYTES {dt.itemsize}" for dt in DType]
    for op, fields in FIELDS.items():
        lines += [f"#define CGRA_{op.name}_{name.upper()} {i}" for i, name in enumerate(fields)]
    lines += [f"#define CGRA_SLOT_{name.upper()} {i}" for i, name in enumerate(SLOT_FIELDS)]
    lines.append(f"#define CGRA_SLOT_FLAG_CONSTANT {SLOT_FLAG_CONSTANT}")
    lines.append("#endif  /* CGRA_ISA_H_ */")
    return "\n".join(lines) + "\n"


def c_prototypes() -> str:
    """gen/cgra_commands.h: the command functions' prototypes, included by cgra_runtime.h."""
    lines = [_GENERATED, "#ifndef CGRA_COMMANDS_H_", "#define CGRA_COMMANDS_H_",
             "#ifndef CGRA_RUNTIME_H_", '#error "include cgra_runtime.h, not this file"', "#endif"]
    for command in COMMAND_FUNCTIONS.values():
        lines += ["", _c_comment(command.doc), _c_signature(command, "CGRA_RUNTIME_API ") + ";"]
    lines.append("\n#endif  /* CGRA_COMMANDS_H_ */")
    return "\n".join(lines) + "\n"


def c_definitions() -> str:
    """gen/cgra_commands.inc: the command functions, included by runtime/src/c_api.cc (which
    defines RecordOn). Each packs its parameters into a zeroed record, word by word, and hands it
    to the recorder with the opcode's check (runtime/src/checks.h: Check<Op>)."""
    lines = [_GENERATED]
    for command in COMMAND_FUNCTIONS.values():
        lines += ["", _c_signature(command) + " {"] + _c_body(command) + ["}"]
    return "\n".join(lines) + "\n"


_GENERATED = ("/* Generated from cgra_sim/isa.py by `python -m cgra_sim.c_api GEN_DIR`. "
              "Do not edit. */")
#: What `python -m cgra_sim.c_api GEN_DIR` writes (CMakeLists.txt runs it at build time).
GENERATED_FILES = {"cgra_isa.h": c_header, "cgra_commands.h": c_prototypes,
                   "cgra_commands.inc": c_definitions}


def _c_comment(text: str) -> str:
    return "/* " + "\n * ".join(textwrap.wrap(text, 96)) + " */"


def _c_signature(command: CommandFunction, prefix: str = "") -> str:
    """`int32_t cgra_x(CGRAKernel* kernel, ...)`, wrapped at 100 columns under its parenthesis."""
    head = f"{prefix}int32_t {command.name}("
    params = ["CGRAKernel* kernel"] + [f"{p.kind.c_type} {p.name}" for p in command.params]
    lines, line = [], head
    for index, param in enumerate(params):
        text = param + (", " if index + 1 < len(params) else ")")
        if line != head and len(line) + len(text.rstrip()) > 100:
            lines.append(line.rstrip())
            line = " " * len(head)
        line += text
    return "\n".join(lines + [line])


def _c_body(command: CommandFunction) -> list[str]:
    op = f"CGRA_OP_{command.op.name}"
    index = f"CGRA_{command.op.name}_"  # + FIELD: the field's word (cgra_isa.h)
    check = "Check" + "".join(part.title() for part in command.op.name.split("_"))
    lines = [f'  return RecordOn(kernel, "{command.name}", [&](CGRAKernel& recorder) {{']
    lines += [f'    if ({p.name} == nullptr) recorder.RaiseCommandError({op}, "{p.name} is NULL");'
              for p in command.params if p.kind is ParamKind.BOX]
    lines += ["    int64_t record[CGRA_RECORD_WORDS] = {};", f"    record[{index}OP] = {op};"]
    lines += [f"    record[{index}{field.upper()}] = 0;" for field in command.fixed]
    for param in command.params:
        first = index + command.fields_of(param)[0].upper()
        if param.kind is ParamKind.BOX:
            end = f"{param.name} + CGRA_BOX_WORDS"
            lines.append(f"    std::copy({param.name}, {end}, record + {first});")
        else:
            lines.append(f"    record[{first}] = {param.name};")
    return lines + [f"    recorder.Record(record, cgra::{check});", "  });"]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m cgra_sim.c_api GEN_DIR   (writes the runtime's generated "
                 f"sources: {', '.join(GENERATED_FILES)})")
    os.makedirs(sys.argv[1], exist_ok=True)
    for _name, _render in GENERATED_FILES.items():
        with open(os.path.join(sys.argv[1], _name), "w", encoding="utf-8") as _out:
            _out.write(_render())
