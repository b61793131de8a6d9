"""The attention kernel's spec: what one attention computes, shared by its family (attention.py)
and its tile search (attention_tiles.py).

Stage: partition (attention.attention_spec makes it), tiling and kernel definition.
"""

from __future__ import annotations

import dataclasses

F32 = "float32"


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """One attention: sizes, the scale (None for 1), the mask's rank-5 broadcast shape (() for
    none), whether the softmax is safe (an all -inf row gives 0), and for a constant causal mask
    (no mask operand then) its offset k: key j is seen by query i where j <= i + k; `length`: the
    variable of a symbolic length (sq = sk = its bound, causal 0: flash_length.py); `unseen`: a safe
    softmax's value in the rows that see no key (where(kept, softmax, c)'s c: 0, or fl(1 / Sk) for
    a finite mask's split, normalise/finite_masks.py: every key's weight, the rows' output c 1ᵀ V;
    the whole-row kernel only, rows.py); `half_out`: None, or the 16-bit float the output is
    stored in, the normalised float32 O rounded to nearest even on store (an EPILOGUE: HF's
    `attn_output.to(h)`, normalise/half_attention_outputs.py)."""

    b: int
    hk: int
    g: int
    sq: int
    sk: int
    d: int
    dv: int
    scale: float | None = None
    mask_shape: tuple = ()
    safe: bool = False
    causal: int | None = None
    param_roles: tuple = ("lhs", "rhs", "value")
    seq_major: tuple = ()  # roles stored (B, S, H, D), not (B, H, S, D): head transposes folded (head_layouts.py)
    parts: tuple = ()  # ((role, origin, source shape), ...): a seq-major role read as a box of a larger tensor
    source_ops: tuple = ()
    shape_args: tuple = ()
    length: str | None = None
    unseen: float = 0.0
    half_out: str | None = None
    op = "attention"
    dtype = F32
    acc_dtype = F32

    @property
    def output_shape(self) -> tuple:
        return (self.b, self.hk, self.g, self.sq, self.dv)

    @property
    def macs(self) -> int:
        return self.b * self.hk * self.g * self.sq * self.sk * (self.d + self.dv)
