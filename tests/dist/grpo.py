"""GRPO under torchrun: the learning test's setting (`tests.grpo_data`, from an SFT model) trained by
each scenario's ranks in turn, with the `Trainer` API; the main rank writes what each did.

    torchrun --standalone --nproc_per_node=2 -m tests.dist.grpo OUT.json SFT_DIR fsdp_learning ddp_short

Per scenario: the strategy and world size the ranks used, the held-out greedy reward before training
and at every eval, the rewards and losses logged, and for every rollout the dataset indices of the
prompts each rank sampled (every G rows: one group), gathered from every rank.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

COMMON = {
    "train.objective": "grpo",
    "train.device_type": "cpu",
    "data.max_length": 16,
    "model.max_position_embeddings": 64,
    "data.eval_fraction": 0,
    "bucketing.max_buckets": 3,
    "bucketing.multiple_of": 2,
    "train.batch_size": 8,
    "grpo.num_generations": 8,
    "grpo.max_completion_length": 4,
    "train.learning_rate": 5e-3,
    "train.warmup_steps": 0,
    "train.progress_bar": False,
    "lora.rank": 8,
    "lora.alpha": 16,
}
SCENARIOS: dict[str, dict[str, Any]] = {
    # the learning test of tests/test_grpo.py, its rows over FSDP2's 2 ranks
    "fsdp_learning": {"mesh.fsdp": 2, "train.steps": 20, "train.log_every": 5, "train.eval_every": 5},
    # DDP with two micro-steps a step, sampled by one rollout and trained twice (mu = 2)
    "ddp_short": {"train.steps": 2, "train.log_every": 1, "train.grad_accum": 2, "grpo.num_iterations": 2},
}


def prompt_file(records: list[dict], path: Path) -> Path:
    """`records` at `path`, written by every rank alike: each its own file, renamed into place."""
    from tests.grpo_data import write_jsonl

    path.parent.mkdir(parents=True, exist_ok=True)
    mine = write_jsonl(records, path.with_suffix(f".rank{os.environ.get('RANK', '0')}"))
    os.replace(mine, path)
    return path


def train(name: str, sft_dir: str, work: Path) -> dict[str, Any]:
    from tests.grpo_data import digit_prompts, digit_reward
    from workbench.config import WorkbenchConfig
    from workbench.data.records import build_datasets
    from workbench.train import Trainer

    train_file = prompt_file(digit_prompts(), work / "prompts.jsonl")  # the same path for every rank
    held_file = prompt_file(digit_prompts(held_out=True), work / "held.jsonl")
    cfg = WorkbenchConfig().with_overrides(
        {**COMMON, **SCENARIOS[name], "data.source": str(train_file), "model.pretrained_path": sft_dir}
    )
    train_ds, _, tokenizer = build_datasets(cfg)
    held, _, _ = build_datasets(cfg.with_overrides({"data.source": str(held_file)}), tokenizer=tokenizer)
    trainer = Trainer(
        cfg, train_dataset=train_ds, eval_dataset=held, tokenizer=tokenizer, rewards=[digit_reward]
    )
    rollouts = trainer.data.rollouts
    sampled: list[list[int]] = []  # this rank's prompt indices, one list per rollout
    run = rollouts.run

    def recording(hosts, seed, **kwargs):
        out = run(hosts, seed, **kwargs)
        mine = [rollouts.replicas.take_rows(h)["index"].tolist() for h in hosts]
        sampled.append([i for part in mine for i in part])
        return out

    rollouts.run = recording
    try:
        before = float(trainer.evaluate()) if cfg.train.eval_every else None
        result = trainer.fit()
        every_rank = trainer.replicas.gather(sampled)
    finally:
        trainer.close()  # its watchdog stops; the next scenario's Trainer reuses the process group
    layout = getattr(trainer.replicas, "layout", None)
    return {
        "strategy": layout.strategy if layout is not None else "single",
        "world_size": trainer.replicas.world_size,
        "before": before,
        "history": [
            {k: m.get(k) for k in ("step", "loss", "reward_mean", "eval_reward_mean", "completion_length")}
            for m in result.history
        ],
        "sampled": every_rank,
    }


def main(out: str, sft_dir: str, *names: str) -> None:
    from workbench.backend import multihost

    results = {name: train(name, sft_dir, Path(out).parent / f"{Path(out).stem}-{name}") for name in names}
    if multihost.is_main():
        Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])
