"""Launch files: one recorded kernel launch on disk (replay.py reruns it on any hardware description).

Stage: simulator tooling (record and replay; docs/command-stream.md describes the format). In:
what the runtime handed the device for one launch (kernel name, source ops, hardware description,
command records, host tensors, optionally their contents before and after). Out: a `.cgra` file;
`load_launch` gives back a `Launch`, and `replay` re-simulates it (on the recorded or another
hardware description) and compares the results with the recorded ones.

The container is a zip archive (the layout numpy's .npz uses): `header.json` (magic, versions,
kernel, arch, tensor specs) and one .npy member per array. Zip checks every member's CRC, so a
damaged file is refused rather than half read. Pure Python: importing this module never imports tvm.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import zipfile
import zlib

import numpy as np

from .arch import HardwareDescription
from .errors import SimulatorError
from .isa import BOX_DIMS, OLDEST_STREAM_VERSION, RECORD_WORDS, STREAM_VERSION, DType

#: The largest array a launch file may hold (one tensor slot, or the command stream): what a
#: file declares is checked against it before anything is allocated.
MAX_ARRAY_BYTES = 1 << 30

MAGIC = "cgra-sim launch"
#: Version of the container and header layout; see docs/command-stream.md for what bumps it.
FORMAT_VERSION = 1
SUFFIX = ".cgra"
HEADER = "header.json"
_ZIP_SIGNATURE = b"PK\x03\x04"


class StreamFileError(SimulatorError, ValueError):
    """A launch file cannot be read: not a launch file, a newer format, another stream version,
    or damaged. The message names the file and, for a version problem, both versions."""

    def __init__(self, path, problem: str):
        super().__init__(f"{os.fspath(path)}: {problem}")
        self.path = os.fspath(path)
        self.problem = problem


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """dtype and shape of one host tensor slot."""

    dtype: str  # numpy name: int8, int32, float32
    shape: tuple[int, ...]

    @classmethod
    def of(cls, array: np.ndarray) -> "TensorSpec":
        return cls(str(array.dtype), tuple(int(d) for d in array.shape))

    def zeros(self) -> np.ndarray:
        return np.zeros(self.shape, dtype=self.dtype)

    def check(self) -> None:
        """ValueError unless this is a host tensor a launch can bind: an ISA dtype, rank 1 to
        BOX_DIMS, at most MAX_ARRAY_BYTES."""
        itemsize = DType.from_name(self.dtype).itemsize  # ValueError for a dtype the ISA does not have
        if not 1 <= len(self.shape) <= BOX_DIMS or min(self.shape) < 0:
            raise ValueError(f"tensor shape {self.shape}: a slot has rank 1 to {BOX_DIMS} and no negative extent")
        if int(np.prod(self.shape, dtype=object)) * itemsize > MAX_ARRAY_BYTES:
            raise ValueError(f"tensor {self.dtype} {self.shape} is larger than the {MAX_ARRAY_BYTES >> 30} GiB a "
                             "launch may bind")


@dataclasses.dataclass(frozen=True, eq=False)
class Launch:
    """One kernel launch as the device received it. Arrays are not copied: treat them as read-only.

    `inputs`: every slot's contents before the kernel ran (None if not recorded); `outputs`: after
    it ran (None if not recorded). `recorded_stats`: the recorded run's `KernelStats.to_dict()`.
    """

    kernel: str
    source_ops: tuple[str, ...]
    arch_json: str  # the hardware description the kernel was compiled for and ran on
    commands: np.ndarray  # int64, shape (n, isa.RECORD_WORDS)
    tensors: tuple[TensorSpec, ...]
    inputs: tuple[np.ndarray, ...] | None = None
    outputs: tuple[np.ndarray, ...] | None = None
    recorded_stats: dict | None = None
    macs_per_output: int | None = None  # the kernel's model MACs per output element (runtime ABI)
    macs_divisor: int = 1  # ... over this divisor
    # Slots the runtime flagged constant (isa.SLOT_FLAG_CONSTANT): what a replay after the launch
    # recorded before it may prefetch (prefetch.py, `replay(previous=)`).
    constant_slots: tuple[int, ...] = ()

    def __post_init__(self):
        commands = np.ascontiguousarray(self.commands, dtype=np.int64)
        if commands.ndim != 2 or commands.shape[1] != RECORD_WORDS:
            raise ValueError(f"commands must have shape (n, {RECORD_WORDS}), got {commands.shape}")
        object.__setattr__(self, "commands", commands)
        object.__setattr__(self, "source_ops", tuple(str(op) for op in self.source_ops))
        object.__setattr__(self, "tensors", tuple(TensorSpec(str(t.dtype), tuple(int(d) for d in t.shape))
                                                  for t in self.tensors))
        for spec in self.tensors:
            spec.check()
        for name in ("inputs", "outputs"):
            arrays = getattr(self, name)
            if arrays is not None:
                object.__setattr__(self, name, tuple(arrays))
                self._check_contents(name, getattr(self, name))

    def _check_contents(self, name: str, arrays: tuple) -> None:
        if len(arrays) != len(self.tensors):
            raise ValueError(f"{name}: {len(arrays)} arrays for {len(self.tensors)} tensor slots")
        for slot, (array, spec) in enumerate(zip(arrays, self.tensors)):
            if TensorSpec.of(array) != spec:
                raise ValueError(f"{name}[{slot}] is {TensorSpec.of(array)}, the slot is {spec}")

    @classmethod
    def from_tensors(cls, kernel: str, source_ops, arch_json: str, commands, inputs,
                     outputs=None, recorded_stats: dict | None = None,
                     macs_per_output: int | None = None, macs_divisor: int = 1, constant_slots=()) -> "Launch":
        """A launch whose tensor specs are those of `inputs` (contents before the kernel ran)."""
        return cls(kernel, tuple(source_ops), arch_json, commands,
                   tuple(TensorSpec.of(a) for a in inputs), tuple(inputs),
                   None if outputs is None else tuple(outputs), recorded_stats, macs_per_output, macs_divisor,
                   tuple(int(slot) for slot in constant_slots))

    @property
    def arch(self) -> HardwareDescription:
        """The recorded hardware description (raises ArchError if it no longer validates)."""
        return HardwareDescription.from_json(self.arch_json)

    def fresh_tensors(self) -> list[np.ndarray]:
        """Host tensors to run the launch on: copies of the inputs, or zeros without them."""
        if self.inputs is None:
            return [spec.zeros() for spec in self.tensors]
        return [np.array(a, copy=True, order="C") for a in self.inputs]


# Writing.

def _unchanged_slots(launch: Launch) -> list[int]:
    """Slots whose recorded output is bit for bit the input (weights, ...): stored once."""
    if launch.inputs is None or launch.outputs is None:
        return []
    return [slot for slot, (before, after) in enumerate(zip(launch.inputs, launch.outputs))
            if before.tobytes() == after.tobytes()]


def _header(launch: Launch) -> dict:
    return {
        "magic": MAGIC,
        "format_version": FORMAT_VERSION,
        "stream_version": STREAM_VERSION,
        "record_words": RECORD_WORDS,
        "kernel": launch.kernel,
        "source_ops": list(launch.source_ops),
        "arch": json.loads(launch.arch_json),
        "num_commands": int(launch.commands.shape[0]),
        "tensors": [{"dtype": t.dtype, "shape": list(t.shape)} for t in launch.tensors],
        "has_inputs": launch.inputs is not None,
        "has_outputs": launch.outputs is not None,
        "outputs_equal_inputs": _unchanged_slots(launch),
        "recorded_stats": launch.recorded_stats,
        "macs_per_output": launch.macs_per_output,
        "macs_divisor": launch.macs_divisor,
        "constant_slots": list(launch.constant_slots),
    }


def _write_array(archive: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
    with archive.open(name, "w", force_zip64=True) as member:
        np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)


def save_launch(path, launch: Launch) -> None:
    """Writes `launch` to `path` (atomically: a reader never sees a half-written file)."""
    path = os.fspath(path)
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # open() applies the umask
    try:
        with open(temporary, "xb") as handle, \
                zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
            header = _header(launch)
            archive.writestr(HEADER, json.dumps(header, indent=1))
            _write_array(archive, "commands.npy", launch.commands.astype("<i8", copy=False))
            for slot, array in enumerate(launch.inputs or ()):
                _write_array(archive, f"inputs/{slot}.npy", array)
            for slot, array in enumerate(launch.outputs or ()):
                if slot not in header["outputs_equal_inputs"]:
                    _write_array(archive, f"outputs/{slot}.npy", array)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


# Reading.

_DAMAGE = (zipfile.BadZipFile, zlib.error, EOFError, KeyError, TypeError, ValueError, AttributeError)


def load_launch(path) -> Launch:
    """Reads a launch file. Raises `StreamFileError` for anything but a readable launch file of
    a format version this code knows and this simulator's stream version (FileNotFoundError if
    there is no file)."""
    with open(path, "rb") as handle:
        _check_signature(path, handle.read(len(_ZIP_SIGNATURE)))
        handle.seek(0)
        try:
            archive = zipfile.ZipFile(handle)
        except zipfile.BadZipFile:
            raise StreamFileError(path, "damaged launch file (the zip directory at its end is missing or "
                                        "broken: truncated?); record the launch again") from None
        try:
            with archive:
                return _read_launch(archive, _read_header(path, archive))
        except StreamFileError:
            raise
        except _DAMAGE as err:
            raise StreamFileError(path, f"damaged launch file ({type(err).__name__}: {err}); "
                                        "record the launch again") from None


def _check_signature(path, head: bytes) -> None:
    if head == _ZIP_SIGNATURE:
        return
    if _ZIP_SIGNATURE.startswith(head):
        raise StreamFileError(path, f"damaged launch file (truncated to {len(head)} bytes)")
    raise StreamFileError(path, f"not a cgra-sim launch file (expected a zip archive holding {HEADER}; "
                                "see docs/command-stream.md)")


#: The header keys a reader needs (besides the versions), with their JSON types.
_HEADER_TYPES = {"kernel": str, "source_ops": list, "arch": dict, "num_commands": int, "tensors": list,
                 "has_inputs": bool, "has_outputs": bool, "outputs_equal_inputs": list}
_JSON_NAMES = {str: "string", list: "array", dict: "object", int: "integer", bool: "boolean"}


def _read_header(path, archive: zipfile.ZipFile) -> dict:
    if HEADER not in archive.namelist():
        raise StreamFileError(path, f"not a cgra-sim launch file (a zip archive without {HEADER})")
    try:
        header = json.loads(archive.read(HEADER).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StreamFileError(path, f"damaged launch file ({HEADER} is not valid JSON: {err})") from None
    if not isinstance(header, dict) or header.get("magic") != MAGIC:
        magic = header.get("magic") if isinstance(header, dict) else None
        raise StreamFileError(path, f"not a cgra-sim launch file (magic {magic!r}, expected {MAGIC!r})")
    _check_versions(path, header)
    for key, kind in _HEADER_TYPES.items():
        if not isinstance(header.get(key), kind):
            raise StreamFileError(path, f"damaged launch file ({HEADER}: '{key}' is missing or not "
                                        f"a JSON {_JSON_NAMES[kind]})")
    return header


def _check_versions(path, header: dict) -> None:
    version, stream = header.get("format_version"), header.get("stream_version")
    if not isinstance(version, int) or version < 1:
        raise StreamFileError(path, f"damaged launch file (format_version {version!r})")
    if version > FORMAT_VERSION:
        raise StreamFileError(path, f"written by a newer cgra-sim: file format version {version}, this "
                                    f"cgra-sim reads versions up to {FORMAT_VERSION}; upgrade to replay it")
    known = isinstance(stream, int) and OLDEST_STREAM_VERSION <= stream <= STREAM_VERSION
    if not known or header.get("record_words") != RECORD_WORDS:
        raise StreamFileError(path, f"holds a command stream of version {stream!r} ({header.get('record_words')!r}"
                                    f"-word records), but this simulator runs stream versions "
                                    f"{OLDEST_STREAM_VERSION} to {STREAM_VERSION} ({RECORD_WORDS}-word records); replay it with the "
                                    "cgra-sim that recorded it, or record it again")


def _read_array(archive: zipfile.ZipFile, name: str) -> np.ndarray:
    """One .npy member, its declared size checked against the member's and MAX_ARRAY_BYTES first."""
    with archive.open(name) as member:
        version = np.lib.format.read_magic(member)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(member)
        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if nbytes > min(archive.getinfo(name).file_size, MAX_ARRAY_BYTES):
            raise ValueError(f"{name} declares {dtype} {shape} ({nbytes} bytes), more than it holds or than the "
                             f"{MAX_ARRAY_BYTES >> 30} GiB a launch file may")
    with archive.open(name) as member:
        return np.lib.format.read_array(member, allow_pickle=False)


