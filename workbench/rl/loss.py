"""The GRPO loss: TRL's clipped policy-gradient loss with its KL term, and its objective.

The math is TRL's ``GRPOTrainer._compute_loss`` (trl 1.16) term for term, so a run here and a TRL
run on the same log-probs give the same loss and gradient:

- the ratio ``r = exp(logp - old_logp)`` per completion token (``importance_sampling_level:
  token``), or per completion ``exp(mean_t(logp - old_logp))`` over its tokens (``sequence``:
  GSPO), clipped to ``[1 - epsilon, 1 + epsilon_high]``; a token's loss is ``-min(r A, clip(r) A)``
  with the completion's advantage ``A``;
- with ``beta > 0`` the k3 estimate of KL(policy || reference) per token,
  ``exp(ref - logp) - (ref - logp) - 1``, is added times beta;
- the log-probs are those of the logits divided by the sampling temperature (as TRL does), so at
  μ = 1 they are the sampler's own.

The log-probs are taken at the completion's positions only, never the prompt's: the final hidden
states of those positions go through the LM head a chunk of positions at a time when
``train.loss_chunk_tokens`` says so for the batch's shape (`workbench.train.objective.LossChunking`,
the next-token loss's rule, 'auto' included; `workbench.models.lm_head.chunked_columns`), each
chunk's logits recomputed in the backward pass, so the ``[rows, positions, vocab]`` logits never
exist whole; unchunked, the head runs on the completion's positions at once. The reference's
log-probs (β > 0) are taken the same way, without gradients.

Like every objective here (`workbench.train.objective`) it returns a *sum* and its count, and the
step engine divides Σ sums by Σ counts over an optimizer step's micro-batches (`grpo_loss_sums`):
``loss_type`` 'dapo' counts completion tokens, 'grpo' completions (each one's token mean summed),
'dr_grpo' completions x ``max_completion_length``. Every choice reads shapes and settings, never a
tensor's value: no host read, one program per batch shape on XLA.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.config_grpo import GRPOConfig
from workbench.models.inputs import model_inputs
from workbench.models.lm_head import LMHead, chunked_columns
from workbench.train.objective import ChunkPlan, LossChunking, Notice

LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
"""The ``grpo.loss_type`` values: how token losses are averaged (`grpo_loss_sums`)."""
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
"""The ``grpo.importance_sampling_level`` values: a ratio per token, or per completion (GSPO)."""


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
    importance_sampling_level: str = "token",
) -> dict[str, torch.Tensor | None]:
    """Per completion token ``[rows, T]``: ``per_token_loss`` (clipped surrogate plus beta x KL),
    ``is_clipped`` (TRL's region clip: the ratio below ``1 - epsilon_low`` with a negative advantage
    or above ``1 + epsilon_high`` with a positive one) and ``per_token_kl`` (None when beta is 0).
    `advantages` is ``[rows]``. At the 'sequence' level (GSPO) the ratio is each completion's
    ``exp`` of its mean log-ratio over the tokens `mask` marks, so the surrogate and ``is_clipped``
    are ``[rows, 1]`` (broadcast over the tokens; the KL stays per token); at 'token' `mask` is
    only applied by the sums."""
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    log_ratio = logps - old_logps
    if importance_sampling_level == "sequence":
        weights = mask.to(log_ratio.dtype)
        log_ratio = ((log_ratio * weights).sum(-1) / weights.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    elif importance_sampling_level != "token":
        raise ValueError(
            f"grpo.importance_sampling_level={importance_sampling_level!r} is not allowed: one of "
            f"{', '.join(IMPORTANCE_SAMPLING_LEVELS)}"
        )
    ratio = torch.exp(log_ratio)
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
    ``selective_log_softmax``: the token's logit minus the logsumexp of its row). `logits` cover
    every position of `input_ids`, or only the last ``completion_length + 1``."""
    length = input_ids.shape[1]
    start = length - completion_length
    scores = logits[:, logits.shape[1] - completion_length - 1 : -1].float()
    if temperature != 1.0:
        scores = scores / temperature
    targets = input_ids[:, start:].unsqueeze(-1)
    return (torch.gather(scores, -1, targets).squeeze(-1) - torch.logsumexp(scores, dim=-1)).float()


class CompletionLogpChunk(torch.nn.Module):
    """One chunk of completion positions' token log-probs ``[rows, n]`` through the head, at the
    sampling temperature (`workbench.models.lm_head.chunked_columns` sets the chunks side by side)."""

    def __init__(self, head: LMHead, temperature: float) -> None:
        super().__init__()
        self.head = head.head  # registered: `chunked_columns` sees whether the head trains
        self.lm_head, self.temperature = head, float(temperature)

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        scores = self.lm_head.logits(hidden)
        if self.temperature != 1.0:
            scores = scores / self.temperature
        return scores.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scores, dim=-1)


