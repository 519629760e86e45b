"""Knowledge distillation: a student learns from a frozen teacher of another size, same tokenizer.

Per real (non-padding) next-token position the loss is

    α · T² · KL(softmax(teacher/T) ‖ softmax(student/T))  +  (1 − α) · CE(student, labels)
      + β · ‖W·h_student − h_teacher‖² / d_teacher          (optional, β = `hidden_weight`)

The T² keeps the soft-target gradients on the same scale as the hard-label ones when the
temperature changes (Hinton et al., 2015). The hidden-state term compares the last hidden
layers through a learned linear projection (student width → teacher width), which is
trained with the student and saved in its checkpoints.

`DistillationObjective` plugs into the training loop in place of the plain LM loss (`DistillationRun`, the
SFT objective's run when a teacher is given: `workbench.objectives.sft`): it
returns per-token *sums* plus the token count, so the loop normalises over all the real
tokens of an optimizer step exactly as it does for ordinary training. The teacher is
put in eval mode with ``requires_grad=False`` and kept out of the objective's registered
submodules (its weights are never in the optimizer or the student's checkpoints); with a
mesh it is sharded like the student.

With ``train.loss_chunk_tokens`` (`workbench.train.objective.LossChunking`) the KL and CE terms
run in chunks of positions like the plain loss (`workbench.models.lm_head`): per chunk the
student's and the teacher's logits from their final hidden states and heads (the teacher's
without gradients), recomputed in the backward pass, so neither model's ``[tokens x vocab]``
logits exist whole. The hidden-state term is the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from workbench.backend.xla import runtime
from workbench.data.chat import IGNORE_INDEX
from workbench.models.build import no_kv_cache
from workbench.models.inputs import model_inputs
from workbench.models.lm_head import LMHead, chunked_sums, next_token_labels
from workbench.train.objective import (
    ChunkPlan,
    LossChunking,
    Notice,
    shift_for_next_token,
    token_ce_sum,
)
from workbench.train.objective_run import ObjectiveRun
from workbench.train.trainer import place


@dataclass
class DistillSettings:
    alpha: float = 0.5
    """Weight of the KL (soft-target) term; 1 − alpha weighs the cross-entropy on labels."""
    temperature: float = 2.0
    """Softmax temperature for both teacher and student in the KL term."""
    hidden_weight: float = 0.0
    """Weight of the projected hidden-state MSE (0 disables it and the projection)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha={self.alpha!r} is not allowed: must be in [0, 1]")
        if self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature!r} is not allowed: must be > 0")
        if self.hidden_weight < 0:
            raise ValueError(f"hidden_weight={self.hidden_weight!r} is not allowed: must be >= 0")