def _read_launch(archive: zipfile.ZipFile, header: dict) -> Launch:
    tensors = tuple(TensorSpec(str(t["dtype"]), tuple(int(d) for d in t["shape"])) for t in header["tensors"])
    for spec in tensors:
        spec.check()  # before any is allocated (a launch without recorded inputs replays on zeros)
    commands = _read_array(archive, "commands.npy")
    if commands.dtype != np.dtype("<i8") or commands.shape != (header["num_commands"], RECORD_WORDS):
        raise ValueError(f"commands.npy is {commands.dtype} {commands.shape}, the header says "
                         f"int64 ({header['num_commands']}, {RECORD_WORDS})")
    inputs = outputs = None
    if header["has_inputs"]:
        inputs = tuple(_read_array(archive, f"inputs/{slot}.npy") for slot in range(len(tensors)))
    if header["has_outputs"]:
        unchanged = set(header["outputs_equal_inputs"])
        if unchanged and inputs is None:
            raise ValueError("outputs_equal_inputs names slots but the file holds no inputs")
        outputs = tuple(inputs[slot] if slot in unchanged else _read_array(archive, f"outputs/{slot}.npy")
                        for slot in range(len(tensors)))
    stats = header.get("recorded_stats")
    if stats is not None and not isinstance(stats, dict):
        raise ValueError(f"recorded_stats is a {type(stats).__name__}, not an object")
    macs_per_output = header.get("macs_per_output")  # absent in files written before it existed
    if macs_per_output is not None and (not isinstance(macs_per_output, int) or macs_per_output < -1):
        raise ValueError(f"macs_per_output is {macs_per_output!r}, not an integer >= -1")
    macs_divisor = header.get("macs_divisor", 1)  # absent in files written before it existed
    if not isinstance(macs_divisor, int) or macs_divisor < 1:
        raise ValueError(f"macs_divisor is {macs_divisor!r}, not a positive integer")
    constant_slots = header.get("constant_slots", [])  # absent in files written before it existed
    if not isinstance(constant_slots, list) or not all(isinstance(s, int) and 0 <= s < len(tensors)
                                                       for s in constant_slots):
        raise ValueError(f"constant_slots is {constant_slots!r}, not a list of slots")
    return Launch(header["kernel"], tuple(header["source_ops"]),
                  json.dumps(header["arch"], sort_keys=True, separators=(",", ":")), commands, tensors,
                  inputs, outputs, stats, macs_per_output, macs_divisor, tuple(constant_slots))


# Replay.
