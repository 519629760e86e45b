"""The training objective: next-token cross-entropy as a sum over real tokens and their count.

Objectives return per-token *sums* plus the token count (fp32), never a mean, so the step
engine normalises over all real tokens of an optimizer step however they are spread over
micro-batches. `CausalLMObjective` is the plain language-model loss (and the eval loss);
`workbench.objectives.distillation.DistillationObjective` builds on the same helpers.

Both compute the loss in chunks of positions when `LossChunking` (``train.loss_chunk_tokens``)
says so for a batch's shape (`workbench.models.lm_head`): the decision reads only the shape
(Python ints, never a tensor: no host read), so each batch shape is one program with a fixed
chunk length and nothing recompiles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from workbench.data.chat import IGNORE_INDEX
from workbench.models.inputs import model_inputs
from workbench.models.lm_head import (
    LMHead,
    LossChunkingError,
    chunked_ce_sum,
    lm_head_of,
    logits_bytes,
    loss_chunk_length,
    vocab_size,
)
from workbench.units import format_bytes

Notice = Callable[[str], None]


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


def next_token_count(labels: torch.Tensor) -> torch.Tensor:
    """How many next-token positions count (label 1..L-1 not -100), as an fp32 scalar."""
    return (labels[:, 1:] != IGNORE_INDEX).sum().to(torch.float32)


# ---- when to chunk ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossChunking:
    """``train.loss_chunk_tokens`` and what its rule (`workbench.models.lm_head.loss_chunk_length`)
    needs to know about the run's devices."""

    setting: int | str = "auto"
    """0 never chunks, N >= 1 tokens per chunk, 'auto' by the device's memory."""
    memory_bytes: int | None = None
    """One device's memory (`HardwareInfo.memory_per_device_bytes`); None (CPU): the rule's reference."""
    data_parallel: int = 1
    """Ways the batch splits (the mesh's data x fsdp): a device holds ``rows / data_parallel`` rows."""
    model_parallel: int = 1
    """The mesh's model axis: the head's vocabulary splits over it."""

    def positions(self, rows: int, length: int, vocab: int) -> int | None:
        """Positions per chunk for a global batch of `rows` x `length` (None: the plain loss)."""
        return loss_chunk_length(
            self.setting,
            rows=self.rows_per_device(rows),
            length=length,
            vocab=vocab,
            memory_bytes=self.memory_bytes,
            model_parallel=self.model_parallel,
        )

    def rows_per_device(self, rows: int) -> int:
        return max(1, -(-rows // max(1, self.data_parallel)))

    def describe(self, rows: int, length: int, vocab: int, positions: int) -> str:
        """``loss in chunks of 128 positions: logits 2.00 GiB → 128.00 MiB per device``."""
        sizes = dict(rows=self.rows_per_device(rows), vocab=vocab, model_parallel=self.model_parallel)
        whole, chunk = logits_bytes(positions=length, **sizes), logits_bytes(positions=positions, **sizes)
        return (
            f"loss in chunks of {positions} positions (train.loss_chunk_tokens={self.setting!r}): "
            f"logits {format_bytes(whole)} → {format_bytes(chunk)} per device"
        )


class ChunkPlan:
    """Per batch, whether and how an objective chunks: the chunk length from the shape alone, the
    model's head, and the run's one notice (`notice`) the first time a batch is chunked.

    With ``'auto'`` a model whose head cannot be chunked (`LossChunkingError`) falls back to the
    plain loss with a notice; an explicit N raises the error.
    """

    def __init__(self, chunking: LossChunking | None, notice: Notice | None) -> None:
        self.chunking = chunking or LossChunking()
        self.notice = notice
        self._noticed = False

    def heads(self, models: list[torch.nn.Module], labels: torch.Tensor) -> tuple[list[LMHead], int] | None:
        """The heads of `models` (which share a vocabulary) and the positions per chunk for
        `labels`' shape, or None for the plain loss."""
        rows, length = labels.shape
        vocab = vocab_size(models[0])
        positions = self.chunking.positions(rows, length, vocab)
        if positions is None:
            return None
        try:
            heads = [lm_head_of(model) for model in models]
        except LossChunkingError as err:
            if self.chunking.setting != "auto":
                raise
            self._say(f"{err}; 'auto' keeps the plain loss")
            return None
        self._say(self.chunking.describe(rows, length, vocab, positions))
        return heads, positions

    def _say(self, message: str) -> None:
        if self.notice is not None and not self._noticed:
            self._noticed = True
            self.notice(message)


# ---- objectives ----------------------------------------------------------------------------------


class CausalLMObjective(torch.nn.Module):
    """Next-token cross-entropy: returns the sum over real positions and their count (fp32).

    `chunking` (default: 'auto') decides per batch shape whether the loss runs in chunks;
    `notice` hears once that it does.
    """

    def __init__(self, chunking: LossChunking | None = None, notice: Notice | None = None) -> None:
        super().__init__()
        self.plan = ChunkPlan(chunking, notice)

    @property
    def chunking(self) -> LossChunking:
        return self.plan.chunking

    def forward(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # The batch's model keys and a mask built on its device: no host read in transformers 5's
        # masking (workbench.models.inputs). The KV cache is off: workbench.models.build.no_kv_cache.
        labels = batch["labels"]
        chunked = self.plan.heads([model], labels)
        if chunked is None:
            logits = model(**model_inputs(batch, model)).logits
            s, y = shift_for_next_token(logits, labels)
            return {"loss_sum": token_ce_sum(s, y), "tokens": next_token_count(labels)}
        (head,), positions = chunked
        hidden = head.hidden_states(model_inputs(batch, model)).last_hidden_state
        return {
            "loss_sum": chunked_ce_sum(head, hidden, labels, positions),
            "tokens": next_token_count(labels),
        }
