"""The training objective: next-token cross-entropy as a sum over real tokens and their count.

Objectives return per-token *sums* plus the token count (fp32), never a mean, so the step
engine normalises over all real tokens of an optimizer step however they are spread over
micro-batches. `CausalLMObjective` is the plain language-model loss (and the eval loss);
`workbench.train.distill.DistillationObjective` builds on the same two helpers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.data.records import IGNORE_INDEX
from workbench.models.inputs import model_inputs


def shift_for_next_token(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits at positions 0..L-2 paired with labels 1..L-1 (what a causal LM predicts)."""
    return logits[:, :-1, :], labels[:, 1:]


def token_ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Σ of next-token cross-entropy over positions whose label is not -100, in fp32 (already shifted)."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


# ---- objectives ----------------------------------------------------------------------------------


class CausalLMObjective(torch.nn.Module):
    """Next-token cross-entropy: returns the sum over real positions and their count (fp32)."""

    def forward(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # The batch's model keys and a mask built on its device: no host read in transformers 5's
        # masking (workbench.models.inputs). The KV cache is off: workbench.models.build.no_kv_cache.
        logits = model(**model_inputs(batch, model)).logits
        s, y = shift_for_next_token(logits, batch["labels"])
        return {"loss_sum": token_ce_sum(s, y), "tokens": (y != IGNORE_INDEX).sum().to(torch.float32)}
