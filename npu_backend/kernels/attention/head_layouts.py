"""The head split and merge transposes around an attention, folded into its kernel's DMA boxes.

Stage: partition (the attention patterns' operand and result forms, the spec's `seq_major`) and
kernel definition (where each tensor's element lies). A projection's output (B, S, H * D) is
viewed as (B, S, H, D) and transposed to (B, H, S, D) for the attention, whose output comes back
through the inverse transpose to (B, S, H, D) for the output projection: BERT's, ViT's and
Llama's head transposes, copy kernels of their own (5.6 k of BERT's 96 k cycles on cgra-8x8 at
32 tokens). The kernel reads a head's rows of Q, K and V, and writes its rows of O, as boxes
whatever the order of the axes (a row of D elements H * D apart: lower/dma.py's box loops walk
any axis), so the attention patterns take

    q, k, v:  reshape(permute_dims(x, [0, 2, 1, 3]), (B, Hk, G, S, D))   x (B, S, H, D)
    out:      permute_dims(reshape(attention), [0, 2, 1, 3])             (B, Sq, H, Dv)

beside the plain operands and result, and the kernel's tensors of those roles are stored
sequence-major, (B, S, H, D), instead of (B, H, S, D). A "seq_major" role's parameter is named
`<role>_seq` (its pattern's wildcard: a role per pattern node).

The sequence-major tensor may itself be a unit-step box of a larger one, x = strided_slice(y)
with constant bounds: a merged q / k / v projection's part (normalise/qkv_merges.py,
split_slices.py). The kernel then reads y, parameter `<role>_src`, at the box's origin
(`AttentionSpec.parts`): V's slice was a copy kernel of its own (Llama at 32 tokens on
cgra-8x8: 544 cycles a layer). Parts of one y for two roles are two parameters, one y each.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import shape_dims

HEADS_FIRST = [0, 2, 1, 3]  # (B, S, H, D) <-> (B, H, S, D): its own inverse
ROLES = ("lhs", "rhs", "value")


def operand(role: str):
    """(pattern, roles): the operand as it is, or a head split of a sequence-major tensor (tried
    first: a wildcard matches anything)."""
    plain, seq, src = wildcard(), wildcard(), wildcard()
    part = is_op("relax.strided_slice")(src, varg_default_wildcard=True)
    split = is_op("relax.reshape")(is_op("relax.permute_dims")(part | seq).has_attr({"axes": HEADS_FIRST}),
                                   wildcard())
    return split | plain, {role: plain, f"{role}_seq": seq, f"{role}_src": src, f"{role}_part": part,
                           f"{role}_split": split}


def merged(root):
    """The attention's result through one or two reshapes to (B, H, Sq, Dv) and the transpose
    to (B, Sq, H, Dv): the pattern's root (a role of its own would name the same call twice)."""
    once = is_op("relax.reshape")(root, wildcard())
    twice = is_op("relax.reshape")(once, wildcard())
    return is_op("relax.permute_dims")(twice | once).has_attr({"axes": HEADS_FIRST})


def operand_of(annotated: dict, role: str):
    """The 5-d normal-form operand of `role` (the reshape of a head split)."""
    return annotated[role] if role in annotated else annotated[f"{role}_split"]


def seq_major_roles(annotated: dict, shapes: dict) -> tuple:
    """The roles ("lhs", "rhs", "value", "out") stored sequence-major in a matched attention;
    `shapes`: role -> its normal-form 5-d shape (B, Hk, G, S, D). Raises UnsupportedOperator
    when a head split does not only split the heads (then the plain pattern takes the
    attention and the transposes stay copies)."""
    roles = []
    for role in ROLES:
        seq = annotated.get(f"{role}_part", annotated.get(f"{role}_seq"))
        if seq is None:
            continue
        b, hk, g, s, d = shapes[role]
        if tuple(shape_dims(seq) or ()) != (b, s, hk * g, d):
            raise UnsupportedOperator(f"attention operand {role}: a transpose of {shape_dims(annotated[role + '_seq'])} "
                                      f"reshaped to {shapes[role]} is not a head split")
        roles.append(role)
    if annotated["root"].op.name == "relax.permute_dims":  # the merged patterns' root
        b, hk, g, sq, _ = shapes["lhs"]
        dv = shapes["value"][4]
        if tuple(shape_dims(annotated["root"]) or ()) != (b, sq, hk * g, dv):
            raise UnsupportedOperator(f"attention result reshaped to {shape_dims(annotated['root'])}: not a head merge")
        roles.append("out")
    return tuple(roles)


