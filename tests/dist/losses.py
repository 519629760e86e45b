"""Train several small configs one after another with the `Trainer` API and write what each did.

    torchrun --standalone --nproc_per_node=2 -m tests.dist.losses OUT.json fsdp_full ddp_lora ...
    python -m tests.dist.losses OUT.json full lora ...          # the one-process reference

A scenario is a reference config (`BASES`: full fine-tune, LoRA, accumulation, eval) plus mesh
overrides (`SCENARIOS`); one process runs the bases themselves. For each, the main rank writes the
logged losses, grad norms and eval losses, the strategy the ranks used, which micro-batches asked for
their gradients to be reduced, and the rows each rank fed to the model at every training micro-batch
(as per-row fingerprints: a row's token ids weighted by position and summed), so the test can check
that the ranks' slices put together are the batch the single process trained on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

COMMON = {
    "train.device_type": "cpu",
    "train.steps": 4,
    "train.log_every": 1,
    "train.batch_size": 4,
    "train.warmup_steps": 1,
    "train.learning_rate": 3e-3,  # large enough that the four steps move the loss well past fp32 noise
    "train.progress_bar": False,
    "data.max_examples": 64,
    "data.max_length": 64,
    "data.eval_fraction": 0.0,
}
BASES: dict[str, dict[str, Any]] = {
    "full": {},
    "lora": {"lora.rank": 4},
    "accum": {"train.grad_accum": 2},
    # 10 eval examples: the last eval batch is short (filled up to the batch size by the loader)
    "eval": {"data.eval_fraction": 0.15, "train.eval_every": 2},
    "eval_accum": {"data.eval_fraction": 0.15, "train.eval_every": 2, "train.grad_accum": 2},
}
SCENARIOS: dict[str, tuple[str, dict[str, Any]]] = {
    "ddp_full": ("full", {}),
    "fsdp_full": ("full", {"mesh.fsdp": 2}),
    "ddp_lora": ("lora", {}),
    "fsdp_lora": ("lora", {"mesh.fsdp": 2}),
    "ddp_accum": ("accum", {}),
    "fsdp_accum": ("accum", {"mesh.fsdp": 2}),
    "fsdp_eval": ("eval", {"mesh.fsdp": 2}),
    "hsdp_accum_eval": ("eval_accum", {"mesh.data": 2, "mesh.fsdp": 2}),
}
"""Name -> (the base config whose one-process run it must match, its mesh)."""
REFERENCE = {name: base for name, (base, _) in SCENARIOS.items()}


def fingerprint(ids: Any) -> list[int]:
    """One integer per row of `ids` ([rows, length]): order-sensitive, so equal rows are (almost surely) equal."""
    import torch

    weights = torch.arange(1, ids.shape[1] + 1, dtype=torch.int64)
    return (ids.to(torch.int64).cpu() * weights).sum(dim=1).tolist()


def train(name: str) -> dict[str, Any]:
    from workbench.config import WorkbenchConfig
    from workbench.train import Trainer

    if name in BASES:
        overrides = {**COMMON, **BASES[name]}
    else:
        base, mesh = SCENARIOS[name]
        overrides = {**COMMON, **BASES[base], **mesh}
    cfg = WorkbenchConfig().with_overrides(overrides)
    trainer = Trainer(cfg)
    rows: list[list[int]] = []  # this rank's rows of every training micro-batch, in order
    forward = trainer.engine._forward

    def recording(batch: dict, objective: Any = None) -> Any:
        if trainer.model.training:
            rows.append(fingerprint(batch["input_ids"]))
        return forward(batch, objective)

    trainer.engine._forward = recording
    replicas = trainer.replicas  # torchrun's ranks, or this process alone
    syncs: list[bool] = []  # per training micro-batch: whether its backward was to reduce gradients
    gradient_sync = replicas.gradient_sync

    def recording_sync(enabled: bool) -> Any:
        syncs.append(bool(enabled))
        return gradient_sync(enabled)

    replicas.gradient_sync = recording_sync
    try:
        result = trainer.fit()
        every_rank = replicas.gather(rows)
    finally:
        trainer.close()  # its watchdog stops; the next scenario's Trainer reuses the process group
    layout = getattr(replicas, "layout", None)  # RankTraining's mesh over the ranks
    return {
        "strategy": layout.strategy if layout is not None else "single",
        "world_size": replicas.world_size,
        "losses": [m["loss"] for m in result.history],
        "grad_norms": [m["grad_norm"] for m in result.history],
        "eval_losses": [m["eval_loss"] for m in result.history if m["eval_loss"] is not None],
        "final_eval_loss": None if result.eval_loss is None else float(result.eval_loss),
        "rows": every_rank,
        "syncs": syncs,
    }


def main(out: str, *names: str) -> None:
    from workbench.backend import multihost

    results = {name: train(name) for name in names}
    if multihost.is_main():
        Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])
