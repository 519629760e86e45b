"""Watches a ``python -m workbench train`` process for tests/test_distributed.py, changing nothing it does.

Python imports `sitecustomize` at start-up from its path. The test puts this directory on
PYTHONPATH, with WB_PROBE_DIR set, for the runs it watches; the ranks that torchrun (or ``--nproc``)
starts inherit both. In a process that trains (a torchrun rank, with RANK set, or one started with
WB_PROBE_SINGLE=1) the main rank records under WB_PROBE_DIR:

- ``saved-<step>.pt``: the state a checkpoint save is handed (`CheckpointManager.snapshot`), every
  tensor whole (FSDP2's shards put together with ``DTensor.full_tensor``, which every rank calls in the
  same order): what the run held, read beside the checkpoint's own write path;
- ``loaded-<step>.pt``: the same, right after a resume loaded a checkpoint (`TrainingState.load`);
- ``metrics-writes``: a line naming the rank each time a call wrote ``--metrics-out``.
"""

from __future__ import annotations

import os


def _install(out: str) -> None:
    from pathlib import Path

    import torch

    from tests.dist import flat_state
    from workbench import run
    from workbench.train import checkpoint, state

    rank = int(os.environ.get("RANK", "0"))
    directory = Path(out)

    def whole(value):
        if isinstance(value, torch.Tensor):
            from torch.distributed.tensor import DTensor

            value = value.full_tensor() if isinstance(value, DTensor) else value
            return value.detach().cpu().clone()
        return value

    def record(name: str, held) -> None:
        flat = {key: whole(value) for key, value in flat_state(held)}  # collective: every rank runs it
        if rank == 0:
            torch.save(flat, directory / name)

    snapshot = checkpoint.CheckpointManager.snapshot

    def snapshot_recorded(self, step, held, **kwargs):
        record(f"saved-{step}.pt", held)
        return snapshot(self, step, held, **kwargs)

    load = state.TrainingState.load

    def load_recorded(self, checkpoints, path, config=None):
        load(self, checkpoints, path, config)
        record(f"loaded-{self.loop.step}.pt", self.state_dict(config or {}))

    write_metrics = run._write_metrics

    def write_metrics_recorded(path, *args, **kwargs):
        def stamp():
            return (
                (os.stat(path).st_ino, os.stat(path).st_mtime_ns) if path and os.path.exists(path) else None
            )

        before = stamp()
        write_metrics(path, *args, **kwargs)
        if stamp() != before:
            with open(directory / "metrics-writes", "a") as log:
                log.write(f"{rank}\n")

    checkpoint.CheckpointManager.snapshot = snapshot_recorded
    state.TrainingState.load = load_recorded
    run._write_metrics = write_metrics_recorded


if os.environ.get("WB_PROBE_DIR") and (os.environ.get("RANK") or os.environ.get("WB_PROBE_SINGLE")):
    _install(os.environ["WB_PROBE_DIR"])
