"""Which `Backend` a process runs on: `backend_for` (from detection's hardware) and `backend_of` (from
the tensors at hand, for a caller that holds none).

It sits above the protocol (`workbench.backend.protocol`) and its three implementations, each in its
room (`xla.spmd.XlaSpmd`, `native.torch_native.NativeTorch`, `torchtpu.backend.TorchTpu`), which build
on the protocol: so the protocol never imports what implements it. Nothing here starts a runtime or
imports torch_xla: the rooms import it on first use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from workbench.backend import routing
from workbench.backend.hardware import HardwareInfo, detect
from workbench.backend.native.torch_native import NativeTorch
from workbench.backend.protocol import Backend
from workbench.backend.torchtpu.backend import TorchTpu
from workbench.backend.xla import runtime
from workbench.backend.xla.spmd import XlaSpmd


def backend_of(tensors: Sequence[torch.Tensor]) -> Backend:
    """The `Backend` of the device `tensors` are on, for a caller that holds none (a checkpoint read
    outside a run): torch_xla's when any is an XLA tensor, else plain torch's on the CPU."""
    on_xla = any(runtime.is_xla_tensor(t) for t in tensors)
    return backend_for(dataclasses.replace(detect("cpu"), via_xla=on_xla))


def backend_for(hw: HardwareInfo | None) -> Backend:
    """The `Backend` of detection's `hw`, by routing's one rule (`routing.execution_backend`): torch_xla
    where it runs through XLA, TorchTPU on its ``tpu`` device, else plain torch. None (a caller told no
    hardware): this process's CPU, through torch_xla once the process imported it (nothing is detected,
    no runtime started)."""
    if hw is None:
        hw = dataclasses.replace(detect("cpu"), via_xla=runtime.xla_imported())
    kinds: dict[str, type[Backend]] = {"torch_xla": XlaSpmd, "torchtpu": TorchTpu}
    return kinds.get(routing.execution_backend(hw), NativeTorch)(hw)
