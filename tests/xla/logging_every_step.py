"""A Trainer run on one XLA device that logs every step (tests/test_train.py)."""

from __future__ import annotations

from typing import Any

from tests.test_train import tiny_cfg, token_dataset
from tests.xla import run
from workbench.train import Trainer
from workbench.train.optim import lr_multiplier


def main() -> dict[str, Any]:
    cfg = tiny_cfg(
        **{"train.device_type": "xla", "train.steps": 5, "train.log_every": 1, "train.max_grad_norm": 1.0}
    )
    trainer = Trainer(cfg, train_dataset=token_dataset(32))
    r = trainer.fit()
    t = cfg.train
    expected_lr = [
        t.learning_rate
        * lr_multiplier(s, warmup_steps=t.warmup_steps, total_steps=t.steps, min_lr_ratio=t.min_lr_ratio)
        for s in range(t.steps)
    ]
    return {
        "transfers": [m["transfers"] for m in r.history],
        "grad_norms": [m["grad_norm"] for m in r.history],
        "lr": [m["lr"] for m in r.history],
        "expected_lr": expected_lr,
        "advice": [a.kind for a in trainer.profiler.advice()],
    }


if __name__ == "__main__":
    run(main)
