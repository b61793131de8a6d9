"""End to end: tvm.compile(target=...) -> VM -> C++ runtime -> simulator, against numpy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st

import npu_backend
from models import assert_matches, conv2d_model, matmul_model, relax_module, run

PRESETS = npu_backend.preset_names()


@pytest.mark.parametrize("arch", PRESETS)
@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_matmul_bias_relu(arch, dtype):
    mod, inputs, ref = matmul_model(100, 50, 70, dtype)  # no extent is a multiple of a tile
    ex = tvm.compile(mod, target=arch)
    with npu_backend.profile() as prof:
        out = run(ex, inputs)
    assert_matches(out, ref, dtype)
    assert len(prof.kernels) == 1 and prof.kernels[0].source_ops == ("matmul", "add", "nn.relu")
    (kernel,) = prof.kernels
    assert kernel.cycles > 0 and kernel.macs == 100 * 50 * 70 <= kernel.padded_macs  # the model's, then the array's


@pytest.mark.parametrize("arch", PRESETS)
@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_conv2d_bias_relu(arch, dtype):
    mod, inputs, ref = conv2d_model(1, 3, 30, 30, 8, 3, 3, (2, 2), (1, 1, 1, 1), dtype)
    ex = tvm.compile(mod, target=arch)
    with npu_backend.profile() as prof:
        out = run(ex, inputs)
    assert_matches(out, ref, dtype)
    assert [k.source_ops for k in prof.kernels] == [("nn.conv2d", "add", "nn.relu")]


def test_the_profile_counts_the_models_macs_and_the_padded_ones_apart():
    """A 1x512 -> 1001 dense layer has 512,512 MACs on every chip; the PE array executes a
    padded multiple of them (its last column tile; a tile's rows past the model's run no GEMM
    since lower/padded_rows.py, so 1000 columns, a multiple of 4 and 8, padded only on cgra-16x16),
    and the utilisation is counted from the model's."""
    mod, inputs, _ = matmul_model(1, 1001, 512, bias=False, relu=False)
    seen = {}
    for arch in PRESETS:
        with npu_backend.profile() as prof:
            run(npu_backend.compile(mod, arch), inputs)
        (kernel,) = prof.kernels
        hw = npu_backend.load_arch(arch)
        peak = kernel.cycles * hw.num_pes * hw.macs_per_pe["float32"]
        assert kernel.utilisation == pytest.approx(kernel.macs / peak)
        assert kernel.array_utilisation == pytest.approx(kernel.padded_macs / peak)
        assert prof.to_dict()["total_padded_macs"] == kernel.padded_macs > kernel.macs
        seen[arch] = kernel.macs
    assert set(seen.values()) == {512_512}


@pytest.mark.parametrize("level", [1, 2, 3])
def test_the_host_codes_optimisation_changes_no_command(level):
    """LLVM's optimisation level of the host code (0 by default, the fastest build) records the
    same command streams, so the same cycles and results."""
    mod, inputs, ref = conv2d_model(2, 5, 13, 11, 7, 3, 3, (2, 1), (1, 0, 1, 2), "int8")
    streams = []
    for opt in (0, level):
        with npu_backend.profile(keep_timelines=True) as prof:
            out = run(npu_backend.compile(mod, "cgra-4x4", host_opt_level=opt), inputs)
        assert_matches(out, ref, "int8")
        streams.append([t.commands.tolist() for t in prof.timelines])
    assert streams[0] == streams[1] and streams[0]
    with pytest.raises(ValueError, match="host_opt_level must be 0, 1, 2 or 3"):
        npu_backend.compile(mod, host_opt_level=4)


def test_a_registered_chip_is_a_target_of_tvm_compile(tmp_path):
    """A user's chip from a JSON file, registered as a tag, compiles with tvm.compile exactly as
    npu_backend.compile(arch=file) compiles it; the presets keep their names."""
    arch = json.loads(npu_backend.load_arch("cgra-8x8").to_json())
    arch.update(name="wide-dma", dma_bytes_per_cycle=64)
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(arch))
    assert npu_backend.register_arch(str(path)) == "wide-dma"
    mod, inputs, ref = matmul_model(64, 48, 300)
    cycles = {}
    for how, build in (("tag", lambda: tvm.compile(mod, target="wide-dma")),
                       ("file", lambda: npu_backend.compile(mod, str(path))),
                       ("preset", lambda: tvm.compile(mod, target="cgra-8x8"))):
        with npu_backend.profile() as prof:
            assert_matches(run(build(), inputs), ref, "float32")
        cycles[how] = (prof.kernels[0].arch, prof.total_cycles)
    assert cycles["tag"] == cycles["file"] and cycles["tag"][0] == "wide-dma"
    assert cycles["preset"][0] == "cgra-8x8" and cycles["preset"][1] > cycles["tag"][1]  # a quarter of the DMA bandwidth
    assert npu_backend.register_arch("cgra-4x4") == "cgra-4x4"
    arch.update(name="cgra-4x4")
    path.write_text(json.dumps(arch))
    with pytest.raises(ValueError, match="has the name of a preset but other parameters"):
        npu_backend.register_arch(str(path))


