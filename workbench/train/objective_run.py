"""The trainer's side of an objective, for one run: what the loop asks of whatever ``train.objective`` names.

`workbench.objective_registry.Objective.start` makes one `ObjectiveRun` a run, before its model is
placed. The `Trainer` then asks it, in this order and never which objective it is:

1. `check_data`: the datasets handed to the trainer are this objective's kind of example;
2. `prepare`: anything the unplaced model must give first (DPO's frozen reference copy);
3. `training_data`: the run's data, once the model sits on its devices (GRPO's prompts and rollouts);
4. `loss`: the step's objective module, ``forward(model, batch) -> {"loss_sum", "tokens", "stats"?}``,
   summed over real tokens (or pairs, or completion tokens) so accumulation averages exactly, and
   `eval_module`, what `StepEngine.eval_loss` computes on held-out batches;
5. `warmup_work`: the batches warm-up compiles the step and the eval on (`workbench.train.warmup`);
6. `evaluate`: the held-out figure (a loss, or GRPO's mean reward);
7. `step_work`: after each step, what it did by design that the profiler must not advise against (GRPO's
   reads of completions, its rollout's seconds inside the input stream);
8. `interval_metrics`: the objective's own figures of a log interval (`workbench.analysis.metrics`).

This class is the next-token loss's run (SFT): every default here is its behaviour, and the other
objectives (`workbench.objectives`) override where they differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from workbench.data.loader import synthetic_batch
from workbench.data.preference import is_pair_dataset
from workbench.train.objective import CausalLMObjective, LossChunking
from workbench.train.step import EvalLoss
from workbench.train.stream import TrainingData
from workbench.train.warmup import WarmupWork


class ObjectiveRun:
    """One run's objective, as the trainer sees it; the defaults are the next-token loss's (SFT)."""

    eager_reason: str | None = None
    """Why ``train.compile`` never compiles this objective's step on plain torch (said once when the
    user asked for it), or None: it may."""

    def check_data(self, trainer: Any) -> None:
        """Refuse datasets this objective cannot train on: here, preference pairs, whose rejected answers
        the next-token loss would learn."""
        data = trainer.data
        for split in (data.train_dataset, data.eval_dataset):
            if split is not None and is_pair_dataset(split):
                names = sorted(getattr(split, "column_names", None) or [])
                raise ValueError(
                    f"a dataset handed to the Trainer holds preference pairs ({names}) but train.objective="
                    f"{trainer.cfg.train.objective!r} would train on the rejected answers too: set "
                    "train.objective=dpo"
                )

    def prepare(self, trainer: Any, model: torch.nn.Module) -> None:
        """Take what the run needs from the model before it is placed on its devices: nothing here."""
        return None

    def training_data(self, trainer: Any) -> TrainingData:
        """The run's data, once the model is placed: the trainer's own `TrainingData` here."""
        return trainer.data

    def loss(self, trainer: Any, chunking: LossChunking) -> torch.nn.Module:
        """The step's objective module for the placed model: next-token cross-entropy, in chunks of
        positions as `chunking` says, with one notice when it chunks."""
        return CausalLMObjective(chunking, notice=trainer._notice).to(trainer.device)

    def eval_module(self, loss: torch.nn.Module) -> torch.nn.Module:
        """What the held-out eval computes beside the step's `loss` module: the next-token loss, in chunks
        as the step's (``train.loss_chunk_tokens``), without the step's notice."""
        return CausalLMObjective(loss.chunking)

    def warmup_work(self, trainer: Any) -> WarmupWork:
        """The programs warm-up compiles: the step on synthetic tokens of every shape the loaders emit,
        laid out like a real batch (the stream's first, put back after), and the eval on the eval split's."""
        template, _ = trainer.stream_batch()  # which keys, dtypes and layout a batch has
        engine, data = trainer.engine, trainer.data
        vocab = int(engine.model.get_input_embeddings().weight.shape[0])
        grad_accum = int(trainer.cfg.train.grad_accum)

        def batch(shape: tuple[int, int]) -> dict[str, torch.Tensor]:
            fake = synthetic_batch(shape, vocab_size=vocab, pad_token_id=data.pad_token_id, template=template)
            return data.to_device(fake)

        def train_step(shape: tuple[int, int]) -> Any:
            return engine.train_step([batch(shape)] * grad_accum)

        return WarmupWork(
            train_shapes=lambda size: (
                data.shapes(size, data.train_dataset) or [tuple(template["input_ids"].shape[:2])]
            ),
            train_step=train_step,
            eval_shapes=lambda size: data.shapes(size, data.eval_dataset),
            eval_step=lambda shape: engine.eval_loss([batch(shape)]),
        )

    def evaluate(self, trainer: Any, max_batches: int | None = None) -> EvalLoss:
        """The held-out figure: the mean eval loss of the objective's eval module (`StepEngine.eval_loss`)."""
        batches = trainer.data.eval_batches(trainer.loop.batch_size)
        return trainer.engine.eval_loss(batches, max_batches)

    def step_work(self, trainer: Any) -> dict[str, Any]:
        """What the step just run did by design, as `workbench.analysis.profiler.StepProfiler.step` takes it
        (``expected_transfers``: reads made on purpose; ``input_work_s``: the step's own work done inside
        the input stream), after its eval: nothing here."""
        return {}

    def interval_metrics(self, trainer: Any, interval: Mapping[str, Any]) -> dict[str, Any]:
        """The objective's own figures of a log interval, beside the profiler's: none here."""
        return {}
