"""A static matmul's epilogue over the rows that exist, not its padded tile's.

Stage: lowering, the last pass (calls are plain, their row counts constants). Input: a kernel
with the PrimFunc attribute VALID_ROWS = [valid, tile, piece] (kernels/gemm/matmul.py: a static
2-D matmul whose M rows fit one row tile of `tile` rows, valid < tile: 17 tokens in a tile of 24
on an array of 8 rows), finished in EPILOGUEs of `piece` rows (the whole tile, or pieces under
a loop annotated HOIST_ALLOCS: kernels/gemm/gemm_schedule.py). Output: the same kernel in which
each vector-unit command of the output tile (EPILOGUE, VFUNC, ELTWISE, FABRIC, REDUCE, FILL)
runs on the valid rows: `valid` for a whole tile's, min(piece, valid - i * piece) for piece i's.
A whole tile's GEMM computes the valid rows too (a fold of 1 row costs what a fold of 8 does,
but reads no padding). A pre-norm's program on the A panel (kernels/gemm/row_norm.py, buffers
`row_*`), and the DMA load of the A tile it reads (without the zero halo past the tensor's rows),
are cut when every GEMM reading the panel reads a constant range of its rows (the pieces
lower/gemm_rows.py made: 8, 8, 1 of them cut then), so that no command reads a panel row
nothing wrote (the simulator refuses that). A GEMM piece of a DMA-loaded tile is left as it is.
So are the DMA loads of the A tile and the residual tile when every command reading them is a
whole tile's GEMM (as its A) or EPILOGUE (as its residual), all cut to the valid rows: their zero
halo is read by nothing (ConvNeXt's last-stage fc2 at 4 tokens in a tile of 8 streamed 512 + 128
cycles of zeros on its load engine, the unit that bounds it).

Why: a tile's padded rows are computed and never stored (the store's box already stops at the
valid rows, lower/dma.py), and the vector unit pays for them per element: a GELU or SiLU VFUNC
through the function unit's one lane takes an element a cycle, so a ViT's MLP epilogue over
17 tokens spent 24 / 17 of its time on its tiles (tail_tile_cycles prices the padding too:
epilogue_tail.check_tail_padding), and a pre-norm's ELTWISEs before the first GEMM as much. The
padded rows of the tiles keep whatever they held; no command after the cut ones reads them and
the store drops them, so every stored element is the same bits.
"""

from __future__ import annotations

from tvm import ir, tirx

from cgra_codegen import device_call_positions
from cgra_sim.isa import BOX_DIMS

from ..kernels.common.spec import HOIST_ALLOCS, VALID_ROWS
from .calls import buffer_args, buffer_of

#: The A panel's row program's blocks (row_norm.PREFIX): rows the GEMM reads, not the output's.
_PANEL_PREFIX = "row_"
#: Device call -> the position of its row count in the call's arguments.
_LOAD = device_call_positions("cgra_dma_load")
_LOAD_SPAD, _BOX = _LOAD["spad_addr"][0], _LOAD["box"]
_GEMM = device_call_positions("cgra_gemm")
(_GEMM_M,), (_GEMM_A, _), (_GEMM_A_STRIDE,) = _GEMM["m"], _GEMM["a_addr"], _GEMM["a_stride"]
_EPILOGUE = device_call_positions("cgra_epilogue")
(_EPILOGUE_M,), (_EPILOGUE_RESIDUAL, _) = _EPILOGUE["m"], _EPILOGUE["residual_addr"]
_ROWS = {name: device_call_positions(name)[param][0] for name, param in (
    ("cgra_epilogue", "m"), ("cgra_vfunc", "rows"), ("cgra_eltwise", "rows"), ("cgra_fabric", "rows"),
    ("cgra_reduce", "rows"), ("cgra_fill", "rows"))}


