"""GRPO on 8 XLA:CPU devices, mesh data=2 x fsdp=2 x model=2, LoRA, on a task a tiny model learns
(`tests.grpo_data`), starting from `sft_dir`: the model an SFT run (``tests/test_grpo.py``, plain
CPU) taught the answer format with the wrong digit most of the time; GRPO with `digit_reward` then raises the held-out greedy reward. Then
two short runs of the same model: mu = 2 with 2 micro-batches a step (a rollout per micro-batch,
each serving two steps, the sampler's log-probs as the old ones, checked against a forward of the
training program) and beta > 0 (the KL to the
adapters-off reference). Each run: its figures per log step, compiles after warm-up, transfers."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from tests.grpo_data import digit_prompts, digit_reward, write_jsonl
from tests.xla import run
from workbench.analysis.metrics import GRPO_KEYS
from workbench.config import WorkbenchConfig
from workbench.data.records import build_datasets
from workbench.train import Trainer

MESH = {"mesh.enabled": True, "mesh.data": 2, "mesh.fsdp": 2, "mesh.model": 2, "train.device_type": "xla"}
BASE = {
    "data.max_length": 16,
    "model.max_position_embeddings": 64,
    "data.eval_fraction": 0,
    "bucketing.max_buckets": 1,
    "train.progress_bar": False,
}
BUCKETS = {"bucketing.max_buckets": 3, "bucketing.multiple_of": 2}
"""Prompts of 4 and 5 tokens in buckets of 4 and 6 (and data.max_length, which every plan keeps and
no prompt reaches): the warm-up compiles each bucket's rollout and step."""
GRPO = {
    **BASE,
    **MESH,
    **BUCKETS,
    "train.objective": "grpo",
    "train.batch_size": 8,
    "grpo.num_generations": 8,
    "grpo.max_completion_length": 4,
    "train.learning_rate": 5e-3,
    "train.warmup_steps": 0,
    "lora.rank": 8,
    "lora.alpha": 16,
}
KEYS = (
    "step",
    "loss",
    *GRPO_KEYS,
    "eval_loss",
    "transfers",
    "expected_transfers",
    "compiles",
    "steps_in_interval",
)
"""What each log step reports back: the contract's GRPO keys and the counters the tests check."""


def _figures(result: Any) -> dict[str, Any]:
    return {
        "history": [{k: m.get(k) for k in KEYS} for m in result.history],
        "compiles_after_warmup": result.compiles_after_warmup,
        "warmup_compiles": result.warmup_compiles,
        "final_loss": result.final_loss,
    }


def _logps_agreement(trainer: Trainer) -> float:
    """Largest |sampler's log-prob - the training program's own| over a fresh rollout's completion tokens."""
    import torch

    data = trainer.data
    loader, _ = data.loader(data.train_dataset, trainer.cfg.train.batch_size)
    host = next(iter(loader))
    (batch,), _, _ = data.rollouts.run([host], 123)
    with torch.no_grad():
        forward = trainer.objective.policy_logps(trainer.model, batch)
    mask = batch["completion_mask"]
    return float(((forward - batch["old_logps"]).abs() * mask).max().cpu())


def main(sft_dir: str, steps: int = 20) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="grpo-")
    train_file = write_jsonl(digit_prompts(), os.path.join(work, "prompts.jsonl"))
    held_file = write_jsonl(digit_prompts(held_out=True), os.path.join(work, "held.jsonl"))
    cfg = WorkbenchConfig().with_overrides(
        {**GRPO, "data.source": str(train_file), "model.pretrained_path": sft_dir}
    )
    train, _, tokenizer = build_datasets(cfg)
    held, _, _ = build_datasets(cfg.with_overrides({"data.source": str(held_file)}), tokenizer=tokenizer)

    def trainer(**overrides: Any) -> Trainer:
        run_cfg = cfg.with_overrides(overrides)
        return Trainer(
            run_cfg, train_dataset=train, eval_dataset=held, tokenizer=tokenizer, rewards=[digit_reward]
        )

    learning = trainer(  # completions logged: rows from what the host holds, no read of their own
        **{"train.steps": steps, "train.log_every": 5, "train.eval_every": 5, "grpo.log_completions": True}
    )
    before = float(learning.evaluate())
    grpo_start = time.perf_counter()
    learned = _figures(learning.fit())
    learned.update(before=before, seconds=time.perf_counter() - grpo_start)

    reuse = trainer(
        **{"train.steps": 4, "train.log_every": 1, "grpo.num_iterations": 2, "train.grad_accum": 2}
    )
    reused = _figures(reuse.fit())
    reused["logps_max_diff"] = _logps_agreement(reuse)

    kl_run = trainer(
        **{"train.steps": 3, "train.log_every": 1, "grpo.beta": 0.1, "grpo.mask_truncated_completions": True}
    )
    return {
        "learning": learned,
        "mu2": reused,
        "beta": _figures(kl_run.fit()),
        "prompt_shapes": learning.data.shapes(learning.cfg.train.batch_size, train),
        "eval_shapes": learning.data.shapes(learning.cfg.train.batch_size, held),
        "eval_batches": len(learning.data.loader(held, learning.cfg.train.batch_size)[1]),
    }


if __name__ == "__main__":
    run(main)
