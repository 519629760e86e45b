"""Where a model's layer checkpoints can live in host memory (``train.offload_activations``).

Offload needs checkpointing: it moves the checkpoints, each layer's saved input, and recomputes the
rest as checkpointing does. On XLA the scanned layer stack does it (`workbench.models.scan`, through
`workbench.backend.xla.host_offload`); an unrolled XLA stack cannot (torch_xla's checkpoint has no
offload). On plain torch the layers' checkpoint function does it
(`workbench.backend.native.offload`, installed by `workbench.models.build.enable_gradient_checkpointing`).
`offload_choice` decides for a prepared model; `checkpoints_offloaded` reads it back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workbench.config import ConfigError


def offload_choice(
    train: Any, offload: bool | None, *, xla: bool, scan: bool, notice: Callable[[str], None] | None
) -> bool:
    """Whether a model prepared with `train` (a `TrainConfig`) offloads: `offload` (None: whether
    ``train.offload_activations`` is 'on'), with gradient checkpointing, and on XLA only under the
    scanned stack: 'on' with an unrolled XLA stack is a `ConfigError`, 'auto' says why it stays off.
    On XLA:CPU `notice` hears that the checkpoints stay put (its host memory is the device's)."""
    wanted = train.offload_activations == "on" if offload is None else offload
    if not (wanted and train.gradient_checkpointing):
        return False
    if xla and not scan:
        why = "on XLA the layers' checkpoints are offloaded under the scanned stack, and this one is unrolled"
        if train.offload_activations == "on":
            raise ConfigError(
                f"train.offload_activations='on' is not allowed here: {why} (model.scan_layers: true or "
                "auto with a family whose layers scan; or train.offload_activations: off)"
            )
        if notice is not None:
            notice(f"train.offload_activations=auto: off, {why}")
        return False
    if xla and notice is not None:
        from workbench.backend.xla import host_offload

        placement = host_offload.placement_notice()
        if placement is not None:
            notice(placement)
    return True


def checkpoints_offloaded(model: Any) -> bool:
    """Whether `model` keeps its layers' checkpoints in host memory: its scanned stack offloads, or
    its layers checkpoint through `workbench.backend.native.offload.offloaded_checkpoint_function`."""
    for module in model.modules():
        if getattr(module, "offload", False) is True and hasattr(module, "remat"):  # a ScannedLayers
            return True
        if hasattr(getattr(module, "_gradient_checkpointing_func", None), "offload"):
            return bool(getattr(module, "gradient_checkpointing", False))
    return False


__all__ = ["checkpoints_offloaded", "offload_choice"]
