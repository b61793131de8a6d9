"""The last tile of a symbolic axis, cut to the rows that exist.

Stage: lowering, after the DMA pass and fold_init. Input: a kernel whose tile loop runs over a
symbolic axis (kernels/common/dynamic.py): `for t in range(ceildiv(n, T))` around the tile's DMA and
compute calls, each sized for a whole tile of T rows. Output: the same kernel where every call
of the tile moves and computes min(T, n - t * T) rows: the GEMM's m, FILL's and ELTWISE's rows,
EPILOGUE's m, and each DMA box's extent along the symbolic dimension of its host tensor. A
kernel may name other parameters to cut (kernels/common/dynamic.py CUT_PARAMS), also one per nested
symbolic tile loop (a global pool's blocks: POOL kh by block rows, kw by block columns), and
loops over a tile's rows to cut (CUT_LOOP: a depthwise conv2d's EPILOGUE per output row). A
conv2d in blocks of rows and columns (BLOCKS) cuts its blocks both ways and packs a cut block's
pixels row by row, so that they are a prefix of its GEMM rows (`_Cutter._pack_block`).

Why: the DMA pass lets a tile overhang a tensor (the halo zero-fills loads and drops stores),
which is right for any size, but the overhang costs DMA beats and PE-array folds for rows that
do not exist: a kernel compiled for tiles of 32 rows would take a 32-row tile's time at n = 1.
Cut to the valid rows, the ragged tile costs what a kernel compiled for its size would. The
scratchpad buffers stay tile-sized; only the commands shrink.
"""

from __future__ import annotations

from tvm import ir, sym, tirx
from tvm.ir import StringImm as tvm_string
from tvm.tirx import _ffi_api as _tirx_api

from cgra_codegen import device_call_positions
from cgra_sim.isa import BOX_DIMS

from ..errors import ScheduleError
from ..kernels.common.dynamic import BLOCKS, BOUNDED, CUT_EXTENTS, CUT_LOOP, CUT_PARAMS, GATHERS, STORE_CUTS, \
    TILE_OF

_CALL_EXTERN = "tirx.call_extern"
#: Device call -> its parameter that counts the tile's rows (the tile loop's axis).
_ROW_PARAMS = {"cgra_gemm": "m", "cgra_fill": "rows", "cgra_epilogue": "m", "cgra_eltwise": "rows",
               "cgra_fabric": "rows", "cgra_vfunc": "rows",  # these two: a GEMM's activation (epilogue_tail.py)
               "cgra_reduce": "rows"}  # a GEMM's norm of its A panel's rows (kernels/gemm/row_norm.py)
_DMA = ("cgra_dma_load", "cgra_dma_store")


_BUFFER_DATA = ir.Op.get("tirx.buffer_data")




def cut_ragged_tiles(func: tirx.PrimFunc) -> tirx.PrimFunc:
    attrs = func.attrs or {}
    # [dim, scale, per, offset] cut by the innermost symbolic tile loop, or with a fifth entry,
    # by that tile loop level (0: the outermost).
    gathers, stores = ({str(name): {int(cut[0]): (int(cut[1]), int(cut[2]), int(cut[3]),
                                                  int(cut[4]) if len(cut) > 4 else None) for cut in cuts}
                        for name, cuts in attrs.get(key, {}).items()} for key in (GATHERS, STORE_CUTS))
    cut_params = attrs.get(CUT_PARAMS)
    cutter = _Cutter(gathers, None if cut_params is None else {str(k): _names(v) for k, v in cut_params.items()},
                     int(attrs.get(BLOCKS, 0)),
                     {str(param.name): list(param.ty.shape) for param in func.params if hasattr(param.ty, "shape")})
    cutter.stores = stores
    dims = {extent.name: extent for param in func.params if hasattr(param.ty, "shape")
            for extent in param.ty.shape if isinstance(extent, tirx.Var)}
    cutter.extents = {str(call): [(str(param), int(tile), dims[str(name)]) for param, tile, name in cuts]
                      for call, cuts in attrs.get(CUT_EXTENTS, {}).items()}
    body = cutter.stmt(func.body, None)
    checks = [_bound_check(dims[str(entry[0])], int(entry[1]), *map(str, entry[2:])) for entry in attrs.get(BOUNDED, [])]
    return func.with_body(tirx.SeqStmt([*checks, body]) if checks else body)


def _bound_check(var, bound: int, what: str, why: str = ""):
    """A LengthPastBound (a ValueError) at run time when symbolic dimension `var` exceeds `bound`
    (BOUNDED); `why` replaces the scratchpad as the reason (a preallocated KV cache's length)."""
    name = var.name
    how = (f"torch.export.Dim('{name}', max=...), npu_backend.compile(..., shape_bounds={{'{name}': ...}}) or the "
           "function's tir_var_upper_bound") if name.isidentifier() else \
        "torch.export.Dim(max=...), npu_backend.compile(..., shape_bounds=...) or the function's tir_var_upper_bound"
    why = why or f"the kernel holds up to {bound} in the scratchpad and would write past it"
    message = f"{what} of symbolic length {name} past its bound {bound}: {why}; compile with a larger bound ({how})"
    # TVM 0.27's tirx.AssertStmt passes its arguments to the constructor in the wrong order.
    return _tirx_api.AssertStmt(var <= tirx.IntImm(str(var.ty), bound), tvm_string("LengthPastBound"),
                                [tvm_string(message)], None)


