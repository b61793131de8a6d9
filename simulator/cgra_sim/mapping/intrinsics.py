"""The bodies of the NPU's intrinsics as dataflow graphs: what the fabric must run per element.

Stage: mapping (input). One graph per intrinsic of the ISA (isa.py) and per activation the vector
unit lacks: GEMM's multiply-accumulate (one MAC, and four unrolled as a dot product), the
depthwise convolution's taps, the elementwise ops, the max pool's compare tree, the int8
requantisation, and leaky relu and hard-swish in fixed point. `cgra-sim map --intrinsic NAME`
maps one; `INTRINSICS` is the suite the benchmark and the tests run.
"""

from __future__ import annotations

from .dfg import DataflowGraph, Node, Operand


def _n(name, op, *sources, imm=None, stream=None):
    operands = tuple(s if isinstance(s, Operand) else Operand(s) for s in sources)
    return Node(name, op, operands, imm, stream)


def _loads(prefix: str, count: int) -> list[Node]:
    return [_n(f"{prefix}{i}", "load", stream=f"{prefix}{i}") for i in range(count)]


def _sum_tree(values: list[str], prefix: str, op: str = "add") -> tuple[list[Node], str]:
    nodes, level = [], list(values)
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level) - 1, 2):
            name = f"{prefix}{len(nodes)}"
            nodes.append(_n(name, op, level[i], level[i + 1]))
            nxt.append(name)
        level = nxt + ([level[-1]] if len(level) % 2 else [])
    return nodes, level[0]


def mac(dtype: str = "int32") -> DataflowGraph:
    """GEMM's multiply-accumulate on one PE: acc += a * b."""
    return DataflowGraph("mac", (
        _n("a", "load", stream="a"), _n("b", "load", stream="b"), _n("p", "mul", "a", "b"),
        _n("acc", "add", Operand("acc", 1), "p"), _n("out", "store", "acc", stream="out")), dtype)


def dot(width: int = 4, dtype: str = "int32", name: str = "gemm") -> DataflowGraph:
    """GEMM's inner product unrolled `width` times: acc += sum_i a_i * b_i."""
    nodes = _loads("a", width) + _loads("b", width)
    nodes += [_n(f"p{i}", "mul", f"a{i}", f"b{i}") for i in range(width)]
    tree, total = _sum_tree([f"p{i}" for i in range(width)], "s")
    nodes += tree + [_n("acc", "add", Operand("acc", 1), total), _n("out", "store", "acc", stream="out")]
    return DataflowGraph(name, tuple(nodes), dtype)


def depthwise(taps: int = 3, dtype: str = "int32") -> DataflowGraph:
    """One row of a depthwise window: acc += sum_t x_t * w_t (weights are the channel's, loaded)."""
    return dot(taps, dtype, "depthwise")


def eltwise(op: str, dtype: str = "int32") -> DataflowGraph:
    return DataflowGraph(f"eltwise-{op}", (_n("a", "load", stream="a"), _n("b", "load", stream="b"),
                                           _n("y", op, "a", "b"), _n("out", "store", "y", stream="out")), dtype)


def relu(dtype: str = "int32") -> DataflowGraph:
    return DataflowGraph("relu", (_n("x", "load", stream="x"), _n("y", "max", "x", imm=0),
                                  _n("out", "store", "y", stream="out")), dtype)


def max_pool(window: int = 4, dtype: str = "int32") -> DataflowGraph:
    """A max pool's compare tree over `window` taps."""
    tree, top = _sum_tree([f"x{i}" for i in range(window)], "m", "max")
    return DataflowGraph("maxpool", tuple(_loads("x", window) + tree + [_n("out", "store", top, stream="out")]), dtype)


def requantise(multiplier: int = 1_518_500_250, shift: int = 38, zero_point: int = -3) -> DataflowGraph:
    """int32 accumulator to int8: (acc * M + round) >> s, + zero point, clamped to [-128, 127]
    (in 32-bit wrap-around arithmetic, as the fabric's ALUs compute; the ISA's REQUANTISE uses 64-bit
    products, so this body is the fabric's version, checked against its own numpy meaning)."""
    m = multiplier >> 16  # a 16-bit multiplier keeps the product in 32 bits for |acc| < 2**15
    s = shift - 16
    return DataflowGraph("requantise", (
        _n("acc", "load", stream="acc"), _n("scaled", "mul", "acc", imm=m), _n("rounded", "add", "scaled", imm=1 << (s - 1)),
        _n("shifted", "shr", "rounded", imm=s), _n("zp", "add", "shifted", imm=zero_point),
        _n("low", "max", "zp", imm=-128), _n("high", "min", "low", imm=127), _n("out", "store", "high", stream="out")))


def leaky_relu(alpha_q8: int = 26) -> DataflowGraph:
    """max(x, alpha x) with alpha in Q8 fixed point (26/256 ~ 0.1)."""
    return DataflowGraph("leaky-relu", (
        _n("x", "load", stream="x"), _n("ax", "mul", "x", imm=alpha_q8), _n("scaled", "shr", "ax", imm=8),
        _n("y", "max", "x", "scaled"), _n("out", "store", "y", stream="out")))


def hard_swish() -> DataflowGraph:
    """x * relu6(x + 3) / 6 in Q8 fixed point (x in Q8; 1/6 ~ 43/256)."""
    three, six = 3 << 8, 6 << 8
    return DataflowGraph("hard-swish", (
        _n("x", "load", stream="x"), _n("x3", "add", "x", imm=three), _n("lo", "max", "x3", imm=0),
        _n("hi", "min", "lo", imm=six), _n("prod", "mul", "x", "hi"), _n("q", "shr", "prod", imm=8),
        _n("sixth", "mul", "q", imm=43), _n("y", "shr", "sixth", imm=8), _n("out", "store", "y", stream="out")))


#: name -> graph builder (no arguments): the suite `cgra-sim map` and the benchmark know.
INTRINSICS = {
    "mac": mac, "gemm": dot, "gemm-f32": lambda: dot(4, "float32", "gemm-f32"), "depthwise": depthwise,
    "eltwise-add": lambda: eltwise("add"), "eltwise-mul": lambda: eltwise("mul"),
    "eltwise-add-f32": lambda: eltwise("add", "float32"), "relu": relu, "maxpool": max_pool,
    "requantise": requantise, "leaky-relu": leaky_relu, "hard-swish": hard_swish,
}
