"""Attention as one kernel: the scores stay in the scratchpad (attention.py, its tile search in
attention_tiles.py)."""
