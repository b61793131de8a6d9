"""`cgra-sim verify`: one kernel compiled for the NPU, simulated, and checked against numpy.

Stage: tools (command line). The kernel is one operator (matmul, batched matmul, conv2d, pooling
or an elementwise op) on random inputs (`--seed`); its arguments are checked before anything is
compiled, so a malformed shape, stride or padding is a usage error naming the argument (exit 2).
If the compiler keeps the operator on the host (a chip that cannot hold its tiles, a dtype it
does not compute), verify fails with exit 3 and the reason `explain` gives: a PASS always means
the NPU computed the result. int8 and integer results must match exactly, float32 within 1e-5
of the output's scale, bfloat16 and float16 (matmul, conv2d) within `half_floats.error_bound` of
numpy's model of the NPU (float32 sums, rounded to nearest even on store): one ulp of the format
at each result plus twice float32's summation error over its terms. `--weight-dtype int4` runs a
matmul with 4-bit weights (MatMulNBits: packed in DRAM, unpacked by UNPACK4 in the scratchpad)
against numpy; with `--dtype int8` signed int4 weights (QDQ's) unpacked to int8, an int32 bias and a
per-channel requantisation, exactly; `--op conv2d --weight-dtype int4` the same two for a conv2d
(verify_int4.py, kernels/gemm/int4_conv.py).
"""

from __future__ import annotations

import dataclasses
import json

from cgra_cli.arguments import EXIT_MISMATCH, EXIT_NOT_OFFLOADED, EXIT_OK, UsageError, observe, publish
from cgra_cli.verify_arguments import SHAPES

