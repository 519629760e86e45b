"""The LM head and its loss in chunks of positions (``train.loss_chunk_tokens``).

A causal LM's loss normally materialises ``[tokens x vocab]`` fp32 logits (and as much again for
log-softmax and the gradients): 1.96 GiB at 1024 tokens for a 128k vocabulary. Chunked, the
hidden states go through the head and the cross-entropy a slice of positions at a time, each
slice recomputed in the backward pass, so at most one chunk's logits exist.

- **The split** (`lm_head_of`): the model's decoder (``get_decoder()``, final norm included;
  through a peft model its base's, adapters inside) gives the final hidden states, the output
  embedding (``get_output_embeddings()``, called as a module: tied or not, a peft or quantized
  module) the logits, in fp32, with Gemma 2/3's ``final_logit_softcapping``. Families the
  registry does not know raise `LossChunkingError` (their heads may scale logits otherwise).
- **The sum** (`chunked_sums`, `chunked_ce_sum`): labels shifted by appending an ignored label
  (`next_token_labels`) so the hidden states are never sliced by one; chunks run along the
  sequence dimension with every row of the batch in each, so under SPMD each chunk stays split
  over the mesh's batch axes like the batch itself (the flattened token dimension is never
  sliced). With gradients each chunk is checkpointed; without (eval) a plain loop.
- **Per-token values** (`chunked_columns`): a chunk's output is one value per position (GRPO's
  completion log-probs), the chunks' outputs set side by side (``[B, L]``, small) rather than
  summed; the same checkpointing and chaining, so any function of them (a ratio, a clip, a
  sequence mean) runs on ``[B, L]`` and only one chunk's logits ever exist.
- **On XLA** the chunks are chained by data dependencies (`_ChainedCheckpoint`), or the compiler
  runs them side by side and saves nothing. The compiler's memory analysis of a training step
  (tests/xla/chunked_memory.py: vocabulary 32768, 2 x 256 tokens) gives 264.1 MiB of
  temporaries plain, 136.7 MiB in chunks of 128 positions and 73.0 MiB in chunks of 64: the
  plain figure less the whole logits term (256 MiB at 16 bytes a vocabulary entry) plus one
  chunk's (128, 64 MiB).

`loss_chunk_length` is the one rule for how long a chunk is, shared by the training objectives
(`workbench.train.objective.LossChunking`) and the memory estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import ConfigError
from workbench.families import FAMILIES
from workbench.units import GiB

_IGNORE = -100
"""The label the loss skips (`workbench.data.chat.IGNORE_INDEX`, a layer above this one)."""

AUTO_LOGITS_SHARE = 1 / 16
"""'auto' chunks when the full logits term (4 fp32 copies a token) would exceed this share of a device's memory."""
AUTO_CHUNK_SHARE = 1 / 32
"""... and then makes each chunk's logits term at most this share."""
REFERENCE_MEMORY = 16 * GiB
"""The memory 'auto' plans for where the device's is unknown (CPU): one Colab v5e chip."""
LOGITS_BYTES_PER_ELEMENT = 4 * 4
"""Logits, log-softmax and their two gradients, fp32: what a token's vocabulary row costs."""


