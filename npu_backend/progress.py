"""Progress of long jobs: kernels compiled so far, and one status line that shows it.

Stage: shared (the target hook reports each kernel it compiles; `cgra-sim run` shows that and
each simulated kernel launch). `compile_progress(callback)` makes `callback(done, total, name)`
hear about every kernel the target hook compiles inside the block: once before each kernel
(`done` kernels finished, `name` the next one) and once when all are done (`done == total`).
`StatusLine` writes messages to a stream: rewritten in place with `\\r` on a terminal, one line
each elsewhere (a log file or pipe, when progress was asked for explicitly).
"""

from __future__ import annotations

import contextlib
import shutil
import threading

_listeners: list = []
_lock = threading.Lock()


@contextlib.contextmanager
def compile_progress(callback):
    """Inside the block, `callback(done, total, name)` hears about each kernel compiled."""
    with _lock:
        _listeners.append(callback)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(callback)


def report_kernel(done: int, total: int, name: str) -> None:
    """Called by the target hook: `done` of `total` kernels compiled, `name` next (or last)."""
    with _lock:
        listeners = list(_listeners)
    for callback in listeners:
        callback(done, total, name)


class StatusLine:
    """One status line on `stream` (stderr): each message replaces the previous one."""

    def __init__(self, stream):
        self.stream = stream
        self.rewrite = bool(getattr(stream, "isatty", lambda: False)())
        self._shown = 0  # characters of the message on screen (rewrite mode)

    def show(self, message: str) -> None:
        if not self.rewrite:
            self.stream.write(message + "\n")
        else:
            # Cut to the terminal's width: a wrapped line could not be rewritten with \r.
            width = max(20, shutil.get_terminal_size().columns - 1)
            message = message if len(message) <= width else message[:width - 3] + "..."
            self.stream.write("\r" + message.ljust(self._shown))
            self._shown = len(message)
        self.stream.flush()

    def close(self) -> None:
        """Ends the line, so that what is printed next starts on its own line."""
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = 0
