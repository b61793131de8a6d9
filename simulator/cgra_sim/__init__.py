"""cgra_sim: the CGRA NPU's hardware description, instruction set and cycle-approximate simulator.

Usable on its own: nothing in this package imports tvm.
"""

from .arch import DEFAULT_ARCH, ArchError, HardwareDescription, load_arch, preset_names

__all__ = ["DEFAULT_ARCH", "ArchError", "HardwareDescription", "load_arch", "preset_names"]