def test_default_target_is_cgra_8x8():
    mod, inputs, ref = matmul_model(20, 12, 9)
    with npu_backend.profile() as prof:
        out = run(tvm.compile(mod, target="cgra"), inputs)
    assert_matches(out, ref, "float32")
    assert prof.kernels and prof.kernels[0].arch == "cgra-8x8"


def test_profile_reports_each_launch_and_the_host_seconds_of_each_step():
    from cgra_sim.simulate import STEPS

    mod, inputs, ref = matmul_model(20, 12, 9)
    ex = tvm.compile(mod, target="cgra")
    heard = []
    with npu_backend.profile(on_launch=heard.append) as prof:
        run(ex, inputs)
        run(ex, inputs)
    assert heard == prof.kernels and len(heard) == 2
    assert set(prof.host_seconds) == set(STEPS) | {"device"}
    assert all(seconds >= 0 for seconds in prof.host_seconds.values())
    assert sum(prof.host_seconds[step] for step in STEPS) > 0


def test_llvm_target_is_untouched():
    mod, inputs, ref = matmul_model(20, 12, 9)
    with npu_backend.profile() as prof:
        out = run(tvm.compile(mod, target="llvm"), inputs)
    assert_matches(out, ref, "float32")
    assert prof.kernels == []  # nothing ran on the NPU


def test_linear_form_from_pytorch():
    mod, inputs, ref = matmul_model(33, 17, 5, "float32", transposed=True)
    with npu_backend.profile() as prof:
        out = run(tvm.compile(mod, target="cgra"), inputs)
    assert_matches(out, ref, "float32")
    assert prof.kernels[0].source_ops == ("permute_dims", "matmul", "add", "nn.relu")


def test_softmax_runs_on_the_npu_after_the_fused_matmul():
    mod, inputs, ref = matmul_model(16, 10, 8, softmax=True)
    with npu_backend.profile() as prof:
        out = run(tvm.compile(mod, target="cgra"), inputs)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    assert [k.source_ops for k in prof.kernels] == [("matmul", "add", "nn.relu"), ("nn.softmax",)]


def test_cycles_repeat_across_runs():
    mod, inputs, _ = matmul_model(40, 24, 30, "int8")
    ex = tvm.compile(mod, target="cgra")
    with npu_backend.profile() as prof:
        run(ex, inputs)  # warm-up
        run(ex, inputs)
    assert len(prof.kernels) == 2 and prof.kernels[0].cycles == prof.kernels[1].cycles


@pytest.mark.parametrize("bad", ["dtype", "shape"])
def test_wrong_input_names_the_argument(bad):
    mod, inputs, _ = matmul_model(16, 10, 8)
    ex = tvm.compile(mod, target="cgra")
    if bad == "dtype":
        inputs[1] = inputs[1].astype("float64")
    else:
        inputs[1] = np.zeros((9, 10), "float32")
    with pytest.raises(Exception, match=r"\bw\b"):
        run(ex, inputs)


@given(m=st.integers(1, 300), n=st.integers(1, 300), k=st.integers(1, 300),
       dtype=st.sampled_from(["float32", "int8"]), arch=st.sampled_from(PRESETS),
       bias=st.booleans(), relu=st.booleans())
def test_matmul_lowering_property(m, n, k, dtype, arch, bias, relu):
    mod, inputs, ref = matmul_model(m, n, k, dtype, bias=bias, relu=relu)
    out = run(npu_backend.compile(mod, arch), inputs)
    assert_matches(out, ref, dtype)


