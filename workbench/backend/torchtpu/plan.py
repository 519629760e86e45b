"""What a run on TorchTPU uses: device ``tpu``, process group ``tpu``, ``torch.compile(backend="tpu")``.

TorchTPU runs the way the native CUDA backend does (`workbench.train.ranks`): one process per chip
under torchrun, a ``torch.distributed`` process group, DDP for ``mesh.data`` and FSDP2 on a DTensor
``DeviceMesh`` for ``mesh.fsdp`` (`workbench.parallel.torch_parallel`, with ``tpu`` as the mesh's
device type). What it does not have is GSPMD, the sharding annotations torch_xla partitions a single
process's program by: ``mesh.model > 1`` (tensor parallelism) is refused here with what to use
instead (`refuse_unsupported_mesh`).

`local_devices` is the one function that imports TorchTPU; it runs on a TPU host only.
"""

from __future__ import annotations

import os
from typing import Any

from workbench.config import ConfigError

DEVICE_TYPE = "tpu"
"""``torch.device("tpu")``: TorchTPU renames PyTorch's PrivateUse1 backend."""
PROCESS_GROUP_BACKEND = "tpu"
"""``torch.distributed.init_process_group("tpu")``: TorchTPU's collectives."""
COMPILE_BACKEND = "tpu"
"""``torch.compile(model, backend="tpu", dynamic=False)``: Dynamo graphs lowered through XLA to the chip."""


class TorchTPUMeshError(ConfigError):
    """A mesh setting TorchTPU cannot run; the message names the field and what to use instead."""


def refuse_unsupported_mesh(mesh_cfg: Any) -> None:
    """`TorchTPUMeshError` for ``mesh.model > 1``: GSPMD tensor parallelism is torch_xla's alone."""
    model = int(mesh_cfg.model)
    if model != 1:
        raise TorchTPUMeshError(
            f"mesh.model={model} is not supported on TorchTPU: tensor parallelism here is torch_xla's GSPMD "
            "sharding, which TorchTPU does not have; set mesh.model=1 and shard with mesh.fsdp (FSDP2) or "
            "replicate with mesh.data (DDP), or install torch_xla instead of torch-tpu for mesh.model"
        )


def local_devices() -> tuple[str, int]:  # pragma: no cover - TorchTPU on a TPU host only
    """(device kind, chips this process sees), e.g. ``('TPU v6e-8', 8)``, from TorchTPU itself."""
    import torch
    import torch_tpu  # noqa: F401  registers the tpu device (its torch.backends entry point does too)

    count = int(torch.accelerator.device_count())
    accelerator = os.environ.get("TPU_ACCELERATOR_TYPE", "").strip()
    return (f"TPU {accelerator}" if accelerator else "TPU"), count
