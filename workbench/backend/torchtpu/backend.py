"""TorchTPU as a `Backend` (TPU-only, not yet run on a TPU: tested here for routing alone).

TorchTPU's execution model is native torch's on a device named ``tpu``: eager by default,
``torch.compile(backend="tpu")`` for graphs, one process per chip under torchrun with a ``tpu``
process group; no GSPMD (`plan.refuse_unsupported_mesh`).
"""

from __future__ import annotations

from typing import Any

from workbench.backend.native.torch_native import NativeTorch
from workbench.backend.torchtpu import plan


class TorchTpu(NativeTorch):
    """TorchTPU's ``tpu`` device (see the module docstring)."""

    name = "torchtpu"

    def joins_torchrun(self, cfg: Any) -> bool:
        """Yes, with no GSPMD: ``mesh.model > 1`` is refused, with or without torchrun."""
        plan.refuse_unsupported_mesh(cfg.mesh)
        return True

    def wait(self) -> None:
        """Nothing to wait for that this module can name: TorchTPU's own synchronize is not public."""

    def describe(self) -> str:
        return f"torchtpu on {plan.DEVICE_TYPE} (compile backend {plan.COMPILE_BACKEND!r})"