@given(batch=st.integers(1, 2), channels=st.integers(1, 20), size=st.integers(5, 20),
       filters=st.integers(1, 20), kernel=st.integers(1, 3), stride=st.integers(1, 2),
       pad=st.integers(0, 2), dilation=st.integers(1, 2), dtype=st.sampled_from(["float32", "int8"]),
       arch=st.sampled_from(PRESETS))
def test_conv2d_lowering_property(batch, channels, size, filters, kernel, stride, pad, dilation, dtype, arch):
    mod, inputs, ref = conv2d_model(batch, channels, size, size + 1, filters, kernel, kernel,
                                    (stride, stride), (pad, pad, pad, pad), dtype, dilation=(dilation, dilation))
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    assert_matches(out, ref, dtype)
    assert prof.total_macs == ref.size * channels * kernel * kernel <= prof.total_padded_macs


@given(batch=st.integers(1, 2), groups=st.integers(2, 6), per_group=st.integers(1, 3),
       multiplier=st.integers(1, 3), size=st.integers(3, 12), kernel=st.integers(1, 3),
       stride=st.integers(1, 2), pad=st.integers(0, 1), dtype=st.sampled_from(["float32", "int8"]),
       arch=st.sampled_from(PRESETS))
def test_grouped_conv2d_lowering_property(batch, groups, per_group, multiplier, size, kernel, stride,
                                          pad, dtype, arch):
    """Grouped and depthwise (per_group == 1) conv2d: each group reads only its own channels."""
    channels, filters = groups * per_group, groups * per_group * multiplier
    mod, inputs, ref = conv2d_model(batch, channels, size + kernel, size + 1, filters, kernel, kernel,
                                    (stride, stride), (pad, 0, pad, 1), dtype, groups=groups)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    assert_matches(out, ref, dtype)
    assert len(prof.kernels) == 1  # on the NPU, not the host

@given(batch=st.integers(1, 2), channels=st.integers(2, 40), height=st.integers(1, 14),
       width=st.integers(1, 14), kh=st.integers(1, 5), kw=st.integers(1, 5), stride=st.integers(1, 2),
       dilation=st.integers(1, 2), pads=st.tuples(*[st.integers(0, 2)] * 4), bias=st.booleans(),
       relu=st.booleans(), dtype=st.sampled_from(["float32", "int8"]), arch=st.sampled_from(PRESETS),
       layouts=st.sampled_from([("NCHW", "OIHW", "NCHW"), ("NHWC", "HWIO", "NHWC"), ("NHWC", "OHWI", "NCHW")]))
def test_depthwise_conv2d_lowering_property(batch, channels, height, width, kh, kw, stride, dilation, pads,
                                            bias, relu, dtype, arch, layouts):
    """Depthwise conv2d (groups == C == F), in any layout, runs as DEPTHWISE commands over input
    windows."""
    height, width = height + dilation * (kh - 1), width + dilation * (kw - 1)  # at least one output
    mod, inputs, ref = conv2d_model(batch, channels, height, width, channels, kh, kw, (stride, stride), pads,
                                    dtype, bias=bias, relu=relu, dilation=(dilation, dilation), groups=channels,
                                    layouts=layouts)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    assert_matches(out, ref, dtype)
    (kernel,) = prof.kernels
    assert kernel.op_counts["DEPTHWISE"] >= 1 and kernel.op_counts["GEMM"] == 0
    assert kernel.macs == ref.size * kh * kw <= kernel.padded_macs  # every output's taps, on the PE array


def test_scratchpad_too_small_keeps_the_op_on_the_host(tmp_path):
    chip = npu_backend.load_arch("cgra-4x4").to_dict()
    chip.update(name="tiny-spad", spad_bytes=256, spad_banks=4, bank_width_bytes=8)
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(chip))
    mod, inputs, ref = matmul_model(64, 64, 64)
    placement = npu_backend.explain(mod, str(path))[0]
    assert placement.where == "host" and "scratchpad" in placement.reason
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, str(path)), inputs)
    assert_matches(out, ref, "float32")
    # The matmul stays on the host; its bias add and relu, standalone now, fit as ELTWISE and
    # EPILOGUE tiles.
    assert [k.source_ops for k in prof.kernels] == [("add",), ("nn.relu",)]


