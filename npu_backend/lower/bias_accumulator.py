"""A tile's bias loaded into its accumulator: the activation reads the GEMM's sum.

Stage: lowering, after fold_init (the tile's GEMM overwrites its accumulator) and before double
buffering (buffers still N-d, calls (data, offset) pairs: calls.py). Input: a loop annotated
BIAS_IN_ACC (kernels/gemm/bias_acc.py) whose body is the sequence

    cgra_gemm(flags 0, ..., acc, off, m, n, stride)          # acc = A @ B
    cgra_dma_load(bias_pad <- bias: a box of n elements)
    cgra_epilogue(BIAS only, float32, acc -> out, bias_pad)   # out = acc + bias
    cgra_vfunc(out -> dst, m x n, reading out whole)          # dst = act(out)

(other commands between them touching none of acc, bias_pad, out). Output:

    cgra_dma_load(acc <- bias, each of the m rows: a box loop of tensor step 0)
    cgra_gemm(ACCUMULATE, ...)                                # acc = (A @ B) + bias
    cgra_vfunc(acc -> dst)

bias_pad's allocation gone, the loop's annotation dropped. The same bits (bias_acc.py: the
accumulating float32 GEMM's one rounded add is the EPILOGUE's with its operands swapped), one
vector-unit pass over the tile fewer. A sequence that is not exactly this is left as it is (it
is still right; the accumulator's third copy, which double_buffer.py gives, is then unused).
"""

from __future__ import annotations

from tvm import sym, tirx

from cgra_codegen import device_call_positions
from cgra_sim.isa import BOX_DIMS, EPILOGUE_BIAS, GEMM_ACCUMULATE, DType

from ..kernels.common.spec import BIAS_IN_ACC
from .calls import buffer_of, extern_call, map_loops, touches

_GEMM, _EPI = device_call_positions("cgra_gemm"), device_call_positions("cgra_epilogue")
_LOAD, _VFUNC = device_call_positions("cgra_dma_load"), device_call_positions("cgra_vfunc")
_F32 = int(DType.FLOAT32)
#: Box words: origins, then halo below and above, BOX_DIMS each; then per loop (extent, tdim, tstep, sstride).
_LOOPS_AT = 3 * BOX_DIMS


def accumulate_bias(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_body(map_loops(func.body, _rewrite))


def _rewrite(loop):
    """An annotated tile loop with its bias in the accumulator (module doc), its mark dropped."""
    annotations = dict(loop.annotations or {})
    if BIAS_IN_ACC not in annotations or not isinstance(loop.body, tirx.SeqStmt):
        return loop
    del annotations[BIAS_IN_ACC]
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, _in_sequence(list(loop.body.seq)),
                    loop.thread_binding, annotations)


def _arg(call, table, name, word=0):
    return call.args[table[name][word]]


def _in_sequence(seq: list):
    """The sequence rewritten (module doc), or as it is when it is not the pattern."""
    found = _find(seq)
    if found is None:
        return tirx.SeqStmt(seq)
    g, load, e, v = found
    epilogue = extern_call(seq[e], "cgra_epilogue")
    acc, acc_off = _arg(epilogue, _EPI, "acc_addr"), _arg(epilogue, _EPI, "acc_addr", 1)
    m, acc_stride = _arg(epilogue, _EPI, "m"), _arg(epilogue, _EPI, "acc_stride")
    bias = buffer_of(_arg(epilogue, _EPI, "bias_addr"))
    gemm = extern_call(seq[g], "cgra_gemm")
    gemm_args = list(gemm.args)
    gemm_args[_GEMM["flags"][0]] = gemm_args[_GEMM["flags"][0]] + GEMM_ACCUMULATE
    vfunc = extern_call(seq[v], "cgra_vfunc")
    vfunc_args = list(vfunc.args)
    (a_data, a_off), (a_stride,) = _VFUNC["a_addr"], _VFUNC["a_row_stride"]
    vfunc_args[a_data], vfunc_args[a_off], vfunc_args[a_stride] = acc, acc_off, acc_stride
    out = []
    for i, stmt in enumerate(seq):
        if i == g:
            out += [_broadcast_load(extern_call(seq[load], "cgra_dma_load"), acc, acc_off, m, acc_stride),
                    _evaluate(gemm, gemm_args)]
        elif i == v:
            out.append(_evaluate(vfunc, vfunc_args))
        elif i in (load, e) or isinstance(stmt, tirx.AllocBuffer) and stmt.buffer.same_as(bias):
            continue
        else:
            out.append(stmt)
    return tirx.SeqStmt(out)


def _find(seq: list):
    """(GEMM, bias load, EPILOGUE, VFUNC) positions in `seq`, or None (module doc)."""
    for e, stmt in enumerate(seq):
        epilogue = extern_call(stmt, "cgra_epilogue")
        if epilogue is None or not _bias_only(epilogue):
            continue
        acc, out = (buffer_of(_arg(epilogue, _EPI, name)) for name in ("acc_addr", "out_addr"))
        bias = buffer_of(_arg(epilogue, _EPI, "bias_addr"))
        if acc is None or out is None or bias is None or acc.same_as(out):
            return None
        users = [i for i, s in enumerate(seq) if not isinstance(s, tirx.AllocBuffer) and touches(s, acc)]
        bias_users = [i for i, s in enumerate(seq) if not isinstance(s, tirx.AllocBuffer) and touches(s, bias)]
        after = [i for i in range(e + 1, len(seq)) if touches(seq[i], out) or touches(seq[i], acc)]
        if len(users) != 2 or users[1] != e or len(bias_users) != 2 or bias_users[1] != e or not after:
            return None
        g, load, v = users[0], bias_users[0], after[0]
        if _gemm_fills(extern_call(seq[g], "cgra_gemm"), epilogue) and load > g and \
                _bias_box(extern_call(seq[load], "cgra_dma_load"), _arg(epilogue, _EPI, "n")) is not None and \
                _reads_out(extern_call(seq[v], "cgra_vfunc"), epilogue) and \
                not any(touches(s, acc) for s in seq[v + 1:]):
            return g, load, e, v
        return None
    return None


