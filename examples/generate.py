"""Greedy generation from a small random-weight Llama on the NPU, its KV cache kept on the device.

    python examples/generate.py                       # 64 tokens on cgra-8x8
    python examples/generate.py --arch cgra-16x16 --tokens 16 --prompt-length 5

A Hugging Face `LlamaForCausalLM` is built from a config alone (no download, weights from a fixed
seed). Its decode step (one token in, the next token's logits out; RMSNorm, RoPE, grouped-query
attention over the KV cache, SwiGLU, the LM head) is written with the model's own weights as a
module torch.export takes, exported once with the cache length symbolic, then given caches
preallocated for `--bound` positions (npu_backend.frontend.kv_cache.preallocate_kv_cache: the new
row written in place by an NPU kernel, attention reading the first t + 1 rows) and compiled once.
Its prefill (the prompt's tokens at once, causal attention over them) is exported once with the
prompt's length symbolic and writes the prompt's keys and values into the first rows of the same
caches, in place (npu_backend.frontend.kv_prefill.prefill_kv_cache); then each generated token
goes through the decode step (`--prefill steps`: the prompt too, token by token): every op of
the decode step runs on the NPU, the caches stay the same device tensors from step to step, and
the host only picks the argmax of the logits. The tokens are checked against
`model.generate(do_sample=False)`. It prints the prefill's figures, and per token the NPU's
cycles, the tokens per second at the chip's clock, the DRAM bytes the DMA moved and the energy.
Needs torch and transformers.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

#: The model: small enough to compile in seconds; head_dim 16 makes the attention scale 1/4, a
#: power of two, so scaling q before q Kᵀ is bit-exact with Llama's scaling of the scores.
CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=None, pad_token_id=0)


def build_model(seed: int, bound: int):
    """The random-weight LlamaForCausalLM (eager attention, no end-of-sequence token)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**CONFIG, max_position_embeddings=bound, attn_implementation="eager")
    return LlamaForCausalLM(config).eval()


def _tables(model):
    """Llama's RoPE tables for every position (cos, and sin with rotate_half's sign folded in),
    and the RMSNorm and RoPE the steps compute with them."""
    import torch

    config = model.config
    with torch.no_grad():  # looked up by position (an NPU gather in the decode step)
        cos, sin = model.model.rotary_emb(torch.zeros(1), torch.arange(config.max_position_embeddings)[None])
    half = config.head_dim // 2
    sign = torch.cat([-torch.ones(half), torch.ones(half)])  # rotate_half's negation, in the table

    def rms(x, norm):
        return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))

    def rope(x, cos, sin):
        return x * cos + torch.cat([x[..., half:], x[..., :half]], -1) * sin

    return cos[0], sin[0] * sign, rms, rope


