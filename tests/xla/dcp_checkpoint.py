"""CheckpointManager on SPMD-sharded tensors: through torch DCP, and the full-tensor fallback for
sharded and partially replicated tensors (tests/test_checkpoint.py)."""

from __future__ import annotations

from typing import Any

import torch

from tests.xla import run
from workbench.backend import runtime
from workbench.train.checkpoint import CheckpointManager


def main(checkpoint_dir: str, hsdp_dir: str) -> dict[str, Any]:
    runtime.use_spmd()
    dev = runtime.device()
    mesh = runtime.spmd_mesh(list(range(8)), (8, 1), ("fsdp", "model"))
    w = torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16).to(dev)
    runtime.mark_sharding(w, mesh, ("fsdp", None))
    b = torch.ones(16).to(dev)
    manager = CheckpointManager(checkpoint_dir, sharded=True)
    path = manager.save(4, {"model": {"w": w, "b": b}, "step": 4})
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    with torch.no_grad():
        w.zero_()
        b.zero_()
    runtime.sync()
    spec_before = runtime.sharding_spec(w)
    loaded = manager.load(into={"model": {"w": w, "b": b}})
    expected = torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16)
    # data x fsdp: sharded *and* partially replicated. torch_xla's planner drops such tensors
    # on one process, so the manager verifies DCP's index and falls back to full tensors.
    hsdp = runtime.spmd_mesh(list(range(8)), (2, 4), ("data", "fsdp"))
    v = (torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16) * 2).to(dev)
    runtime.mark_sharding(v, hsdp, ("fsdp", None))
    hsdp_path = CheckpointManager(hsdp_dir, sharded=True).save(1, {"model": {"v": v}})
    hsdp_files = sorted(p.name for p in hsdp_path.iterdir())
    hsdp_ok = bool(torch.equal(CheckpointManager(hsdp_dir).load()["model"]["v"], expected * 2))
    return {
        "files": files,
        "w_ok": bool(torch.equal(loaded["model"]["w"].cpu(), expected)),
        "w_in_place": loaded["model"]["w"] is w,
        "spec_kept": runtime.sharding_spec(w) == spec_before and "devices=" in spec_before,
        "b_ok": bool(torch.equal(b.cpu(), torch.ones(16))),
        "step": loaded["step"],
        "hsdp_files": hsdp_files,
        "hsdp_ok": hsdp_ok,
    }


if __name__ == "__main__":
    run(main)
