"""The POOL family (pool.py), its windows and tile search (pool_tiles.py) and the global pools
(global_pool.py).

Stage: kernels (per-kernel stages).
"""
