"""GRPO rollouts that stop when every completion has ended, on 2 XLA:CPU devices (mesh.data=2), from
`sft_dir`: a tiny model briefly fine-tuned on math-sample's worked solutions (tests/test_grpo_rollouts.py),
whose completions end after about 20 of the 128 tokens allowed. Two accumulated micro-steps a step,
their prompts sampled by one rollout (grpo.steps_per_generation defaults to train.grad_accum). Per log
step: the decode steps run, the completions' lengths, compiles, host reads against the reads the
rollout planned (its completions and one flag per block)."""

from __future__ import annotations

from typing import Any

from tests.xla import run
from workbench.config import WorkbenchConfig
from workbench.train import Trainer

BUDGET = 128

KEYS = (
    "completion_length",
    "completion_length_max",
    "rollout_decode_steps",
    "transfers",
    "expected_transfers",
    "compiles",
    "steps_in_interval",
    "loss",
)


def main(sft_dir: str, steps: int = 3) -> dict[str, Any]:
    from workbench.rl.rollout import ROLLOUT_BLOCK  # after the trainer: rl.rollout imports train's parts

    cfg = WorkbenchConfig().with_overrides(
        {
            "model.pretrained_path": sft_dir,
            "data.source": "math-sample",
            "data.max_length": 64,
            "data.eval_fraction": 0,
            "bucketing.max_buckets": 1,
            "train.objective": "grpo",
            "train.device_type": "xla",
            "mesh.enabled": True,
            "mesh.data": 2,
            "train.batch_size": 4,
            "train.grad_accum": 2,
            "grpo.num_generations": 4,
            "grpo.max_completion_length": BUDGET,
            "train.steps": steps,
            "train.log_every": 1,
            "train.progress_bar": False,
            "lora.rank": 4,
        }
    )
    trainer = Trainer(cfg)
    result = trainer.fit()
    return {
        "history": [{k: m.get(k) for k in KEYS} for m in result.history],
        "compiles_after_warmup": result.compiles_after_warmup,
        "warmup_compiles": result.warmup_compiles,
        "budget": BUDGET,
        "block": ROLLOUT_BLOCK,
        "rollout_rows": trainer.data.rollouts.grpo.num_generations * 4 * 2,
    }


if __name__ == "__main__":
    run(main)
