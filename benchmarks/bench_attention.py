"""One attention layer's DRAM traffic against reading Q, K, V and writing O once (issue 34: within
10% at 128, 512 and 2048 tokens), per preset.

The layer: softmax(Q Kᵀ / sqrt(D) + causal mask) V, H query heads and Hk K / V heads of D float32
dims, in HF's eager form (normalise/attentions.py makes it the attention kernel's normal form).
Columns: preset, tokens, how it ran (the attention kernel with whole score rows of tq queries a
tile, "rows tq", or over key tiles with an online softmax, "keys tq x tk", kernels/attention/
flash.py; or the kernels it fell back to), DMA bytes loaded + stored by all its kernels, the
minimum (Q + K + V + mask + O once), their ratio, the ratio to Q + K + V + O alone (issue 34's
measure: a mask input must be read on top), NPU cycles, cycles over ideal (MACs / PEs).

    python benchmarks/bench_attention.py [--arch cgra-8x8 ...] [--tokens 128 512 2048] [--heads 4 --kv-heads 4 --dim 64]
                                         [--mask input | constant | none]
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the layer's graph builder is test_attention's


def row(arch_name: str, tokens: int, heads: int, kv_heads: int, dim: int, mask_kind: str) -> str:
    """One line of the table; `mask_kind` "input" (a causal mask passed at run time), "constant"
    (the same triangle as a constant: torch SDPA's is_causal) or "none"."""
    import numpy as np
    import tvm

    import npu_backend
    from test_attention import _graph

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, heads, tokens, dim)).astype(np.float32)
    k, v = (rng.standard_normal((1, kv_heads, tokens, dim)).astype(np.float32) for _ in range(2))
    arrays = [q, k, v]
    masked = mask_kind == "input"
    mask = np.triu(np.full((tokens, tokens), -np.inf, np.float32), 1)[None, None] if mask_kind != "none" else None
    if masked:
        arrays.append(mask)
    mod = _graph(1, heads, kv_heads, tokens, tokens, dim, dim ** -0.5, mask.shape if masked else None,
                 mask if mask_kind == "constant" else None)
    arch = npu_backend.load_arch(arch_name)
    executable = npu_backend.compile(mod, arch)
    with npu_backend.profile() as prof:
        tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](*map(tvm.runtime.tensor, arrays))
    fused = any("softmax" in kernel.name and "matmul" in kernel.name for kernel in prof.kernels)
    moved = sum(kernel.dma_load_bytes + kernel.dma_store_bytes for kernel in prof.kernels)
    minimum = sum(x.nbytes for x in arrays) + q.nbytes  # O is Q's size (Dv = D)
    qkvo = sum(x.nbytes for x in arrays[:3]) + q.nbytes
    macs = heads * tokens * tokens * 2 * dim
    how = _tiles(arch, heads, kv_heads, tokens, dim, mask_kind) if fused else f"{len(prof.kernels)} kernels"
    return (f"{arch_name:>11} {tokens:>6} {how:>17} {moved:>12,} {minimum:>12,} {moved / minimum:>6.2f} "
            f"{moved / qkvo:>7.2f} {prof.total_cycles:>12,} {prof.total_cycles / (macs / arch.num_pes):>6.2f}")


def _tiles(arch, heads: int, kv_heads: int, tokens: int, dim: int, mask_kind: str) -> str:
    """The attention kernel's tiles, as its tile search chose them."""
    from npu_backend.kernels.attention.attention_tiles import choose_attention_tiling
    from npu_backend.kernels.attention.flash_tiles import FlashTiling
    from npu_backend.kernels.attention.spec import AttentionSpec

    spec = AttentionSpec(1, kv_heads, heads // kv_heads, tokens, tokens, dim, dim, dim ** -0.5,
                         (1, 1, 1, tokens, tokens) if mask_kind == "input" else (),
                         causal=0 if mask_kind == "constant" else None)
    tiling = choose_attention_tiling(spec, arch)
    return f"keys {tiling.tq} x {tiling.tk}" if isinstance(tiling, FlashTiling) else f"rows {tiling.tm}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", default=["cgra-4x4", "cgra-8x8", "cgra-16x16"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[128, 512, 2048])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--mask", choices=("input", "constant", "none"), default="input",
                        help="the causal mask: an input, a constant (torch's is_causal), or none")
    args = parser.parse_args(argv)
    what = {"input": ", a causal mask input", "constant": ", a constant causal mask", "none": ""}[args.mask]
    print(f"one attention layer: {args.heads} query heads, {args.kv_heads} K / V heads, {args.dim} dims, float32"
          f"{what}")
    print(f"{'preset':>11} {'tokens':>6} {'ran as':>17} {'DMA bytes':>12} {'Q+K+V+m+O':>12} {'ratio':>6} "
          f"{'/QKVO':>7} {'cycles':>12} {'xideal':>6}")
    for arch in args.arch:
        for tokens in args.tokens:
            print(row(arch, tokens, args.heads, args.kv_heads, args.dim, args.mask), flush=True)


if __name__ == "__main__":
    main()