def _names(value):
    """A CUT_PARAMS value: one parameter's name, or a list of them (one per tile loop level)."""
    return str(value) if isinstance(value, str) or not hasattr(value, "__len__") else [str(v) for v in value]


def _host_tensor(slot):
    """The host tensor (Buffer) a DMA's slot argument (`X.data`) names, or None."""
    if isinstance(slot, ir.Call) and slot.op.same_as(_BUFFER_DATA):
        return slot.args[0]
    return None


def _tile_of(loop, shapes: dict):
    """(size, tile) when `loop` runs over the tiles of a symbolic axis: its TILE_OF annotation
    says so (`shapes`: the kernel's parameters' shapes by name), or its extent is
    floordiv(a, tile) for an expression `a` of symbolic dimensions, which is ceildiv(size, tile)
    for size = a - (tile - 1). TVM writes ceildiv(size, tile) as floordiv(size + tile - 1, tile)
    (`size` n, or b * s for rows folded from two axes), or simplified further (ceildiv(max(w - 1,
    1), 2) reads floordiv(max(w, 2), 2)); else None."""
    annotated = (loop.annotations or {}).get(TILE_OF)
    if annotated is not None:
        tensor, dim, tile = annotated
        return shapes[str(tensor)][int(dim)], int(tile)
    extent = sym.Analyzer().simplify(loop.extent)
    if not (isinstance(extent, tirx.FloorDiv) and isinstance(extent.b, tirx.IntImm)):
        return None
    tile, numerator = int(extent.b.value), extent.a
    if isinstance(numerator, tirx.IntImm):
        return None
    if isinstance(numerator, tirx.Add) and not isinstance(numerator.a, tirx.IntImm) and \
            isinstance(numerator.b, tirx.IntImm) and int(numerator.b.value) == tile - 1:
        return numerator.a, tile
    return sym.Analyzer().simplify(numerator - (tile - 1)), tile


