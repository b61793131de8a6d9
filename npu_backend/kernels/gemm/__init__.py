"""The PE array's GEMM families: conv2d.py and matmul.py (patterns and specs), gemm.py (their tile
search and schedule), epilogue.py (the fused chain after them) and depthwise.py (DEPTHWISE, its
specs from the conv2d reader).

Stage: kernels (per-kernel stages).
"""
