"""The Trainer with ``train.loss_chunk_tokens`` on 8 virtual XLA:CPU devices, mesh data=2 x fsdp=2 x
model=2 (tests/test_chunked_loss.py).

A tiny run trained twice from the same seed, the loss in chunks of 8 tokens per device (8
positions of the one row each device holds), then plain (``loss_chunk_tokens=0``), with an eval
pass. Reported for each: the logged losses, the eval loss, the programs compiled after warm-up,
and the notices.
"""

from __future__ import annotations

from typing import Any

from tests.test_train import tiny_cfg, token_dataset
from tests.xla import run
from workbench.train import Trainer

MESH = {"mesh.enabled": True, "mesh.data": 2, "mesh.fsdp": 2, "mesh.model": 2, "train.device_type": "xla"}


def fit(tokens: int) -> dict[str, Any]:
    opts = {"train.steps": 4, "train.log_every": 1, "train.eval_every": 4, "train.loss_chunk_tokens": tokens}
    cfg = tiny_cfg(**MESH, **opts)
    trainer = Trainer(cfg, train_dataset=token_dataset(32), eval_dataset=token_dataset(8, seed=1))
    result = trainer.fit()
    return {
        "losses": [m["loss"] for m in result.history],
        "eval_loss": trainer.last_eval_loss,
        "after": result.compiles_after_warmup,
        "notices": list(result.notices),
    }


def main(tokens: int = 8) -> dict[str, Any]:
    return {"chunked": fit(tokens), "plain": fit(0)}


if __name__ == "__main__":
    run(main)
