"""A run's config as the memory estimate's arguments: what a `WorkbenchConfig` decides of a step's memory.

`config_settings` gives `workbench.analysis.estimate.estimate` (and the batch finder, the config
panel, the dynamic batch's cap) the settings a config fixes: optimizer, precision, checkpointing,
accumulation, LoRA, quantization, loss chunks, the run's objective's term
(`workbench.objective_registry.Objective.memory`: a DPO run's pairs and reference, a GRPO run's
rollout), the layers' checkpoints in host memory and the MLP in tiles (`workbench.analysis.long_context`). The batch, the length, the
mesh, the device's memory and the attention kernel its hardware runs are the caller's;
`config_settings_on` adds the mesh and that kernel for a target.
"""

from __future__ import annotations

from typing import Any

from workbench.analysis.activations import estimate_attention
from workbench.analysis.objective_memory import NEXT_TOKEN
from workbench.objective_registry import objective_for


def config_settings(cfg: Any) -> dict[str, Any]:
    """`estimate`'s arguments as a `WorkbenchConfig` sets them (optimizer, precision, checkpointing,
    accumulation, LoRA, quantization, loss chunks, the objective's term, activation offload, MLP tiles); the batch, the
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
        objective=objective_for(cfg).memory(cfg) or NEXT_TOKEN,  # what an example is: a row, a pair, G rows
        offload_activations=train.offload_activations,
        mlp_chunk_tokens=cfg.model.mlp_chunk_tokens,
    )


def config_settings_on(cfg: Any, target: Any, *, mesh: Any) -> dict[str, Any]:
    """`config_settings(cfg)` with `mesh` and the attention kernel ``model.attention`` runs on `target`
    (a `workbench.backend.targets` chip) at a training row's length: the objective's (a GRPO row is the
    prompt and its completion). What ``plan`` and the config panel price a config with."""
    settings = config_settings(cfg)
    longest = settings["objective"].positions(cfg.data.max_length)
    attention = estimate_attention(cfg.model.attention, target, seq_len=longest, model_config=cfg.model)
    return dict(settings, mesh=mesh, attention=attention)
