"""Scratchpad banks: how much a command's access pattern slows its stream.

Stage: simulator, step 4 (timing; timing.py calls it). In: a command's scratchpad regions and the
hardware description's `spad_banks` (N) and `bank_width_bytes` (W). Out: slowdowns as exact
fractions (cycles with conflicts / cycles without), computed in closed form from the regions'
strides: no per-element work.

The rule (docs/simulator.md, "Scratchpad banks"). Byte address a lies in bank floor(a / W) mod N
(word-interleaved); a bank delivers one W-byte word per cycle. An access stream reads or writes
L *lanes* in parallel, lane i starting at byte addr + i * S (S: the lane stride). Lanes whose words
differ but fall in one bank serialise on it; lanes in the same word share the read. The
*conflict degree* is the largest number of distinct words one bank must serve for one beat:

    one word per lane, S a multiple of W:  ceil(L / (N / gcd(S / W, N)))   (closed form, exact)
    otherwise: counted over the lanes' words, at most L * R / W + L   (L <= PE rows or the
    elements of one beat; memoised on (L, S mod N*W, addr mod W, R))

Two kinds of streams:
- PE-array operand lanes (a GEMM's A column: one element of each of min(m, rows) rows a cycle)
  keep one bank word per lane in an operand buffer, so a lane needs a new word only every
  W / itemsize cycles: the stream slows by max(1, degree * itemsize / W). Reads are issued
  unskewed (the systolic skew is applied by registers after the read).
- Beats (DMA engines, the vector unit, a DEPTHWISE window) move `beat` bytes a cycle in the
  region's row-major order with no buffering across beats. Trailing dimensions that are
  contiguous merge into runs of R bytes; a beat shorter than a run touches consecutive banks
  (conflict-free while beat <= N * W). Otherwise it covers L = min(extent, ceil(beat / R)) runs,
  S apart (the next dimension's stride), and takes as many cycles as its busiest bank has words:
  the stream slows by max(1, degree, beat / (N * W)).
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction
from functools import lru_cache

ONE = Fraction(1)


@lru_cache(maxsize=4096)
def lane_degree(lanes: int, stride: int, addr: int, banks: int, width: int, run: int = 1) -> int:
    """Largest number of distinct bank words one bank serves when `lanes` lanes, each `run`
    contiguous bytes, start at addr + i * stride (bytes) at once. Lanes in one word share it
    (a stride of 0 is one read). Callers may reduce `addr` modulo `width` and `stride` modulo
    banks * width (`degree` does)."""
    if lanes <= 1 or stride == 0:  # one run: consecutive banks (the bandwidth bound covers it)
        return 1
    if stride % width == 0 and (addr % width) + run <= width:
        # One word per lane, lane i in bank (q0 + i * g) mod N: the lanes take N / gcd(g, N)
        # banks in turn, so the busiest holds ceil(L / that) of them.
        reach = banks // math.gcd(stride // width, banks)
        return -(-lanes // reach)
    # Misaligned strides or multi-word runs: count the words (at most lanes * run / width + lanes).
    words = {word for i in range(lanes)
             for word in range((addr + i * stride) // width, (addr + i * stride + run - 1) // width + 1)}
    return max(Counter(word % banks for word in words).values())


def degree(lanes: int, stride: int, addr: int, banks: int, width: int, run: int = 1) -> int:
    """`lane_degree` with its arguments reduced, so the cache sees few distinct keys: the banks
    depend on the stride modulo banks * width, and the lanes share no word as long as the stride
    stays >= run + width, so a stride is replaced by the smallest such one of its residue."""
    period, apart = banks * width, run + width
    if stride > apart + period:
        stride %= period
        if stride < apart:
            stride += period * -(-(apart - stride) // period)
    return lane_degree(lanes, stride, addr % width, banks, width, run)


def operand_slowdown(lanes: int, stride: int, addr: int, itemsize: int, banks: int,
                     width: int) -> Fraction:
    """Slowdown of a PE-array operand stream: `lanes` rows `stride` bytes apart, one element of
    each a cycle, one buffered bank word per lane: max(1, degree * itemsize / width)."""
    conflict = Fraction(degree(lanes, stride, addr, banks, width) * itemsize, width)
    return conflict if conflict > 1 else ONE


def beat_slowdown(beat: int, shape, strides, itemsize: int, addr: int, banks: int,
                  width: int) -> Fraction:
    """Slowdown of a unit moving `beat` bytes a cycle through a region (`shape`, byte `strides`,
    row-major order): a beat takes as many cycles as the busiest bank has words in it, and at
    least beat / (banks * width) (the scratchpad's bandwidth)."""
    dims = [(extent, stride) for extent, stride in zip(shape, strides) if extent > 1]
    run = itemsize
    while dims and dims[-1][1] == run:  # contiguous trailing dimensions: one run
        run *= dims.pop()[0]
    bandwidth = Fraction(beat, banks * width)
    if not dims or run >= beat:  # the beat is contiguous: consecutive banks
        return max(ONE, bandwidth)
    extent, stride = dims[-1]
    lanes = min(extent, -(-beat // run))
    return max(ONE, bandwidth, Fraction(degree(lanes, stride, addr, banks, width, run)))


def slowed(cycles: int, slowdown: Fraction) -> int:
    """`cycles` of a stream stretched by `slowdown` (>= 1), rounded up to whole cycles."""
    if slowdown == 1:
        return cycles
    return -(-cycles * slowdown.numerator // slowdown.denominator)
