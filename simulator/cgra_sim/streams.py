"""Hand-written command streams: record builders and two complete kernels.

Stage: simulator tooling (tests, benchmarks, docs); the compiler does not use it. In: sizes and a
hardware description. Out: int64 records (isa.py) ready for `simulate`, with the slot order
documented per kernel. The kernels are plain, readable tilings, not tuned schedules.
"""

from __future__ import annotations

import numpy as np

from .arch import HardwareDescription
from .isa import ACC_DTYPE, BOX_DIMS, EPILOGUE_BIAS, EPILOGUE_RELU, GEMM_ACCUMULATE, DType, Op, encode


def dma(op: Op, slot: int, spad_addr: int, loops, origin=(), pad_lo=(), pad_hi=()) -> list[int]:
    """A DMA record. `loops`: up to 4 (extent, tdim, tstep, sstride); missing loops are (1,0,0,0)."""
    fields = {"slot": slot, "spad_addr": spad_addr}
    for name, values in (("origin", origin), ("pad_lo", pad_lo), ("pad_hi", pad_hi)):
        fields.update({f"{name}{d}": v for d, v in enumerate(values)})
    loops = list(loops) + [(1, 0, 0, 0)] * (BOX_DIMS - len(loops))
    for loop, (extent, tdim, tstep, sstride) in enumerate(loops):
        fields.update({f"extent{loop}": extent, f"tdim{loop}": tdim, f"tstep{loop}": tstep,
                       f"sstride{loop}": sstride})
    return encode(op, **fields)


def matrix_dma(op: Op, slot: int, spad_addr: int, row0: int, col0: int, rows: int, cols: int,
               spad_stride: int) -> list[int]:
    """DMA of a (rows, cols) tile of a 2-D tensor at (row0, col0), rows `spad_stride` apart."""
    return dma(op, slot, spad_addr, [(rows, 0, 1, spad_stride), (cols, 1, 1, 1)], origin=(row0, col0))


def tiled_gemm(arch: HardwareDescription, m: int, n: int, k: int, dtype: str = "int8",
               tile: tuple[int, int, int] | None = None, epilogue_flags: int | None = None) -> np.ndarray:
    """C = A @ B; slots 0: A (m, k), 1: B (k, n), 2: C (m, n) in the accumulator dtype.

    Output tiles of (tm, tn), k in chunks of tk (default: rows x cols x min(k, 256)). Operand
    buffers are double-buffered (alternating per k-chunk) and so is the accumulator (per output
    tile), so loads of the next tile can overlap the GEMMs of this one. With `epilogue_flags`
    every output tile goes through an in-place EPILOGUE with those flags before its store; with
    EPILOGUE_BIAS, slot 3 is the bias (n,) in the accumulator dtype, loaded once.
    """
    tm, tn, tk = tile or (arch.rows, arch.cols, min(k, 256))
    in_t = DType.from_name(dtype)
    acc_t = ACC_DTYPE[in_t]
    a_bytes, b_bytes, acc_bytes = tm * tk * in_t.itemsize, tk * tn * in_t.itemsize, tm * tn * acc_t.itemsize
    a_base, b_base, acc_base = 0, 2 * a_bytes, 2 * a_bytes + 2 * b_bytes
    bias_base = acc_base + 2 * acc_bytes
    if bias_base + n * acc_t.itemsize > arch.spad_bytes:
        raise ValueError(f"tiles {tm}x{tn}x{tk} do not fit the {arch.spad_bytes}-byte scratchpad")
    records, chunk, out_tile = [], 0, 0
    if epilogue_flags is not None and epilogue_flags & EPILOGUE_BIAS:
        records.append(dma(Op.DMA_LOAD, 3, bias_base, [(n, 0, 1, 1)]))
    for i0 in range(0, m, tm):
        for j0 in range(0, n, tn):
            rows, cols = min(tm, m - i0), min(tn, n - j0)
            acc = acc_base + (out_tile % 2) * acc_bytes
            for p0 in range(0, k, tk):
                depth = min(tk, k - p0)
                a, b = a_base + (chunk % 2) * a_bytes, b_base + (chunk % 2) * b_bytes
                records.append(matrix_dma(Op.DMA_LOAD, 0, a, i0, p0, rows, depth, tk))
                records.append(matrix_dma(Op.DMA_LOAD, 1, b, p0, j0, depth, cols, tn))
                records.append(encode(Op.GEMM, flags=GEMM_ACCUMULATE if p0 else 0, dtype=in_t,
                                      m=rows, n=cols, k=depth, a_addr=a, a_stride=tk, b_addr=b,
                                      b_stride=tn, acc_addr=acc, acc_stride=tn))
                chunk += 1
            if epilogue_flags is not None:
                records.append(encode(Op.EPILOGUE, flags=epilogue_flags, acc_dtype=acc_t,
                                      out_dtype=acc_t, m=rows, n=cols, acc_addr=acc, acc_stride=tn,
                                      bias_addr=bias_base + j0 * acc_t.itemsize
                                      if epilogue_flags & EPILOGUE_BIAS else 0,
                                      out_addr=acc, out_stride=tn))
            records.append(matrix_dma(Op.DMA_STORE, 2, acc, i0, j0, rows, cols, tn))
            out_tile += 1
    return np.array(records, dtype=np.int64)


