"""A run's config as the memory estimate's arguments: what a `WorkbenchConfig` decides of a step's memory.

`config_settings` gives `workbench.analysis.estimate.estimate` (and the batch finder, the config
panel, the dynamic batch's cap) the settings a config fixes: optimizer, precision, checkpointing,
accumulation, LoRA, quantization, loss chunks, a DPO run's reference (`preference_reference`), a
GRPO run's rollout (`workbench.analysis.rollout_memory.rollout_plan`), the layers' checkpoints in host
memory and the MLP in tiles (`workbench.analysis.long_context`). The batch, the length, the
mesh, the device's memory and the attention kernel its hardware runs are the caller's.
"""

from __future__ import annotations

from typing import Any

from workbench.analysis.rollout_memory import rollout_plan
from workbench.config import REFERENCE_FREE_LOSSES


def preference_reference(cfg: Any) -> str | None:
    """The reference a `WorkbenchConfig` plans for under ``train.objective: dpo`` (None otherwise):
    'auto' is 'adapters_off' under LoRA, 'copy' without (a run continuing trained adapters
    precomputes instead, which needs less: the estimate stays on the safe side)."""
    train = cfg.train
    if train.objective != "dpo":
        return None
    if (
        train.dpo_loss in REFERENCE_FREE_LOSSES
    ):  # reference-free: no reference forward, no copy, as precomputed
        return "precompute"
    if train.dpo_reference != "auto":
        return str(train.dpo_reference)
    return "adapters_off" if cfg.lora.rank else "copy"


def config_settings(cfg: Any) -> dict[str, Any]:
    """`estimate`'s arguments as a `WorkbenchConfig` sets them (optimizer, precision, checkpointing,
    accumulation, LoRA, quantization, loss chunks, the DPO reference, the GRPO rollout, activation
    offload, MLP tiles); the batch, the
    length, the mesh, the device's memory and the attention kernel its hardware runs are the caller's.
    Under ``train.objective: grpo`` the batch counts prompts and the length is the prompt's
    (``data.max_length``): the rollout adds the completions."""
    train = cfg.train
    return dict(
        optimizer=train.optimizer,
        precision=train.precision,
        gradient_checkpointing=train.gradient_checkpointing,
        grad_accum=train.grad_accum,
        lora_rank=cfg.lora.rank,
        lora_targets=cfg.lora.target_modules,
        quantize=cfg.model.quantize,
        loss_chunk_tokens=train.loss_chunk_tokens,
        preference=preference_reference(cfg),
        rollout=rollout_plan(cfg),
        offload_activations=train.offload_activations,
        mlp_chunk_tokens=cfg.model.mlp_chunk_tokens,
    )
