"""Kernels that fuse several convolutions: separable.py (a depthwise conv2d and the 1x1 after it)
and inverted_residual.py (MobileNetV2's block), each with its tile search (*_tiles.py).

Stage: kernels (per-kernel stages).
"""