def conv2d_3x3(arch: HardwareDescription, height: int, width: int, channels: int, filters: int,
               dtype: str = "int8", filter_tile: int | None = None) -> np.ndarray:
    """relu(conv2d(x, w)), stride 1, zero padding 1, HWC layout, one output row per tile.

    Slots 0: x (height, width, channels), 1: w (3, 3, channels, filters),
    2: y (height, width, filters) in the accumulator dtype. Each input row band (3 rows plus the
    halo columns) is loaded with zero fill; each of the 9 taps is one GEMM on a shifted view of it.
    """
    in_t = DType.from_name(dtype)
    acc_t = ACC_DTYPE[in_t]
    tf = filter_tile or min(filters, arch.cols * 4)
    band_bytes = 3 * (width + 2) * channels * in_t.itemsize
    acc_bytes = width * tf * acc_t.itemsize
    w_base = 0
    band_base = w_base + 9 * channels * filters * in_t.itemsize
    acc_base = band_base + 2 * band_bytes
    if acc_base + 2 * acc_bytes > arch.spad_bytes:
        raise ValueError("the conv2d working set does not fit the scratchpad")
    records = [_load_weights(w_base, channels, filters)]
    out_tile = 0
    for y in range(height):
        band = band_base + (y % 2) * band_bytes
        records.append(dma(Op.DMA_LOAD, 0, band,
                           [(3, 0, 1, (width + 2) * channels), (width + 2, 1, 1, channels),
                            (channels, 2, 1, 1)],
                           origin=(y - 1, -1, 0), pad_lo=(1, 1, 0), pad_hi=(1, 1, 0)))
        for f0 in range(0, filters, tf):
            cols = min(tf, filters - f0)
            acc = acc_base + (out_tile % 2) * acc_bytes
            for tap in range(9):
                r, s = divmod(tap, 3)
                records.append(encode(
                    Op.GEMM, flags=GEMM_ACCUMULATE if tap else 0, dtype=in_t, m=width, n=cols,
                    k=channels, a_addr=band + (r * (width + 2) + s) * channels * in_t.itemsize,
                    a_stride=channels,
                    b_addr=w_base + (tap * channels * filters + f0) * in_t.itemsize,
                    b_stride=filters, acc_addr=acc, acc_stride=tf))
            records.append(encode(Op.EPILOGUE, flags=EPILOGUE_RELU, acc_dtype=acc_t, out_dtype=acc_t,
                                  m=width, n=cols, acc_addr=acc, acc_stride=tf, out_addr=acc,
                                  out_stride=tf))
            records.append(dma(Op.DMA_STORE, 2, acc, [(width, 1, 1, tf), (cols, 2, 1, 1)],
                               origin=(y, 0, f0)))
            out_tile += 1
    return np.array(records, dtype=np.int64)


def _load_weights(w_base: int, channels: int, filters: int) -> list[int]:
    """All of w (3, 3, channels, filters), contiguous in the scratchpad."""
    return dma(Op.DMA_LOAD, 1, w_base, [(3, 0, 1, 3 * channels * filters), (3, 1, 1, channels * filters),
                                        (channels, 2, 1, filters), (filters, 3, 1, 1)])
