"""cgra_sim: the CGRA NPU's hardware description, instruction set and cycle-approximate simulator.

Usable on its own: nothing in this package imports tvm.
"""

from .arch import DEFAULT_ARCH, ArchError, HardwareDescription, load_arch, preset_names
from .errors import CommandError, CycleLimitExceeded, LaunchError, SimulatorError
from .simulate import SimulationResult, run_functional, simulate, simulate_detailed
from .stats import KernelStats
from .replay import ReplayResult, replay
from .stream_file import Launch, StreamFileError, TensorSpec, load_launch, save_launch
from .timing import DEFAULT_MAX_CYCLES, Timeline
from .trace import TracedLaunch, chrome_trace, write_chrome_trace



def __getattr__(name):
    if name == "Schedule":  # renamed: an s_tir Schedule is the compiler's; this is a timing result
        from .renamed import warn_renamed

        warn_renamed("cgra_sim.Schedule", "cgra_sim.Timeline")
        return Timeline
    raise AttributeError(f"module 'cgra_sim' has no attribute '{name}'")


__all__ = [
    "DEFAULT_ARCH", "ArchError", "HardwareDescription", "load_arch", "preset_names",
    "SimulatorError", "LaunchError", "CommandError", "CycleLimitExceeded",
    "simulate", "simulate_detailed", "run_functional", "SimulationResult", "Timeline",
    "KernelStats", "DEFAULT_MAX_CYCLES",
    "Launch", "TensorSpec", "save_launch", "load_launch", "replay", "ReplayResult", "StreamFileError",
    "TracedLaunch", "chrome_trace", "write_chrome_trace",
]
