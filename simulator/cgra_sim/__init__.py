"""cgra_sim: the CGRA NPU's hardware description, instruction set and cycle-approximate simulator.

Usable on its own: nothing in this package imports tvm.
"""

from .arch import DEFAULT_ARCH, ArchError, HardwareDescription, load_arch, preset_names
from .errors import CommandError, CycleLimitExceeded, LaunchError, SimulatorError
from .simulate import SimulationResult, run_functional, simulate, simulate_detailed
from .stats import KernelStats
from .timing import DEFAULT_MAX_CYCLES, Schedule

__all__ = [
    "DEFAULT_ARCH", "ArchError", "HardwareDescription", "load_arch", "preset_names",
    "SimulatorError", "LaunchError", "CommandError", "CycleLimitExceeded",
    "simulate", "simulate_detailed", "run_functional", "SimulationResult", "Schedule",
    "KernelStats", "DEFAULT_MAX_CYCLES",
]
