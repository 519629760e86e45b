"""DPO on 8 XLA:CPU devices, mesh data=2 x fsdp=2 x model=2, on synthetic pairs whose chosen answer
follows a rule (`tests.preference_data`): LoRA with the adapters-off reference until the held-out
pairs' reward accuracy is measured; then short runs of the same LoRA run, of it with its reference
precomputed and with the loss in chunks, and of a full fine-tune with a frozen copy. Each run: its
metrics per log step, the
compiles after warm-up, the transfers per interval, its notices about the reference."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from tests.preference_data import learnable_pairs, write_jsonl
from tests.xla import run
from workbench.config import WorkbenchConfig
from workbench.data.records import build_datasets
from workbench.train import Trainer

MESH = {"mesh.enabled": True, "mesh.data": 2, "mesh.fsdp": 2, "mesh.model": 2, "train.device_type": "xla"}

RUN = {
    "train.objective": "dpo",
    "data.eval_fraction": 0,
    "data.max_length": 48,
    "bucketing.max_buckets": 2,
    "train.batch_size": 8,
    "train.learning_rate": 3e-3,
    "train.warmup_steps": 2,
    "train.log_every": 5,
    "train.progress_bar": False,
    "lora.rank": 8,
    "lora.alpha": 16,
}


def _run(cfg: WorkbenchConfig, train: Any, held_out: Any, tokenizer: Any) -> dict[str, Any]:
    result = Trainer(cfg, train_dataset=train, eval_dataset=held_out, tokenizer=tokenizer).fit()
    history = result.history
    return {
        "losses": [m["loss"] for m in history],
        "reward_accuracy": [m["reward_accuracy"] for m in history],
        "reward_margin": [m["reward_margin"] for m in history],
        "chosen_logp": [m["chosen_logp"] for m in history],
        "rejected_logp": [m["rejected_logp"] for m in history],
        "eval_reward_accuracy": [m["eval_reward_accuracy"] for m in history],
        "eval_loss": float(result.eval_loss) if result.eval_loss is not None else None,
        "eval_stats": getattr(result.eval_loss, "stats", None),
        "eval_perplexity": result.eval_perplexity,
        "compiles_after_warmup": result.compiles_after_warmup,
        "warmup_compiles": result.warmup_compiles,
        "recompiled": [m["recompiled"] for m in history],
        "transfers": [m["transfers"] for m in history],
        "reference": [n for n in result.notices if n.startswith("DPO reference")],
    }


def main(steps: int = 30) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="dpo-")
    train_file = write_jsonl(learnable_pairs(256, seed=0), os.path.join(work, "train.jsonl"))
    held_file = write_jsonl(learnable_pairs(48, seed=1, held_out=True), os.path.join(work, "held.jsonl"))
    cfg = WorkbenchConfig().with_overrides({**RUN, **MESH, "data.source": str(train_file)})
    train, _, tokenizer = build_datasets(cfg, cache_dir=work)
    held_out, _, _ = build_datasets(cfg.with_overrides({"data.source": str(held_file)}), tokenizer=tokenizer)
    lora = cfg.with_overrides({"train.steps": steps, "train.eval_every": steps})
    short = cfg.with_overrides({"train.steps": 4, "train.eval_every": 4, "train.log_every": 1})
    return {
        "adapters_off": _run(lora, train, held_out, tokenizer),
        "adapters_off_short": _run(short, train, held_out, tokenizer),
        "precompute": _run(
            short.with_overrides({"train.dpo_reference": "precompute"}), train, held_out, tokenizer
        ),
        # the loss in chunks of 16 positions: each chunk's per-row log-probs chained into the next
        "chunked": _run(short.with_overrides({"train.loss_chunk_tokens": 16}), train, held_out, tokenizer),
        "copy": _run(
            short.with_overrides({"lora.rank": 0, "train.learning_rate": 1e-4}), train, held_out, tokenizer
        ),
    }


if __name__ == "__main__":
    run(main)
