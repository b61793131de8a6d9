"""Prefill of decoders compiled once for every length against compiled for one.

The decoder is tests/transformer_models.py's `llama` (Hugging Face's LlamaModel, hidden 64, 2
layers, 4 heads, 2 KV heads, random weights), or with --models any of the families
tests/test_symbolic_exports.py exports (gpt2, qwen2, mistral, gemma, phi3, gpt_neox, gptj,
falcon, bloom) or encoders (distilbert, albert, bert, roberta: their position tables widened
to the bound; t5: its relative-position bias a constant box at the bound), given `input_ids` alone and exported with `torch.export.Dim("s", min=2, max=BOUND)`. Per length: the NPU's share of the model's MACs
(`explain` at that length), the cycles of the symbolic compile (NPU + the host operators'
modelled cycles) over those of a compile for exactly that length, the NPU and host cycles of each,
and the largest difference to PyTorch relative to PyTorch's largest output.

    python benchmarks/bench_prefill.py [--arch cgra-8x8] [--bound 2048] [--lengths 16 128]
        [--models llama gptj falcon] [--kernels]

With more than Llama alone each row starts with the model's name; --kernels prints, per length, the
symbolic and the static run's per-kernel tables (npu_backend.profile) to compare them.

Needs torch and transformers (`pip install -e ".[hf]"`).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the builders are test-side

#: The decoders tests/test_symbolic_exports.py exports with input_ids alone.
FAMILIES = ("llama", "gpt2", "qwen2", "mistral", "gemma", "phi3", "gpt_neox", "gptj", "falcon", "bloom")
#: The encoders exported the same way (their position ids sliced to the length: the bound must not
#: pass their position table, which _positions_for widens to the bound).
ENCODERS = ("distilbert", "albert", "bert", "roberta", "t5")
WIDTH = 10  # the model column, with --models


def _run(vm, ids):
    import tvm

    import npu_backend

    with npu_backend.profile() as prof:
        out = vm["main"](tvm.runtime.tensor(ids.numpy()))
    return prof, (out[0] if not hasattr(out, "numpy") else out).numpy()


def _positions_for(name: str, length: int) -> None:
    """Give the test-side family (transformer_models, 256 positions) position tables of at least
    `length` rows, so that a 1024-token prefill is a valid input; the same model otherwise."""
    import transformer_models

    arguments = transformer_models.ARCHITECTURES[name][2]
    if name in ENCODERS and length > 512:  # (their configs' default of 512 positions, not among the arguments)
        arguments.setdefault("max_position_embeddings", length)
    for key in ("max_position_embeddings", "n_positions"):
        if key in arguments and arguments[key] < length:
            arguments[key] = length


def _model_rows(name, args, named: bool) -> None:
    """Compile `name` exported with a symbolic length once, then per length compile it for that
    length, run both and print a row (and with args.kernels both per-kernel tables)."""
    import numpy as np
    import torch
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    import npu_backend
    from test_symbolic_exports import _export

    _positions_for(name, max(args.lengths) if name in FAMILIES else max(args.bound, *args.lengths) + 2)
    model, mod = _export(name, args.bound)
    (length,) = relax.analysis.defined_symbolic_vars(mod["main"])
    symbolic = relax.VirtualMachine(npu_backend.compile(mod, args.arch), tvm.cpu())
    print(f"{'model' if named else '':<{WIDTH if named else 0}}{'tokens':>6} {'NPU MACs':>9} {'sym/static':>10} {'sym NPU':>10} {'sym host':>10} "
          f"{'static NPU':>10} {'static host':>11} {'error':>8}")
    for n in args.lengths:
        share = npu_backend.npu_mac_fraction(npu_backend.explain(mod, args.arch, dims={length.name: n}))
        ids = torch.randint(0, 100, (1, n), generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            expected = model(ids).numpy()
        fixed = relax.VirtualMachine(npu_backend.compile(
            from_exported_program(torch.export.export(model, (ids,))), args.arch), tvm.cpu())
        (sym, out), (static, _) = _run(symbolic, ids), _run(fixed, ids)
        ratio = (sym.total_cycles + sym.host_cycles) / (static.total_cycles + static.host_cycles)
        error = float(np.abs(out - expected).max() / np.abs(expected).max())
        print(f"{name if named else '':<{WIDTH if named else 0}}{n:>6} {share:>9.4%} {ratio:>10.3f} {sym.total_cycles:>10} {sym.host_cycles:>10} "
              f"{static.total_cycles:>10} {static.host_cycles:>11} {error:>8.1e}", flush=True)
        if args.kernels:
            print(f"-- symbolic, {n} tokens\n{sym.table()}\n-- static, {n} tokens\n{static.table()}", flush=True)


def main(argv=None) -> None:
    """Print one row per model and length."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cgra-8x8")
    parser.add_argument("--bound", type=int, default=2048)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--models", nargs="+", default=["llama"], choices=FAMILIES + ENCODERS)
    parser.add_argument("--kernels", action="store_true", help="print both runs' per-kernel tables")
    args = parser.parse_args(argv)
    named = args.models != ["llama"]
    for name in args.models:
        _model_rows(name, args, named)


if __name__ == "__main__":
    main()
