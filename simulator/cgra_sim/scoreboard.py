"""The timing layer's scratchpad scoreboard: when may a command touch a byte range.

Stage: simulator, step 4 (timing). In: byte intervals [lo, hi) read or written by commands, in
stream order, with the cycle each command ends. Out: the earliest cycle a new access may start.

The scratchpad is cut into segments (a sorted list of start addresses, `bisect` to find them);
each segment keeps the end cycle of its last write, the index of the command that made it, and
the latest end cycle of the reads since that write with the index of that reader. A read waits
for the last write (read-after-write); a write waits for the last write and for those reads
(write-after-write, write-after-read). A query may name one writer whose writes count as done
earlier (`forward`): the timing layer uses it for partial sums that stay inside the PE array. A
write replaces the segments it covers by one, so the segment count stays near the number of live
buffers and every access costs O(log s + touched segments) plus a list insertion. `blocker`
names the command an access waits for; the timing layer asks only when a command stalls, so the
common path stays a `max` over slices.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right


class Scoreboard:
    """Read/write hazards on scratchpad byte ranges."""

    def __init__(self, spad_bytes: int):
        self._size = spad_bytes
        self._starts = [0]  # segment i covers [starts[i], starts[i + 1]) (the last one: to size)
        self._write_end = [0]
        self._writer = [-1]  # index of the command that wrote the segment last (-1: none)
        self._read_end = [0]
        self._reader = [-1]  # index of the command whose read ends at read_end (-1: none)

    def read_ready(self, lo: int, hi: int, forward: tuple[int, int] | None = None) -> int:
        """Earliest start of a read of [lo, hi): when the last write to it has ended.

        forward: (writer, cycle): writes by command `writer` count as done at `cycle`.
        """
        first, stop = self._span(lo, hi)
        if forward is None:
            return max(self._write_end[first:stop])
        writer, cycle = forward
        return max(cycle if who == writer else end
                   for who, end in zip(self._writer[first:stop], self._write_end[first:stop]))

    def write_ready(self, lo: int, hi: int, forward: tuple[int, int] | None = None) -> int:
        """Earliest start of a write to [lo, hi): after the last write and the reads since."""
        first, stop = self._span(lo, hi)
        if forward is None:
            return max(max(self._write_end[first:stop]), max(self._read_end[first:stop]))
        return max(self.read_ready(lo, hi, forward), max(self._read_end[first:stop]))

    def blocker(self, lo: int, hi: int, cycle: int, write: bool,
                forward: tuple[int, int] | None = None) -> int:
        """Index of a command whose access to [lo, hi) ends at `cycle` and orders an access
        (a write if `write`) after it: the command it waits for if `cycle` is its ready cycle.
        -1 if none (the access is not held back until `cycle` by this range)."""
        first, stop = self._span(lo, hi)
        if forward is None:  # the common case: list.index scans at C speed
            written = self._write_end[first:stop]
            if cycle in written:  # cycle > 0 (a stall), so a real write, never the initial one
                return self._writer[first + written.index(cycle)]
        else:
            for i in range(first, stop):
                writer = self._writer[i]
                end = forward[1] if writer == forward[0] else self._write_end[i]
                if end == cycle and writer >= 0:
                    return writer
        if write:
            read = self._read_end[first:stop]
            if cycle in read:
                return self._reader[first + read.index(cycle)]
        return -1

    def record_read(self, lo: int, hi: int, end: int, reader: int = -1) -> None:
        first, stop = self._split(lo), self._split(hi)
        read_end, readers = self._read_end, self._reader
        for i in range(first, stop):
            if read_end[i] < end:
                read_end[i] = end
                readers[i] = reader

    def record_write(self, lo: int, hi: int, end: int, writer: int) -> None:
        first, stop = self._split(lo), self._split(hi)
        # Earlier reads of the range ended before this write started (write_ready), so they no
        # longer constrain anything: the range becomes one segment with no readers.
        self._starts[first:stop] = [lo]
        self._write_end[first:stop] = [end]
        self._writer[first:stop] = [writer]
        self._read_end[first:stop] = [0]
        self._reader[first:stop] = [-1]

    @property
    def num_segments(self) -> int:
        return len(self._starts)

    def _span(self, lo: int, hi: int) -> tuple[int, int]:
        """Indices [first, stop) of the segments overlapping [lo, hi)."""
        return bisect_right(self._starts, lo) - 1, bisect_left(self._starts, hi)

    def _split(self, addr: int) -> int:
        """Index of the segment starting at `addr`, splitting the one containing it if needed."""
        if addr >= self._size:
            return len(self._starts)
        i = bisect_right(self._starts, addr) - 1
        if self._starts[i] == addr:
            return i
        self._starts.insert(i + 1, addr)
        self._write_end.insert(i + 1, self._write_end[i])
        self._writer.insert(i + 1, self._writer[i])
        self._read_end.insert(i + 1, self._read_end[i])
        self._reader.insert(i + 1, self._reader[i])
        return i + 1
