"""What the training loop decides between steps: whether the time limit leaves room for another, whether
the batch grows, the run's last save, and how a step that ran out of memory is tried again.

Each takes the `workbench.train.trainer.Trainer` whose loop asks. A decision read off a clock (a save due
in time, the time limit) is the main rank's under torchrun (`main_decides`), so no rank enters a
collective alone.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.train.clock import ThroughputClock
from workbench.train.oom import retry_on_oom


def out_of_time(trainer: Any) -> bool:
    """Whether ``train.time_limit`` leaves no room for another step, its eval and a final save."""
    evals = trainer.data.eval_dataset is not None and trainer._due(
        trainer.cfg.train.eval_every, trainer.loop.step + 1
    )
    writing = trainer.checkpoints.in_flight_s() if trainer.checkpoints is not None else 0.0
    stop = trainer.budget.must_stop(eval_next=evals, write_in_flight_s=writing)
    return main_decides(trainer, stop, timed=trainer.budget.limit_s is not None)


def maybe_grow_batch(trainer: Any) -> None:
    """Dynamic batching: the next batch size of the ladder every ``train.dynamic_batch_every`` steps."""
    every, loop = trainer.cfg.train.dynamic_batch_every, trainer.loop
    bigger = [b for b in trainer.ladder if b > loop.batch_size]
    if not every or loop.step == 0 or loop.step % every or not bigger:
        return
    old = loop.batch_size
    loop.resize_batch(bigger[0])
    trainer._open_stream()
    trainer._notice(f"dynamic batch: step {loop.step}: batch {old} -> {loop.batch_size}")


def save_final_state(trainer: Any, clock: ThroughputClock, stopped: bool, start_step: int) -> None:
    """The run's last checkpoint, unless the loop (or a resume) has its step, or the time limit leaves no
    room for it (the last complete checkpoint then stands); the time limit's notice when it `stopped` the run.
    A run the limit `stopped` before its first step raises `TimeLimitError` (nothing written); one that
    made steps but checkpointed none of them since `start_step`, `TimeLimitExceededError`."""
    saves, loop, train = trainer.checkpoints, trainer.loop, trainer.cfg.train
    if stopped and loop.step == start_step:
        raise trainer.budget.no_step_error(train.time_limit, trainer.checkpoint_path)
    if saves is not None and saves.step != loop.step:
        if main_decides(trainer, trainer.budget.final_save_fits(), timed=trainer.budget.limit_s is not None):
            clock.paused(trainer.save_checkpoint)
        else:
            trainer._notice(f"time limit: no room for a save of step {loop.step}; the last checkpoint stands")
    if stopped and saves is not None and (saves.step is None or saves.step <= start_step):
        raise trainer.budget.nothing_kept_error(train.time_limit, loop.step, trainer.checkpoint_path)
    if stopped:
        notice = trainer.budget.stop_notice(
            loop.step, train.steps, trainer.checkpoint_path, resume=train.resume
        )
        trainer._notice(notice)


def main_decides(trainer: Any, decision: bool, *, timed: bool) -> bool:
    """A decision read off a clock (`timed`) is the main rank's across torchrun's ranks: ranks whose clocks
    disagreed would leave one in a collective (a save, the next step) that the others never enter."""
    if not timed:
        return decision
    return bool(trainer.replicas.broadcast(decision))


def halve_micro_batches(trainer: Any, err: BaseException) -> bool:
    """The out-of-memory policy: twice the micro-batches per batch, when they still split over the mesh."""
    loop, engine = trainer.loop, trainer.engine
    if not engine.can_halve_micro_batches({*trainer.ladder, loop.batch_size}, trainer.dp_size):
        return False
    engine.halve_micro_batches()
    micro, accum = loop.batch_size // loop.split, engine.micro_steps
    trainer._notice(
        f"out of memory ({str(err).splitlines()[0][:120]}); retrying with micro-batch {micro} x "
        f"{accum} accumulation (same effective batch {loop.batch_size * trainer.cfg.train.grad_accum})"
    )
    return True


def eager_step_with_retry(trainer: Any, batches: list[dict]) -> dict[str, torch.Tensor]:
    """One step on an eager backend (CUDA, CPU) under the out-of-memory policy: a failed step leaves the
    weights intact, so the gradients are cleared, the rates put back and the step run again smaller."""
    lrs = [g["lr"] for g in trainer.optimizer.param_groups]

    def shrink(err: BaseException) -> bool:
        trainer.engine.clear()
        for group, lr in zip(trainer.optimizer.param_groups, lrs):
            group["lr"] = lr
        if trainer.hw.backend == "cuda":
            torch.cuda.empty_cache()
        return halve_micro_batches(trainer, err)

    return retry_on_oom(lambda: trainer.engine.train_step(batches), shrink)
