"""The GRPO loss: TRL's clipped, token-level policy-gradient loss with its KL term, and its objective.

The math is TRL's ``GRPOTrainer._compute_loss`` (trl 1.16, token-level importance sampling) term
for term, so a run here and a TRL run on the same log-probs give the same loss and gradient:

- the ratio ``r = exp(logp - old_logp)`` per completion token, clipped to
  ``[1 - epsilon, 1 + epsilon_high]``; a token's loss is ``-min(r A, clip(r) A)`` with the
  completion's advantage ``A``;
- with ``beta > 0`` the k3 estimate of KL(policy || reference) per token,
  ``exp(ref - logp) - (ref - logp) - 1``, is added times beta;
- the log-probs are those of the logits divided by the sampling temperature (as TRL does), so at
  μ = 1 they are the sampler's own.

Like every objective here (`workbench.train.objective`) it returns a *sum* and its count, and the
step engine divides Σ sums by Σ counts over an optimizer step's micro-batches (`grpo_loss_sums`):
``loss_type`` 'dapo' counts completion tokens, 'grpo' completions (each one's token mean summed),
'dr_grpo' completions x ``max_completion_length``. Every choice reads shapes and settings, never a
tensor's value: no host read, one program per batch shape on XLA.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.models.inputs import model_inputs
from workbench.rl.settings import GRPOConfig

LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
"""The ``grpo.loss_type`` values: how token losses are averaged (`grpo_loss_sums`)."""


def grpo_token_terms(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    beta: float,
) -> dict[str, torch.Tensor | None]:
    """Per completion token ``[rows, T]``: ``per_token_loss`` (clipped surrogate plus beta x KL),
    ``is_clipped`` (TRL's region clip: the ratio below ``1 - epsilon_low`` with a negative advantage
    or above ``1 + epsilon_high`` with a positive one) and ``per_token_kl`` (None when beta is 0).
    `advantages` is ``[rows]``; `mask` is taken for its shape only (the sums apply it)."""
    del mask  # the terms are per token; `grpo_loss_sums` and the stats mask them
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(ratio * advantages, clipped * advantages)
    per_token_kl = None
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError(f"grpo.beta={beta} needs the reference's log-probs; got none")
        delta = ref_logps - logps
        per_token_kl = torch.exp(delta) - delta - 1
        per_token_loss = per_token_loss + beta * per_token_kl
    low = (ratio < 1 - epsilon_low) & (advantages < 0)
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    return {"per_token_loss": per_token_loss, "is_clipped": low | high, "per_token_kl": per_token_kl}


def grpo_loss_sums(
    per_token_loss: torch.Tensor, mask: torch.Tensor, loss_type: str, max_completion_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss_sum, count)``, scalars in `per_token_loss`'s dtype (fp32 in the objective), whose ratio over an optimizer step is TRL's loss:

    - 'grpo': Σ_i (Σ_t l m / max(1, Σ_t m)) over completions i, count = rows;
    - 'dr_grpo': Σ l m, count = rows x `max_completion_length`;
    - 'dapo': Σ l m, count = Σ m (the step's completion tokens).
    """
    mask = mask.to(per_token_loss.dtype)
    rows = per_token_loss.shape[0]
    masked = per_token_loss * mask
    if loss_type == "grpo":
        loss_sum = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum()
        count = mask.new_full((), float(rows))
    elif loss_type == "dr_grpo":
        loss_sum = masked.sum()
        count = mask.new_full((), float(rows * max_completion_length))
    elif loss_type == "dapo":
        loss_sum, count = masked.sum(), mask.sum()
    else:
        raise ValueError(f"grpo.loss_type={loss_type!r} is not allowed: one of {', '.join(LOSS_TYPES)}")
    return loss_sum, count


def completion_logps(
    logits: torch.Tensor, input_ids: torch.Tensor, completion_length: int, temperature: float
) -> torch.Tensor:
    """``[rows, C]`` fp32 log-probs of the last `completion_length` tokens of `input_ids` under
    ``logits / temperature`` (the logits of the positions before each, as TRL's
    ``selective_log_softmax``: the token's logit minus the logsumexp of its row)."""
    length = input_ids.shape[1]
    start = length - completion_length
    scores = logits[:, start - 1 : length - 1].float()
    if temperature != 1.0:
        scores = scores / temperature
    targets = input_ids[:, start:].unsqueeze(-1)
    return (torch.gather(scores, -1, targets).squeeze(-1) - torch.logsumexp(scores, dim=-1)).float()