def loss_chunk_length(
    setting: int | str,
    *,
    rows: int,
    length: int,
    vocab: int,
    memory_bytes: int | None = None,
    model_parallel: int = 1,
) -> int | None:
    """Positions per loss chunk for a batch of `rows` rows (per device) of `length` positions,
    or None for no chunking (the plain loss).

    `setting` is ``train.loss_chunk_tokens``: 0 never chunks; N >= 1 chunks N tokens at a time
    (``N // rows`` positions, at least 1); ``"auto"`` chunks only when the full logits term,
    ``rows x length x vocab / model_parallel x 16`` bytes, exceeds `AUTO_LOGITS_SHARE` of
    `memory_bytes` (`REFERENCE_MEMORY` when unknown), into chunks of at most `AUTO_CHUNK_SHARE`
    (a multiple of 8 positions where that leaves one). A chunk as long as the batch is None.
    """
    if setting == 0:
        return None
    per_position = rows * max(1, vocab // max(1, model_parallel)) * LOGITS_BYTES_PER_ELEMENT
    if setting == "auto":
        memory = memory_bytes or REFERENCE_MEMORY
        if per_position * length <= AUTO_LOGITS_SHARE * memory:
            return None
        positions = int(AUTO_CHUNK_SHARE * memory // per_position)
        positions = positions - positions % 8 if positions >= 8 else max(1, positions)
    elif isinstance(setting, int) and not isinstance(setting, bool) and setting >= 1:
        positions = max(1, setting // rows)
    else:
        raise ValueError(
            f"train.loss_chunk_tokens={setting!r} is not allowed: an int >= 1, 0 (never chunk) or 'auto'"
        )
    return None if positions >= length else positions


def logits_bytes(*, rows: int, positions: int, vocab: int, model_parallel: int = 1) -> int:
    """The logits term of `positions` positions of `rows` rows on one device (what `loss_chunk_length` weighs)."""
    return rows * positions * max(1, vocab // max(1, model_parallel)) * LOGITS_BYTES_PER_ELEMENT


# ---- the head ---------------------------------------------------------------------------------


class LossChunkingError(ConfigError):
    """A model whose LM head the chunked loss cannot reproduce; the message says what to set."""


def _error(family: str, why: str) -> LossChunkingError:
    return LossChunkingError(
        f"train.loss_chunk_tokens cannot chunk the loss of family {family!r}: {why}. "
        "Set train.loss_chunk_tokens: 0 (the plain loss, full logits)"
    )


@dataclass(frozen=True)
class LMHead:
    """A causal LM split where the chunked loss needs it: the decoder (input ids -> final hidden
    states, the final norm included) and the head (hidden states -> logits)."""

    family: str
    decoder: nn.Module
    head: nn.Module
    """The output embedding, called as a module: a Linear, tied or not, a peft wrapper, a quantized module."""
    softcap: float | None = None
    """Gemma 2/3's ``final_logit_softcapping``: logits become ``tanh(logits / cap) * cap``."""

    def hidden_states(self, inputs: dict[str, Any], **kwargs: Any) -> Any:
        """The decoder's output (``.last_hidden_state``; ``.hidden_states`` with ``output_hidden_states``)
        for a forward's inputs (`workbench.models.inputs.model_inputs`)."""
        return self.decoder(**inputs, **kwargs)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits of `hidden` ``[..., H]``, as the family's ``ForCausalLM`` computes them."""
        logits = self.head(hidden).float()
        if self.softcap is not None:  # in fp32: the plain path caps in the head's dtype, then casts
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def lm_head_of(model: nn.Module) -> LMHead:
    """The decoder and head of a `transformers` causal LM of a registered family, or of a peft
    model around one (detected by ``get_base_model``; its adapters sit inside the base's modules).

    Raises `LossChunkingError` for a family the workbench does not register (its ``ForCausalLM``
    may scale or cap its logits in a way the chunked loss would not reproduce) or a model with
    no separate decoder or head.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    family = str(getattr(config, "model_type", type(base).__name__))
    if family not in FAMILIES:
        known = ", ".join(FAMILIES)
        raise _error(family, f"only the registered families' heads are known ({known})")
    get_decoder = getattr(base, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if not isinstance(decoder, nn.Module) or decoder is base or not isinstance(head, nn.Module):
        raise _error(family, f"{type(base).__name__} has no separate decoder and output embedding")
    softcap = getattr(config, "final_logit_softcapping", None)
    return LMHead(family, decoder, head, float(softcap) if softcap else None)


def vocab_size(model: nn.Module) -> int:
    """The model's vocabulary (its config's ``vocab_size``, else its output embedding's rows);
    a peft model's is its base's."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    size = getattr(getattr(base, "config", None), "vocab_size", None)
    if size:
        return int(size)
    return int(base.get_output_embeddings().weight.shape[0])


# ---- the loss in chunks -----------------------------------------------------------------------


def next_token_labels(labels: torch.Tensor) -> torch.Tensor:
    """``labels[:, 1:]`` with an ignored label appended: position t is paired with label t+1, and
    the last position, which predicts nothing, is ignored. The hidden states then need no shift
    (a slice by one of a ``[B, L, H]`` tensor would be a copy)."""
    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], _IGNORE)], dim=1)


