"""The environment of a child process that runs torch_xla on virtual CPU devices.

A mesh that this machine does not have is compiled for real on ``CPU_NUM_DEVICES`` virtual
XLA:CPU devices in a subprocess (`workbench.train.step_hlo`); its environment is the parent's with
the XLA settings replaced, the parent's compile-log switches left out (the child's compiles are
not the run's), and extra ``XLA_FLAGS`` (an HLO dump) appended to the user's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def virtual_devices_environment(
    devices: int, *, xla_flags: str = "", base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """`base` (default: this process's environment) set up for `devices` virtual XLA:CPU devices."""
    env = {
        k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("PT_XLA_DEBUG")
    }
    env.update(
        {
            "PJRT_DEVICE": "CPU",
            "CPU_NUM_DEVICES": str(devices),
            "XLA_FLAGS": f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip(),
            "TF_CPP_MIN_LOG_LEVEL": env.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        }
    )
    return env