def token_kl_sum(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Σ over masked positions of KL(softmax(t/T) ‖ softmax(s/T)), in fp32. Shapes [B, L, V] and [B, L]."""
    t_log = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    s_log = F.log_softmax(student_logits.float() / temperature, dim=-1)
    per_token = (t_log.exp() * (t_log - s_log)).sum(dim=-1)
    return (per_token * mask).sum()


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    alpha: float = 0.5,
    temperature: float = 2.0,
) -> torch.Tensor:
    """α·T²·KL + (1−α)·CE, averaged over real next-token positions (unshifted [B, L, V] logits)."""
    s, y = shift_for_next_token(student_logits, labels)
    t, _ = shift_for_next_token(teacher_logits, labels)
    mask = (y != IGNORE_INDEX).to(torch.float32)
    tokens = mask.sum().clamp(min=1.0)
    kl = token_kl_sum(s, t, mask, temperature)
    ce = token_ce_sum(s, y)
    return (alpha * temperature**2 * kl + (1.0 - alpha) * ce) / tokens


def _hidden_size(model: Any) -> int:
    config = model.config
    return int(getattr(config, "hidden_size", None) or config.n_embd)


class DistillChunk(torch.nn.Module):
    """One chunk's KL(teacher ‖ student at T) and CE sums from both models' final hidden states
    (labels already shifted: `workbench.models.lm_head.next_token_labels`).

    Only the student's head is a submodule (what the chunk's checkpoint treats as its weights);
    the teacher's logits are computed here without gradients, so in the backward pass they are
    recomputed with the student's rather than kept for every chunk.
    """

    def __init__(self, student: LMHead, teacher: LMHead, temperature: float) -> None:
        super().__init__()
        self.head = student.head  # registered; the LMHead records below are plain attributes
        self.student, self.teacher, self.temperature = student, teacher, temperature

    def forward(
        self, student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.student.logits(student_hidden)
        with torch.no_grad():
            t = self.teacher.logits(teacher_hidden)
        mask = (labels != IGNORE_INDEX).to(torch.float32)
        return token_kl_sum(s, t, mask, self.temperature), token_ce_sum(s, labels)


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """Eval mode (dropout off) and no gradients, for a teacher."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class DistillationObjective(torch.nn.Module):
    """The loop's loss for distillation: call with ``(student, batch)``, get sums and a token count.

    Registered (trainable, checkpointed) submodules: only the hidden-state projection, when used.
    `chunking` and `notice`: as `workbench.train.objective.CausalLMObjective`'s.
    """

    def __init__(
        self,
        teacher: torch.nn.Module,
        student: torch.nn.Module,
        settings: DistillSettings | None = None,
        *,
        chunking: LossChunking | None = None,
        notice: Notice | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.settings = settings or DistillSettings()
        self.plan = ChunkPlan(chunking, notice)
        t_vocab = teacher.get_output_embeddings().weight.shape[0]
        s_vocab = student.get_output_embeddings().weight.shape[0]
        if t_vocab != s_vocab:
            raise ValueError(
                f"teacher vocab_size={t_vocab} differs from student vocab_size={s_vocab}: "
                "distillation needs teacher and student to share one tokenizer"
            )
        # A plain attribute, not a submodule: the teacher stays out of parameters(), state_dict() and .to().
        object.__setattr__(self, "teacher", freeze(teacher))
        self.projection: torch.nn.Linear | None = None
        if self.settings.hidden_weight > 0:
            with torch.random.fork_rng(devices=[]):  # the same start in every run and on every rank
                torch.manual_seed(seed)
                self.projection = torch.nn.Linear(_hidden_size(student), _hidden_size(teacher), bias=False)

    def train(self, mode: bool = True) -> DistillationObjective:
        super().train(mode)
        self.teacher.eval()  # the teacher never leaves eval mode
        return self

    @property
    def chunking(self) -> LossChunking:
        return self.plan.chunking

    def forward(self, student: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        settings = self.settings
        want_hidden = self.projection is not None
        labels = batch["labels"]
        chunked = self.plan.heads([student, self.teacher], labels)
        if chunked is None:
            with torch.no_grad():
                t_out = self.teacher(**model_inputs(batch, self.teacher), output_hidden_states=want_hidden)
            s_out = student(**model_inputs(batch, student), output_hidden_states=want_hidden)
            s, y = shift_for_next_token(s_out.logits, labels)
            t, _ = shift_for_next_token(t_out.logits.detach(), labels)
            mask = (y != IGNORE_INDEX).to(torch.float32)
            kl = token_kl_sum(s, t, mask, settings.temperature)
            ce = token_ce_sum(s, y)
        else:
            (s_head, t_head), positions = chunked
            with torch.no_grad():
                t_out = t_head.hidden_states(
                    model_inputs(batch, self.teacher), output_hidden_states=want_hidden
                )
            s_out = s_head.hidden_states(model_inputs(batch, student), output_hidden_states=want_hidden)
            per_position = [
                s_out.last_hidden_state,
                t_out.last_hidden_state.detach(),
                next_token_labels(labels),
            ]
            chunk = DistillChunk(s_head, t_head, settings.temperature)
            kl, ce = chunked_sums(chunk, per_position, positions)
            mask = (labels[:, 1:] != IGNORE_INDEX).to(torch.float32)
        total = settings.alpha * settings.temperature**2 * kl + (1.0 - settings.alpha) * ce
        parts = {"kl_sum": kl.detach(), "ce_sum": ce.detach()}
        if self.projection is not None:
            s_hidden = s_out.hidden_states[-1][:, :-1]
            t_hidden = t_out.hidden_states[-1][:, :-1].detach().float()
            projected = self.projection(s_hidden.to(self.projection.weight.dtype)).float()
            hidden = (((projected - t_hidden) ** 2).mean(dim=-1) * mask).sum()
            total = total + settings.hidden_weight * hidden
            parts["hidden_sum"] = hidden.detach()
        return {"loss_sum": total, "tokens": mask.sum(), **parts}


@torch.no_grad()
def mean_token_kl(
    student: torch.nn.Module,
    teacher: torch.nn.Module,
    batches: list[dict[str, torch.Tensor]],
    temperature: float = 1.0,
) -> float:
    """Mean per-token KL(teacher ‖ student) over real next-token positions of `batches` (an eval metric).

    Reads the result on the host once, at the end.
    """
    kl_total = torch.zeros(())
    tokens_total = torch.zeros(())
    for batch in batches:
        s, y = shift_for_next_token(student(**model_inputs(batch, student)).logits, batch["labels"])
        t, _ = shift_for_next_token(teacher(**model_inputs(batch, teacher)).logits, batch["labels"])
        mask = (y != IGNORE_INDEX).to(torch.float32)
        kl_total = kl_total.to(s.device) + token_kl_sum(s, t, mask, temperature)
        tokens_total = tokens_total.to(s.device) + mask.sum()
    return float((kl_total / tokens_total.clamp(min=1.0)).cpu())


class DistillationRun(ObjectiveRun):
    """An SFT run given a teacher (``Trainer(cfg, teacher=model)``): the distillation loss, weighted by
    ``train.distill_*``, over the same text and the next-token eval. The teacher sits where the student
    does (sharded like it under a mesh) in the run's precision; the projection of the hidden-state term
    is small, replicated on every device and trained with the student."""

    def __init__(self, teacher: torch.nn.Module) -> None:
        self.teacher = teacher

    def loss(self, trainer: Any, chunking: LossChunking) -> torch.nn.Module:
        train = trainer.cfg.train
        settings = DistillSettings(
            train.distill_alpha, train.distill_temperature, train.distill_hidden_weight
        )
        objective = DistillationObjective(
            no_kv_cache(self.teacher),
            trainer.model,
            settings,
            chunking=chunking,
            notice=trainer._notice,
            seed=train.seed,
        )
        if train.precision == "bf16":
            self.teacher.to(torch.bfloat16)
        place(self.teacher, trainer.mesh, trainer.device)
        objective.to(trainer.device)
        if trainer.mesh is not None:
            for p in objective.parameters():  # the distillation projection: small, replicated
                runtime.mark_sharding(p, trainer.mesh, (None,) * p.dim())
        return objective