class CrossEntropyChunk(nn.Module):
    """One chunk's next-token cross-entropy sum: ``head`` -> fp32 logits -> CE (labels already shifted).

    A module holding the head as a submodule, so `chunked_sums` sees whether the head trains.
    """

    def __init__(self, head: LMHead) -> None:
        super().__init__()
        self.head = head.head  # registered: its parameters are the module's
        self.lm_head = head

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head.logits(hidden)
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=_IGNORE, reduction="sum"
        )


def _after(x: torch.Tensor, dep: torch.Tensor | None) -> torch.Tensor:
    """`x`, unchanged, computed from `dep` (a scalar) so that nothing using it runs before `dep`.

    ``x + 0 * dep``: a real data dependency, which every XLA scheduler honours and XLA's
    simplifier keeps (it folds ``0 * y`` for integers only: for floats ``y`` may be NaN).
    """
    if dep is None:
        return x
    zero = dep.detach().float().sum() * 0
    return x + zero.to(x.dtype)


class _ChainedCheckpoint(torch.autograd.Function):
    """One chunk of the loss on XLA, recomputed in the backward pass, in sequence with the others.

    XLA sees the chunks as independent and schedules them side by side. Measured on XLA:CPU
    (vocab 32768, 2 x 256 tokens, 4 chunks): torch_xla's checkpoint gave 201 MiB of
    temporaries against 264 MiB unchunked, because the CPU compiler expands its optimization
    barriers before scheduling (none is left in the optimized program), merges each recompute
    with its forward (common-subexpression elimination) and computes all four chunks' logits,
    softmax and gradients at once. Barriers of our own fared the same. Data dependencies
    cannot be dropped: the chunk's inputs are computed from the previous chunk's running sum
    (`dep`), and in the backward pass from the incoming gradient, whose part from `dep` is a
    zero computed from the next chunk's input gradients. So chunk i+1 runs after chunk i in
    the forward pass, chunk i's recompute after chunk i+1's gradients in the backward pass, and
    the recompute can never be merged into the forward.

    The head and loss must be deterministic (no dropout: the RNG state is not replayed).
    Parameter gradients accumulate into ``.grad`` as torch's reentrant checkpoint does.
    """

    @staticmethod
    def forward(
        ctx: Any, loss: nn.Module, dep: torch.Tensor | None, *xs: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        xs = tuple(_after(x, dep) for x in xs)
        device_type = xs[0].device.type
        ctx.loss, ctx.dep_shape = loss, dep.shape if dep is not None else None
        ctx.autocast = (
            device_type,
            torch.is_autocast_enabled(device_type),
            torch.get_autocast_dtype(device_type),
        )
        ctx.save_for_backward(*xs)
        out = loss(*xs)
        return (out,) if isinstance(out, torch.Tensor) else tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        tie = sum(g.float().sum() for g in grads if g is not None)  # what the recompute waits for
        needs = ctx.needs_input_grad[2:]
        device_type, enabled, dtype = ctx.autocast
        with torch.enable_grad(), torch.autocast(device_type, dtype=dtype, enabled=enabled):
            inputs = [
                _after(x, tie).detach().requires_grad_(need) for x, need in zip(ctx.saved_tensors, needs)
            ]
            outs = ctx.loss(*inputs)
        outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        input_grads = [x.grad if need else None for x, need in zip(inputs, needs)]
        dep_grad = None
        if ctx.dep_shape is not None:  # the previous chunks' backward waits for this one's input gradients
            done = [g.float().sum() for g in input_grads if g is not None]
            # shaped like the dependency: a running sum per row (DPO's log-probs) is a vector
            dep_grad = _after(torch.zeros(ctx.dep_shape, device=grads[0].device), sum(done) if done else None)
        return (None, dep_grad, *input_grads)


def chunked_sums(
    loss: nn.Module, per_position: Sequence[torch.Tensor], positions: int
) -> tuple[torch.Tensor, ...]:
    """Σ over chunks of ``loss(*chunk)``: each chunk is `positions` positions (the last may be
    shorter) of every ``[B, L, ...]`` tensor in `per_position`, all rows included, so under SPMD
    a chunk is split over the mesh's batch axes like the batch. `loss` returns a scalar or a
    tuple of scalars; so does this (as a tuple).

    With gradients on, each chunk is checkpointed: its forward keeps only the chunk's inputs
    and the backward pass recomputes its logits, so at most one chunk's logits exist. On XLA
    that is `_ChainedCheckpoint`, which also makes the compiler run the chunks one after the
    other; elsewhere torch's non-reentrant checkpoint (eager execution runs the chunks in order).
    Without gradients (eval) no checkpoint, the chunks still chained on XLA.
    """
    length = per_position[0].shape[1]
    grads = torch.is_grad_enabled() and (
        any(t.requires_grad for t in per_position) or any(p.requires_grad for p in loss.parameters())
    )
    xla = per_position[0].device.type == "xla"
    anchor = None
    if grads and xla and not any(t.requires_grad for t in per_position):
        # autograd calls a Function's backward only when an input needs a gradient: a trainable
        # head over frozen hidden states chains its first chunk to this throwaway leaf instead
        anchor = torch.zeros((), device=per_position[0].device, requires_grad=True)
    totals: list[torch.Tensor] | None = None
    for start in range(0, length, positions):
        chunk = [t[:, start : start + positions] for t in per_position]
        dep = anchor if totals is None else totals[0]
        if grads and xla:
            out = _ChainedCheckpoint.apply(loss, dep, *chunk)
        elif grads:
            out = torch.utils.checkpoint.checkpoint(loss, *chunk, use_reentrant=False)
        else:
            out = loss(*[_after(c, dep) if xla else c for c in chunk])
        out = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        totals = list(out) if totals is None else [a + b for a, b in zip(totals, out)]
    assert totals is not None
    return tuple(totals)


def chunked_columns(loss: nn.Module, per_position: Sequence[torch.Tensor], positions: int) -> torch.Tensor:
    """``loss(*chunk)`` ``[B, n]`` per chunk of `positions` positions of every ``[B, L, ...]`` tensor in
    `per_position`, concatenated along the positions into ``[B, L]``: a per-position value (a
    token's log-prob) whose vocabulary-wide intermediates exist for one chunk at a time.

    As `chunked_sums`: with gradients each chunk is checkpointed (its logits recomputed in the
    backward pass), on XLA chained to the previous chunk's output (`_ChainedCheckpoint`) so the
    compiler runs them one after the other; without gradients a plain loop (chained on XLA).
    """
    length = per_position[0].shape[1]
    grads = torch.is_grad_enabled() and (
        any(t.requires_grad for t in per_position) or any(p.requires_grad for p in loss.parameters())
    )
    xla = per_position[0].device.type == "xla"
    dep = None
    if grads and xla and not any(t.requires_grad for t in per_position):
        dep = torch.zeros((), device=per_position[0].device, requires_grad=True)  # as in `chunked_sums`
    columns: list[torch.Tensor] = []
    for start in range(0, length, positions):
        chunk = [t[:, start : start + positions] for t in per_position]
        if grads and xla:
            (out,) = _ChainedCheckpoint.apply(loss, dep, *chunk)
        elif grads:
            out = torch.utils.checkpoint.checkpoint(loss, *chunk, use_reentrant=False)
        else:
            out = loss(*[_after(c, dep) if xla else c for c in chunk])
        columns.append(out)
        dep = out
    return torch.cat(columns, dim=1)


def chunked_ce_sum(head: LMHead, hidden: torch.Tensor, labels: torch.Tensor, positions: int) -> torch.Tensor:
    """Σ of next-token cross-entropy over labels that are not -100, from final hidden states
    ``[B, L, H]`` and unshifted labels ``[B, L]``, `positions` positions at a time: the same sum
    as the plain loss on the full logits, which never exist whole."""
    (total,) = chunked_sums(CrossEntropyChunk(head), [hidden, next_token_labels(labels)], positions)
    return total
