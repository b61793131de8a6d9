"""The arguments of `cgra-sim verify` (npu_backend/tools/verify.py runs it).

Stage: tools (command line). Here, apart from the command, so that `cgra-sim --help` builds its
parser without importing the compiler.
"""

from __future__ import annotations

from .arguments import add_observation_arguments, ints

#: --op -> what --shape lists.
SHAPES = {"matmul": "M,N,K", "batch_matmul": "B,M,N,K", "conv2d": "N,C,H,W,F,KH,KW", "pool": "N,C,H,W",
          "eltwise": "D0[,D1[,D2[,D3]]]"}
ELTWISE_FUNCS = ("add", "subtract", "multiply", "maximum", "minimum")


def add_verify_arguments(verify) -> None:
    verify.add_argument("--op", choices=list(SHAPES), required=True)
    verify.add_argument("--shape", type=ints, required=True,
                        help="matmul: M,N,K (x[M,K] @ w[K,N]); batch_matmul: B,M,N,K (x[B,M,K] @ w[B,K,N]); "
                             "conv2d: N,C,H,W,F,KH,KW; pool: N,C,H,W; eltwise: the left operand's shape "
                             "(in NCHW / OIHW order whatever --layout)")
    verify.add_argument("--dtype", choices=["float32", "int8", "int32", "bfloat16", "float16", "int16"],
                        default="float32",
                        help="input dtype; int8 matmul / conv2d accumulate and output int32; int16: int16 "
                             "activations times int8 weights (16x8), accumulated and output in int64, matmul "
                             "and conv2d; bfloat16, float16: "
                             "matmul and conv2d, summed in float32 and stored rounded to nearest "
                             "even, checked within half_floats.error_bound; int32: eltwise only (default float32)")
    verify.add_argument("--weight-dtype", choices=["int4"], default=None,
                        help="matmul: 4-bit weights as onnxruntime's MatMulNBits stores them (two per byte in "
                             "DRAM, a float32 scale and a 4-bit zero point per --block-size rows), unpacked on "
                             "the NPU; float32 activations, no bias or relu; with --dtype int8 signed int4 weights (a QDQ "
                             "model's, zero point 0) packed likewise, an int32 bias and a per-channel requantisation "
                             "to int8, checked exactly. conv2d (NCHW, groups 1): the same two, the weights of a "
                             "channel packed in (KH, KW, C) order, a GEMM a kernel tap (default: weights of --dtype)")
    verify.add_argument("--block-size", type=int, default=32,
                        help="--weight-dtype int4, float32: rows per scale (conv2d: of a channel's KH*KW*C "
                             "reduction, 0 for one scale a channel; default 32)")
    verify.add_argument("--arch", default="cgra-8x8", help="preset name or JSON file (default cgra-8x8)")
    verify.add_argument("--seed", type=int, default=None, help="seed of the random inputs (default: from the shape)")
    verify.add_argument("--layout", default="NCHW",
                        help="conv2d: DATA[,KERNEL] layouts, e.g. NHWC or NHWC,OHWI; the output takes the data's "
                             "(default NCHW, with OIHW weights; NHWC data: HWIO). pool: the data layout")
    verify.add_argument("--stride", type=ints, default=(1,), help="conv2d, pool: S or SH,SW (default 1)")
    verify.add_argument("--padding", type=ints, default=(0,),
                        help="conv2d, pool: P, PH,PW or top,left,bottom,right (default 0)")
    verify.add_argument("--dilation", type=ints, default=(1,), help="conv2d, max pool: D or DH,DW (default 1)")
    verify.add_argument("--groups", type=int, default=1, help="conv2d: channel groups (C and F divisible; default 1)")
    verify.add_argument("--window", type=ints, help="pool: KH,KW (required for --op pool)")
    verify.add_argument("--pool", choices=["max", "avg"], default="max", help="pool: the kind (default max)")
    verify.add_argument("--ceil-mode", action="store_true", help="pool: output size rounded up")
    verify.add_argument("--count-include-pad", action="store_true", help="avg pool: divide by the padded window")
    verify.add_argument("--func", choices=ELTWISE_FUNCS, default="add", help="eltwise: the function (default add)")
    verify.add_argument("--rhs-shape", type=ints, help="eltwise: the right operand's shape, broadcast numpy's way "
                                                       "(default: --shape)")
    verify.add_argument("--shared-weights", action="store_true",
                        help="batch_matmul: one w[K,N] for the whole batch (folds into one GEMM)")
    verify.add_argument("--no-bias", action="store_true", help="matmul, conv2d: leave out the bias add")
    verify.add_argument("--no-relu", action="store_true", help="matmul, conv2d: leave out the relu")
    verify.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_observation_arguments(verify)
