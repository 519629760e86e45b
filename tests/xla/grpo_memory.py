"""The compiler's memory analysis of a GRPO training step beside the estimate (tests/test_rollout_memory.py):
the GRPO objective's forward, backward and AdamW update on a rollout-shaped batch of B x G rows of
prompt + completion, and the supervised step at the same rows; then, at a shape where the logits
dominate (a 32768-token vocabulary, LoRA: the head frozen, as a GRPO run's), the objective with its
log-probs in chunks of positions and unchunked (the head on the completion's positions at once)
against the objective as it was before (the head on every position of the rows at once, the
completion's log-probs sliced from those logits). Needs the compile memory log (PT_XLA_DEBUG_LEVEL=1,
PT_XLA_DEBUG_FILE) in the environment."""

from __future__ import annotations

from typing import Any

import torch

from tests.xla import run
from workbench.analysis.estimate import estimate
from workbench.analysis.probe import compiled_program_memory, compiled_step_memory
from workbench.analysis.rollout_memory import RolloutPlan
from workbench.backend.xla import runtime
from workbench.config import ModelConfig
from workbench.config_grpo import GRPOConfig
from workbench.models.build import build_model
from workbench.models.inputs import model_inputs
from workbench.rl.loss import GRPOObjective, completion_logps
from workbench.train.objective import LossChunking

CFG = ModelConfig(
    hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=512
)
LOGITS_CFG = ModelConfig(
    hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=32768
)
"""A shape whose step the logits dominate: a 32768-token vocabulary over a 64-wide model."""
LORA_RANK = 8
CHUNK_TOKENS = 128
"""``train.loss_chunk_tokens`` of the chunked runs: 16 positions of 8 rows a chunk."""


class WholeLogits(GRPOObjective):
    """The objective before chunking: the model's logits at every position of the rows, in fp32, and
    the completion's log-probs sliced from them."""

    def policy_logps(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(**model_inputs(batch, model)).logits
        completion = batch["completion_mask"].shape[1]
        return completion_logps(logits, batch["input_ids"], completion, self.settings.temperature)


def grpo_step_memory(
    cfg: ModelConfig,
    prompts: int,
    plan: RolloutPlan,
    prompt_length: int,
    objective: GRPOObjective,
    lora_rank: int = 0,
) -> int:
    """The compiler's peak for one GRPO step (fp32, full fine-tuning or LoRA adapters of `lora_rank`,
    AdamW with its moments)."""
    rows, length = prompts * plan.num_generations, prompt_length + plan.completion_positions
    dev = runtime.device()
    model = build_model(cfg, seed=0)
    if lora_rank:
        from workbench.config import LoraConfig
        from workbench.train.lora import apply_lora

        model = apply_lora(model, LoraConfig(rank=lora_rank), seed=0)
    model = model.to(dev)
    model.tie_weights()
    model.train()
    objective = objective.to(dev)
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=1e-3)
    for p in trained:  # the steady-state step: the moments exist
        opt.state[p] = {
            "step": torch.tensor(1.0),
            "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": torch.zeros_like(p),
        }
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, cfg.vocab_size, (rows, length), generator=gen)
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
        return [out["loss_sum"], *trained, *(t for t in state if t.device.type == "xla")]

    return compiled_program_memory(trace, execute=True).peak_bytes


def main() -> dict[str, Any]:
    prompts, prompt_length, plan = 2, 32, RolloutPlan(num_generations=4, max_completion_length=32)
    rows, length = prompts * plan.num_generations, prompt_length + plan.completion_positions
    settings = GRPOConfig(num_generations=4, max_completion_length=32)
    logits_plan = RolloutPlan(num_generations=4, max_completion_length=96)
    logits_settings = GRPOConfig(num_generations=4, max_completion_length=96)

    def logits_estimate(chunk: int | str) -> int:
        return estimate(
            LOGITS_CFG,
            batch_size=prompts,
            seq_len=prompt_length,
            precision="fp32",
            objective=logits_plan,
            loss_chunk_tokens=chunk,
            lora_rank=LORA_RANK,
        ).total_bytes

    def logits_step(objective: GRPOObjective) -> int:
        return grpo_step_memory(LOGITS_CFG, prompts, logits_plan, prompt_length, objective, LORA_RANK)

    return {
        "grpo_compiled": grpo_step_memory(CFG, prompts, plan, prompt_length, GRPOObjective(settings)),
        "grpo_estimate": estimate(
            CFG, batch_size=prompts, seq_len=prompt_length, precision="fp32", objective=plan
        ).total_bytes,
        "sft_compiled": compiled_step_memory(CFG, batch_size=rows, seq_len=length).peak_bytes,
        "sft_estimate": estimate(CFG, batch_size=rows, seq_len=length, precision="fp32").total_bytes,
        "whole_logits_compiled": logits_step(WholeLogits(logits_settings, LossChunking(0))),
        "chunked_compiled": logits_step(GRPOObjective(logits_settings, LossChunking(CHUNK_TOKENS))),
        "chunked_estimate": logits_estimate(CHUNK_TOKENS),
        "unchunked_compiled": logits_step(GRPOObjective(logits_settings, LossChunking(0))),
        "unchunked_estimate": logits_estimate(0),
    }


if __name__ == "__main__":
    run(main)
