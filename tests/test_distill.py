"""Knowledge distillation: the loss terms, the frozen teacher, and a real run on the embedded corpus."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workbench.config import ModelConfig, WorkbenchConfig
from workbench.models.build import build_model
from workbench.objectives.distillation import (
    DistillationObjective,
    DistillSettings,
    distillation_loss,
    mean_token_kl,
)


def _logits(seed: int, shape=(2, 6, 11)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_loss_terms_match_their_definitions():
    student, teacher = _logits(0), _logits(1)
    labels = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(2))
    labels[0, :2] = -100
    s, t, y = student[:, :-1], teacher[:, :-1], labels[:, 1:]
    mask = y != -100
    ce = F.cross_entropy(s[mask], y[mask])
    T = 3.0
    kl = F.kl_div(
        F.log_softmax(s[mask] / T, -1), F.log_softmax(t[mask] / T, -1), log_target=True, reduction="batchmean"
    )
    got = distillation_loss(student, teacher, labels, alpha=0.3, temperature=T)
    torch.testing.assert_close(got, 0.3 * T * T * kl + 0.7 * ce)
    torch.testing.assert_close(distillation_loss(student, teacher, labels, alpha=0.0), ce)
    assert float(distillation_loss(teacher, teacher, labels, alpha=1.0)) == pytest.approx(0.0, abs=1e-6)


def test_settings_and_mismatched_vocabularies_fail_clearly():
    with pytest.raises(ValueError, match=r"alpha=1\.5"):
        DistillSettings(alpha=1.5)
    with pytest.raises(ValueError, match="temperature=0"):
        DistillSettings(temperature=0)
    small = build_model(ModelConfig(hidden_size=32, intermediate_size=64, vocab_size=100))
    other = build_model(ModelConfig(hidden_size=32, intermediate_size=64, vocab_size=120))
    with pytest.raises(ValueError, match="share one tokenizer"):
        DistillationObjective(other, small)


def test_teacher_is_frozen_out_of_the_objective_and_projection_trains():
    teacher = build_model(ModelConfig(hidden_size=64, intermediate_size=128, vocab_size=100), seed=1)
    student = build_model(ModelConfig(hidden_size=32, intermediate_size=64, vocab_size=100), seed=2)
    objective = DistillationObjective(teacher, student, DistillSettings(hidden_weight=0.5))
    objective.train()
    assert not teacher.training and all(not p.requires_grad for p in teacher.parameters())
    assert [n for n, _ in objective.named_parameters()] == ["projection.weight"]
    assert set(objective.state_dict()) == {"projection.weight"}
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    out = objective(student, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    out["loss_sum"].backward()
    assert objective.projection.weight.grad is not None and objective.projection.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())
    assert float(out["tokens"]) == 2 * 11 and float(out["hidden_sum"]) > 0


def _corpus_cfg(**overrides) -> WorkbenchConfig:
    base = {
        "data.source": "embedded",
        "data.max_length": 32,
        "data.max_examples": 240,
        "data.eval_fraction": 0.1,
        "data.tokenizer_vocab_size": 256,
        "bucketing.max_buckets": 2,
        "bucketing.multiple_of": 8,
        "model.hidden_size": 64,
        "model.intermediate_size": 128,
        "model.num_layers": 2,
        "model.max_position_embeddings": 32,
        "train.device_type": "cpu",
        "train.batch_size": 8,
        "train.learning_rate": 3e-3,
        "train.warmup_steps": 3,
        "train.log_every": 10,
        "train.progress_bar": False,
    }
    base.update(overrides)
    return WorkbenchConfig().with_overrides(base)


@pytest.mark.slow
def test_distillation_on_the_embedded_corpus_brings_the_students_kl_to_the_teacher_down(tmp_path):
    from workbench.data.loader import make_loader
    from workbench.data.records import build_datasets
    from workbench.train.trainer import Trainer

    teacher_cfg = _corpus_cfg(**{"train.steps": 30})
    train_ds, eval_ds, tokenizer = build_datasets(teacher_cfg, cache_dir=tmp_path)
    teacher_run = Trainer(teacher_cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds)
    teacher_run.fit()
    teacher = teacher_run.model

    student_cfg = _corpus_cfg(
        **{
            "model.hidden_size": 32,
            "model.intermediate_size": 64,
            "model.num_layers": 1,
            "train.steps": 30,
            "train.distill_alpha": 0.9,
            "train.distill_temperature": 2.0,
            "train.distill_hidden_weight": 0.1,
            "train.seed": 1,
        }
    )
    loader, _ = make_loader(eval_ds, student_cfg, pad_token_id=tokenizer.pad_token_id, seed=0)
    eval_batches = list(loader)
    assert eval_batches, "the eval split should give at least one batch"
    trainer = Trainer(
        student_cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, teacher=teacher
    )
    before = mean_token_kl(trainer.model, teacher, eval_batches)
    projection_before = trainer.objective.projection.weight.detach().clone()
    result = trainer.fit()
    after = mean_token_kl(trainer.model, teacher, eval_batches)
    assert after < 0.7 * before, (before, after)
    assert not torch.equal(projection_before, trainer.objective.projection.weight)  # the projection learned
    assert not teacher.training and all(not p.requires_grad for p in teacher.parameters())
    assert result.history[-1]["loss"] < result.history[0]["loss"]
