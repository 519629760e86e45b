"""One optimizer step on the device: micro-batches, token-mean gradients, clipping and the update.

- **Loss normalisation.** Each micro-batch contributes the *sum* of its token losses and its
  count of real (label != -100) next-token positions. Gradients of the sums accumulate, and
  before the optimizer step they are scaled by 1 / (real tokens in the whole optimizer step):
  the mean over every real token of the effective batch, the same gradient as one batch
  `grad_accum` times larger however the tokens are spread over the micro-batches. The count
  stays on the device, so nothing waits for the host.
- **Programs.** With one micro-batch per step, forward, backward and the update are one XLA
  program per batch shape and one sync. With accumulation each micro-batch is its own program
  (per shape) and the update a separate one: unrolling the micro-batches into one program
  would compile one program per *combination* of bucket shapes. Gradients and the running
  sums then live in persistent buffers, zeroed inside the update program, so every micro-step
  has the same inputs and compiles once per shape.
- **No hidden syncs.** Loss, token counts and grad norm stay device tensors; clipping is
  `clip_grad_norm_fp32` on the device (the norm summed in fp32).
- **Compiled (plain torch).** With ``train.compile`` on, the training forward and loss run as one
  torch.compile graph per batch shape (`workbench.train.compiled_step`); the rest stays eager.
- **Precision.** 'bf16-mixed': fp32 weights, bf16 autocast (the backend's: ``torch.autocast("xla")``
  on XLA, CUDA autocast where the GPU has bf16, CPU autocast on plain CPU). Losses are computed in
  fp32. 'bf16': bf16 weights, no autocast.
- **The seam.** What differs between execution models is asked of the run's `Backend` (the step's
  boundary, autocast, compile counts, optimizer-state placement) and `Replicas` (the forward through
  a data-parallel wrapper, gradient reduction, sums and norms over every process); with one process
  the replicas' parts do nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from workbench.analysis.metrics import perplexity
from workbench.backend.protocol import Backend, Batch, OneProcess, Replicas
from workbench.config import TrainConfig
from workbench.parallel.torch_parallel import local_part
from workbench.train.compiled_step import compiled_forward
from workbench.train.oom import halved_micro_batch
from workbench.train.optim import init_optimizer_state
from workbench.train.state import LoopState


class EvalLoss(float):
    """The mean eval loss (a float, as before), with its perplexity beside it, and the objective's
    own averages (`stats`: a DPO eval's reward accuracy and margin, chosen and rejected log-probs)."""

    stats: dict[str, float]

    def __new__(cls, value: Any, stats: dict[str, float] | None = None) -> EvalLoss:
        loss = super().__new__(cls, value)
        loss.stats = dict(stats or {})
        return loss

    @property
    def perplexity(self) -> float | None:
        """exp(loss) of a next-token loss: inf where it overflows; None for a loss of another kind (DPO)."""
        return None if self.stats else perplexity(self)


def clip_grad_norm_fp32(
    params: Sequence[torch.Tensor], max_norm: float, replicas: Replicas | None = None
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` with the norm summed in fp32 whatever the gradients' dtype;
    returns the total norm (a device tensor). torch sums each gradient's squares in its own dtype:
    in bf16 a large tensor's norm is off by several percent (a stacked ``[layers, ...]`` gradient
    more than a layer's), and the clip scales the whole update by it. `replicas.grad_norm` sums over
    every process (under torchrun, the global norm of sharded gradients)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    total = (replicas or OneProcess()).grad_norm(grads)
    coefficient = (max_norm / (total + 1e-6)).clamp(max=1.0)
    with torch.no_grad():
        for g in grads:
            local_part(g).mul_(coefficient.to(g.dtype))
    return total


class StepEngine:
    """Runs training and eval steps for `model` under `objective`, as `train` (precision, accumulation,
    clipping) says; `loop.split` says how each loaded batch is cut into micro-batches (the
    out-of-memory policy doubles it)."""

    def __init__(
        self,
        model: torch.nn.Module,
        objective: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        loop: LoopState,
        train: TrainConfig,
        *,
        backend: Backend,
        replicas: Replicas,
        eval_objective: torch.nn.Module,
        sharded: bool = False,
        eager_reason: str | None = None,
    ) -> None:
        self.model, self.objective = model, objective
        self.backend = backend
        """The device's execution model: the step's boundary, autocast, compile counts, state placement."""
        self.replicas = replicas
        """The data-parallel processes: the forward through their wrapper, sums and norms over all of
        them (`OneProcess`: this one alone; under torchrun `workbench.train.ranks.RankTraining`)."""
        self.optimizer, self.scheduler, self.loop = optimizer, scheduler, loop
        self.device, self.sharded = replicas.device, sharded
        self.precision, self.grad_accum, self.max_grad_norm = (
            train.precision,
            train.grad_accum,
            train.max_grad_norm,
        )
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.eval_objective = eval_objective
        """What `eval_loss` computes (`workbench.train.objective_run.ObjectiveRun.eval_module`): the
        next-token loss, chunked as the step's, or an objective's own (DPO: held-out pairs' loss and rewards)."""
        self.stat_names: tuple[str, ...] = tuple(getattr(objective, "stat_names", ()))
        """What the objective reports beside its loss, as sums over the count it returns (``tokens``)."""
        self._loss_acc: torch.Tensor | None = None
        self._tokens_acc: torch.Tensor | None = None
        self._stat_acc: dict[str, torch.Tensor] = {}
        self.compiled, self.notices = compiled_forward(
            train.compile,
            model,
            objective,
            backend=backend,
            eager_reason=eager_reason,
            wrapped=replicas.wrapped,
        )
        """``train.compile``: the training forward through torch.compile (`workbench.train.compiled_step`),
        or None (eager; XLA compiles anyway); `notices`: what the run says about it, once."""

    @property
    def micro_steps(self) -> int:
        """Micro-batches per optimizer step: the configured accumulation times the OOM split."""
        return self.grad_accum * self.loop.split

    def autocast(self) -> contextlib.AbstractContextManager:
        return self.backend.autocast(self.precision)

    def sync(self) -> None:
        """The step's boundary: on XLA the traced graph is cut and run; eager backends do nothing."""
        self.backend.step_boundary()

    @property
    def prewarms(self) -> bool:
        """Whether warm-up has step programs to compile: XLA's, or the compiled native step's graphs."""
        return self.backend.compiles_every_shape or self.compiled is not None

    def compile_count(self) -> int:
        """Programs compiled so far in this process: XLA's, else the compiled native step's graphs."""
        return self.backend.compile_count()

    # ---- state on the device ----
    def init_optimizer_state(self) -> None:
        """Create the optimizer state now; under SPMD shard each tensor like its parameter."""
        init_optimizer_state(self.optimizer)
        if not self.sharded:
            return
        for p in self.params:
            for value in self.optimizer.state[p].values():
                if isinstance(value, torch.Tensor):
                    self.backend.place_like(p, value)

    def init_state(self) -> None:
        """Optimizer state, gradient buffers and running sums exist before the first step (one program per shape)."""
        self.init_optimizer_state()
        with torch.no_grad():
            self._loss_acc = torch.zeros((), dtype=torch.float32, device=self.device)
            self._tokens_acc = torch.zeros((), dtype=torch.float32, device=self.device)
            self._stat_acc = {
                name: torch.zeros((), dtype=torch.float32, device=self.device) for name in self.stat_names
            }
        self._clear_gradients()
        self.sync()

    def clear(self) -> None:
        """Zero the running sums and the gradients; with accumulation the gradient buffers persist.

        Called inside the update program and whenever a step is abandoned (warm-up restore,
        out-of-memory retry), so every micro-step starts from the same buffers.
        """
        with torch.no_grad():
            self._loss_acc.zero_()
            self._tokens_acc.zero_()
            for acc in self._stat_acc.values():
                acc.zero_()
        self._clear_gradients()

    def _clear_gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=self.micro_steps == 1)
        if self.micro_steps > 1:
            with torch.no_grad():
                for p in self.params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)

    # ---- the step ----
    def _forward(self, batch: Batch, objective: torch.nn.Module | None = None) -> dict[str, Any]:
        if objective is None and self.compiled is not None:  # the training forward: a graph per shape
            return self.compiled(batch)
        # under torchrun through DDP / FSDP2, whose hooks gather and reduce
        return self.replicas.forward(self.model, objective or self.objective, batch)

    def _micro_step(self, batch: Batch, last: bool = True) -> None:
        """One micro-batch's forward and backward; across ranks gradients are reduced on the `last` only."""
        with self.replicas.gradient_sync(last):
            with self.autocast():
                out = self._forward(batch)
            out["loss_sum"].backward()
        with torch.no_grad():
            self._loss_acc.add_(out["loss_sum"].detach().float())
            self._tokens_acc.add_(out["tokens"].float())
            for name, value in out.get("stats", {}).items():
                self._stat_acc[name].add_(value.detach().float())

    def _update(self) -> dict[str, torch.Tensor]:
        """Scale accumulated gradients to the mean over the step's count (real tokens; DPO: real pairs), clip,
        step; returns device tensors to log. Across ranks the sums are every rank's, so the loss is the
        global mean and the gradient the mean over every real token of the global batch (one process:
        its own sums, a scale of 1)."""
        self.replicas.reduce_sums([self._loss_acc, self._tokens_acc, *self._stat_acc.values()])
        scale = self.replicas.gradient_scale
        with torch.no_grad():
            inv_tokens = 1.0 / self._tokens_acc.clamp(min=1.0)
            grad_scale = inv_tokens * scale
            for p in self.params:
                if p.grad is not None:
                    local_part(p.grad).mul_(grad_scale.to(p.grad.dtype))
        grad_norm = None
        if self.max_grad_norm is not None:
            grad_norm = clip_grad_norm_fp32(self.params, self.max_grad_norm, self.replicas)
        self.optimizer.step()
        self.scheduler.step()
        with torch.no_grad():
            loss = self._loss_acc * inv_tokens
            # one stacked tensor: the profiler reads every figure in one transfer at a log step
            stats = (
                torch.stack([self._stat_acc[n] for n in self.stat_names]) * inv_tokens
                if self.stat_names
                else None
            )
        self.clear()
        out = {"loss": loss}
        if grad_norm is not None:
            out["grad_norm"] = grad_norm.detach()
        if stats is not None:
            out["stats"] = stats
        return out

    def split_batch(self, batch: Batch) -> list[Batch]:
        split = self.loop.split
        if split == 1:
            return [batch]
        rows = batch["input_ids"].shape[0]
        per_example = getattr(self.objective, "rows_per_example", 1)  # a DPO pair's two rows stay together
        if (rows // per_example) % split:
            what = "pairs" if per_example == 2 else "rows"
            raise ValueError(
                f"cannot split a batch of {rows // per_example} {what} into {split} equal micro-batches after an "
                "out-of-memory retry; use a batch size (or bucketing.tokens_per_batch) divisible by it"
            )
        size = rows // split
        return [{k: v[i * size : (i + 1) * size] for k, v in batch.items()} for i in range(split)]

    def train_step(self, batches: Sequence[Batch]) -> dict[str, torch.Tensor]:
        """One optimizer step over `batches` (already on the device), with the loop's syncs."""
        self.model.train()
        self.objective.train()
        micro = [m for b in batches for m in self.split_batch(b)]
        if len(micro) == 1:
            self._micro_step(micro[0])
        else:
            for i, m in enumerate(micro):
                self._micro_step(m, last=i == len(micro) - 1)
                self.sync()
        return self._update()

    # ---- out of memory ----
    def can_halve_micro_batches(self, batch_sizes: Iterable[int], dp_size: int) -> bool:
        """Whether every batch size can be cut into twice as many micro-batches that still split over the mesh."""
        return all(
            size % self.loop.split == 0
            and halved_micro_batch(size // self.loop.split, multiple_of=dp_size) is not None
            for size in batch_sizes
        )

    def halve_micro_batches(self) -> None:
        """Twice the micro-batches per loaded batch (same effective batch); buffers follow."""
        self.loop.split *= 2
        self._clear_gradients()
        self.sync()

    # ---- eval ----
    def eval_loss(self, batches: Iterable[Batch], max_batches: int | None = None) -> EvalLoss:
        """Mean eval loss over device batches (next-token, with ``.perplexity``; or the objective's own,
        with its ``.stats``: a DPO run's): one program per shape, one host read at the end."""
        names = tuple(getattr(self.eval_objective, "stat_names", ()))
        # a tensor of its own per sum: one shared zero would be one program input in the first
        # batch and several in the next, two programs for one shape
        sums = {
            name: torch.zeros((), dtype=torch.float32, device=self.device)
            for name in ("loss_sum", "tokens", *names)
        }
        self.sync()
        self.model.eval()
        for i, batch in enumerate(batches):
            if max_batches is not None and i >= max_batches:
                break
            with torch.no_grad(), self.autocast():
                out = self._forward(batch, self.eval_objective)
            figures = {"loss_sum": out["loss_sum"], "tokens": out["tokens"], **out.get("stats", {})}
            sums = {name: sums[name] + figures[name] for name in sums}
            self.sync()
        self.model.train()
        self.replicas.reduce_sums(list(sums.values()))  # under torchrun every rank evaluated its rows
        means = torch.stack([sums[name] for name in ("loss_sum", *names)]) / sums["tokens"].clamp(min=1.0)
        loss, *stats = means.cpu().tolist()  # the one read
        return EvalLoss(loss, dict(zip(names, stats)))
