"""A training process for the SIGKILL drill (tests/test_session_end.py): the tiny CPU run, a checkpoint
after every step written in the background, optionally to a slow target, its progress in a file.

    python -m tests.kill_drill '{"checkpoint_dir": "...", "progress": "...", "seconds_per_block": 0.2}'

Killed at random moments and started again, it resumes from its last complete checkpoint each time.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

STEPS = 12


def main(checkpoint_dir: str, progress: str, seconds_per_block: float = 0.0) -> None:
    from tests.test_train import tiny_cfg, token_dataset
    from workbench.train import Trainer, state_io

    if seconds_per_block:
        real = state_io.write_block

        def slow(handle: Any, block: Any) -> None:  # a slow mount: the writes are where kills land
            time.sleep(seconds_per_block)
            real(handle, block)

        state_io.write_block = slow

    def record(metrics: dict[str, Any]) -> None:
        Path(progress).write_text(str(metrics["step"]))

    cfg = tiny_cfg(
        **{
            "train.steps": STEPS,
            "train.grad_accum": 2,
            "train.batch_size": 2,
            "train.checkpoint_dir": checkpoint_dir,
            "train.checkpoint_every": 1,
            "train.keep_checkpoints": 2,
            "train.async_checkpoint": True,
        }
    )
    Trainer(cfg, train_dataset=token_dataset(24), callbacks=[record]).fit()


if __name__ == "__main__":
    main(**json.loads(sys.argv[1]))
