"""The head split and merge transposes around an attention over a symbolic length, in its kernel.

Stage: partition (flash_length.length_spec asks `length_layouts`) and kernel definition
(flash_length.length_script asks `length_shapes` and `length_views`). head_layouts.py folds a
static attention's head transposes into its DMA boxes; this does the same for flash_length.py's
kernel, whose sequence axis is a variable: q, k and v may be head splits of sequence-major
(B, s, H, D) tensors, or boxes of heads of one (a merged q / k / v projection's view: Llama's V),
and the result may come back through the head merge as (B, s, H, Dv) for the output projection.
A box's source is (B, s, N, D): its slice cuts the heads (axis 2) or the dims, never the length.

Why: over a symbolic length the attention took plain operands only, so V's slice and the
output's transpose were copy kernels of their own (Llama at 16 tokens on cgra-8x8: 352 + 672
cycles a layer, which a static compile's attention does not spend).
"""

from __future__ import annotations

from tvm import tirx

from ...errors import UnsupportedOperator
from ...relax_info import shape_dims
from .head_layouts import ROLES, _origin, base_role

_PREFIX = "causal attention over a symbolic length: "


def length_layouts(annotated: dict, name: str, sizes: tuple) -> tuple:
    """(seq_major, parts) of a matched attention over length `name` (head_layouts' meaning:
    the roles stored (B, s, H, D); ((role, origin, source shape), ...), the source's length axis
    as `name`); `sizes` (B, Hk, G, D, Dv). Raises UnsupportedOperator for a split that is no head split."""
    b, hk, g, d, dv = sizes
    heads = {"lhs": (hk * g, d), "rhs": (hk, d), "value": (hk, dv)}
    seq_major, parts = [], []
    for role in ROLES:
        part = annotated.get(f"{role}_part")
        seq = part if part is not None else annotated.get(f"{role}_seq")
        if seq is None:
            continue
        if not _is(shape_dims(seq), (b, name) + heads[role]):
            raise UnsupportedOperator(_PREFIX + f"operand {role} of shape {shape_dims(seq)} is no head split "
                                      f"of a (B, {name}, H, D) tensor")
        seq_major.append(role)
        if part is not None:
            parts.append((role,) + _box(part, name, role))
    if annotated["root"].op.name == "relax.permute_dims":  # the merged patterns' root
        if not _is(shape_dims(annotated["root"]), (b, name, hk * g, dv)):
            raise UnsupportedOperator(_PREFIX + f"result reshaped to {shape_dims(annotated['root'])}: not a head merge")
        seq_major.append("out")
    return tuple(seq_major), tuple(parts)


def _is(dims, expected: tuple) -> bool:
    """`dims` (ints, one variable) equal to `expected` (ints; the variable's name)."""
    return dims is not None and len(dims) == len(expected) and all(
        (isinstance(x, tirx.Var) and x.name == e) if isinstance(e, str) else x == e for x, e in zip(dims, expected))


def _box(part, name: str, role: str) -> tuple:
    """(origin, source shape) of a unit-step slice of a (B, s, N, D) tensor that keeps the length."""
    source = shape_dims(part.args[0])
    if source is None or len(source) != 4 or not isinstance(source[1], tirx.Var) or source[1].name != name or \
            not all(isinstance(x, int) for i, x in enumerate(source) if i != 1):
        raise UnsupportedOperator(_PREFIX + f"operand {role}: a slice of a tensor of shape {source}; the kernel reads "
                                  f"a box of heads of a (B, {name}, N, D) tensor")
    axes = [int(getattr(getattr(a, "value", a), "value", getattr(a, "value", a))) % 4
            for a in (getattr(part.args[1], "fields", None) or getattr(part.args[1], "values", None) or ())]
    if 1 in axes:
        raise UnsupportedOperator(_PREFIX + f"operand {role}: a slice along the length; the kernel reads boxes of "
                                  "heads or dims")
    static = tuple(1 if i == 1 else x for i, x in enumerate(source))  # the length axis is not sliced
    return _origin(part, static, role), tuple(name if i == 1 else x for i, x in enumerate(source))


def _heads(spec, role: str) -> int:
    return spec.hk * spec.g if role in ("lhs", "out") else spec.hk


def _depth(spec, role: str) -> int:
    return spec.dv if role in ("value", "out") else spec.d


def _stored(spec, role: str, length) -> tuple:
    """`role`'s tensor's shape, its length `length` (text or a variable)."""
    for part_role, _, source in spec.parts:
        if part_role == role:
            return tuple(length if isinstance(x, str) else x for x in source)
    h, d = _heads(spec, role), _depth(spec, role)
    return (spec.b, length, h, d) if role in spec.seq_major else (spec.b, h, length, d)


def length_shapes(spec, length: str) -> dict:
    """Kernel buffer name (a parameter's base role, and "out") -> its shape, the length as text."""
    shapes = {base_role(p): _stored(spec, _role_read(spec, p), length) for p in list(spec.param_roles) + ["out"]
              if p != "mask"}
    # a bias row's table (1, Hk, G, 1, T) read as (Hk G, T), a box's (1, Hk, G, T, T) as (Hk G, T, T):
    # the DMA boxes take up to four dimensions
    rows = (spec.mask_shape[1] * spec.mask_shape[2],) + tuple(d for d in spec.mask_shape[3:] if d > 1) \
        if spec.mask_shape else ()
    return {**shapes, "mask": rows} if "mask" in spec.param_roles else shapes


def length_views(spec, length) -> dict:
    """Kernel buffer name -> the caller's view of it (`cgra.arg_shapes`): a plain role as the
    normal form's (B, Hk, G, s, D) (K and V: G 1), a sequence-major one as it is stored, a bias
    row's table as it is."""
    views = {}
    for param in list(spec.param_roles) + ["out"]:
        role = _role_read(spec, param)
        if param == "mask":  # a bias row's (1, Hk, G, 1, bound) table, read whole (length_rows.py)
            views["mask"] = tuple(spec.mask_shape)
        elif role in spec.seq_major:
            views[base_role(param)] = _stored(spec, role, length)
        else:
            g = spec.g if role in ("lhs", "out") else 1
            views[base_role(param)] = (spec.b, spec.hk, g, length, _depth(spec, role))
    return views


def _role_read(spec, param: str) -> str:
    """The role a kernel parameter holds (of a tensor several boxes are read from: the first)."""
    return base_role(param)
