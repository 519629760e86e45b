"""The multihost facts on XLA, asked before SPMD is switched on (tests/test_multihost.py)."""

from __future__ import annotations

from typing import Any

from tests.xla import run
from workbench.backend import multihost
from workbench.backend.xla import runtime
from workbench.parallel.mesh import MeshSpec


def main() -> dict[str, Any]:
    facts = [multihost.process_index(), multihost.process_count(), multihost.is_main()]
    mesh = MeshSpec(data=1, fsdp=8).build()  # asking the runtime did not lock SPMD out
    return {"facts": facts, "spmd": runtime.is_spmd(), "mesh": list(mesh.mesh_shape)}


if __name__ == "__main__":
    run(main)
