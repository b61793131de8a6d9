"""A third copy of a GEMM's per-step operand tiles where the scratchpad has room for it.

Stage: tiling and schedule (gemm.py's tile search asks `operand_copies` for each tiling it
prices; its schedule calls `annotate_copies`; lower/double_buffer.py gives the buffers the copies).
Double buffered, the load of step t + 2 waits for step t's GEMM to end (write after read), then
takes the DMA's latency and its transfer: a step whose GEMM is shorter than that round trip
waits each step. That is a prefill GEMM whose weights' tiles take as long to load as to multiply
(B's tiles stream once per row tile and A's panel is held: 32 x 64 x 128 on cgra-16x16 loads a
64 x 32 tile in 100 + 256 cycles and multiplies it in 256). With three copies the load of step
t + 3 waits for step t: the round trip spreads over three steps.
"""

from __future__ import annotations

from ..common.spec import BUFFER_COPIES, KernelSpec, Tiling, aligned

#: Copies of a per-step operand tile with room for a third (the load round trip spread over them).
MORE_COPIES = 3


def may_take_copies(spec: KernelSpec) -> bool:
    """Whether the kernel's operand tiles may get a third copy: a matmul, static or of symbolic
    rows (its tile search prices it: gemm_estimate.estimate_cycles; with symbolic rows the tiles
    are chosen double buffered and the copies given where they fit: gemm.choose_tiling; a
    conv2d's, a symbolic reduction's or columns' and the fused families' searches do not)."""
    return spec.op == "matmul" and spec.compute_name == "matmul" and \
        all(axis == 0 and role != "rhs" for role, axis, _ in spec.symbols)


def operand_copies(footprint: int, tm: int, a_row: int, tk: int, tn: int, in_bytes: int, spad_bytes: int) -> int:
    """MORE_COPIES if a third copy of A's step tile (rows `tm` of `a_row` elements) and of B's
    tile (tk x tn) fits beside the tiling's double-buffered `footprint`, else 2."""
    extra = aligned(MORE_COPIES * tm * a_row * in_bytes) - aligned(2 * tm * a_row * in_bytes) \
        + aligned(MORE_COPIES * tk * tn * in_bytes) - aligned(2 * tk * tn * in_bytes)
    return MORE_COPIES if footprint + extra <= spad_bytes else 2


def annotate_copies(sch, tiling: Tiling, tile_loop) -> None:
    """Ask lowering for the tiling's copies of the operand tiles allocated under `tile_loop`
    (the innermost loop over output tiles; A's panel, held or streamed, is allocated outside it
    and keeps its own)."""
    if tiling.operand_copies > 2:
        sch.annotate(tile_loop, BUFFER_COPIES, {"a_pad": tiling.operand_copies, "b_pad": tiling.operand_copies})
