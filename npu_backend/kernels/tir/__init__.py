"""A user's PrimFunc called with R.call_tir, offloaded (tir.py), and the reading of its elementwise
block's expression (tir_exprs.py).

Stage: kernels (per-kernel stages).
"""
