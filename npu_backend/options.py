"""Compile options: a frozen object, separate from the hardware description, passed explicitly."""

from __future__ import annotations

import dataclasses
import json
import os


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    dump_dir: str | None = None  # write every stage's output under this directory, by stage name

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "CompileOptions":
        return cls(**json.loads(text))


def dump(options: CompileOptions, name: str, content) -> None:
    """Write one stage's output (an IRModule, a PrimFunc, LLVM IR, ...) when dumping is on."""
    if options.dump_dir is None:
        return
    path = os.path.join(options.dump_dir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = content.script() if hasattr(content, "script") else str(content)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
