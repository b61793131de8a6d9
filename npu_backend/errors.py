"""The errors the compiler raises. Each says what went wrong, where, and how to fix it.

Stage context is added as an error propagates (`stage_context`), so a failure deep inside
scheduling still says which kernel and which stage it came from.
"""

from __future__ import annotations

import contextlib
import threading

import tvm_ffi


class CGRAError(Exception):
    """Base class of every error raised by the CGRA backend."""


class UnsupportedOperator(CGRAError, ValueError):
    """An operator (or one of its attributes) cannot run on the NPU."""


class InvalidModel(CGRAError, ValueError):
    """A model cannot be read, or does not describe a valid graph (an ONNX file that is not one)."""


class ScratchpadTooSmall(CGRAError, ValueError):
    """No tiling of a kernel fits the scratchpad of the chosen architecture."""


class UnsupportedChip(CGRAError, ValueError):
    """The chip's description cannot run the NPU's commands (a fabric that cannot map the PE
    array's systolic cell)."""


class FamilyError(CGRAError, TypeError):
    """An op family is declared incompletely (a required OpFamily field left unset) or builds a
    kernel its caller cannot call (a view left out of `operands.prim_func`): a bug in the
    family's module, caught when the family is made or its kernel defined, not at run time."""


@tvm_ffi.register_error  # raised by compiled code too (a kernel's assert, frontend/length_checks.py)
class LengthPastBound(CGRAError, ValueError):
    """A run given a symbolic dimension (a prompt's length) past the bound it was compiled for:
    the message names the bound and how to compile with a larger one."""


class ScheduleError(CGRAError, RuntimeError):
    """A kernel could not be scheduled or tensorized (a compiler bug: please report it)."""


class UnsupportedCopy(ScheduleError):
    """A copy into or out of the scratchpad is not expressible as one DMA box."""


def one_line(err: Exception) -> str:
    """An error as one line: TVM's schedule errors carry the IR and an "Error message:" line."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    detail = next((line for line in lines if line.startswith("Error message:")), None)
    head = lines[0] if lines else type(err).__name__
    return f"{head} {detail}" if detail and detail != head else head


@contextlib.contextmanager
def stage_context(stage: str, kernel: str):
    """Prefix errors escaping the block with the stage and the kernel they happened in."""
    try:
        yield
    except CGRAError as err:
        if not getattr(err, "_cgra_context", False):
            err.args = (f"[{stage}] kernel '{kernel}': {err.args[0] if err.args else ''}",) + err.args[1:]
            err._cgra_context = True
        raise


_LAST_ERROR = threading.local()


def remember_error(err: CGRAError) -> None:
    """TVM hands an error raised inside a pass (or the codegen hook) on as a RuntimeError with
    the same message; keep ours so that npu_backend.compile can raise it with its own type."""
    _LAST_ERROR.error = err


def original_error(err: Exception) -> Exception:
    """The CGRAError a RuntimeError from a TVM pass stands for (same message), else `err`."""
    ours = getattr(_LAST_ERROR, "error", None)
    _LAST_ERROR.error = None
    return ours if ours is not None and str(ours) in str(err) else err
