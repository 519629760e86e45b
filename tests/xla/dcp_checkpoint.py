"""CheckpointManager on SPMD-sharded tensors: through torch DCP, and the full-tensor fallback for
sharded and partially replicated tensors, the finiteness check of a save's local shards, and the XLA
device's RNG seed in a checkpoint's RNG state (tests/test_checkpoint.py)."""

from __future__ import annotations

from typing import Any

import torch

from tests.xla import run
from workbench.backend.hardware import detect
from workbench.backend.protocol import OneProcess
from workbench.backend.selection import backend_for
from workbench.backend.xla import runtime
from workbench.train.checkpoint import CheckpointManager
from workbench.train.finite import first_non_finite
from workbench.train.state_io import capture_rng, host_shards, restore_rng


def main(checkpoint_dir: str, hsdp_dir: str) -> dict[str, Any]:
    runtime.use_spmd()
    backend = backend_for(detect("xla"))
    one_process = OneProcess(backend)
    dev = runtime.device()
    mesh = runtime.spmd_mesh(list(range(8)), (8, 1), ("fsdp", "model"))
    w = torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16).to(dev)
    runtime.mark_sharding(w, mesh, ("fsdp", None))
    b = torch.ones(16).to(dev)
    manager = CheckpointManager(checkpoint_dir, sharded=True, replicas=one_process)
    path = manager.save(4, {"model": {"w": w, "b": b}, "step": 4})
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    with torch.no_grad():
        w.zero_()
        b.zero_()
    runtime.sync()
    spec_before = runtime.sharding_spec(w)
    loaded = manager.load(into={"model": {"w": w, "b": b}})
    expected = torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16)
    # a manager of its own (no run's backend): the planner follows the targets' device (torch_xla's)
    with torch.no_grad():
        w.zero_()
    runtime.sync()
    reloaded = CheckpointManager(checkpoint_dir).load(into={"model": {"w": w, "b": b}})
    w_ok_without_a_backend = (
        bool(torch.equal(reloaded["model"]["w"].cpu(), expected)) and reloaded["model"]["w"] is w
    )
    # data x fsdp: sharded *and* partially replicated. torch_xla's planner drops such tensors
    # on one process, so the manager verifies DCP's index and falls back to full tensors.
    hsdp = runtime.spmd_mesh(list(range(8)), (2, 4), ("data", "fsdp"))
    v = (torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16) * 2).to(dev)
    runtime.mark_sharding(v, hsdp, ("fsdp", None))
    hsdp_path = CheckpointManager(hsdp_dir, sharded=True, replicas=one_process).save(1, {"model": {"v": v}})
    hsdp_files = sorted(p.name for p in hsdp_path.iterdir())
    hsdp_ok = bool(torch.equal(CheckpointManager(hsdp_dir).load()["model"]["v"], expected * 2))
    # an uneven split (60 rows over 8 devices): the last shard's padding is not the state, whatever it holds
    u = torch.ones(60, 4).to(dev)
    runtime.mark_sharding(u, mesh, ("fsdp", None))
    shards = host_shards({"u": u}, backend)["u"]
    padded = max(shards.shards, key=lambda shard: shard.indices[0].start)
    padded.data[padded.unpadded_data.shape[0] :] = float("nan")
    padding_ignored = first_non_finite({"model": {"u": shards}}) is None
    padded.data[0, 0] = float("inf")
    # the device's seed under "xla" (old checkpoints' key); a state another backend wrote leaves it be
    rng = capture_rng(backend)
    restore_rng({**rng, "xla": 7}, backend)
    seed_restored = runtime.rng_state() == 7
    restore_rng(capture_rng(), backend)
    return {
        "files": files,
        "w_ok": bool(torch.equal(loaded["model"]["w"].cpu(), expected)),
        "w_in_place": loaded["model"]["w"] is w,
        "w_ok_without_a_backend": w_ok_without_a_backend,
        "spec_kept": runtime.sharding_spec(w) == spec_before and "devices=" in spec_before,
        "b_ok": bool(torch.equal(b.cpu(), torch.ones(16))),
        "step": loaded["step"],
        "hsdp_files": hsdp_files,
        "hsdp_ok": hsdp_ok,
        "padding_rows": int(padded.data.shape[0] - padded.unpadded_data.shape[0]),
        "padding_ignored": padding_ignored,
        "non_finite_found": first_non_finite({"model": {"u": shards}}),
        "rng_seed_is_an_int": isinstance(rng["xla"], int),
        "rng_seed_restored": seed_restored,
        "rng_seed_kept_by_a_host_state": runtime.rng_state() == 7,
    }


if __name__ == "__main__":
    run(main)
