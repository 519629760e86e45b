"""The loss in chunks on XLA equals the plain loss (tests/test_chunked_loss.py): loss and every
gradient, on one XLA:CPU device or on a data x fsdp x model mesh of 8 virtual devices.

A tiny Llama-style model (untied head, vocabulary 512) on 4 rows of 13 positions with ignored
labels in the middle and at both ends, chunks of 5 positions (the last one 3), plain and chunked:
the next-token cross-entropy (`CausalLMObjective`) and distillation from a wider teacher
(`DistillationObjective`); on one device also the cross-entropy with only the head trainable.
Reported per objective: both losses, the largest relative gradient
error over the parameters (by norm), and the sharding of the head's gradient on the mesh.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.tiny import tiny
from tests.xla import run
from workbench.backend.xla import runtime
from workbench.models.build import build_model
from workbench.objectives.distillation import DistillationObjective, DistillSettings
from workbench.parallel.apply import move_model, shard_batch, shard_model
from workbench.parallel.mesh import MeshSpec
from workbench.train.objective import CausalLMObjective, LossChunking


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 512, (4, 13), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, 4:7] = -100
    labels[1, :2] = -100
    labels[2, -3:] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _measure(objective: torch.nn.Module, model: torch.nn.Module, batch: dict[str, Any]) -> dict[str, Any]:
    for p in model.parameters():
        p.grad = None
    out = objective(model, batch)
    out["loss_sum"].backward()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    runtime.sync()
    values = runtime.to_cpu([out["loss_sum"].detach()] + [p.grad for _, p in named])
    head = model.get_output_embeddings().weight
    return {
        "loss": float(values[0]),
        "grads": dict(zip([n for n, _ in named], values[1:])),
        "head_grad_sharding": runtime.sharding_spec(head.grad),
    }


def _compare(plain: dict[str, Any], chunked: dict[str, Any]) -> dict[str, Any]:
    errors = {
        n: float((chunked["grads"][n] - g).norm() / g.norm().clamp(min=1e-30))
        for n, g in plain["grads"].items()
    }
    worst = max(errors, key=errors.get)
    return {
        "loss_plain": plain["loss"],
        "loss_chunked": chunked["loss"],
        "grad_error": errors[worst],
        "worst": worst,
        "params": len(errors),
        "head_grad_sharding": [plain["head_grad_sharding"], chunked["head_grad_sharding"]],
    }


def main(mesh: dict[str, int] | None = None) -> dict[str, Any]:
    rows = 4
    data_parallel = 1 if mesh is None else mesh.get("data", 1) * mesh.get("fsdp", 1)
    # 5 positions a chunk for the rows one device holds
    chunked = LossChunking(5 * (rows // data_parallel), data_parallel=data_parallel)
    plain = LossChunking(0)
    model = build_model(tiny("llama", tie_word_embeddings=False), seed=0)
    teacher = build_model(tiny("llama", hidden_size=96, intermediate_size=128), seed=1)
    if mesh is None:
        move_model(model)
        move_model(teacher)
        batch = {k: v.to(runtime.device()) for k, v in _batch().items()}
    else:
        runtime.use_spmd()
        built = MeshSpec(**mesh).build()
        shard_model(model, built)
        shard_model(teacher, built)
        batch = shard_batch(_batch(), built)
    result = {
        "ce": _compare(
            _measure(CausalLMObjective(plain), model, batch),
            _measure(CausalLMObjective(chunked), model, batch),
        )
    }
    settings = DistillSettings(alpha=0.3, temperature=2.0)
    result["distill"] = _compare(
        _measure(DistillationObjective(teacher, model, settings, chunking=plain), model, batch),
        _measure(DistillationObjective(teacher, model, settings, chunking=chunked), model, batch),
    )
    if mesh is None:  # a trainable head over frozen hidden states (every other weight frozen)
        for name, p in model.named_parameters():
            p.requires_grad_(name == "lm_head.weight")
        result["head_only"] = _compare(
            _measure(CausalLMObjective(plain), model, batch),
            _measure(CausalLMObjective(chunked), model, batch),
        )
    return result


if __name__ == "__main__":
    run(main)