def parts(annotated: dict) -> tuple:
    """((role, origin, source shape), ...) of the sequence-major operands read as a box of a
    larger tensor (module doc); raises UnsupportedOperator for a slice that is no such box."""
    found = []
    for role in ROLES:
        part = annotated.get(f"{role}_part")
        if part is None:
            continue
        source = shape_dims(part.args[0])
        if source is None or len(source) != 4 or not all(isinstance(d, int) for d in source):
            raise UnsupportedOperator(f"attention operand {role}: a slice of a tensor of shape {source}; the kernel "
                                      "reads a box of a static (B, S, H, D) tensor")
        found.append((role, _origin(part, source, role), tuple(source)))
    return tuple(found)


def _origin(part, source: tuple, role: str) -> tuple:
    """The origin of a unit-step strided_slice with constant bounds of a rank-4 tensor."""
    args = list(part.args[1:])
    if len(args) < 3 or not all(isinstance(a, (relax.Tuple, relax.ShapeExpr)) for a in args[:3]):
        raise UnsupportedOperator(f"attention operand {role}: a slice with bounds computed at run time")
    axes, begins = _ints(args[0]), _ints(args[1])
    steps = _ints(args[3]) if len(args) > 3 and isinstance(args[3], (relax.Tuple, relax.ShapeExpr)) else [1] * len(axes)
    if any(step != 1 for step in steps):
        raise UnsupportedOperator(f"attention operand {role}: a slice with steps {steps}; the kernel reads unit-step "
                                  "boxes")
    origin = [0] * 4
    for axis, begin in zip(axes, begins):
        axis %= 4
        origin[axis] = min(max(begin + source[axis] if begin < 0 else begin, 0), source[axis])
    return tuple(origin)


def _ints(expr) -> list:
    """The ints of a Relax tuple of PrimValues or a ShapeExpr."""
    values = getattr(expr, "fields", None) or getattr(expr, "values", None) or ()
    return [int(getattr(getattr(v, "value", v), "value", getattr(v, "value", v))) for v in values]


def param_name(seq_major: tuple, role: str, sliced: tuple = ()) -> str:
    """The kernel parameter of `role`: `<role>_src` for a box of a larger sequence-major tensor,
    `<role>_seq` for a sequence-major operand."""
    if role in sliced:
        return f"{role}_src"
    return f"{role}_seq" if role in seq_major and role != "out" else role


def base_role(param: str) -> str:
    """The role ("lhs", "rhs", "value", "mask", "out") of a kernel parameter's name; of a tensor
    several parts are read from ("rhs_src+value_src"), the first's."""
    return param.split("+")[0].removesuffix("_seq").removesuffix("_src")


def buffer_of(spec, role: str) -> str:
    """The name of the kernel's buffer that holds `role`'s elements: its own, or the buffer of
    the first role of a tensor several parts are read from."""
    for param in spec.param_roles:
        if f"{role}_src" in param.split("+"):
            return base_role(param)
    return role


def stored(spec, role: str, index: tuple, plus=None) -> tuple:
    """A (B, H, S, D) index of `role` where the kernel's tensor stores it (a box's origin added:
    as text, or by `plus(origin, index)` for expressions, prim_build.py)."""
    b, h, s, d = index
    place = (b, s, h, d) if role in spec.seq_major else (b, h, s, d)
    plus = plus or (lambda o, p: f"{o} + {p}")
    for part_role, origin, _ in spec.parts:
        if part_role == role:
            return tuple(p if o == 0 else plus(o, p) for p, o in zip(place, origin))
    return place


def stored_shape(spec, role: str, shape: tuple) -> tuple:
    """The shape of `role`'s tensor, (B, H, S, D) as the kernel reads it: as it is stored (a box's
    whole source)."""
    for part_role, _, source in spec.parts:
        if part_role == role:
            return source
    b, h, s, d = shape
    return (b, s, h, d) if role in spec.seq_major else (b, h, s, d)
