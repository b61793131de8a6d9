"""Compile options: a frozen object, separate from the hardware description, passed explicitly."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    dump_dir: str | None = None  # write every stage's output under this directory, by stage name
    # ((name, bound), ...): the largest value a symbolic dimension takes, for the tile searches
    # of kernels that are compiled once for every size (kernels/common/dynamic.py); sorted by name.
    shape_bounds: tuple = ()
    # LLVM optimisation level (0-3) of the host code that drives the NPU. It changes how fast that
    # code builds and runs on the host, never the commands it records (the same stream, cycles and
    # results at every level). ResNet-18 (224) compiles in 1.5 s at 0, 2.8 s at 2 (cgra-8x8).
    host_opt_level: int = 0
    # A chain of elementwise ops after a conv2d / matmul (a leaky relu, a hard-swish) runs inside
    # that kernel, as a FABRIC over each output tile in place (kernels/gemm/epilogue.py), instead of as
    # a kernel of its own: less DRAM traffic and energy, more cycles, since the FABRIC takes the
    # PE array between two tiles' GEMMs (MobileNetV3-Small at 224, cgra-8x8: DMA -18%, energy
    # -16%, cycles +2.8%). Off: the chain is the fabric family's kernel (kernels/elementwise/fabric.py).
    fuse_chains: bool = False

    def __post_init__(self):
        if self.dump_dir is not None:  # a pathlib.Path too
            object.__setattr__(self, "dump_dir", os.fspath(self.dump_dir))
        if self.host_opt_level not in (0, 1, 2, 3):
            raise ValueError(f"host_opt_level must be 0, 1, 2 or 3, not {self.host_opt_level!r}")
        bounds = dict(self.shape_bounds.items() if isinstance(self.shape_bounds, dict) else self.shape_bounds)
        for name, bound in bounds.items():
            if not isinstance(bound, int) or isinstance(bound, bool) or bound < 1:
                raise ValueError(f"shape_bounds['{name}'] must be a positive int, not {bound!r}")
        object.__setattr__(self, "shape_bounds", tuple(sorted(bounds.items())))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "CompileOptions":
        fields = json.loads(text)
        fields["shape_bounds"] = tuple(tuple(pair) for pair in fields.get("shape_bounds", ()))
        return cls(**fields)


#: What a compile writes in a dump folder besides the stage files (`cgra-sim run` adds streams/).
DUMP_FOLDERS = ("kernels", "llvm", "streams")


def clear_dump(options: CompileOptions, stage_files) -> None:
    """Remove what an earlier compile dumped in `options.dump_dir` (its stage files and
    DUMP_FOLDERS, nothing else), so that a second model dumped there is not mixed with the first."""
    if options.dump_dir is None or not os.path.isdir(options.dump_dir):
        return
    for name in stage_files:
        path = os.path.join(options.dump_dir, name)
        if os.path.isfile(path):
            os.remove(path)
    for folder in DUMP_FOLDERS:  # emptied, kept (a profile recording there may have made it already)
        path = os.path.join(options.dump_dir, folder)
        for entry in os.listdir(path) if os.path.isdir(path) else ():
            inside = os.path.join(path, entry)
            shutil.rmtree(inside) if os.path.isdir(inside) else os.remove(inside)


def dump(options: CompileOptions, name: str, content) -> None:
    """Write one stage's output (an IRModule, a PrimFunc, LLVM IR, ...) when dumping is on."""
    if options.dump_dir is None:
        return
    path = os.path.join(options.dump_dir, *(_short(part) for part in name.split("/")))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = content.script() if hasattr(content, "script") else str(content)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _short(part: str, most: int = 120) -> str:
    """A path component of at most `most` characters: a fused kernel's symbol names every op it
    holds (Llama's attention: over 400 characters, past the 255 a file name may have), so a long
    one keeps its start and a digest of the whole, which tells kernels apart."""
    if len(part) <= most:
        return part
    return f"{part[:most - 17]}_{hashlib.sha1(part.encode()).hexdigest()[:16]}"
