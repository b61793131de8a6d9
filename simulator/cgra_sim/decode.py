"""Decoding of a command stream, with every check that needs only one command at a time.

Stage: simulator, step 1 (decode -> dataflow check -> execute -> time). In: the raw records
(int64 array of shape (n, isa.RECORD_WORDS), or the same little-endian bytes), the host tensors
bound to the slots and the hardware description. Out: one decoded command per record
(`DmaCommand`, `GemmCommand`, `DepthwiseCommand`, `FillCommand`, `EpilogueCommand`,
`PoolCommand`, `EltwiseCommand`, `FabricCommand`: commands.py), each naming the scratchpad `Region`s it reads and
writes, so later steps never look at record words again. This module is the driver; the
decoders are per unit: decode_dma.py, decode_pe.py (GEMM, DEPTHWISE, FABRIC), decode_vector.py.

Checks made here (each failure is a `CommandError` naming the command, its kind and the range):
known opcode and flags, unused words zero, dtypes known and combined as isa.ACC_DTYPE says, sizes
>= 1, slots in range, every DMA coordinate inside the tensor plus its halo, every scratchpad byte
inside [0, spad_bytes), and no command writing one element twice (a load whose scratchpad strides
alias, a store whose loops revisit a tensor element, a 2-D destination whose rows overlap), since
the result would then depend on an order the ISA does not define.
"""

from __future__ import annotations


import numpy as np

from .arch import HardwareDescription
from .commands import (DTYPE_OF_NUMPY, Checker, Command, DepthwiseCommand, DmaCommand, EltwiseCommand,
                       EpilogueCommand, FabricCommand, FillCommand, GemmCommand, PoolCommand)
from .decode_dma import decode_dma
from .decode_pe import decode_depthwise, decode_fabric, decode_gemm
from .lookup import decode_lookup
from .unpack4 import decode_unpack4
from .decode_vector import decode_eltwise, decode_epilogue, decode_fill, decode_pool, decode_reduce, decode_vfunc
from .errors import LaunchError
from .isa import BOX_DIMS, FIELDS, RECORD_WORDS, DType, Op

__all__ = ["Command", "DepthwiseCommand", "DmaCommand", "EltwiseCommand", "EpilogueCommand", "FabricCommand",
           "FillCommand", "GemmCommand", "PoolCommand", "as_records", "check_tensors", "decode_stream"]

_OPS = {int(op): op for op in Op}


def as_records(commands) -> np.ndarray:
    """The stream as an int64 array of shape (n, RECORD_WORDS); accepts bytes or an array."""
    if isinstance(commands, (bytes, bytearray, memoryview)):
        raw = bytes(commands)
        if len(raw) % (8 * RECORD_WORDS):
            raise LaunchError(f"command buffer holds {len(raw)} bytes, not a whole number of "
                              f"{8 * RECORD_WORDS}-byte records")
        return np.frombuffer(raw, dtype="<i8").reshape(-1, RECORD_WORDS)
    records = np.asarray(commands)
    if records.size == 0:
        return np.zeros((0, RECORD_WORDS), dtype=np.int64)
    if records.dtype.kind not in "iu":
        raise LaunchError(f"commands must be int64 records, got dtype {records.dtype}")
    if records.ndim != 2 or records.shape[1] != RECORD_WORDS:
        raise LaunchError(f"commands must have shape (n, {RECORD_WORDS}), got {records.shape}")
    return records.astype(np.int64, copy=False)


def check_tensors(tensors) -> list[np.ndarray]:
    """The host tensors, checked: numpy arrays of rank 1..4, C-contiguous, of an ISA dtype."""
    checked = []
    for slot, tensor in enumerate(tensors):
        if not isinstance(tensor, np.ndarray):
            raise LaunchError(f"slot {slot}: expected a numpy array, got {type(tensor).__name__}")
        if tensor.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: the same bits, as the storage
            tensor = tensor.view(np.uint16)
        if tensor.dtype not in DTYPE_OF_NUMPY:
            raise LaunchError(f"slot {slot}: dtype {tensor.dtype} is not one of "
                              f"{', '.join(d.numpy_name for d in DType)} (bfloat16 as uint16 bits)")
        if not 1 <= tensor.ndim <= BOX_DIMS:
            raise LaunchError(f"slot {slot}: rank {tensor.ndim} is outside 1..{BOX_DIMS}")
        if not tensor.flags.c_contiguous:
            raise LaunchError(f"slot {slot}: tensor must be C-contiguous (pass np.ascontiguousarray)")
        checked.append(tensor)
    return checked


#: One decoder per opcode: (checker, index, op, record, tensors) -> the decoded command.
_DECODERS = {
    Op.DMA_LOAD: decode_dma,
    Op.DMA_STORE: decode_dma,
    Op.GEMM: decode_gemm,
    Op.FILL: decode_fill,
    Op.EPILOGUE: decode_epilogue,
    Op.DEPTHWISE: decode_depthwise,
    Op.POOL: decode_pool,
    Op.ELTWISE: decode_eltwise,
    Op.FABRIC: decode_fabric,
    Op.REDUCE: decode_reduce,
    Op.VFUNC: decode_vfunc,
    Op.UNPACK4: decode_unpack4,
    Op.LOOKUP: decode_lookup,
}


def decode_stream(arch: HardwareDescription, records: np.ndarray, tensors) -> list[Command]:
    """Decodes and checks every record; raises `CommandError` at the first bad one.

    A record equal to an earlier one is not decoded again: it was valid there and is valid
    here (the checks see only the record, the tensors and the arch), so it gets a copy of the
    earlier command (`Command.repeated_at`). Compiled loops repeat many records (weight tiles,
    epilogues), so this saves most of the decoding."""
    check = Checker(arch)
    commands = []
    first_of: dict[tuple, Command] = {}
    for index, record in enumerate(records.tolist()):
        key = tuple(record)
        earlier = first_of.get(key)
        if earlier is not None:
            commands.append(earlier.repeated_at(index))
            continue
        op = _OPS.get(record[0])
        check.index, check.op = index, op.name if op is not None else f"opcode {record[0]}"
        if op is None:
            check.fail(f"unknown opcode {record[0]} (known: "
                       f"{', '.join(f'{o.name}={int(o)}' for o in Op)})")
        used = len(FIELDS[op])
        if any(record[used:]):
            first = used + next(i for i, w in enumerate(record[used:]) if w)
            check.fail(f"word {first} is {record[first]} but {op.name} records use only words "
                       f"0..{used - 1}; unused words must be 0")
        first_of[key] = cmd = _DECODERS[op](check, index, op, record, tensors)
        commands.append(cmd)
    return commands
