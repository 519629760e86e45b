"""``train.objective: sft``: next-token cross-entropy on the labelled tokens, or distillation with a teacher.

The examples are `workbench.data.records`' (text or chat, labelled on what the model should say) and
the run is the training loop's default (`workbench.train.objective_run.ObjectiveRun`). A run given a
teacher (``Trainer(cfg, teacher=model)``: a model object, so the config cannot name one) distils from
it instead (`workbench.objectives.distillation`), weighted by ``train.distill_*``; without one those
keys are named as unread.
"""

from __future__ import annotations

from typing import Any

from workbench.objective_registry import Objective, register_objective, set_keys

TEACHER_SETTINGS = ("train.distill_alpha", "train.distill_temperature", "train.distill_hidden_weight")
"""The keys a run reads only with a teacher (distillation)."""


class NextToken(Objective):
    """Supervised fine-tuning; distillation when a teacher is given."""

    name = "sft"
    summary = "next-token cross-entropy on the labelled tokens"
    example_kind = "text"
    settings = TEACHER_SETTINGS

    @property
    def reader(self) -> str:
        return "distillation (train.objective=sft with a teacher: Trainer(cfg, teacher=model))"

    def examples(self, cfg: Any, tokenizer: Any, cache_dir: Any) -> Any:
        from workbench.data.records import load_records, tokenize_records

        return tokenize_records(load_records(cfg.data, cache_dir), tokenizer, cfg.data)

    def start(self, trainer: Any, *, teacher: Any = None) -> Any:
        if teacher is not None:  # distillation: the same examples, the teacher's distribution as target
            from workbench.objectives.distillation import DistillationRun

            return DistillationRun(teacher)
        from workbench.train.objective_run import ObjectiveRun

        return ObjectiveRun()

    def idle_settings(self, cfg: Any, *, teacher: Any = None) -> list[str]:
        if teacher is not None:
            return []
        return [
            f"{key}={getattr(cfg.train, key.split('.', 1)[1])!r} is read by {self.reader}; this run has no "
            "teacher: it is ignored"
            for key in set_keys(cfg, TEACHER_SETTINGS)
        ]


register_objective(NextToken())