class GRPOObjective(torch.nn.Module):
    """The GRPO loss of a rollout batch, with ``clip_ratio`` and (beta > 0) ``kl`` as stats.

    The batch (device tensors, built by the rollout): ``input_ids``, ``attention_mask``,
    ``position_ids`` ``[rows, P + C]`` (left-padded prompt, then the completion), ``completion_mask``
    ``[rows, C]`` (float: 1 on the completion's tokens up to and including its end),
    ``advantages`` ``[rows]`` and, when the rollout was sampled by an earlier policy (μ > 1, or
    ``grpo.steps_per_generation`` not dividing the accumulation), ``old_logps`` ``[rows, C]``
    (otherwise the policy's own log-probs, detached, as TRL does).

    `chunking` (``train.loss_chunk_tokens`` for the run's devices; default 'auto') decides per batch
    shape whether the completion's log-probs run in chunks of positions; `notice` hears once that
    they do.

    With beta > 0 the reference is the same model with its LoRA adapters switched off (peft's
    ``disable_adapter``), a forward without gradients in the same program; a model without adapters
    is refused (no frozen copy is kept: `workbench.objectives.grpo.GRPO.check_config` refuses the config
    first). Stats are the micro-batch's token means over the completion mask (TRL's
    ``clip_ratio/region_mean`` and ``kl``; at the sequence level the clip ratio is a mean over
    completions, as TRL's) times its count, so the engine's division by the count gives them back:
    exact with one micro-batch per step and under 'dapo', a count-weighted mean of the micro-batches'
    means otherwise.
    """

    def __init__(
        self, settings: GRPOConfig, chunking: LossChunking | None = None, notice: Notice | None = None
    ) -> None:
        super().__init__()
        if settings.loss_type not in LOSS_TYPES:
            raise ValueError(
                f"grpo.loss_type={settings.loss_type!r} is not allowed: one of {', '.join(LOSS_TYPES)}"
            )
        self.settings = settings
        self.plan = ChunkPlan(chunking, notice)
        self.epsilon_low = settings.epsilon
        self.epsilon_high = settings.epsilon if settings.epsilon_high is None else settings.epsilon_high
        self.stat_names: tuple[str, ...] = ("clip_ratio", "kl") if settings.beta > 0 else ("clip_ratio",)
        """What a step reports beside its loss (`workbench.analysis.metrics` keys)."""

    @property
    def chunking(self) -> LossChunking:
        return self.plan.chunking

    def policy_logps(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[rows, C]`` log-probs of the completion tokens under `model` at the sampling temperature,
        from the completion's positions only, in chunks of positions where the plan says so."""
        mask = batch["completion_mask"]
        completion = mask.shape[1]
        input_ids = batch["input_ids"]
        chunked = self.plan.heads([model], mask)  # the chunk rule over the completion's positions
        inputs = model_inputs(batch, model)
        temperature = self.settings.temperature
        if chunked is None:
            logits = model(**inputs, **_keep_last(model, completion + 1)).logits
            return completion_logps(logits, input_ids, completion, temperature)
        (head,), positions = chunked
        hidden = head.hidden_states(inputs).last_hidden_state
        length = input_ids.shape[1]
        before = hidden[:, length - completion - 1 : length - 1]  # the positions that predict the completion
        targets = input_ids[:, length - completion :]
        return chunked_columns(CompletionLogpChunk(head, temperature), [before, targets], positions)

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
            importance_sampling_level=settings.importance_sampling_level,
        )
        loss_sum, count = grpo_loss_sums(
            terms["per_token_loss"], mask, settings.loss_type, settings.max_completion_length
        )
        with torch.no_grad():
            # each stat as the micro-batch's mean times its count: the engine divides by Σ count
            clipped = terms["is_clipped"].float()
            if clipped.shape[1] == 1:  # GSPO: one ratio per completion, its mean over completions (TRL's)
                stats = {"clip_ratio": clipped.sum() * (count / clipped.shape[0])}
            else:
                stats = {"clip_ratio": (clipped * mask).sum() * (count / mask.sum().clamp(min=1.0))}
            if terms["per_token_kl"] is not None:
                per_count = count / mask.sum().clamp(min=1.0)
                stats["kl"] = (terms["per_token_kl"].detach() * mask).sum() * per_count
        return {"loss_sum": loss_sum, "tokens": count, "stats": stats}


def _keep_last(model: torch.nn.Module, positions: int) -> dict[str, int]:
    """``logits_to_keep`` for a forward that needs only the last `positions` positions' logits, where
    the model's forward takes it (transformers' causal LMs do); otherwise nothing (every position)."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        takes = "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        takes = False
    return {"logits_to_keep": positions} if takes else {}
