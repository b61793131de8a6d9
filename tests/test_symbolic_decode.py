"""A Llama-style decode step compiled once for every KV-cache length (issue 36): one new token, the
caches (1, KV heads, t, d) as inputs and the caches grown by the token (t + 1) as outputs, the
position an input. Attention's q Kᵀ (the cache length as columns), its softmax over a row of
length t + 1 and P V (t + 1 the reduction) run on the NPU (kernels/gemm/symbolic_matmul.py,
kernels/rows/rows.py): every MAC at every length, outputs equal to PyTorch, cycles close to a
compile for the length. In this form the caches cross the host (concat); preallocated for a bound
(frontend/kv_cache.py, the last test) they stay on the device; see docs/dynamic-shapes.md.
Needs torch."""

from __future__ import annotations

import numpy as np
import pytest

HEADS, KV_HEADS, DEPTH, HIDDEN, FFN, LAYERS = 4, 2, 16, 64, 128, 2


def _step_module():
    torch = pytest.importorskip("torch")

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def rope(x, pos):
        inverse = 1.0 / (10000 ** (torch.arange(0, DEPTH, 2, dtype=torch.float32) / DEPTH))
        angles = pos.float()[..., None] * inverse
        emb = torch.cat([angles, angles], -1)
        half = DEPTH // 2
        return x * emb.cos()[None, None] + torch.cat([-x[..., half:], x[..., :half]], -1) * emb.sin()[None, None]

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            gen = torch.Generator().manual_seed(0)

            def weights(rows, cols):
                return torch.nn.ParameterList([torch.nn.Parameter(torch.randn(rows, cols, generator=gen) / cols ** 0.5)
                                               for _ in range(LAYERS)])

            self.q, self.k, self.v = weights(HEADS * DEPTH, HIDDEN), weights(KV_HEADS * DEPTH, HIDDEN), \
                weights(KV_HEADS * DEPTH, HIDDEN)
            self.o, self.gate, self.up, self.down = weights(HIDDEN, HEADS * DEPTH), weights(FFN, HIDDEN), \
                weights(FFN, HIDDEN), weights(HIDDEN, FFN)
            self.norms = weights(2, HIDDEN)

        def forward(self, x, pos, *caches):
            grown = []
            for layer in range(LAYERS):
                h = rms(x, 1 + 0.1 * self.norms[layer][0])
                q = rope((h @ self.q[layer].T).view(1, 1, HEADS, DEPTH).transpose(1, 2), pos)
                k = rope((h @ self.k[layer].T).view(1, 1, KV_HEADS, DEPTH).transpose(1, 2), pos)
                v = (h @ self.v[layer].T).view(1, 1, KV_HEADS, DEPTH).transpose(1, 2)
                keys, values = torch.cat([caches[2 * layer], k], 2), torch.cat([caches[2 * layer + 1], v], 2)
                grown += [keys, values]
                grouped = q.reshape(1, KV_HEADS, HEADS // KV_HEADS, DEPTH)  # torch.export takes no repeat_interleave
                scores = torch.softmax(grouped @ keys.transpose(2, 3) / DEPTH ** 0.5, -1)
                x = x + (scores @ values).reshape(1, 1, HEADS * DEPTH) @ self.o[layer].T
                h = rms(x, 1 + 0.1 * self.norms[layer][1])
                x = x + (torch.nn.functional.silu(h @ self.gate[layer].T) * (h @ self.up[layer].T)) @ self.down[layer].T
            return (x, *grown)

    return torch, Step().eval()


def _inputs(torch, t: int):
    gen = torch.Generator().manual_seed(t)
    return (torch.randn(1, 1, HIDDEN, generator=gen), torch.tensor([t]),
            *[torch.randn(1, KV_HEADS, t, DEPTH, generator=gen) for _ in range(2 * LAYERS)])


@pytest.mark.slow  # three compiles of a two-layer decoder: about 40 s
def test_a_decode_step_compiles_once_and_runs_every_cache_length_on_the_npu():
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    import npu_backend

    torch, step = _step_module()
    length = torch.export.Dim("t", min=2, max=255)
    dynamic = (None, None, tuple({2: length} for _ in range(2 * LAYERS)))  # *caches: one group
    mod = from_exported_program(torch.export.export(step, _inputs(torch, 8), dynamic_shapes=dynamic))
    (var,) = relax.analysis.defined_symbolic_vars(mod["main"])
    for t in (3, 200):
        assert npu_backend.npu_mac_fraction(npu_backend.explain(mod, "cgra-8x8", dims={var.name: t})) == 1.0
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    for t in (2, 47):
        args = _inputs(torch, t)
        with torch.no_grad():
            expected = step(*args)
        with npu_backend.profile() as prof:
            got = vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
        for out, ref in zip(got, expected):
            np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
        static = relax.VirtualMachine(npu_backend.compile(from_exported_program(torch.export.export(step, args)),
                                                          "cgra-8x8"), tvm.cpu())
        with npu_backend.profile() as fixed:
            static["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
        assert prof.total_cycles <= 1.10 * fixed.total_cycles, (t, prof.total_cycles, fixed.total_cycles)


@pytest.mark.slow  # a preallocated and a static compile, 64 steps: about 80 s on a busy machine
def test_the_step_with_preallocated_caches_matches_pytorch_over_64_steps_with_the_cache_on_the_device():
    """frontend/kv_cache.py: the same step, its caches preallocated for 128 positions and written in
    place (test_kv_cache.py has the mechanism); 64 steps from an empty cache equal PyTorch's
    grown caches and outputs, with no host op and no crossing, and a step costs about what a
    compile for its length does."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    import npu_backend
    from npu_backend.frontend.kv_cache import preallocate_kv_cache

    torch, step = _step_module()
    length, bound = torch.export.Dim("t", min=2, max=255), 128
    dynamic = (None, None, tuple({2: length} for _ in range(2 * LAYERS)))
    mod = preallocate_kv_cache(from_exported_program(torch.export.export(step, _inputs(torch, 8),
                                                                          dynamic_shapes=dynamic)), bound)
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    caches = [tvm.runtime.tensor(np.zeros((1, KV_HEADS, bound, DEPTH), "float32")) for _ in range(2 * LAYERS)]
    grown = [torch.zeros(1, KV_HEADS, 0, DEPTH) for _ in range(2 * LAYERS)]
    gen = torch.Generator().manual_seed(0)
    for t in range(64):
        x = torch.randn(1, 1, HIDDEN, generator=gen)
        with torch.no_grad():
            expected, *grown = step(x, torch.tensor([t]), *grown)
        with npu_backend.profile() as prof:
            got = vm["main"](tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(np.array([t])), *caches)
        np.testing.assert_allclose(got[0].numpy(), expected.numpy(), rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
        for cache, ref in zip(caches, grown):
            np.testing.assert_allclose(cache.numpy()[:, :, :t + 1], ref.numpy(), rtol=1e-5, atol=1e-6)
        # no crossing at all: the caches stay on the device, and RoPE's cos and sin of the position
        # are rows of tables looked up by it on the NPU (frontend/position_tables.py)
        assert prof.crossings == 0 and prof.host_calls == [], [call.name for call in prof.host_calls]
    static = relax.VirtualMachine(npu_backend.compile(from_exported_program(torch.export.export(
        step, (x, torch.tensor([t]), *[g[:, :, :t] for g in grown]))), "cgra-8x8"), tvm.cpu())
    with npu_backend.profile() as fixed:
        static["main"](tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(np.array([t])),
                       *[tvm.runtime.tensor(g[:, :, :t].numpy()) for g in grown])
    ours = prof.total_cycles + prof.host_cycles
    assert ours <= 1.10 * (fixed.total_cycles + fixed.host_cycles), (ours, fixed.total_cycles, fixed.host_cycles)
