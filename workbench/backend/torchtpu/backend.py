"""TorchTPU as a `Backend` (TPU-only, not yet run on a TPU: tested here for routing alone).

TorchTPU's execution model is native torch's on a device named ``tpu``: eager by default,
``torch.compile(backend="tpu")`` for graphs, one process per chip under torchrun with a ``tpu``
process group; no GSPMD (`plan.refuse_unsupported_mesh`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from workbench.backend.native.torch_native import NativeTorch
from workbench.backend.torchtpu import plan


class TorchTpu(NativeTorch):
    """TorchTPU's ``tpu`` device (see the module docstring)."""

    name = "torchtpu"

    def joins_torchrun(self, cfg: Any) -> bool:
        """Yes, with no GSPMD: ``mesh.model > 1`` is refused, with or without torchrun."""
        plan.refuse_unsupported_mesh(cfg.mesh)
        return True

    def autocast(self, precision: str) -> contextlib.AbstractContextManager:
        """bf16 autocast on ``tpu`` where TorchTPU registers one; else none (fp32 compute), which is
        what torch gives a device without autocast (TorchTPU's docs do not say; not run on a TPU)."""
        try:
            available = torch.amp.is_autocast_available(plan.DEVICE_TYPE)
        except RuntimeError:  # torch knows no device 'tpu' until TorchTPU renames PrivateUse1
            available = False
        return super().autocast(precision) if available else contextlib.nullcontext()

    def wait(self) -> None:
        """No explicit wait: queued work is waited for at the next host read (which TorchTPU call
        would wait sooner is not checked, not having run on a TPU)."""

    def describe(self) -> str:
        return f"torchtpu on {plan.DEVICE_TYPE} (compile backend {plan.COMPILE_BACKEND!r})"
