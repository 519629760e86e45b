"""Packed rows in a sharded Trainer run (data=2 x fsdp=4 over 8 devices): the position-ids layout,
whose block-diagonal mask `workbench.models.inputs.model_inputs` builds on the device, makes no
host transfer between log steps under transformers 4.x and 5.x (tests/test_bucketing.py)."""

from __future__ import annotations

from typing import Any

from tests.test_train import tiny_cfg, token_dataset
from tests.xla import run
from workbench.data.loader import make_loader
from workbench.train import Trainer


def main() -> dict[str, Any]:
    import transformers

    cfg = tiny_cfg(
        **{
            "mesh.enabled": True,
            "mesh.data": 2,
            "mesh.fsdp": 4,
            "train.device_type": "xla",
            "bucketing.packing": True,
            "train.batch_size": 8,
            "train.steps": 6,
            "train.log_every": 3,
        }
    )
    trainer = Trainer(cfg, train_dataset=token_dataset(96))
    result = trainer.fit()
    loader, _ = make_loader(token_dataset(96), cfg, pad_token_id=0)
    batch = next(iter(loader))  # what the run's loader collates
    return {
        "transformers": transformers.__version__,
        "keys": sorted(batch),
        "packing": trainer.sampler.notes["packing"],
        "compiles_after_warmup": result.compiles_after_warmup,
        "losses": [m["loss"] for m in result.history],
        "transfers": [m["transfers"] for m in result.history],
    }


if __name__ == "__main__":
    run(main)
