"""Where RoPE should run after a Llama-style layer's merged q / k / v projection: the figures behind
the choice (docs/transformer-ops.md, "RoPE after the merged projection").

One layer: S tokens of a C-wide input, H query heads and Hk K / V heads of D dims, torch.export's
form (normalise/qkv_merges.py merges the three projections). Lines, NPU cycles on each preset:
- today: the merged GEMM (N = (H + 2 Hk) D) and the two RoPE kernels (q's and k's);
- the interleaved-weights option (W and W P side by side, the epilogue even * cos + odd * sin,
  as kernels/gemm/gated.py does for SwiGLU): its GEMM has N = 2 (H + Hk) D + Hk D columns, whose
  cost is measured here as a plain GEMM of that width, and an epilogue over interleaved columns
  whose cost is measured as the gated SwiGLU kernel's over a plain GEMM of its width (a lower
  bound: RoPE's epilogue also loads a cos and a sin tile);
- what a RoPE epilogue inside the tile that holds whole heads would have to beat: the RoPE
  kernels' cycles (its vector work, four ELTWISEs over the tile, runs beside the PE array).

    python benchmarks/bench_rope_options.py [--arch cgra-8x8 ...] [--tokens 32] [--hidden 64 --heads 4 --kv-heads 2]
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the model builders are the tests'


def layer_model(s, c, heads, kv_heads, d, seed=0):
    """main(x): q, k, v projections of x in heads, RoPE (HF's rotate_half) on q and k; out: q,
    k and v concatenated along the head axis."""
    import numpy as np
    from tvm import relax

    rng = np.random.default_rng(seed)
    angles = np.arange(s)[:, None] * (10000.0 ** (-np.arange(0, d, 2) / d))[None, :]
    cos, sin = (np.concatenate([f(angles)] * 2, axis=1).astype("float32") for f in (np.cos, np.sin))
    x = relax.Var("x", relax.TensorType((1, s, c), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = []
            for index, h in enumerate((heads, kv_heads, kv_heads)):
                w = (rng.standard_normal((h * d, c)) / np.sqrt(c)).astype("float32")
                flat = bb.emit(relax.op.reshape(x, (s, c)))
                y = bb.emit(relax.op.matmul(flat, bb.emit(relax.op.permute_dims(relax.const(w))), out_dtype="float32"))
                y = bb.emit(relax.op.reshape(bb.emit(relax.op.reshape(y, (1, s, h * d))), (1, s, h, d)))
                y = bb.emit(relax.op.permute_dims(y, [0, 2, 1, 3]))
                if index < 2:
                    halves = [bb.emit(relax.op.strided_slice(y, [3], [b], [b + d // 2])) for b in (0, d // 2)]
                    rotated = bb.emit(relax.op.concat([bb.emit(relax.op.negative(halves[1])), halves[0]], axis=-1))
                    y = bb.emit(relax.op.add(bb.emit(relax.op.multiply(y, relax.const(cos))),
                                             bb.emit(relax.op.multiply(rotated, relax.const(sin)))))
                parts.append(y)
            out = bb.emit_output(bb.emit(relax.op.concat(parts, axis=1)))
        bb.emit_func_output(out)
    return bb.get(), [rng.standard_normal((1, s, c)).astype("float32")]


def kernel_cycles(mod, inputs, arch) -> list:
    """(name, source ops, cycles) of every NPU launch of `mod`."""
    import npu_backend
    from models import run
    with npu_backend.profile() as prof:
        run(npu_backend.compile(mod, arch), inputs)
    return [(k.name, k.source_ops, k.cycles) for k in prof.kernels]


def gemm_cycles(s, c, n, arch) -> int:
    from test_qkv_merges import projections_model
    mod, xs = projections_model([n // 16], s=s, k=c, d=16)
    return sum(cycles for _, ops, cycles in kernel_cycles(mod, xs, arch) if "matmul" in ops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", help="presets (default: cgra-8x8)")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    args = parser.parse_args()
    s, c, h, hk = args.tokens, args.hidden, args.heads, args.kv_heads
    d = c // h
    from test_gated_linears import gated_model
    for arch in args.arch or ["cgra-8x8"]:
        launches = kernel_cycles(*layer_model(s, c, h, hk, d), arch)
        gemm = sum(cycles for _, ops, cycles in launches if "matmul" in ops)
        rope = sum(cycles for _, ops, cycles in launches if "concat" in ops and "multiply" in ops)
        print(f"{arch}: S={s} C={c} H={h} Hk={hk} D={d}")
        print(f"  today          merged GEMM (N={(h + 2 * hk) * d}) {gemm:>7,} + RoPE kernels {rope:>6,} = {gemm + rope:>7,}")
        wide = 2 * (h + hk) * d + hk * d
        qk = (h + hk) * d
        mod, xs, _ = gated_model("two", "silu", s=s, k=c, n=qk)
        gated = sum(cycles for _, _, cycles in kernel_cycles(mod, xs, arch))
        epilogue = max(0, gated - gemm_cycles(s, c, 2 * qk, arch))  # (< 0: its narrower store hid it)
        interleaved = gemm_cycles(s, c, wide, arch)
        print(f"  interleaved    GEMM (N={wide}) {interleaved:>7,} + epilogue >= {epilogue:>5,} = {interleaved + epilogue:>7,}"
              f"  ({(interleaved + epilogue) / (gemm + rope):.2f}x today)")
        print(f"  whole-heads epilogue: the GEMM's {gemm:,} plus what its four ELTWISEs a tile do not hide "
              f"(at most the RoPE kernels' {rope:,})")


if __name__ == "__main__":
    main()
