"""Resume an FSDP run from its sharded checkpoint after a crash; prewarm on and off
(tests/test_train.py)."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from tests.test_train import tiny_cfg, token_dataset
from tests.xla import run
from workbench.train import Trainer

COMMON = {
    "mesh.enabled": True,
    "mesh.data": 1,
    "mesh.fsdp": 8,
    "train.device_type": "xla",
    "train.batch_size": 8,
    "train.steps": 6,
    "train.log_every": 1,
}


class Crash(RuntimeError):
    pass


def crash_at_step_4(metrics: dict[str, Any]) -> None:
    if metrics["step"] == 4:
        raise Crash


def main(checkpoint_dir: str) -> dict[str, Any]:
    data = token_dataset(48)
    straight = [m["loss"] for m in Trainer(tiny_cfg(**COMMON), train_dataset=data).fit().history]
    # prewarm runs real steps on synthetic batches and restores the state: it must not change training
    unwarmed_cfg = tiny_cfg(**COMMON, **{"train.prewarm": False})
    unwarmed = [m["loss"] for m in Trainer(unwarmed_cfg, train_dataset=data).fit().history]

    cfg = tiny_cfg(**COMMON, **{"train.checkpoint_dir": checkpoint_dir, "train.checkpoint_every": 3})
    with contextlib.suppress(Crash):
        Trainer(cfg, train_dataset=data, callbacks=[crash_at_step_4]).fit()
    resumed = Trainer(cfg, train_dataset=data).fit()
    return {
        "straight": straight,
        "unwarmed": unwarmed,
        "resumed": [m["loss"] for m in resumed.history],
        "steps": [m["step"] for m in resumed.history],
        "files": sorted(os.listdir(resumed.checkpoint_path)),
        "notices": resumed.notices,
        "compiles_after_warmup": resumed.compiles_after_warmup,
        "recompiled_steps": [m["step"] for m in resumed.history if m["recompiled"]],
    }


if __name__ == "__main__":
    run(main)
