"""The compiler's memory analysis of a GRPO training step beside the estimate (tests/test_rollout_memory.py):
the GRPO objective's forward, backward and AdamW update on a rollout-shaped batch of B x G rows of
prompt + completion, and the supervised step at the same rows. Needs the compile memory log
(PT_XLA_DEBUG_LEVEL=1, PT_XLA_DEBUG_FILE) in the environment."""

from __future__ import annotations

from typing import Any

import torch

from tests.xla import run
from workbench.analysis.estimate import estimate
from workbench.analysis.probe import compiled_program_memory, compiled_step_memory
from workbench.analysis.rollout_memory import RolloutPlan
from workbench.backend.xla import runtime
from workbench.config import ModelConfig
from workbench.models.build import build_model
from workbench.rl.loss import GRPOObjective
from workbench.rl.settings import GRPOConfig

CFG = ModelConfig(
    hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=512
)


def grpo_step_memory(prompts: int, plan: RolloutPlan, prompt_length: int) -> int:
    """The compiler's peak for one GRPO step (fp32, full fine-tuning, AdamW with its moments)."""
    rows, length = prompts * plan.num_generations, prompt_length + plan.completion_positions
    dev = runtime.device()
    model = build_model(CFG, seed=0).to(dev)
    model.tie_weights()
    model.train()
    settings = GRPOConfig(
        num_generations=plan.num_generations, max_completion_length=plan.max_completion_length
    )
    objective = GRPOObjective(settings).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():  # the steady-state step: the moments exist
        opt.state[p] = {
            "step": torch.tensor(1.0),
            "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": torch.zeros_like(p),
        }
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, CFG.vocab_size, (rows, length), generator=gen)
    attention = torch.ones_like(ids)
    batch = {
        "input_ids": ids,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "completion_mask": torch.ones((rows, plan.completion_positions)),
        "advantages": torch.randn(rows, generator=gen),
    }
    batch = {k: v.to(dev) for k, v in batch.items()}
    runtime.sync()

    def trace() -> list[torch.Tensor]:
        out = objective(model, batch)
        (out["loss_sum"] / out["tokens"]).backward()
        opt.step()
        state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        return [out["loss_sum"], *model.parameters(), *(t for t in state if t.device.type == "xla")]

    return compiled_program_memory(trace, execute=True).peak_bytes


def main() -> dict[str, Any]:
    prompts, prompt_length, plan = 2, 32, RolloutPlan(num_generations=4, max_completion_length=32)
    rows, length = prompts * plan.num_generations, prompt_length + plan.completion_positions
    return {
        "grpo_compiled": grpo_step_memory(prompts, plan, prompt_length),
        "grpo_estimate": estimate(
            CFG, batch_size=prompts, seq_len=prompt_length, precision="fp32", rollout=plan
        ).total_bytes,
        "sft_compiled": compiled_step_memory(CFG, batch_size=rows, seq_len=length).peak_bytes,
        "sft_estimate": estimate(CFG, batch_size=rows, seq_len=length, precision="fp32").total_bytes,
    }


if __name__ == "__main__":
    run(main)
