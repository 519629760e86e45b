"""MeshSpec.build() once the device was used without SPMD (tests/test_sharding.py).

torch_xla 2.9: use_spmd() after torch_xla.device() "works" and then segfaults at the next
execution (pytorch/xla#9735). build() must refuse instead, and say how to fix it.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.xla import run
from workbench.backend.xla import runtime
from workbench.parallel.mesh import MeshError, MeshSpec


def main() -> dict[str, Any]:
    errors = []
    runtime.device()  # only asks for the device: already fixes non-SPMD mode
    for _ in range(2):
        try:
            MeshSpec(fsdp=8, data=1).build()
            errors.append(None)
        except MeshError as err:
            errors.append(str(err))
        x = torch.ones(4, 4, device=runtime.device())
    return {"errors": errors, "spmd": runtime.is_spmd(), "sum": float(x.sum())}


if __name__ == "__main__":
    run(main)