class _Cutter:
    def __init__(self, gathers: dict, row_params: dict | None = None, block_columns: int = 0,
                 shapes: dict | None = None):
        self.gathers = gathers
        self.shapes = shapes or {}
        self.row_params = _ROW_PARAMS if row_params is None else row_params
        # Blocks of rows x block_columns pixels: the two outermost symbolic tile loops walk
        # block rows and block columns; a cut block's commands compute valid rows x valid
        # columns GEMM rows, its pixels packed row by row (_pack_block).
        self.block_columns = block_columns
        self.extents = {}  # device call -> [(parameter, tile, variable)]: CUT_EXTENTS
        self.stores = {}  # host tensor -> GATHERS-like cuts of its stores: STORE_CUTS

    def stmt(self, stmt, rows, levels=()):
        """`stmt` with its calls cut; `rows` = (tile size, valid rows of this tile) inside a
        symbolic tile loop, else None; `levels` the same of every enclosing symbolic tile loop,
        the outermost first."""
        if isinstance(stmt, tirx.For):
            tile = _tile_of(stmt, self.shapes)
            inner = rows
            if tile is not None:
                extent, size = tile
                valid = (size, tirx.min(tirx.IntImm(str(extent.ty), size), extent - stmt.loop_var * size))
                levels = (*levels, valid)
                if not self.block_columns:
                    inner = valid
                elif len(levels) == 1:  # block rows: valid rows x whole blocks' columns
                    inner = (size * self.block_columns, valid[1] * self.block_columns)
                elif len(levels) == 2:  # block columns: the block's pixels, packed
                    inner = (levels[0][0] * size, levels[0][1] * valid[1])
            extent = stmt.extent
            level = (stmt.annotations or {}).get(CUT_LOOP)
            if level is not None and int(level) < len(levels):  # a loop over the tile's rows
                extent = tirx.min(extent, levels[int(level)][1].astype(str(extent.ty)))
            return tirx.For(stmt.loop_var, stmt.min, extent, stmt.kind, self.stmt(stmt.body, inner, levels),
                            stmt.thread_binding, stmt.annotations)
        if isinstance(stmt, tirx.SeqStmt):
            return tirx.SeqStmt([self.stmt(s, rows, levels) for s in stmt.seq])
        if isinstance(stmt, tirx.IfThenElse):
            else_case = self.stmt(stmt.else_case, rows, levels) if stmt.else_case is not None else None
            return tirx.IfThenElse(stmt.condition, self.stmt(stmt.then_case, rows, levels), else_case)
        if isinstance(stmt, tirx.Evaluate) and _is_extern(stmt.value):
            return tirx.Evaluate(self.call(stmt.value, rows, levels))
        return stmt

    def call(self, call, rows, levels=()):
        name = str(call.args[0].value)
        args = list(call.args)
        if name in _DMA:
            self._cut_box(name, args, rows, levels)
        elif name in self.row_params:
            params = self.row_params[name]
            # One parameter: cut by the innermost tile loop; a list: one per tile loop level.
            if not isinstance(params, str) and len(params) != len(levels):
                raise ScheduleError(f"{name} cuts {list(params)} by tile loop, but runs inside "
                                    f"{len(levels)} symbolic tile loops")
            cuts = [(params, rows)] if isinstance(params, str) else list(zip(params, levels))
            for param, level in cuts:
                if level is None or not param:  # "": not cut by that tile loop
                    continue
                (position,) = device_call_positions(name)[param]
                size, valid = level
                if isinstance(args[position], tirx.IntImm) and int(args[position].value) == size:
                    args[position] = valid.astype(str(args[position].ty))
        for param, tile, var in self.extents.get(name, ()):
            (position,) = device_call_positions(name)[param]
            if isinstance(args[position], tirx.IntImm) and int(args[position].value) == tile:
                kind = str(args[position].ty)
                args[position] = tirx.min(tirx.IntImm(kind, tile), var.astype(kind))
        return ir.Call(call.op, args, call.attrs, call.ty_args, call.span, call.ty)

    def _cut_box(self, name: str, args, rows, levels=()) -> None:
        """Each box loop walking a symbolic dimension of the host tensor moves only the
        coordinates inside it: extent min(extent, size - origin) (one step per coordinate); a
        gather's (GATHERS) only along the dims it names, to what the tile's valid outputs read.
        In a conv2d in blocks (BLOCKS) the GATHERS entries cut stores too, and a box cut along
        both block levels is packed (`_pack_block`)."""
        positions = device_call_positions(name)
        tensor = _host_tensor(args[positions["slot"][0]])
        if tensor is None:
            return
        shape = list(tensor.shape)
        box = positions["box"]
        gather = self.gathers.get(str(tensor.name)) if name == "cgra_dma_load" or self.block_columns else \
            self.stores.get(str(tensor.name))
        by_level = {}  # tile loop level -> the sstride position of the box loop it cut
        for loop in range(BOX_DIMS):
            extent_at, dim_at, step_at, stride_at = (box[3 * BOX_DIMS + 4 * loop + k] for k in range(4))
            dim, step = args[dim_at], args[step_at]
            if gather is not None:
                cut = gather.get(int(dim.value)) if isinstance(dim, tirx.IntImm) else None
                level = None if cut is None else rows if cut[3] is None else \
                    levels[cut[3]] if cut[3] < len(levels) else None
                if level is not None:
                    scale, per, offset, at = cut
                    valid = (tirx.floordiv(level[1] * scale, per) + offset).astype("int64")
                    args[extent_at] = tirx.max(tirx.min(args[extent_at], valid), tirx.IntImm("int64", 1))
                    if at is not None:
                        by_level[at] = stride_at
                continue
            if not (isinstance(dim, tirx.IntImm) and isinstance(step, tirx.IntImm) and int(step.value) == 1):
                continue
            extent = shape[int(dim.value)] if int(dim.value) < len(shape) else None
            if extent is None or isinstance(extent, tirx.IntImm):
                continue
            origin = args[box[int(dim.value)]]
            remaining = extent.astype("int64") - origin
            args[extent_at] = tirx.max(tirx.min(args[extent_at], remaining), tirx.IntImm("int64", 1))
        if self.block_columns and len(levels) == 2 and 0 in by_level:
            if 1 not in by_level:  # its commands compute packed rows: a box that is not would differ
                raise ScheduleError(f"{name} of {tensor.name} in a conv2d in blocks walks the block's rows but "
                                    "not its columns: its pixels cannot be packed like its commands' rows")
            self._pack_block(name, args, by_level[0], by_level[1], levels[1][1])

    def _pack_block(self, name: str, args, rows_at: int, columns_at: int, columns) -> None:
        """A block of a conv2d in blocks holds its pixels row by row, block_columns to a row;
        its last block column has fewer valid columns (`columns`). Its commands then compute
        valid rows x `columns` GEMM rows (`stmt`), so its boxes put pixel (y, x) at row
        y * columns + x: the box loop over the block's rows steps `columns` pixels in the
        scratchpad instead of block_columns. Every block's valid pixels are then a prefix of
        the tile, and none of the PE array's rows computes a pixel past the image's edge."""
        stride, step = args[rows_at], args[columns_at]
        if not (isinstance(stride, tirx.IntImm) and isinstance(step, tirx.IntImm)
                and int(stride.value) == self.block_columns * int(step.value)):
            raise ScheduleError(f"{name} of a conv2d in blocks of {self.block_columns} columns walks its "
                                f"rows {stride} scratchpad elements apart, not {self.block_columns} pixels of "
                                f"{step}: the block's pixels are not stored row by row")
        args[rows_at] = columns.astype("int64") * step


def _is_extern(value) -> bool:
    return isinstance(value, ir.Call) and getattr(value.op, "name", "") == _CALL_EXTERN
