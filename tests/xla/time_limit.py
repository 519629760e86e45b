"""A run under `train.time_limit` on 8 XLA:CPU devices (FSDP): it stops before the limit with its last
checkpoint (written in the background through DCP, every few seconds) complete, and a re-run resumes
to the end as if never stopped (tests/test_session_end.py)."""

from __future__ import annotations

import time
from typing import Any

from tests.test_train import tiny_cfg, token_dataset
from tests.xla import run
from tests.xla.fsdp_resume import COMMON as FSDP_RUN
from workbench.train import Trainer
from workbench.train.checkpoint import CheckpointManager

COMMON = {**FSDP_RUN, "train.steps": 60}  # the FSDP resume scenario's run, longer


def main(checkpoint_dir: str, limit_s: float = 30.0, step_sleep_s: float = 0.5) -> dict[str, Any]:
    data = token_dataset(48)
    straight = [m["loss"] for m in Trainer(tiny_cfg(**COMMON), train_dataset=data).fit().history]

    def slow_step(metrics: dict[str, Any]) -> None:  # 60 steps of this would outlast the limit
        time.sleep(step_sleep_s)

    cfg = {**COMMON, "train.checkpoint_dir": checkpoint_dir, "train.checkpoint_every": "4s"}
    start = time.monotonic()
    limited = Trainer(
        tiny_cfg(**cfg, **{"train.time_limit": limit_s}), train_dataset=data, callbacks=[slow_step]
    )
    stopped = limited.fit()
    elapsed = time.monotonic() - start
    manager = CheckpointManager(checkpoint_dir)
    manager.verify(stopped.checkpoint_path)
    saved_steps = [manager.step_of(p) for p in manager.checkpoints()]
    resumed = Trainer(tiny_cfg(**cfg), train_dataset=data).fit()
    return {
        "straight": straight,
        "stopped_steps": stopped.steps,
        "time_limited": stopped.time_limited,
        "elapsed_s": elapsed,
        "limit_s": limit_s,
        "stopped_checkpoint": stopped.checkpoint_path,
        "saved_steps": saved_steps,
        "stalls": [m["checkpoint_stall_s"] for m in stopped.history if m["checkpoint_stall_s"] is not None],
        "planned": [m["planned_stop_step"] for m in stopped.history],
        "notices": stopped.notices,
        "resumed": [m["loss"] for m in resumed.history],
        "resumed_steps": [m["step"] for m in resumed.history],
        "resumed_compiles_after_warmup": resumed.compiles_after_warmup,
        "files": sorted(p.name for p in manager.latest().iterdir()),
    }


if __name__ == "__main__":
    run(main)