def test_damaged_library_is_refused_on_load(tmp_path):
    mod, _, _ = matmul_model(8, 8, 8)
    library = tmp_path / "model.so"
    tvm.compile(mod, target="cgra").export_library(str(library))
    data = library.read_bytes()
    library.write_bytes(data[: len(data) // 2])  # truncated: a half-copied artifact
    with pytest.raises(npu_backend.DamagedArtifact, match="truncated"):
        tvm.runtime.load_module(str(library))


def test_a_library_with_any_flipped_bit_is_refused_before_it_is_loaded(tmp_path):
    # Single bit flips used to crash the loader with SIGSEGV in 3 of 8 tries (issue 12, item 5):
    # export_library seals the file with its SHA-256, and loading checks it before dlopen.
    mod, inputs, ref = matmul_model(8, 8, 8)
    library = tmp_path / "model.so"
    tvm.compile(mod, target="cgra").export_library(str(library))
    data = library.read_bytes()
    vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())  # sealed, still loads
    assert_matches(vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy(), ref, "float32")
    rng = np.random.default_rng(0)
    positions = list(rng.integers(0, len(data), 24)) + [len(data) - 40, len(data) - 1]  # the seal too
    for position in positions:
        damaged = bytearray(data)
        damaged[position] ^= 1 << int(rng.integers(0, 8))
        flipped = tmp_path / f"flipped_{position}.so"
        flipped.write_bytes(bytes(damaged))
        with pytest.raises(npu_backend.DamagedArtifact, match="digest"):
            tvm.runtime.load_module(str(flipped))


def test_a_library_run_without_the_runtime_raises_instead_of_killing_the_process(tmp_path):
    # The kernels' runtime functions are weak symbols: without `import npu_backend` they are NULL
    # and the kernel raises; the dynamic loader used to kill the process (rc 127, issue 12 item 5).
    import subprocess
    import sys

    mod, _, _ = matmul_model(8, 8, 8)
    library = tmp_path / "model.so"
    tvm.compile(mod, target="cgra").export_library(str(library))
    script = (
        "import numpy as np, tvm\n"
        "from tvm import relax\n"
        f"vm = relax.VirtualMachine(tvm.runtime.load_module({str(library)!r}), tvm.cpu())\n"
        "args = [tvm.runtime.tensor(np.ones(s, 'float32')) for s in ((8, 8), (8, 8), (8,))]\n"
        "try:\n"
        "    vm['main'](*args)\n"
        "except Exception as err:\n"
        "    print(err)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "needs the CGRA runtime, which is not loaded: `import npu_backend`" in done.stdout


@pytest.mark.parametrize("relu", [False, True])
def test_bias_added_first_is_fused(relu):
    """PyTorch's Linear imports as add(bias, matmul): the operands of add come in either order."""
    from tvm import relax

    def body(bb, x, w, b):
        y = bb.emit(relax.op.add(b, relax.op.matmul(x, w)))
        return bb.emit(relax.op.nn.relu(y)) if relu else y
    mod = relax_module([("x", (5, 16), "float32"), ("w", (16, 8), "float32"), ("b", (8,), "float32")], body)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype("float32") for s in ((5, 16), (16, 8), (8,))]
    ref = inputs[0] @ inputs[1] + inputs[2]
    ref = np.maximum(ref, 0) if relu else ref
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-4x4"), inputs)
    assert_matches(out, ref, "float32")
    assert len(prof.kernels) == 1


def test_fused_kernels_report_the_models_macs_exactly():
    """A depthwise conv2d fused with the 1x1 conv2d after it does C (9 + F) / F MACs per output
    element: a fraction, which the runtime ABI carried as an integer (v6) and so dropped up to an
    output's worth of MACs per kernel (PyTorch's MobileNetV2: 1,280 of 24.5 M). ABI v7 gives the
    fraction's divisor."""
    from tvm.relax.frontend.onnx import from_onnx

    from onnx_models import _Graph

    g = _Graph(0)
    x = g.conv_bn("input", 10, 10, groups=10, act="relu6")
    x = g.conv_bn(x, 10, 7, kernel=1, act=None)  # 10 (9 + 7) / 7 MACs per output element
    mod = from_onnx(g.model("separable", [1, 10, 12, 12], x, [1, 7, 12, 12]), keep_params_in_input=False)
    placements = npu_backend.explain(mod, "cgra-8x8")
    vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    with npu_backend.profile() as prof:
        vm["main"](tvm.runtime.tensor(np.zeros((1, 10, 12, 12), "float32")))
    assert [list(k.source_ops).count("nn.conv2d") for k in prof.kernels] == [2]  # one fused kernel
    assert prof.total_macs == sum(p.macs for p in placements if p.where == "npu") == 144 * 10 * (9 + 7)