def cut_padded_rows(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with its output tile's commands cut to the valid rows (module doc)."""
    valid_rows = (func.attrs or {}).get(VALID_ROWS)
    if valid_rows is None:
        return func
    valid, tile, piece = (int(v) for v in valid_rows)
    panel_gemms = []
    _visit_calls(func.body, lambda call: panel_gemms.append(call) if _panel_start(call) is not False else None)
    # The panel's program is cut only when no GEMM reads its padded rows (each reads a constant
    # row range of it, cut to the valid rows): the simulator requires every byte read written.
    cut_panel = all(start is not None and start < valid for start in map(_panel_start, panel_gemms))
    # The tiles the panel's program reads (A, loaded by DMA): only its valid rows are read then.
    sources = set()
    _visit_calls(func.body, lambda call: sources.update(
        b.name for b in buffer_args(call) if not b.name.startswith(_PANEL_PREFIX))
        if str(call.args[0].value) != "cgra_gemm" and any(b.name.startswith(_PANEL_PREFIX) for b in buffer_args(call))
        else None)
    sources = (sources if cut_panel else set()) | _whole_tile_operands(func.body, tile)
    return func.with_body(_Cut(valid, tile, piece, cut_panel, sources).stmt(func.body, None))


def _whole_tile_operands(body, tile: int) -> set:
    """The buffers that only whole-tile GEMMs read as A, or whole-tile EPILOGUEs as the residual
    (rows == `tile`, both cut to the valid rows): their loads' zero halo is read by nothing."""
    only_rows: dict = {}
    def visit(call):
        name = str(call.args[0].value)
        if name == "cgra_dma_load":
            return
        rows_at, operand_at = {"cgra_gemm": (_GEMM_M, _GEMM_A),
                               "cgra_epilogue": (_EPILOGUE_M, _EPILOGUE_RESIDUAL)}.get(name, (None, None))
        rows = call.args[rows_at] if rows_at is not None else None
        whole = isinstance(rows, tirx.IntImm) and int(rows.value) == tile
        for position, arg in enumerate(call.args):
            buffer = buffer_of(arg)
            if buffer is not None:
                only_rows[buffer.name] = only_rows.get(buffer.name, True) and whole and position == operand_at
    _visit_calls(body, visit)
    return {name for name, only in only_rows.items() if only}


def _visit_calls(stmt, visit) -> None:
    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _visit_calls(s, visit)
    elif isinstance(stmt, tirx.For):
        _visit_calls(stmt.body, visit)
    elif isinstance(stmt, tirx.IfThenElse):
        _visit_calls(stmt.then_case, visit)
        if stmt.else_case is not None:
            _visit_calls(stmt.else_case, visit)
    elif isinstance(stmt, tirx.Evaluate) and _is_extern(stmt.value):
        visit(stmt.value)


def _is_extern(value) -> bool:
    return isinstance(value, ir.Call) and getattr(value.op, "name", "") == "tirx.call_extern"


def _panel_start(call):
    """For a GEMM whose A is the panel (row_norm.py's `row_*` buffer): the first panel row it reads
    (None when the offset is no constant number of rows); False for any other call."""
    if str(call.args[0].value) != "cgra_gemm":
        return False
    buffer = buffer_of(call.args[_GEMM_A])
    if buffer is None or not buffer.name.startswith(_PANEL_PREFIX):
        return False
    offset, stride = call.args[_GEMM_A + 1], call.args[_GEMM_A_STRIDE]
    if not (isinstance(offset, tirx.IntImm) and isinstance(stride, tirx.IntImm)) or int(offset.value) % int(stride.value):
        return None
    return int(offset.value) // int(stride.value)


class _Cut:
    def __init__(self, valid: int, tile: int, piece: int, cut_panel: bool, sources: set):
        self.valid, self.tile, self.piece, self.cut_panel, self.sources = valid, tile, piece, cut_panel, sources

    def stmt(self, stmt, piece_var):
        """`stmt` with its calls cut; `piece_var` the enclosing piece loop's variable, or None."""
        if isinstance(stmt, tirx.For):
            inner = stmt.loop_var if HOIST_ALLOCS in (stmt.annotations or {}) else piece_var
            return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, self.stmt(stmt.body, inner),
                            stmt.thread_binding, stmt.annotations)
        if isinstance(stmt, tirx.SeqStmt):
            return tirx.SeqStmt([self.stmt(s, piece_var) for s in stmt.seq])
        if isinstance(stmt, tirx.IfThenElse):
            else_case = self.stmt(stmt.else_case, piece_var) if stmt.else_case is not None else None
            return tirx.IfThenElse(stmt.condition, self.stmt(stmt.then_case, piece_var), else_case)
        if isinstance(stmt, tirx.Evaluate) and _is_extern(stmt.value):
            return tirx.Evaluate(self.call(stmt.value, piece_var))
        return stmt

    def call(self, call, piece_var):
        """`call` with its row count cut, when it is a command over the output tile's rows (or
        the panel's, or a GEMM reading a constant row range of the panel)."""
        name = str(call.args[0].value)
        if name == "cgra_dma_load":
            return self.load(call)
        start = _panel_start(call) if name == "cgra_gemm" else False
        if name == "cgra_gemm" and start is not False:
            if not self.cut_panel:
                return call
            rows = call.args[_GEMM_M]
            return _with_arg(call, _GEMM_M, tirx.IntImm(str(rows.ty), min(int(rows.value), self.valid - start)))
        position = _GEMM_M if name == "cgra_gemm" else _ROWS.get(name)
        if position is None or (not self.cut_panel and any(b.name.startswith(_PANEL_PREFIX)
                                                           for b in buffer_args(call))):
            return call
        rows = call.args[position]
        if not isinstance(rows, tirx.IntImm):
            return call
        if int(rows.value) == self.tile:
            return _with_arg(call, position, tirx.IntImm(str(rows.ty), self.valid))
        if int(rows.value) == self.piece < self.tile and piece_var is not None and name != "cgra_gemm":
            left = tirx.IntImm(str(piece_var.ty), self.valid) - piece_var * self.piece
            return _with_arg(call, position, tirx.min(tirx.IntImm(str(piece_var.ty), self.piece), left)
                             .astype(str(rows.ty)))
        return call


    def load(self, call):
        """A DMA load of a tile the panel's program reads, without the rows past the tensor's
        end (its zero halo: DMA beats for rows no command reads once the program is cut)."""
        buffer = buffer_of(call.args[_LOAD_SPAD])
        if buffer is None or buffer.name not in self.sources:
            return call
        for loop in range(BOX_DIMS):
            extent_at, dim_at, step_at, _ = (_BOX[3 * BOX_DIMS + 4 * loop + k] for k in range(4))
            extent, dim, step = call.args[extent_at], call.args[dim_at], call.args[step_at]
            if not all(isinstance(v, tirx.IntImm) for v in (extent, dim, step)):
                return call
            if int(extent.value) == 1:
                continue
            if int(step.value) != 1 or int(extent.value) != self.tile or int(dim.value) >= BOX_DIMS:
                return call  # the rows are the outermost loop walked; a column loop is never cut
            pad_at = _BOX[2 * BOX_DIMS + int(dim.value)]
            pad = call.args[pad_at]
            if isinstance(pad, tirx.IntImm) and int(pad.value) == self.tile - self.valid:
                call = _with_arg(call, extent_at, tirx.IntImm(str(extent.ty), self.valid))
                return _with_arg(call, pad_at, tirx.IntImm(str(pad.ty), 0))
            return call
        return call


def _with_arg(call, position: int, value):
    args = list(call.args)
    args[position] = value
    return ir.Call(call.op, args, call.attrs, call.ty_args, call.span, call.ty)
