"""The vector unit's and the fabric's elementwise families: eltwise.py (ELTWISE), activation.py (a
relu or clip on the EPILOGUE), fabric.py (a chain as one FABRIC body) and sigmoid.py (the
smooth activations).

Stage: kernels (per-kernel stages).
"""
