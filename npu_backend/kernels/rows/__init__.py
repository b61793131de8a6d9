"""The row families on the vector unit: softmax.py, norms.py (layer norm, RMSNorm) and
row_reduce.py (sum / mean / max along the last axis), each a program of REDUCE, VFUNC and ELTWISE
steps over tiles of whole rows (rows.py; rows longer than the scratchpad in passes over column
tiles, rows_long.py). docs/transformer-ops.md.

Stage: kernels (per-kernel stages).
"""
