"""A bucketed Trainer run under FSDP over 8 devices, gradient accumulation against one large batch,
and distillation from a sharded teacher (tests/test_train.py)."""

from __future__ import annotations

from typing import Any

from tests.test_train import _grads_of_one_step, _pad, tiny_cfg, token_dataset
from tests.xla import run
from workbench.backend.xla import runtime
from workbench.models.build import build_model
from workbench.parallel.apply import shard_batch
from workbench.train import Trainer

MESH = {"mesh.enabled": True, "mesh.data": 1, "mesh.fsdp": 8, "train.device_type": "xla"}


def fit_and_evaluate(checkpoint_dir: str) -> tuple[Trainer, dict[str, Any]]:
    cfg = tiny_cfg(
        **MESH,
        **{
            "train.batch_size": 8,
            "train.steps": 10,
            "train.log_every": 5,
            "train.eval_every": 5,
            "train.checkpoint_dir": checkpoint_dir,
            "train.checkpoint_every": 5,
        },
    )
    trainer = Trainer(cfg, train_dataset=token_dataset(96), eval_dataset=token_dataset(16, 7))
    result = trainer.fit()
    sampler = trainer.sampler
    shapes = sorted({tuple(s) for s in sampler.batch_shapes()}) if hasattr(sampler, "batch_shapes") else []
    spec = runtime.sharding_spec(trainer.model.get_input_embeddings().weight)
    eval_loss = trainer.evaluate()
    return trainer, {
        "compiles_after_warmup": result.compiles_after_warmup,
        "warmup_compiles": result.warmup_compiles,
        "shapes": shapes,
        "losses": [m["loss"] for m in result.history],
        "eval_losses": [m["eval_loss"] for m in result.history],
        "transfers": [m["transfers"] for m in result.history],
        "recompiled": [m["recompiled"] for m in result.history],
        "spec": spec,
        "checkpoint": result.checkpoint_path,
        "eval_loss": eval_loss,
    }


def worst_accumulation_difference(mesh: Any) -> float:
    """Accumulation on XLA under FSDP: the gradients of 4 x 8 rows vs 1 x 32 rows."""
    rows = token_dataset(32, seed=3)["input_ids"]
    big = _pad(rows, 32)
    small = [_pad(rows[i : i + 8], 32) for i in range(0, 32, 8)]
    one = _grads_of_one_step(
        tiny_cfg(**MESH, **{"train.batch_size": 32, "train.max_grad_norm": None}),
        [shard_batch(big, mesh)],
    )
    four = _grads_of_one_step(
        tiny_cfg(**MESH, **{"train.batch_size": 8, "train.grad_accum": 4, "train.max_grad_norm": None}),
        [shard_batch(b, mesh) for b in small],
    )
    return max(
        float((a.cpu() - b.cpu()).abs().max() / (a.cpu().abs().max() + 1e-12)) for a, b in zip(one, four)
    )


def distillation() -> dict[str, Any]:
    """Distillation in the same loop: the teacher (wider) is sharded over the mesh like the student."""
    teacher = build_model(tiny_cfg(**{"model.hidden_size": 64, "model.intermediate_size": 128}).model, seed=5)
    cfg = tiny_cfg(
        **MESH,
        **{
            "train.batch_size": 8,
            "train.steps": 4,
            "train.log_every": 2,
            "train.distill_hidden_weight": 0.1,
        },
    )
    distilled = Trainer(cfg, train_dataset=token_dataset(64), teacher=teacher).fit()
    return {
        "distill_losses": [m["loss"] for m in distilled.history],
        "distill_compiles_after_warmup": distilled.compiles_after_warmup,
        "teacher_spec": runtime.sharding_spec(teacher.get_input_embeddings().weight),
        "teacher_frozen": (not teacher.training) and not any(p.requires_grad for p in teacher.parameters()),
    }


def main(checkpoint_dir: str) -> dict[str, Any]:
    trainer, out = fit_and_evaluate(checkpoint_dir)
    out["worst_rel_grad_diff"] = worst_accumulation_difference(trainer.mesh)
    out.update(distillation())
    return out


if __name__ == "__main__":
    run(main)