def decode_step(model):
    """A torch module computing `model`'s decode step: (token (1, 1), position (1,), caches k0,
    v0, k1, ... (1, KV heads, t, d)) -> (logits (1, 1, vocab), the caches grown by the token)."""
    import torch

    config = model.config
    heads, kv_heads, depth = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    layers = model.model.layers
    cos_table, sin_table, rms, rope = _tables(model)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cos", cos_table)
            self.register_buffer("sin", sin_table)

        def forward(self, token, position, *caches):
            x = model.model.embed_tokens(token)
            cos, sin = self.cos[position][:, None, None, :], self.sin[position][:, None, None, :]
            grown = []
            for i, layer in enumerate(layers):
                attn, h = layer.self_attn, rms(x, layer.input_layernorm)
                q = attn.q_proj(h).view(1, 1, heads, depth).transpose(1, 2)
                k = attn.k_proj(h).view(1, 1, kv_heads, depth).transpose(1, 2)
                v = attn.v_proj(h).view(1, 1, kv_heads, depth).transpose(1, 2)
                q, k = rope(q, cos, sin) * attn.scaling, rope(k, cos, sin)
                keys, values = torch.cat([caches[2 * i], k], 2), torch.cat([caches[2 * i + 1], v], 2)
                grown += [keys, values]
                grouped = q.reshape(1, kv_heads, heads // kv_heads, depth)  # head h reads KV head h // group
                scores = torch.softmax(grouped @ keys.transpose(2, 3), -1)
                x = x + attn.o_proj((scores @ values).reshape(1, 1, heads * depth))
                h = rms(x, layer.post_attention_layernorm)
                x = x + layer.mlp.down_proj(torch.nn.functional.silu(layer.mlp.gate_proj(h)) * layer.mlp.up_proj(h))
            return (model.lm_head(rms(x, model.model.norm)), *grown)

    return Step().eval()


def prefill_step(model):
    """A torch module computing `model`'s prefill: (tokens (1, s)) -> (logits (1, s, vocab), the
    prompt's keys and values k0, v0, k1, ... (1, KV heads, s, d)), causal attention over the
    prompt, the same arithmetic as the decode step's."""
    import torch

    config = model.config
    heads, kv_heads, depth = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    group, layers = heads // kv_heads, model.model.layers
    cos_table, sin_table, rms, rope = _tables(model)

    def repeat(x, s):  # repeat_kv: KV head h // group for head h
        return x[:, :, None].expand(1, kv_heads, group, s, depth).reshape(1, heads, s, depth)

    class Prefill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cos", cos_table)
            self.register_buffer("sin", sin_table)

        def forward(self, tokens):
            s = tokens.shape[1]
            x, positions = model.model.embed_tokens(tokens), torch.arange(s)
            cos, sin = self.cos[positions][None, None], self.sin[positions][None, None]
            mask = torch.where(positions[None, :] <= positions[:, None], 0.0, torch.finfo(torch.float32).min)
            rows = []
            for layer in layers:
                attn, h = layer.self_attn, rms(x, layer.input_layernorm)
                q = attn.q_proj(h).view(1, s, heads, depth).transpose(1, 2)
                k = attn.k_proj(h).view(1, s, kv_heads, depth).transpose(1, 2)
                v = attn.v_proj(h).view(1, s, kv_heads, depth).transpose(1, 2)
                q, k = rope(q, cos, sin) * attn.scaling, rope(k, cos, sin)
                rows += [k, v]
                scores = torch.softmax(q @ repeat(k, s).transpose(2, 3) + mask, -1)
                x = x + attn.o_proj((scores @ repeat(v, s)).transpose(1, 2).reshape(1, s, heads * depth))
                h = rms(x, layer.post_attention_layernorm)
                x = x + layer.mlp.down_proj(torch.nn.functional.silu(layer.mlp.gate_proj(h)) * layer.mlp.up_proj(h))
            return (model.lm_head(rms(x, model.model.norm)), *rows)

    return Prefill().eval()


def compile_prefill(model, bound: int, arch: str):
    """The prefill exported once (the prompt's length symbolic, 2..bound), writing its rows into
    the decode step's caches (npu_backend.frontend.kv_prefill), compiled for `arch`: (the VM, the
    compile's seconds)."""
    import torch
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    import npu_backend
    from npu_backend.frontend.kv_prefill import prefill_kv_cache

    length = torch.export.Dim("s", min=2, max=bound)
    with torch.no_grad():
        exported = torch.export.export(prefill_step(model), (torch.ones(1, 8, dtype=torch.int64),),
                                       dynamic_shapes=({1: length},))
    mod = prefill_kv_cache(from_exported_program(exported), bound)
    started = time.perf_counter()
    executable = npu_backend.compile(mod, arch)
    return relax.VirtualMachine(executable, tvm.cpu()), time.perf_counter() - started


def compile_step(model, bound: int, arch: str):
    """The decode step exported once (cache length symbolic), its caches preallocated for `bound`
    positions, compiled for `arch`: (the VM, the compile's seconds)."""
    import torch
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    import npu_backend
    from npu_backend.frontend.kv_cache import preallocate_kv_cache

    step, config = decode_step(model), model.config
    shape = (1, config.num_key_value_heads, 8, config.head_dim)
    example = (torch.tensor([[1]]), torch.tensor([8]), *[torch.zeros(shape) for _ in range(2 * len(step_layers(model)))])
    length = torch.export.Dim("t", min=2, max=bound - 1)
    dynamic = (None, None, tuple({2: length} for _ in example[2:]))
    with torch.no_grad():
        exported = torch.export.export(step, example, dynamic_shapes=dynamic)
    mod = preallocate_kv_cache(from_exported_program(exported), bound, position="position")
    started = time.perf_counter()
    executable = npu_backend.compile(mod, arch)
    return relax.VirtualMachine(executable, tvm.cpu()), time.perf_counter() - started


def step_layers(model):
    return model.model.layers


def new_caches(model, bound: int) -> list:
    """The step's KV caches, zeros, preallocated once on the device: (1, KV heads, bound, d) each."""
    import tvm

    config = model.config
    shape = (1, config.num_key_value_heads, bound, config.head_dim)
    return [tvm.runtime.tensor(np.zeros(shape, "float32")) for _ in range(2 * len(step_layers(model)))]


def run_step(vm, token: int, position: int, caches: list):
    """One decode step on the NPU: (the logits as numpy, its profile)."""
    import tvm

    import npu_backend

    with npu_backend.profile() as prof:
        out = vm["main"](tvm.runtime.tensor(np.array([[token]], "int64")), tvm.runtime.tensor(np.array([position])),
                         *caches)
    return out[0].numpy(), prof


def run_prefill(vm, prompt: list, caches: list):
    """The prompt's prefill on the NPU, its rows written into the first len(prompt) positions of
    `caches`: (the logits (1, s, vocab) as numpy, its profile)."""
    import tvm

    import npu_backend

    with npu_backend.profile() as prof:
        out = vm["main"](tvm.runtime.tensor(np.array([prompt], "int64")), *caches)
    return out[0].numpy(), prof


def step_figures(prof) -> dict:
    """A step's cycles (NPU and host), DRAM bytes, energy and host/NPU crossings."""
    return {"cycles": prof.total_cycles, "host_cycles": prof.host_cycles,
            "dram_bytes": sum(k.dma_load_bytes + k.dma_store_bytes for k in prof.kernels),
            "energy_nj": prof.total_energy_pj / 1000, "crossings": prof.crossings, "launches": len(prof.kernels)}


def generate(vm, model, prompt: list, tokens: int, bound: int, report=None, prefill=None) -> tuple[list, list]:
    """Greedy generation on the NPU: (the generated tokens, each decode step's figures). The
    prompt goes through `prefill` (compile_prefill's VM) at once, or without one (or for a
    prompt of one token) through the decode step token by token; then each generated token
    goes through the decode step."""
    if len(prompt) + tokens > bound:
        raise ValueError(f"{len(prompt)} prompt tokens + {tokens} new ones need a KV cache of "
                         f"{len(prompt) + tokens} positions, past the bound {bound}: pass --bound "
                         f"{len(prompt) + tokens} or more")
    caches, figures, generated = new_caches(model, bound), [], []
    if prefill is not None and len(prompt) > 1:
        logits, prof = run_prefill(prefill, prompt, caches)
        if report is not None:
            report("prefill", 0, len(prompt), step_figures(prof))
    else:
        for position, token in enumerate(prompt):
            logits, prof = run_step(vm, token, position, caches)
            if report is not None:
                report("prefill", position, token, step_figures(prof))
    for index in range(tokens):
        token = int(np.argmax(logits[0, -1]))
        generated.append(token)
        if index == tokens - 1:
            break
        logits, prof = run_step(vm, token, len(prompt) + index, caches)
        figures.append(step_figures(prof))
        if report is not None:
            report("decode", len(prompt) + index, token, figures[-1])
    return generated, figures


def reference(model, prompt: list, tokens: int) -> list:
    """PyTorch's greedy tokens: model.generate(do_sample=False)."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.int64))
    return [int(t) for t in out[0, len(prompt):]]


def main(argv=None) -> int:
    head, _, rest = __doc__.partition("\n\n")
    parser = argparse.ArgumentParser(description=head, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="cgra-8x8", help="chip preset or JSON file (default: cgra-8x8)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens to generate (default: 64)")
    parser.add_argument("--prompt-length", type=int, default=8, help="random prompt tokens (default: 8)")
    parser.add_argument("--bound", type=int, default=128, help="KV cache positions preallocated (default: 128)")
    parser.add_argument("--seed", type=int, default=0, help="weights and prompt seed (default: 0)")
    parser.add_argument("--prefill", choices=("batched", "steps"), default="batched",
                        help="the prompt through the prefill step at once (default) or the decode step token by token")
    parser.add_argument("--quiet", action="store_true", help="no line per token")
    args = parser.parse_args(argv)
    from cgra_sim.arch import load_arch
    clock = load_arch(args.arch).clock_mhz * 1e6

    model = build_model(args.seed, args.bound)
    prompt = [int(t) for t in np.random.default_rng(args.seed).integers(3, CONFIG["vocab_size"], args.prompt_length)]
    print(f"model: LlamaForCausalLM {CONFIG['num_hidden_layers']} layers, hidden {CONFIG['hidden_size']}, "
          f"vocab {CONFIG['vocab_size']} (random weights, seed {args.seed}); prompt {prompt}", flush=True)
    vm, seconds = compile_step(model, args.bound, args.arch)
    print(f"decode step compiled once for cache lengths 1..{args.bound} on {args.arch} in {seconds:.1f} s", flush=True)
    prefill = None
    if args.prefill == "batched":
        prefill, seconds = compile_prefill(model, args.bound, args.arch)
        print(f"prefill step compiled once for prompts of 2..{args.bound} tokens in {seconds:.1f} s", flush=True)

    def report(phase, position, token, f):
        if phase == "prefill" and prefill is not None and len(prompt) > 1:  # token: the prompt's length
            print(f"prefill of {token} tokens: {f['cycles']} NPU cycles ({f['cycles'] / token:.0f} a token), "
                  f"DRAM {f['dram_bytes']} B, {f['energy_nj']:.1f} nJ, host {f['host_cycles']} cycles, "
                  f"{f['crossings']} crossings, {f['launches']} launches", flush=True)
        elif not args.quiet:
            print(f"{phase:>7} pos {position:>4} token {token:>4}: {f['cycles']:>8} cycles "
                  f"({clock / f['cycles']:>9.0f} tokens/s), DRAM {f['dram_bytes']:>8} B, "
                  f"{f['energy_nj']:>8.1f} nJ, host {f['host_cycles']} cycles, {f['crossings']} crossings", flush=True)

    generated, figures = generate(vm, model, prompt, args.tokens, args.bound, report, prefill)
    expected = reference(model, prompt, args.tokens)
    cycles = np.mean([f["cycles"] for f in figures]) if figures else float("nan")
    print(f"generated {generated}")
    print(f"per decode step (mean of {len(figures)}): {cycles:.0f} NPU cycles = {clock / cycles:.0f} tokens/s at "
          f"{clock / 1e6:.0f} MHz, DRAM {np.mean([f['dram_bytes'] for f in figures]):.0f} B, "
          f"{np.mean([f['energy_nj'] for f in figures]):.1f} nJ, host {np.mean([f['host_cycles'] for f in figures]):.0f}"
          f" cycles, {np.mean([f['crossings'] for f in figures]):.0f} host/NPU crossings (none of them the cache)")
    same = generated == expected
    print(f"PyTorch model.generate(do_sample=False): {'the same tokens' if same else f'DIFFERENT: {expected}'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
