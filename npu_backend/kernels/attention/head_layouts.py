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
"""

from __future__ import annotations

from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import shape_dims

HEADS_FIRST = [0, 2, 1, 3]  # (B, S, H, D) <-> (B, H, S, D): its own inverse
ROLES = ("lhs", "rhs", "value")


def operand(role: str):
    """(pattern, roles): the operand as it is, or a head split of a sequence-major tensor (tried
    first: a wildcard matches anything)."""
    plain, seq = wildcard(), wildcard()
    split = is_op("relax.reshape")(is_op("relax.permute_dims")(seq).has_attr({"axes": HEADS_FIRST}), wildcard())
    return split | plain, {role: plain, f"{role}_seq": seq, f"{role}_split": split}


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
        if f"{role}_seq" not in annotated:
            continue
        b, hk, g, s, d = shapes[role]
        if tuple(shape_dims(annotated[f"{role}_seq"]) or ()) != (b, s, hk * g, d):
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


def param_name(seq_major: tuple, role: str) -> str:
    """The kernel parameter of `role`: `<role>_seq` for a sequence-major operand."""
    return f"{role}_seq" if role in seq_major and role != "out" else role


def stored(spec, role: str, shape: tuple) -> tuple:
    """A (B, H, S, D) shape or index of `role` as the kernel's tensor stores it."""
    b, h, s, d = shape
    return (b, s, h, d) if role in spec.seq_major else (b, h, s, d)
