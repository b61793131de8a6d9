"""The layout family: layout ops as DMA-only copy kernels (layout.py, copy_kernel.py)."""
