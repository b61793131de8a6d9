"""Issue 37: a transformer of tests/transformer_models.py in float32, bfloat16 and float16 on the NPU.

Each model is built as bench_transformers.py builds it, then `.to(torch.bfloat16)` /
`.to(torch.float16)` (float inputs cast the same way; token ids stay integers) and exported with
torch.export, as tests/test_half*.py do. Columns: model; format; NPU cycles; cycles over the float32
row's; DRAM bytes moved by the NPU's DMA; the largest difference to PyTorch's own run in that format
relative to its largest output; the costliest kernels with `--kernels N`.

    python benchmarks/bench_half.py [--arch cgra-8x8 ...] [--models llama vit bert gpt2]
        [--dtype float32 bfloat16 float16] [--tokens 32] [--kernels 10]

Needs torch and transformers (`pip install -e ".[hf]"`).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the builders (transformer_models.py) are test-side
sys.path.insert(0, HERE)

FORMATS = ("float32", "bfloat16", "float16")


def half_model(name: str, dtype: str, tokens: int):
    """(model, inputs) of transformer_models.build in `dtype`: the weights and any float input."""
    import torch
    from transformer_models import build

    model, inputs = build(name, tokens=tokens)
    if dtype == "float32":
        return model, inputs
    torch_dtype = getattr(torch, dtype)
    inputs = tuple(x.to(torch_dtype) if x.is_floating_point() else x for x in inputs)
    return model.to(torch_dtype), inputs


def run(name: str, dtype: str, arch: str, tokens: int):
    """(cycles, DRAM bytes, error against PyTorch's run in `dtype`, profile) of one model."""
    import numpy as np
    import torch
    import tvm
    import npu_backend
    from transformer_models import first_output

    model, inputs = half_model(name, dtype, tokens)
    with torch.no_grad():
        expected = first_output(model(*inputs)).float().numpy().astype(np.float64)
        # npu_backend's importer: TVM's raises on a half conv's bias (frontend/torch_import.py)
        mod = npu_backend.from_exported_program(torch.export.export(model, inputs))
    executable = npu_backend.compile(mod, arch)
    args = [tvm.runtime.tensor(x.float().numpy().astype(_numpy_dtype(dtype)) if x.is_floating_point()
                               else x.numpy()) for x in inputs]
    with npu_backend.profile() as prof:
        out = first_output(tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](*args)).numpy()
    error = float(np.abs(out.astype(np.float64) - expected).max() / np.abs(expected).max())
    dram = sum(k.dma_load_bytes + k.dma_store_bytes for k in prof.kernels)
    return prof.total_cycles, dram, error, prof


def _numpy_dtype(dtype: str):
    """numpy's dtype for `dtype` (ml_dtypes' bfloat16, as TVM's tensors take it)."""
    import ml_dtypes
    import numpy as np

    return ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", help="presets or chip files (default cgra-8x8)")
    parser.add_argument("--models", nargs="*", default=["llama", "vit", "bert", "gpt2"])
    parser.add_argument("--dtype", nargs="*", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--tokens", type=int, default=32, help="tokens of text per prompt (default 32)")
    parser.add_argument("--kernels", type=int, default=0, metavar="N",
                        help="also list each run's N costliest NPU kernels (cycles, share, launches)")
    args = parser.parse_args()
    os.environ.setdefault("CGRA_KERNEL_CACHE", "off")
    from bench_transformers import kernel_lines

    for arch in args.arch or ["cgra-8x8"]:
        print(f"\n{arch}, random weights, {args.tokens} tokens of text")
        print(f"{'model':<8} {'format':<9} {'cycles':>9} {'x f32':>6} {'DRAM MB':>8} {'error':>8}")
        for name in args.models:
            base = None
            for dtype in args.dtype:
                try:
                    cycles, dram, error, prof = run(name, dtype, arch, args.tokens)
                except Exception as err:  # noqa: BLE001  (a run that fails is a row, not the end)
                    print(f"{name:<8} {dtype:<9} fails: {type(err).__name__}: {str(err).splitlines()[0][:100]}",
                          flush=True)
                    continue
                base = cycles if dtype == "float32" else base
                ratio = f"{cycles / base:>6.3f}" if base else f"{'-':>6}"
                print(f"{name:<8} {dtype:<9} {cycles:>9,} {ratio} {dram / 1e6:>8.2f} {error:>8.1e}", flush=True)
                for line in kernel_lines(prof)[:args.kernels]:
                    print("          " + line, flush=True)


if __name__ == "__main__":
    main()
