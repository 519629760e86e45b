"""The GRPO objective on XLA:CPU (tests/test_grpo_loss.py): a LoRA policy's loss with its
adapters-off reference (beta > 0) and old log-probs (μ > 1), its log-probs in chunks of 2 positions
(chained on XLA), forward and backward on rollout-shaped batches; the second step of a shape compiles
nothing and reads nothing, and the loss equals the CPU's unchunked one.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.test_grpo_loss import rollout_batch
from tests.tiny import tiny
from tests.xla import run
from workbench.backend.xla import runtime
from workbench.config import LoraConfig
from workbench.config_grpo import GRPOConfig
from workbench.models.build import build_model
from workbench.rl.loss import GRPOObjective
from workbench.train.lora import apply_lora
from workbench.train.objective import LossChunking


def main() -> dict[str, Any]:
    dev = runtime.device()
    policy = apply_lora(
        build_model(tiny("llama", vocab_size=256), seed=0).float(), LoraConfig(rank=4), seed=0
    )
    settings = GRPOConfig(beta=0.04, num_iterations=2, epsilon_high=0.28, loss_type="dapo")
    cpu_batch = {**rollout_batch(), "old_logps": torch.full((4, 5), -5.0)}
    with torch.no_grad():
        cpu_loss = GRPOObjective(settings, LossChunking(0))(policy, cpu_batch)["loss_sum"].item()
    objective = GRPOObjective(settings, LossChunking(8))  # 8 tokens of 4 rows: chunks of 2 positions
    policy.to(dev)
    losses, compiles, transfers = [], [], []
    for seed in (0, 1):  # the same shapes, other values
        policy.zero_grad(set_to_none=True)  # each step makes its gradients: one program
        batch = {**rollout_batch(seed=seed), "old_logps": torch.full((4, 5), -5.0)}
        batch = {k: v.to(dev) for k, v in batch.items()}
        runtime.sync()
        before, moved = runtime.compile_count(), runtime.transfer_count()
        out = objective(policy, batch)
        out["loss_sum"].backward()
        runtime.sync()
        compiles.append(runtime.compile_count() - before)
        transfers.append(runtime.transfer_count() - moved)
        losses.append(out["loss_sum"])
    return {
        "compiles": compiles,
        "transfers": transfers,
        "cpu_loss": cpu_loss,
        "xla_loss": losses[0].item(),
    }


if __name__ == "__main__":
    run(main)
