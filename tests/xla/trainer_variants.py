"""Optimizer / precision / checkpointing variants of a Trainer run on one XLA device
(tests/test_train.py)."""

from __future__ import annotations

from typing import Any

from tests.test_train import tiny_cfg, token_dataset
from tests.xla import run
from workbench.train import Trainer

VARIANTS: dict[str, dict[str, Any]] = {
    "adafactor + bf16-mixed": {"train.optimizer": "adafactor", "train.precision": "bf16-mixed"},
    "bf16 + checkpointing + accumulation": {
        "train.precision": "bf16",
        "train.gradient_checkpointing": True,
        "train.grad_accum": 2,
        "train.batch_size": 2,
    },
}


def main() -> dict[str, Any]:
    results = {}
    for name, opts in VARIANTS.items():
        cfg = tiny_cfg(**{"train.device_type": "xla", "train.steps": 4, "train.log_every": 2}, **opts)
        trainer = Trainer(cfg, train_dataset=token_dataset(32))
        r = trainer.fit()
        model = trainer.model
        results[name] = {
            # the config ties the LM head to the input embedding: one tensor, trained once
            "tied": model.get_output_embeddings().weight is model.get_input_embeddings().weight,
            "after": r.compiles_after_warmup,
            "losses": [m["loss"] for m in r.history],
            "transfers": [m["transfers"] for m in r.history],
        }
    return results


if __name__ == "__main__":
    run(main)
