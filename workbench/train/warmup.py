"""Warm-up: compile every step program before training, then put the training state back exactly.

On XLA, before the first step, every (batch, length) shape the sampler can emit (at every batch
size dynamic growth will reach, and the eval split's shapes when evals run) goes through the
real step on synthetic tokens. The model, objective, optimizer, scheduler and RNG are
snapshotted to the host first and copied back *into* the live tensors after (keeping their
device placement and sharding), so training continues exactly as it would have without the
warm-up, and after it nothing compiles on a bucketed run.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.data.loader import prewarm, synthetic_batch
from workbench.train.optim import restore_optimizer_scalars
from workbench.train.state import model_state
from workbench.train.state_io import capture_rng, flatten_state, host_tensors, restore_rng, unflatten_state
from workbench.train.step import StepEngine
from workbench.train.stream import TrainingData


def _live_state(engine: StepEngine) -> dict[str, Any]:
    return {
        "model": model_state(engine.model),  # a LoRA model's trainable part: the frozen base never changes
        "objective": engine.objective.state_dict(),
        "optimizer": engine.optimizer.state_dict(),
    }


def snapshot(engine: StepEngine) -> dict[str, Any]:
    """A host copy of everything a warm-up step changes."""
    structure, tensors = flatten_state(_live_state(engine))
    host = host_tensors(tensors)
    # Tensors already on the host (AdamW's step counters) come back as themselves: copy them,
    # or the warm-up steps would advance the "snapshot" too.
    host = {k: (v.clone() if tensors[k].device.type == "cpu" else v) for k, v in host.items()}
    return {
        "structure": structure,
        "tensors": host,
        "scheduler": engine.scheduler.state_dict(),
        "lrs": [g["lr"] for g in engine.optimizer.param_groups],
        "rng": capture_rng(engine.xla),
    }


def restore(engine: StepEngine, snap: dict[str, Any]) -> None:
    """Copy `snap` back *into* the live tensors (keeps their device placement and sharding)."""
    _, live_tensors = flatten_state(_live_state(engine))
    with torch.no_grad():
        for key, value in snap["tensors"].items():
            live_tensors[key].copy_(value)
    saved = unflatten_state(snap["structure"], snap["tensors"])
    restore_optimizer_scalars(engine.optimizer, saved["optimizer"])
    engine.scheduler.load_state_dict(snap["scheduler"])
    for group, lr in zip(engine.optimizer.param_groups, snap["lrs"]):
        group["lr"] = lr
    restore_rng(snap["rng"])
    engine.clear()
    engine.sync()


def compile_step_programs(
    engine: StepEngine,
    data: TrainingData,
    template: dict[str, torch.Tensor],
    *,
    batch_sizes: list[int],
    grad_accum: int,
    evals: bool,
) -> None:
    """Run the training step (and the eval forward when `evals`) once for every shape the loaders
    can emit at each of `batch_sizes`, on synthetic tokens laid out like `template` (a real batch)."""
    vocab = int(engine.model.get_input_embeddings().weight.shape[0])

    def make_batch(shape: tuple[int, int]) -> dict[str, torch.Tensor]:
        fake = synthetic_batch(shape, vocab_size=vocab, pad_token_id=data.pad_token_id, template=template)
        return data.to_device(fake)

    for size in batch_sizes:
        shapes = data.shapes(size, data.train_dataset) or [tuple(template["input_ids"].shape[:2])]
        prewarm(lambda batch: engine.train_step([batch] * grad_accum), shapes, make_batch)
        if evals:  # the eval split has its own bucket plan: compile its forward shapes too
            prewarm(lambda batch: engine.eval_loss([batch]), data.shapes(size, data.eval_dataset), make_batch)
