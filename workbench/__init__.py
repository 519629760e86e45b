"""XLA Workbench: train and fine-tune transformer LMs on TPUs (PyTorch/XLA), with GPU and CPU fallback.

Importing this package starts no runtime: torch_xla is only imported (through
`workbench.backend.xla.runtime`) when a function needs it, e.g. `hardware.detect()`.
"""

from workbench import interrupt

try:  # Ctrl-C here, the first moment of `python -m workbench`: one line and 130 (`workbench.interrupt`)
    # the objectives train.objective can name register themselves (light: no torch until a run starts)
    import workbench.objectives  # noqa: F401
    from workbench.backend.hardware import HardwareError, HardwareInfo, detect
    from workbench.config import ConfigError, WorkbenchConfig, load_config

    # Imported last and by name: the function `doctor` replaces the subpackage of the same name as the
    # package attribute, so `from workbench import doctor` always gives the function (cheap: no torch).
    from workbench.doctor import doctor
except KeyboardInterrupt:
    interrupt.exit_if_the_command()
    raise

__all__ = [
    "ConfigError",
    "HardwareError",
    "HardwareInfo",
    "WorkbenchConfig",
    "detect",
    "doctor",
    "load_config",
]
__version__ = "0.1.0"