HALF_FLOATS = ("bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class Case:
    """The one-operator model verify compiles, with its inputs and numpy's result."""

    mod: object
    inputs: list
    ref: object
    macs: int  # the operator's own multiply-accumulates (0 for pooling and elementwise ops)
    relax_op: str  # the operator as explain names it ("nn.conv2d")
    exact: bool  # integer results must match exactly
    bound: object = None  # 16-bit float outputs: per element, how far from `ref` they may be


def run_verify(args) -> int:
    import npu_backend
    from .workloads import half_mismatch, mismatch, run

    arch = npu_backend.load_arch(args.arch)
    case = build_case(args, arch)
    report = {"op": args.op, "shape": list(args.shape), "dtype": args.dtype, "arch": arch.name, "macs": case.macs}
    refused = [p for p in npu_backend.explain(case.mod, arch) if p.op == case.relax_op and p.where == "host"]
    if refused:
        return _not_offloaded(args, report, refused[0].reason)
    with observe(args) as prof:
        out = run(npu_backend.compile(case.mod, arch), case.inputs)
    if not prof.kernels:
        return _not_offloaded(args, report, "no kernel ran on the NPU")
    problem = half_mismatch(out, case.ref, case.bound) if case.bound is not None else \
        mismatch(out, case.ref, "int8" if case.exact else "float32")
    bound = -(-case.macs // arch.peak_macs_per_cycle(args.dtype)) if case.macs else 0
    report.update(result="PASS" if problem is None else "FAIL", cycles=prof.total_cycles, mac_bound_cycles=bound,
                  mismatch=problem, kernels=[k.to_dict() for k in prof.kernels])
    written = publish(args, prof, report)
    if args.json:
        print(json.dumps(report))
    else:
        peak = f" (MAC bound {bound}, {bound / max(1, prof.total_cycles):.1%} of peak)" if bound else ""
        print(f"{report['result']} {_title(args)} on {arch.name}: {prof.total_cycles} cycles{peak}")
        if problem:
            print(f"  mismatch: {problem}")
        print("\n".join(f"  {line}" for line in written), end="\n" if written else "")
    return EXIT_OK if problem is None else EXIT_MISMATCH


def _title(args) -> str:
    weights = ""
    if getattr(args, "weight_dtype", None) == "int4":
        weights = " x int4 weights" + ("" if args.dtype == "int8" else f" (block {args.block_size})")
    return f"{args.op} {'x'.join(str(d) for d in args.shape)} {args.dtype}{weights}"


def _not_offloaded(args, report: dict, reason: str) -> int:
    report.update(result="NOT OFFLOADED", reason=reason, cycles=0, kernels=[])
    if args.json:
        print(json.dumps(report))
    else:
        print(f"FAIL {_title(args)} on {report['arch']}: not run on the NPU: {reason}")
    return EXIT_NOT_OFFLOADED


def build_case(args, arch) -> Case:
    """The model of --op with its inputs and reference; UsageError for malformed arguments."""
    if len(args.shape) != len(SHAPES[args.op].split(",")) and args.op != "eltwise":
        raise UsageError(f"--shape must be {SHAPES[args.op]}")
    if any(d < 1 for d in args.shape):
        raise UsageError(f"--shape {_text(args.shape)}: every dimension must be at least 1")
    if args.dtype == "int32" and args.op != "eltwise":
        raise UsageError("--dtype int32 is for --op eltwise; int8 matmul and conv2d already produce int32")
    if args.dtype in HALF_FLOATS + ("int16",) and args.op not in ("matmul", "conv2d"):
        raise UsageError(f"--dtype {args.dtype} is for --op matmul and conv2d (the vector unit computes "
                         "float32, int32 and int8)")
    if getattr(args, "weight_dtype", None) == "int4" and args.op not in ("matmul", "conv2d"):
        raise UsageError(f"--weight-dtype int4 is for --op matmul and conv2d, not --op {args.op}")
    if args.op in ("matmul", "batch_matmul", "conv2d") and args.dtype not in arch.dtypes:
        raise UsageError(f"--dtype {args.dtype}: architecture '{arch.name}' computes {', '.join(arch.dtypes)} "
                         "(its macs_per_pe); pick one of those or describe a chip that computes it")
    return _BUILDERS[args.op](args)


def _text(values) -> str:
    return ",".join(str(v) for v in values)


def _pair(values, name: str, minimum: int) -> tuple[int, int]:
    """One value or two (vertical, horizontal), each at least `minimum`."""
    if len(values) not in (1, 2) or min(values) < minimum:
        raise UsageError(f"--{name} {_text(values)}: give one value or two (vertical,horizontal), "
                         f"each at least {minimum}")
    return (values[0], values[-1])


def _padding(values) -> tuple[int, int, int, int]:
    """One value, two (vertical, horizontal) or four (top, left, bottom, right), none negative."""
    if len(values) not in (1, 2, 4) or min(values) < 0:
        raise UsageError(f"--padding {_text(values)}: give P, PH,PW or top,left,bottom,right, none negative")
    return tuple(values * 4) if len(values) == 1 else tuple(values * 2) if len(values) == 2 else tuple(values)


def _window_fits(h: int, w: int, kernel, stride, pad, dilation) -> None:
    for extent, k, s, lo, hi, d, axis in zip((h, w), kernel, stride, pad[:2], pad[2:], dilation, ("H", "W")):
        if extent + lo + hi - d * (k - 1) - 1 < 0:
            raise UsageError(f"a window of {k} (dilation {d}) does not fit {axis} = {extent} with padding "
                             f"{lo}+{hi}: there is no output position; use a smaller window or more padding")


def _matmul(args) -> Case:
    from .workloads import matmul_model

    m, n, k = args.shape
    if getattr(args, "weight_dtype", None) == "int4":
        return _matmul_int4(args, m, n, k)
    mod, inputs, ref = matmul_model(m, n, k, args.dtype, bias=not args.no_bias, relu=not args.no_relu, seed=args.seed)
    return Case(mod, inputs, ref, m * n * k, "matmul", args.dtype in ("int8", "int16"),
                _half_bound(args, ref, inputs, k, "matmul", {}))


def _half_bound(args, ref, inputs, depth: int, op: str, conv: dict):
    """A 16-bit float case's per-element bound (half_floats.error_bound), else None."""
    if args.dtype not in HALF_FLOATS:
        return None
    from cgra_sim.half_floats import error_bound

    from .workloads import gemm_terms

    terms = gemm_terms(inputs, op, bias=not args.no_bias, residual=False, **conv)
    return error_bound(ref.astype("float32"), terms, depth + (not args.no_bias), args.dtype)


def _matmul_int4(args, m: int, n: int, k: int) -> Case:
    """x @ W with W 4-bit (onnxruntime's MatMulNBits: packed nibbles, a float32 scale and a zero
    point per --block-size rows of a column), against numpy's float32 x @ (q - z) * s."""
    import numpy as np

    from ..frontend.matmul_nbits import layer_module

    block = args.block_size
    if args.dtype == "int8":
        return _matmul_int8_int4(args, m, n, k)
    if args.dtype != "float32" or block < 16 or block & (block - 1):
        raise UsageError(f"--weight-dtype int4 takes --dtype int8, or float32 activations and a --block-size that is a power "
                         f"of 2 >= 16 (got {args.dtype}, {block})")
    rng = np.random.default_rng(m * 1000003 + n * 1009 + k if args.seed is None else args.seed)
    groups = -(-k // block)
    q = rng.integers(0, 16, (n, groups * block), dtype=np.uint8)
    z = rng.integers(0, 16, (n, groups + groups % 2), dtype=np.uint8)
    s = (rng.standard_normal((n, groups)) * 0.05).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    packed, zeros = (q[:, 0::2] | q[:, 1::2] << 4), (z[:, 0::2] | z[:, 1::2] << 4)
    rows = np.arange(k) // block
    w = ((q[:, :k].astype(np.int32) - z[:, rows]).astype(np.float32) * s[:, rows]).T
    return Case(layer_module(m, k, block, packed, s, zeros), [x], x @ w, m * n * k, "call_tir matmul_int4", False)


def _matmul_int8_int4(args, m: int, n: int, k: int) -> Case:
    """int8 x @ W with W signed int4 (a QDQ layer's: packed two per byte, zero point 0), an int32
    bias and a per-channel requantisation to int8, against numpy's integer sum and
    rne(clamp(float32(acc) * M)) + zp (the EPILOGUE's and onnxruntime's QLinearMatMul order)."""
    import numpy as np

    from cgra_sim.unpack4 import pack_signed

    from ..normalise.qdq_int4 import QInt4Layer, host_prim_func

    rng = np.random.default_rng(m * 1000003 + n * 1009 + k if args.seed is None else args.seed)
    w = rng.integers(-8, 8, (k, n))
    x = rng.integers(-128, 128, (m, k)).astype(np.int8)
    bias = rng.integers(-2000, 2000, n).astype(np.int32) if not args.no_bias else np.zeros(n, np.int32)
    scale = (rng.uniform(0.5, 2.0, n) / (8 * np.sqrt(k) * 16)).astype(np.float32)
    zp = int(rng.integers(-20, 20))
    acc = x.astype(np.int64) @ w + bias
    ref = (np.rint(np.clip(acc.astype(np.float32) * scale, -128 - zp, 127 - zp)) + zp).astype(np.int8)
    return Case(_int4_module(host_prim_func(QInt4Layer(m, k, n, zp)), x, [pack_signed(w), bias, scale], (m, n)),
                [x], ref, m * n * k, "call_tir matmul_int8_int4", True)


def _int4_module(func, x, consts: list, out_shape) -> "tvm.IRModule":
    """main(x) = call_tir(func, [x, *consts]) with an int8 result of `out_shape`."""
    from tvm import relax

    bb = relax.BlockBuilder()
    var = relax.Var("x", relax.TensorType(x.shape, "int8"))
    with bb.function("main", [var]):
        with bb.dataflow():
            gvar = bb.add_func(func.with_attr("global_symbol", "int4_layer"), "int4_layer")
            out = bb.emit_output(relax.call_tir(gvar, [var] + [relax.const(c) for c in consts],
                                                relax.TensorType(out_shape, "int8")))
        bb.emit_func_output(out)
    return bb.get()


def _batch_matmul(args) -> Case:
    from .workloads import batch_matmul_model

    b, m, n, k = args.shape
    rhs = (k, n) if args.shared_weights else (b, k, n)
    mod, inputs, ref = batch_matmul_model((b, m, k), rhs, args.dtype, bias=not args.no_bias, relu=not args.no_relu,
                                          seed=args.seed)
    return Case(mod, inputs, ref, b * m * n * k, "matmul", args.dtype in ("int8", "int16"))


def _conv2d(args) -> Case:
    from .workloads import conv2d_model

    n, c, h, w, f, kh, kw = args.shape
    stride, dilation = _pair(args.stride, "stride", 1), _pair(args.dilation, "dilation", 1)
    pad = _padding(args.padding)
    if args.groups < 1 or c % args.groups or f % args.groups:
        raise UsageError(f"--groups {args.groups}: the input channels C={c} and the output channels F={f} must "
                         "both be multiples of it")
    _window_fits(h, w, (kh, kw), stride, pad, dilation)
    if getattr(args, "weight_dtype", None) == "int4":
        from .verify_int4 import conv2d_int4_case

        return conv2d_int4_case(args, (n, c, h, w, f, kh, kw), stride, pad, dilation, Case)
    mod, inputs, ref = conv2d_model(n, c, h, w, f, kh, kw, stride=stride, pad=pad, dtype=args.dtype,
                                    bias=not args.no_bias, relu=not args.no_relu, dilation=dilation,
                                    groups=args.groups, layouts=_conv2d_layouts(args.layout), seed=args.seed)
    layouts = _conv2d_layouts(args.layout)
    conv = dict(stride=stride, pad=pad, dilation=dilation, groups=args.groups)
    if args.dtype in HALF_FLOATS and layouts != ("NCHW", "OIHW", "NCHW"):
        raise UsageError(f"--dtype {args.dtype} conv2d: verify's bound is computed for --layout NCHW")
    return Case(mod, inputs, ref, int(ref.size) * (c // args.groups) * kh * kw, "nn.conv2d", args.dtype in ("int8", "int16"),
                _half_bound(args, ref, inputs, (c // args.groups) * kh * kw, "conv2d", conv))


def _conv2d_layouts(text: str) -> tuple[str, str, str]:
    """--layout DATA[,KERNEL] -> (data, kernel, out) layouts; the output takes the data's."""
    data, _, kernel = text.upper().partition(",")
    kernel = kernel or ("OIHW" if data == "NCHW" else "HWIO")
    if sorted(data) != sorted("NCHW") or sorted(kernel) != sorted("OIHW"):
        raise UsageError(f"--layout {text}: expected an order of NCHW, then optionally one of OIHW "
                         "(e.g. NHWC or NHWC,OHWI)")
    return data, kernel, data


def _pool(args) -> Case:
    from .workloads import pool_model

    if args.window is None:
        raise UsageError("--op pool needs --window KH,KW")
    window = _pair(args.window, "window", 1)
    stride, dilation = _pair(args.stride, "stride", 1), _pair(args.dilation, "dilation", 1)
    pad = _padding(args.padding)
    layout = args.layout.upper()
    if sorted(layout) != sorted("NCHW"):
        raise UsageError(f"--layout {args.layout}: a pool takes an order of NCHW (e.g. NCHW or NHWC)")
    if args.dtype not in (("float32", "int8") if args.pool == "max" else ("float32",)):
        raise UsageError(f"--dtype {args.dtype}: a {args.pool} pool takes "
                         f"{'float32 or int8' if args.pool == 'max' else 'float32'}")
    n, c, h, w = args.shape
    _window_fits(h, w, window, stride, pad, dilation)
    mod, inputs, ref = pool_model(args.pool, n, c, h, w, window, stride, pad, dilation, ceil_mode=args.ceil_mode,
                                  count_include_pad=args.count_include_pad, dtype=args.dtype, layout=layout,
                                  seed=args.seed)
    return Case(mod, inputs, ref, 0, f"nn.{args.pool}_pool2d", args.dtype == "int8")


def _eltwise(args) -> Case:
    from .workloads import eltwise_model

    rhs = args.rhs_shape or args.shape
    for name, shape in (("--shape", args.shape), ("--rhs-shape", rhs)):
        if not 1 <= len(shape) <= 4 or min(shape) < 1:
            raise UsageError(f"{name} {_text(shape)}: an elementwise operand has rank 1 to 4, every dimension "
                             "at least 1")
    rank = max(len(args.shape), len(rhs))
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in (args.shape, rhs)]
    if any(a != b and 1 not in (a, b) for a, b in zip(*padded)):
        raise UsageError(f"--shape {_text(args.shape)} and --rhs-shape {_text(rhs)} do not broadcast "
                         "(numpy's rule: equal, or one of them 1, per trailing dimension)")
    mod, inputs, ref = eltwise_model(args.func, args.shape, rhs, args.dtype, seed=0 if args.seed is None else args.seed)
    return Case(mod, inputs, ref, 0, args.func, args.dtype != "float32")


_BUILDERS = {"matmul": _matmul, "batch_matmul": _batch_matmul, "conv2d": _conv2d, "pool": _pool, "eltwise": _eltwise}
