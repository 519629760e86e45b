"""A length-normalised next-token objective, the example of docs/how-to/objectives.md.

Plain SFT averages the loss over every labelled token of a step, so a long answer weighs more than a
short one. This objective averages each row's loss over its own tokens first, then over the rows: every
example counts the same. It reads the same records as SFT and differs only in its loss.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from workbench.models.inputs import model_inputs
from workbench.objective_registry import Objective, objective_named, register_objective
from workbench.train.objective import LossChunking, shift_for_next_token
from workbench.train.objective_run import ObjectiveRun

IGNORE = -100  # labels of the tokens the loss leaves out (prompts, padding)


class LengthNormalisedLoss(torch.nn.Module):
    """Each row's mean next-token loss, summed over the rows, counted in rows: the step divides the sum
    by the rows of all its micro-batches, so accumulation averages exactly."""

    def __init__(self, chunking: LossChunking) -> None:
        super().__init__()
        self.chunking = chunking  # the eval's next-token loss chunks as the step would

    def forward(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        logits = model(**model_inputs(batch, model)).logits
        predicted, labels = shift_for_next_token(logits, batch["labels"])
        per_token = F.cross_entropy(
            predicted.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="none"
        ).view(labels.shape)
        tokens = (labels != IGNORE).sum(dim=1)
        per_row = per_token.sum(dim=1) / tokens.clamp(min=1)  # a row without labels adds 0
        return {"loss_sum": per_row.sum(), "tokens": (tokens > 0).sum().to(torch.float32)}


class LengthNormalisedRun(ObjectiveRun):
    """The trainer's side: the next-token run (data, warm-up, eval) with the loss above."""

    def loss(self, trainer: Any, chunking: LossChunking) -> torch.nn.Module:
        return LengthNormalisedLoss(chunking).to(trainer.device)


class LengthNormalised(Objective):
    """``train.objective: sft_length_normalised``: SFT's examples, every example weighing the same."""

    name = "sft_length_normalised"
    summary = "next-token cross-entropy averaged per example"
    example_kind = "text"

    def examples(self, cfg: Any, tokenizer: Any, cache_dir: Any) -> Any:
        return objective_named("sft").examples(cfg, tokenizer, cache_dir)  # the same records as SFT

    def start(self, trainer: Any, *, teacher: Any = None) -> ObjectiveRun:
        if teacher is not None:
            raise ValueError(f"train.objective={self.name!r} takes no teacher")
        return LengthNormalisedRun()


register_objective(LengthNormalised())
