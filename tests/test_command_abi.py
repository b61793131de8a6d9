"""Tests of the one source of the command ABI: isa.COMMAND_FUNCTIONS, what is generated from it
(the runtime's C prototypes and definitions) and what the compiler derives from it (the code
generator's calls with their LLVM types, the TIR builder `device_call`).

Stage: shared (isa) and codegen. Pure Python: no runtime build, no kernel compiled.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import tvm
from tvm import tirx

from cgra_codegen import DEVICE_CALLS, SPAD_SCOPE, DeviceCallError, device_call, device_call_positions
from cgra_sim import c_api, isa
from cgra_sim.isa import COMMAND_FUNCTIONS, FIELDS, Op, ParamKind

COMMANDS = list(COMMAND_FUNCTIONS.values())
C_TO_LLVM = {"CGRAKernel*": "ptr", "int32_t": "i32", "int64_t": "i64", "const int64_t*": "ptr"}


def generated_prototypes() -> dict[str, list[tuple[str, str]]]:
    """name -> [(C type, parameter name), ...] of every prototype in gen/cgra_commands.h."""
    found = re.findall(r"CGRA_RUNTIME_API int32_t (cgra_\w+)\(([^)]*)\);", c_api.c_prototypes())
    return {name: [tuple(param.strip().rsplit(" ", 1)) for param in params.split(",")]
            for name, params in found}


# The table --------------------------------------------------------------------------------------

def test_every_opcode_has_exactly_one_command_function():
    assert list(COMMAND_FUNCTIONS) == list(Op)
    for op, command in COMMAND_FUNCTIONS.items():
        assert command.op is op and command.name == f"cgra_{op.name.lower()}"
        names = [param.name for param in command.params]
        assert len(set(names)) == len(names), command.name


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_every_record_field_is_a_parameter_or_fixed(command):
    filled = ["op", *command.fixed]
    for param in command.params:
        filled += command.fields_of(param)
    assert sorted(filled) == sorted(FIELDS[command.op])  # each field exactly once


def test_flag_dependent_parameters_name_a_bit_of_the_flags_parameter():
    gated = {(c.op, p.name): p.when for c in COMMANDS for p in c.params if p.when}
    for (op, name), bit in gated.items():
        flags = [p for p in COMMAND_FUNCTIONS[op].params if p.name == "flags"]
        assert flags and flags[0].kind is ParamKind.INT32, (op, name)
        assert bit & (bit - 1) == 0, (op, name)  # one bit
    # The addresses the code generator passes as 0 when their bit is off.
    assert {key: bit for key, bit in gated.items() if key[1].endswith("_addr")} == {
        (Op.EPILOGUE, "bias_addr"): isa.EPILOGUE_BIAS,
        (Op.EPILOGUE, "residual_addr"): isa.EPILOGUE_RESIDUAL,
        (Op.EPILOGUE, "scale_addr"): isa.EPILOGUE_REQUANTISE,
        (Op.FABRIC, "b_addr"): isa.FABRIC_INPUT_B,
        (Op.UNPACK4, "zero_addr"): isa.UNPACK4_ZERO_POINTS,
    }


# What is generated from it, and what the code generator derives --------------------------------

def test_generated_prototypes_agree_with_the_table_and_the_codegen():
    prototypes = generated_prototypes()
    assert list(prototypes) == [c.name for c in COMMANDS] and set(DEVICE_CALLS) == set(prototypes)
    for command in COMMANDS:
        params = prototypes[command.name]
        assert params[0] == ("CGRAKernel*", "kernel")
        assert params[1:] == [(p.kind.c_type, p.name) for p in command.params]
        llvm = f"i32 ({', '.join(C_TO_LLVM[c_type] for c_type, _ in params)})"
        assert str(DEVICE_CALLS[command.name].function_type) == llvm


def test_the_abi_keeps_its_c_signatures():
    """ABI v2: the C types of every command function, as compiled libraries link against them."""
    signatures = {name: [c_type for c_type, _ in params]
                  for name, params in generated_prototypes().items()}
    i32, i64, kernel = "int32_t", "int64_t", "CGRAKernel*"
    assert signatures == {
        "cgra_dma_load": [kernel, i32, i32, i64, "const int64_t*"],
        "cgra_dma_store": [kernel, i32, i64, "const int64_t*"],
        "cgra_gemm": [kernel, i32, i32] + [i64] * 9,
        "cgra_fill": [kernel, i32] + [i64] * 5,
        "cgra_epilogue": [kernel, i32, i32, i32] + [i64] * 13,
        "cgra_depthwise": [kernel, i32, i32] + [i64] * 16,
        "cgra_pool": [kernel, i32, i32] + [i64] * 23,
        "cgra_eltwise": [kernel, i32, i32] + [i64] * 10,
        "cgra_fabric": [kernel, i32, i32] + [i64] * 27,  # ABI v5
        "cgra_reduce": [kernel, i32, i32] + [i64] * 7,  # ABI v8
        "cgra_vfunc": [kernel, i32, i32, i32] + [i64] * 9,  # ABI v8
        "cgra_unpack4": [kernel, i32] + [i64] * 11,  # ABI v9
        "cgra_lookup": [kernel] + [i64] * 7,  # ABI v10
    }


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_generated_definition_packs_every_parameter_into_its_word(command):
    text = c_api.c_definitions()
    body = text[text.index(f"int32_t {command.name}("):]
    body = body[:body.index("\n}\n")]
    prefix = f"CGRA_{command.op.name}_"
    for param in command.params:
        if param.kind is ParamKind.BOX:
            assert f"record + {prefix}ORIGIN0);" in body and f"{param.name} == nullptr" in body
        else:
            assert f"record[{prefix}{param.name.upper()}] = {param.name};" in body
    check = "Check" + command.op.name.title().replace("_", "")
    assert f"recorder.Record(record, cgra::{check});" in body


def test_the_build_writes_the_generated_sources(tmp_path):
    """The command CMakeLists.txt runs, and the header that includes its output."""
    subprocess.run([sys.executable, "-m", "cgra_sim.c_api", str(tmp_path / "gen")], check=True)
    for name, render in c_api.GENERATED_FILES.items():
        assert (tmp_path / "gen" / name).read_text() == render()
    from npu_backend.device import runtime_lib

    header = (runtime_lib.REPO_ROOT / "runtime" / "include" / "cgra_runtime.h").read_text()
    assert '#include "cgra_commands.h"' in header


# The TIR builder --------------------------------------------------------------------------------

def _buffer(name, dtype="int8"):
    """A scratchpad buffer whose element offset is a variable (as in an intrinsic's impl)."""
    offset = tirx.Var(f"{name}_offset", "int32")
    return tirx.decl_buffer((4, 8), dtype, name=name, scope=SPAD_SCOPE, elem_offset=offset)


def test_device_call_orders_operands_and_expands_buffers():
    a, b, acc = _buffer("A"), _buffer("B"), _buffer("Acc", "int32")
    call = device_call("cgra_gemm", acc_stride=8, acc_addr=acc, b_stride=8, b_addr=b, a_stride=8,
                       a_addr=a, k=8, n=8, m=4, dtype=1, flags=isa.GEMM_ACCUMULATE)
    expected = tirx.call_extern("int32", "cgra_gemm", 1, 1, 4, 8, 8, a.data, a.elem_offset, 8,
                                b.data, b.elem_offset, 8, acc.data, acc.elem_offset, 8)
    tvm.ir.assert_structural_equal(call, expected)


def test_device_call_takes_a_slot_an_address_pair_and_a_box():
    host, spad = tirx.decl_buffer((4, 8), "float32", name="X"), _buffer("S")
    box = list(range(100, 128))
    call = device_call("cgra_dma_load", flags=0, slot=host, spad_addr=(spad.data, 16), box=box)
    expected = tirx.call_extern("int32", "cgra_dma_load", 0, host.data, spad.data, 16, *box)
    tvm.ir.assert_structural_equal(call, expected)


def test_device_call_takes_0_for_an_address_only_when_its_flag_may_be_off():
    acc, out = _buffer("Acc", "int32"), _buffer("Out")
    operands = dict(flags=isa.EPILOGUE_RELU, acc_dtype=2, out_dtype=2, m=4, n=8, acc_addr=acc,
                    acc_stride=8, bias_addr=0, out_addr=out, out_stride=8, residual_addr=0,
                    residual_stride=0, clip_lo_bits=0, clip_hi_bits=0, scale_addr=0,
                    out_zero_point=0)
    call = device_call("cgra_epilogue", **operands)
    positions = device_call_positions("cgra_epilogue")
    assert [int(call.args[i]) for i in positions["bias_addr"] + positions["scale_addr"]] == [0] * 4
    with pytest.raises(DeviceCallError, match=r"cgra_epilogue: acc_addr is a scratchpad address: "
                                              r"give a Buffer or \(data, elem_offset\), not 0"):
        device_call("cgra_epilogue", **{**operands, "acc_addr": 0})


@pytest.mark.parametrize("operands, message", [
    (dict(dtype=1, addr=None, rows=1, cols=8, stride=8, value_bits=0, flags=0),
     r"cgra_fill: unknown flags \(its parameters, in order: dtype, addr, rows, cols, stride, "
     r"value_bits\)"),
    (dict(dtype=1, rows=1, cols=8), r"cgra_fill: missing addr, stride, value_bits \(its parameters"),
    (dict(dtype=1, addr=None, rows=1, cols=8, stride=8, value=0),
     r"cgra_fill: unknown value; missing value_bits"),
])
def test_device_call_rejects_unknown_and_missing_parameters(operands, message):
    operands = {key: (_buffer("S") if key == "addr" else value) for key, value in operands.items()}
    with pytest.raises(DeviceCallError, match=message):
        device_call("cgra_fill", **operands)


def test_device_call_rejects_operands_of_the_wrong_kind_and_unknown_calls():
    spad = _buffer("S")
    with pytest.raises(DeviceCallError, match="box takes the DMA box's 28 words as a list"):
        device_call("cgra_dma_store", slot=spad, spad_addr=spad, box=[0] * 27)
    with pytest.raises(DeviceCallError, match="cgra_fill: rows is one int64 value"):
        device_call("cgra_fill", dtype=1, addr=spad, rows=spad, cols=8, stride=8, value_bits=0)
    with pytest.raises(DeviceCallError,
                       match=r"'cgra_teleport' is not a device call \(known: cgra_dma_load"):
        device_call("cgra_teleport")
    assert isinstance(DeviceCallError("x"), TypeError)


def test_positions_of_the_gemm_accumulator():
    positions = device_call_positions("cgra_gemm")
    assert [positions[name] for name in ("flags", "acc_addr", "m", "n", "acc_stride")] == [
        (1,), (12, 13), (3,), (4,), (14,)]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_positions_find_every_operand_device_call_placed(command):
    operands, marks = {}, {}
    for index, param in enumerate(command.params):
        base = 1000 * (index + 1)
        if param.kind is ParamKind.SPAD_ADDR:
            data = tirx.Var(f"{param.name}_data", "handle")
            operands[param.name], marks[param.name] = (data, base), [data, base]
        elif param.kind is ParamKind.BOX:
            operands[param.name] = marks[param.name] = list(range(base, base + isa.BOX_WORDS))
        else:
            operands[param.name], marks[param.name] = base, [base]
    call = device_call(command.name, **operands)
    positions = device_call_positions(command.name)
    assert len(call.args) == 1 + DEVICE_CALLS[command.name].arity
    every = sorted(i for indices in positions.values() for i in indices)
    assert every == list(range(1, len(call.args)))  # each argument belongs to one parameter
    for name, indices in positions.items():
        got = [call.args[i] for i in indices]
        assert all(g.same_as(m) if isinstance(m, tirx.Var) else int(g) == m
                   for g, m in zip(got, marks[name])), name