class GRPOObjective(torch.nn.Module):
    """The GRPO loss of a rollout batch, with ``clip_ratio`` and (beta > 0) ``kl`` as stats.

    The batch (device tensors, built by the rollout): ``input_ids``, ``attention_mask``,
    ``position_ids`` ``[rows, P + C]`` (left-padded prompt, then the completion), ``completion_mask``
    ``[rows, C]`` (float: 1 on the completion's tokens up to and including its end),
    ``advantages`` ``[rows]`` and, when μ > 1, ``old_logps`` ``[rows, C]`` (otherwise the policy's
    own log-probs, detached, as TRL does).

    With beta > 0 the reference is the same model with its LoRA adapters switched off (peft's
    ``disable_adapter``), a forward without gradients in the same program; a model without adapters
    is refused (no frozen copy is kept: `workbench.rl.settings.validate_grpo_run` refuses the config
    first). Stats are the micro-batch's token means over the completion mask (TRL's
    ``clip_ratio/region_mean`` and ``kl``) times its count, so the engine's division by the count gives
    them back: exact with one micro-batch per step and under 'dapo', a count-weighted mean of the
    micro-batches' means otherwise.
    """

    def __init__(self, settings: GRPOConfig) -> None:
        super().__init__()
        if settings.loss_type not in LOSS_TYPES:
            raise ValueError(
                f"grpo.loss_type={settings.loss_type!r} is not allowed: one of {', '.join(LOSS_TYPES)}"
            )
        self.settings = settings
        self.epsilon_low = settings.epsilon
        self.epsilon_high = settings.epsilon if settings.epsilon_high is None else settings.epsilon_high
        self.stat_names: tuple[str, ...] = ("clip_ratio", "kl") if settings.beta > 0 else ("clip_ratio",)
        """What a step reports beside its loss (`workbench.analysis.metrics` keys)."""

    def policy_logps(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[rows, C]`` log-probs of the completion tokens under `model` at the sampling temperature."""
        logits = model(**model_inputs(batch, model)).logits
        completion_length = batch["completion_mask"].shape[1]
        return completion_logps(logits, batch["input_ids"], completion_length, self.settings.temperature)

    def reference_logps(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The same log-probs with the adapters switched off, without gradients."""
        disable = getattr(model, "disable_adapter", None)
        if disable is None:
            raise ValueError(
                f"grpo.beta={self.settings.beta} takes the model with its LoRA adapters switched off as the "
                "reference; this model has no adapters: set lora.rank >= 1 or grpo.beta=0"
            )
        with torch.no_grad(), disable():
            return self.policy_logps(model, batch)

    def forward(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        settings = self.settings
        mask = batch["completion_mask"].float()
        ref = self.reference_logps(model, batch) if settings.beta > 0 else None
        logps = self.policy_logps(model, batch)
        old = batch.get("old_logps")
        old = logps.detach() if old is None else old.float()
        terms = grpo_token_terms(
            logps,
            old,
            ref,
            batch["advantages"].float(),
            mask,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            beta=settings.beta,
        )
        loss_sum, count = grpo_loss_sums(
            terms["per_token_loss"], mask, settings.loss_type, settings.max_completion_length
        )
        with torch.no_grad():
            # each stat as the micro-batch's token mean times its count: the engine divides by Σ count
            per_count = count / mask.sum().clamp(min=1.0)
            stats = {"clip_ratio": (terms["is_clipped"].float() * mask).sum() * per_count}
            if terms["per_token_kl"] is not None:
                stats["kl"] = (terms["per_token_kl"].detach() * mask).sum() * per_count
        return {"loss_sum": loss_sum, "tokens": count, "stats": stats}

    def for_eval(self) -> GRPOObjective:
        """A GRPO eval is the reward of greedy completions (the rollout's eval), not a loss on a batch;
        asked for a loss, the objective gives its own."""
        return self
