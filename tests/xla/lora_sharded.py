"""A LoRA run on 8 XLA:CPU devices, mesh data=2 x fsdp=2 x model=2: per-step losses (compared with
the same run on plain CPU by tests/test_lora.py), the frozen base bit-identical after training,
where base weights and adapters were placed, no compiles after warm-up, an adapter-sized sharded
checkpoint, and the adapter and merged exports written from the device."""

from __future__ import annotations

import os
from typing import Any

import torch

from tests.xla import run
from workbench.backend.xla import runtime
from workbench.train import Trainer

MESH = {
    "mesh.enabled": True,
    "mesh.data": 2,
    "mesh.fsdp": 2,
    "mesh.model": 2,
    "train.device_type": "xla",
}


def main(checkpoint_dir: str, export_dir: str) -> dict[str, Any]:
    from tests.test_lora import LORA_RUN, lora_cfg, lora_data

    compiles: dict[int, int] = {}

    def count_compiles(metrics: dict[str, Any]) -> None:  # at each log step, before that step's save
        compiles[metrics["step"]] = runtime.compile_count()

    cfg = lora_cfg(**MESH, **LORA_RUN, **{"train.checkpoint_dir": checkpoint_dir})
    trainer = Trainer(cfg, train_dataset=lora_data(), callbacks=[count_compiles])
    frozen = {n: p for n, p in trainer.model.named_parameters() if not p.requires_grad}
    before = dict(zip(frozen, runtime.to_cpu(list(frozen.values()))))
    result = trainer.fit()
    after = dict(zip(frozen, runtime.to_cpu(list(frozen.values()))))
    report = trainer.sharding_report
    trainer.save_pretrained(os.path.join(export_dir, "adapter"))
    trainer.save_pretrained(os.path.join(export_dir, "merged"), merged=True)
    ckpt = result.checkpoint_path
    return {
        "losses": [m["loss"] for m in result.history],
        "compiles_after_warmup": result.compiles_after_warmup,
        "compiles_at_step": compiles,
        "transfers": [m["transfers"] for m in result.history],
        "base_unchanged": all(torch.equal(before[n], after[n]) for n in frozen),
        "frozen": len(frozen),
        "specs": {e.name: [list(a) if isinstance(a, tuple) else a for a in e.spec] for e in report.entries},
        "fallbacks": report.fallbacks,
        "checkpoint_files": {
            str(os.path.relpath(os.path.join(d, f), ckpt)): os.path.getsize(os.path.join(d, f))
            for d, _, files in os.walk(ckpt)
            for f in files
        },
        "exports": {
            name: sorted(os.listdir(os.path.join(export_dir, name))) for name in ("adapter", "merged")
        },
    }


if __name__ == "__main__":
    run(main)
