"""What the op families share: how a kernel's compute reads its operands (operands.py, views.py,
dynamic.py), the spec and tiling records (spec.py), scratchpad row layouts (spad_layout.py),
the check of a scheduled kernel (schedule_check.py), elementwise chains as FABRIC bodies
(chains.py) and the one-input kernels' view, tile search and schedule (unary.py).

Stage: kernels (per-kernel stages).
"""
