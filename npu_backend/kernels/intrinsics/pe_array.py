"""The PE array's intrinsics: GEMM over scratchpad tiles, and DEPTHWISE's sliding window.

Stage: schedule and tensorize. Each factory returns the (description, implementation) pair of one
intrinsic sized for a kernel's tile (builder.py); `window_sum` is the one expression of a
depthwise output, shared with the depthwise kernel's TE compute so tensorize sees one expression.
"""

from __future__ import annotations


from cgra_codegen import device_call
from cgra_sim.isa import GEMM_ACCUMULATE, DType

from .builder import SPAD, Tile, intrinsic


def dtype_code(dtype: str) -> int:
    """The ISA's code of a dtype, as the device calls take it."""
    return int(DType.from_name(dtype))


def gemm_intrin(rows: int, cols: int, depth: int, dtype: str, acc_dtype: str, *, scope: str = SPAD):
    """One GEMM: acc[rows, cols] += A[rows, depth] @ B[depth, cols] on scratchpad tiles (the PE
    array runs its folds of a tile larger than itself back to back)."""
    # int16 activations multiply int8 weights (the 16x8 mode); other GEMMs take one dtype.
    a, b = Tile("A", (rows, depth), dtype), Tile("B", (depth, cols), "int8" if dtype == "int16" else dtype)
    acc = Tile("C", (rows, cols), acc_dtype)

    def value(buffers, i, j, k):
        # No cast where the dtypes agree (float32): a same-dtype cast would be a node user
        # TensorIR does not have, and TVM's tensorize-mapping analysis would not match it.
        return buffers["A"][i, k].astype(acc_dtype) * buffers["B"][k, j].astype(acc_dtype)

    def call(buffers, strides):
        A, B, C = buffers["A"], buffers["B"], buffers["C"]
        return device_call(
            "cgra_gemm", flags=GEMM_ACCUMULATE, dtype=dtype_code(dtype), m=rows, n=cols, k=depth,
            a_addr=A, a_stride=strides["A"][0], b_addr=B, b_stride=strides["B"][0],
            acc_addr=C, acc_stride=strides["C"][0])

    return intrinsic([a, b], acc, "update", value, call, grid=(rows, cols, depth), kinds="SSR",
                     accumulate=True, scope=scope)


def window_extent(out: int, kernel: int, stride: int, dilation: int) -> int:
    """Input rows (or columns) a window of `out` outputs reads."""
    return (out - 1) * stride + (kernel - 1) * dilation + 1


def window_sum(load_a, load_b, y, x, c, window, acc_dtype: str):
    """The depthwise sum at output (y, x, c): taps ry-major, each term cast to `acc_dtype`, added
    left to right (the order the simulator adds them in). `window` = (kh, kw, sh, sw, dh, dw);
    `load_a(iy, ix, c)` and `load_b(ry, rx, c)` read the input window and the weights."""
    kh, kw, sh, sw, dh, dw = window
    total = None
    for ry in range(kh):
        for rx in range(kw):
            term = load_a(y * sh + ry * dh, x * sw + rx * dw, c).astype(acc_dtype) * \
                load_b(ry, rx, c).astype(acc_dtype)
            total = term if total is None else total + term
    return total


def depthwise_intrin(oh: int, ow: int, cols: int, window: tuple, dtype: str, acc_dtype: str, *,
                     scope: str = SPAD):
    """One DEPTHWISE, a PE per output: acc[oh, ow, cols] = the window sum over an input tile
    (in_h, in_w, cols) and weights (kh, kw, cols). `window` = (kh, kw, sh, sw, dh, dw)."""
    kh, kw, sh, sw, dh, dw = window
    a = Tile("A", (window_extent(oh, kh, sh, dh), window_extent(ow, kw, sw, dw), cols), dtype)
    b, acc = Tile("B", (kh, kw, cols), dtype), Tile("C", (oh, ow, cols), acc_dtype)

    def value(buffers, y, x, c):
        return window_sum(lambda i, j, k: buffers["A"][i, j, k], lambda i, j, k: buffers["B"][i, j, k],
                          y, x, c, window, acc_dtype)

    def call(buffers, strides):
        A, B, C = buffers["A"], buffers["B"], buffers["C"]
        (sa0, sa1), (sb0, sb1), (sc0, sc1) = strides["A"], strides["B"], strides["C"]
        return device_call(
            "cgra_depthwise", flags=0, dtype=dtype_code(dtype), oh=oh, ow=ow, n=cols, kh=kh, kw=kw,
            a_addr=A, a_y_stride=sa0 * sh, a_x_stride=sa1 * sw, a_ry_stride=sa0 * dh,
            a_rx_stride=sa1 * dw, b_addr=B, b_ry_stride=sb0, b_rx_stride=sb1,
            acc_addr=C, acc_y_stride=sc0, acc_x_stride=sc1)

    return intrinsic([a, b], acc, "acc", value, call, scope=scope)
