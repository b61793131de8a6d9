"""Python's garbage collector, paused while a model compiles.

Stage: shared (target/relax_pipeline.py: cgra_pipeline runs every stage inside `gc_paused`).
"""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector off for the block. A compile allocates objects by the
    million, and every so many the collector walks every object of the process (250,000 after
    importing TVM): 0.13 s of ShuffleNetV2's one-second compile. The compile makes little cyclic
    garbage; what it makes waits for the next collection after it. Kernel workers forked inside
    (target/parallel.py) inherit the pause, so they do not write to every page they share with
    this process either."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