def _bias_only(epilogue) -> bool:
    """A float32 EPILOGUE adding its bias row and nothing else."""
    words = [_arg(epilogue, _EPI, name) for name in ("flags", "acc_dtype", "out_dtype")]
    return all(isinstance(w, tirx.IntImm) for w in words) and \
        [int(w) for w in words] == [EPILOGUE_BIAS, _F32, _F32]


def _gemm_fills(gemm, epilogue) -> bool:
    """`gemm` overwrites exactly the EPILOGUE's accumulator region (its first step: fold_init.py)."""
    if gemm is None:
        return False
    flags = _arg(gemm, _GEMM, "flags")
    if not isinstance(flags, tirx.IntImm) or int(flags) & GEMM_ACCUMULATE:
        return False
    pairs = [("acc_addr", "acc_addr", 1), ("m", "m", 0), ("n", "n", 0), ("acc_stride", "acc_stride", 0)]
    analyzer = sym.Analyzer()
    return buffer_of(_arg(gemm, _GEMM, "acc_addr")).same_as(buffer_of(_arg(epilogue, _EPI, "acc_addr"))) and \
        all(analyzer.can_prove_equal(_arg(gemm, _GEMM, a, w), _arg(epilogue, _EPI, b, w)) for a, b, w in pairs)


def _reads_out(vfunc, epilogue) -> bool:
    """`vfunc` reads exactly the EPILOGUE's output tile (rows, columns, strides)."""
    if vfunc is None or buffer_of(_arg(vfunc, _VFUNC, "a_addr")) is None or \
            not buffer_of(_arg(vfunc, _VFUNC, "a_addr")).same_as(buffer_of(_arg(epilogue, _EPI, "out_addr"))):
        return False
    pairs = [(_arg(vfunc, _VFUNC, "a_addr", 1), _arg(epilogue, _EPI, "out_addr", 1)),
             (_arg(vfunc, _VFUNC, "a_row_stride"), _arg(epilogue, _EPI, "out_stride")),
             (_arg(vfunc, _VFUNC, "a_col_stride"), 1), (_arg(vfunc, _VFUNC, "rows"), _arg(epilogue, _EPI, "m")),
             (_arg(vfunc, _VFUNC, "cols"), _arg(epilogue, _EPI, "n"))]
    analyzer = sym.Analyzer()
    return all(analyzer.can_prove_equal(a, b) for a, b in pairs)


def _bias_box(load, n):
    """The position of the one loop of the bias load's box (n elements, scratchpad stride 1, no
    halo, no lowest-value fill), or None."""
    if load is None or not _is_int(_arg(load, _LOAD, "flags"), 0):
        return None
    box = [load.args[i] for i in _LOAD["box"]]
    if not all(_is_int(w, 0) for w in box[BOX_DIMS:_LOOPS_AT]):
        return None
    loops = [box[_LOOPS_AT + 4 * loop:_LOOPS_AT + 4 * loop + 4] for loop in range(BOX_DIMS)]
    walking = [i for i, (extent, *_) in enumerate(loops) if not _is_int(extent, 1)]
    if len(walking) != 1 or not _is_int(loops[walking[0]][3], 1) or \
            not sym.Analyzer().can_prove_equal(loops[walking[0]][0], n):
        return None
    return walking[0]


def _broadcast_load(load, acc, acc_off, m, acc_stride):
    """The bias load's box, its row down the accumulator tile's m rows (acc_stride apart)."""
    box = [load.args[i] for i in _LOAD["box"]]
    walking = [i for i in range(BOX_DIMS) if not _is_int(box[_LOOPS_AT + 4 * i], 1)][0]
    extent, tdim, tstep, _ = box[_LOOPS_AT + 4 * walking:_LOOPS_AT + 4 * walking + 4]
    rows = [tirx.Cast("int64", m), tdim, tirx.const(0, "int64"), tirx.Cast("int64", acc_stride)]
    cols = [extent, tdim, tstep, tirx.const(1, "int64")]
    unit = [tirx.const(v, "int64") for v in (1, 0, 0, 0)]
    loops = rows + cols + unit * (BOX_DIMS - 2)
    args = list(load.args)
    args[_LOAD["spad_addr"][0]], args[_LOAD["spad_addr"][1]] = acc, acc_off
    for word, value in zip(_LOAD["box"][_LOOPS_AT:], loops):
        args[word] = value
    return _evaluate(load, args)


def _evaluate(call, args):
    return tirx.Evaluate(type(call)(call.op, args, call.attrs, call.ty_args, call.span, call.ty))


def _is_int(expr, value: int) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr) == value
