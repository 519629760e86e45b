"""The run's clocks: the throughput window (`ThroughputClock`) and the time budget (`TimeBudget`).

Notebook sessions end: Colab disconnects long runtimes, Kaggle caps a TPU session at hours. With
``train.time_limit`` the run measures its own steps, evals and saves and stops before the limit
with its last checkpoint complete, so a re-run resumes where it stopped instead of losing the
session's work to a kill in the middle of a step or a write.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from workbench.backend.protocol import Backend
from workbench.units import duration_or_none, format_duration

SAFETY = 1.25
"""Every measured duration is planned at this multiple: steps and writes vary (a busy host, a slow mount)."""
ASSUMED_WRITE_BYTES_PER_S = 50e6
"""Checkpoint write speed assumed before the run has timed a save of its own (a slow Drive mount writes
at tens of MB/s); replaced by the slowest save measured once there is one."""
ASSUMED_SAVE_OVERHEAD_S = 2.0
"""Fixed cost assumed for a save not yet measured: directories, fsyncs, the manifest."""


class TimeLimitError(ValueError):
    """``train.time_limit`` leaves no room for one step and its save, known before the first step: the run
    cannot start (the CLI exits 2) and writes nothing."""


class TimeLimitExceededError(RuntimeError):
    """The steps' measured time shows ``train.time_limit`` cannot hold a step and its save: the run stopped
    with nothing of its own checkpointed (the CLI exits 1), never a success with nothing done."""


def check_time_limit(limit: float | str | None, checkpoint_dir: str | None) -> None:
    """Refuse, before anything loads, a ``train.time_limit`` shorter than a checkpoint's save alone is
    planned at (`ASSUMED_SAVE_OVERHEAD_S` x `SAFETY`, without any state): no step could ever be kept."""
    seconds = duration_or_none(limit) if limit is not None else None
    need = SAFETY * ASSUMED_SAVE_OVERHEAD_S
    if seconds is None or not checkpoint_dir or seconds >= need:
        return
    raise TimeLimitError(
        f"train.time_limit={limit!r} ({format_duration(seconds)}) cannot hold one step and its save: with "
        f"train.checkpoint_dir set a save alone is planned at {format_duration(need)} or more, before loading, "
        "warm-up and the step itself. Give train.time_limit the session's length (e.g. '8h' or '20m'), or "
        "null for no limit"
    )


class ThroughputClock:
    """Real tokens per second of training: from the end of the first step, less evals and saves
    (whose time, and whose compiles, are kept apart from the training steps'). Compiles are the
    `backend`'s count: XLA's programs, or on plain torch the compiled step's graphs (an eval or a save
    compiles none of those there)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.start: float | None = None
        self.tokens, self.paused_s, self.paused_compiles = 0, 0.0, 0

    def step_done(self, tokens: int) -> None:
        if self.start is None:
            # XLA (and CUDA) run a step asynchronously: wait for the first one, once per run,
            # or its tail would be billed to the timed steps.
            self.backend.wait()
            self.start = time.perf_counter()
        else:
            self.tokens += tokens

    def paused(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` (an eval, a save) outside the timed window."""
        start, compiles = time.perf_counter(), self.backend.compile_count()
        try:
            return fn()
        finally:
            self.paused_s += time.perf_counter() - start
            self.paused_compiles += self.backend.compile_count() - compiles

    def tokens_per_s(self, end: float) -> float | None:
        elapsed = end - self.start - self.paused_s if self.start is not None else 0.0
        return self.tokens / elapsed if elapsed > 0 and self.tokens else None


class TimeBudget:
    """``train.time_limit``: when the run must stop so that its last checkpoint is written before the limit.

    The limit counts from `start` (the `Trainer`'s creation: loading, warm-up and compiles are part
    of the session's time). Before each step the loop asks `must_stop`: one more iteration (the
    slowest of the recent ones, callbacks and a save's host copy included), the eval due after it
    and the final save (the slowest measured, or an assumption from the state's size) must fit in
    what is left, each at `SAFETY` times its measure.
    Host clock only: nothing here reads the device.

    An iteration is everything between two checks, so a GRPO step's rollout, which runs inside the
    stream's ``next()``, is timed with its training step. With ``grpo.num_iterations`` μ above 1 a
    rollout serves μ steps, so a step with a rollout is much slower than the μ - 1 after it:
    `expect_rollouts` makes the window hold at least two rollouts' steps (the next step is planned at
    the slowest, a rollout's), and the planned stop step uses the mean step over whole rollout cycles.
    """

    def __init__(
        self,
        limit_s: float | None,
        *,
        start: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit_s, self.clock = limit_s, clock
        self.start = clock() if start is None else start
        self.steps: deque[float] = deque(maxlen=16)
        """The recent iterations' times: a step and whatever ran beside it (callbacks, a save's copy), evals apart."""
        self._last_check: float | None = None
        self._eval_since_check = 0.0
        self.eval_s: float | None = None
        self.save_s: float | None = None
        self.assumed_save_s = 0.0
        self.saving = False
        self.training_from: float | None = None
        """When the first step could start (the first `must_stop`): what loading and warm-up took before it."""
        self.rollout_every = 1
        """Optimizer steps per rollout (GRPO's ``grpo.num_iterations``; 1: every step alike)."""

    def expect_rollouts(self, every: int) -> None:
        """The run rolls out once every `every` optimizer steps (GRPO, ``grpo.num_iterations``), inside
        the step that takes the rollout's batch: keep enough steps to see two rollouts."""
        self.rollout_every = max(1, int(every))
        self.steps = deque(self.steps, maxlen=max(16, 2 * self.rollout_every))

    def expect_saves(self, state_bytes: int | None) -> None:
        """The run checkpoints `state_bytes` of state (None: it writes no checkpoint, nothing to plan)."""
        self.saving = state_bytes is not None
        self.assumed_save_s = ASSUMED_SAVE_OVERHEAD_S + (state_bytes or 0) / ASSUMED_WRITE_BYTES_PER_S

    def left(self) -> float | None:
        """Seconds left before the limit (negative past it); None without a limit."""
        return None if self.limit_s is None else self.limit_s - (self.clock() - self.start)

    def timed_eval(self, evaluate: Callable[[], Any]) -> Any:
        """Run `evaluate`, keeping the slowest eval's time for planning."""
        start = self.clock()
        try:
            return evaluate()
        finally:
            seconds = self.clock() - start
            self.eval_s = max(self.eval_s or 0.0, seconds)
            self._eval_since_check += seconds

    def save_done(self, seconds: float) -> None:
        """A save's whole time (host copy and write): the final save is planned at the slowest."""
        self.save_s = max(self.save_s or 0.0, seconds)

    def _step_s(self) -> float:
        return max(self.steps, default=0.0)

    def _mean_step_s(self) -> float:
        """A step's time on average over the run's long haul: the slowest recent step, or, when a
        rollout serves several steps, the mean over the latest whole rollout cycles (each holds one)."""
        every = self.rollout_every
        if every == 1 or len(self.steps) < every:
            return self._step_s()
        cycles = list(self.steps)[-(len(self.steps) // every) * every :]
        return sum(cycles) / len(cycles)

    def _final_save_s(self) -> float:
        if not self.saving:
            return 0.0
        return self.save_s if self.save_s is not None else self.assumed_save_s

    def must_stop(self, *, eval_next: bool, write_in_flight_s: float = 0.0) -> bool:
        """Asked before each step: whether to stop now rather than run one more step (and its eval) and
        still save in time, after the rest of a background write that has run `write_in_flight_s` (the
        final save waits for it). Each call also times the iteration since the previous one."""
        now = self.clock()
        if self._last_check is not None:
            self.steps.append(now - self._last_check - self._eval_since_check)
        else:
            self.training_from = now
        self._last_check, self._eval_since_check = now, 0.0
        left = self.left()
        if left is None:
            return False
        eval_s = (self.eval_s if self.eval_s is not None else 2 * self._step_s()) if eval_next else 0.0
        rest_of_write = max(0.0, self._final_save_s() - write_in_flight_s) if write_in_flight_s else 0.0
        return left < SAFETY * (self._step_s() + eval_s + rest_of_write + self._final_save_s())

    def final_save_fits(self) -> bool:
        """Whether a final save still fits before the limit (it may not, when a write in flight took
        longer than planned: then the checkpoint that write completed is the one to resume from)."""
        left = self.left()
        return left is None or left >= SAFETY * self._final_save_s()

    def planned_stop_step(self, step: int, total: int, *, eval_every: int) -> int | None:
        """The step the run is expected to end at: `total`, or the last one that fits before the limit."""
        left = self.left()
        if left is None:
            return None
        per_step = self._mean_step_s() + ((self.eval_s or 0.0) / eval_every if eval_every else 0.0)
        if per_step <= 0:
            return total
        room = left / SAFETY - self._final_save_s()
        return min(total, step + max(0, math.floor(room / per_step)))

    def no_step_error(self, limit: Any, checkpoint: str | None) -> TimeLimitError:
        """The run stopped before its first step: what the limit left, what a save needs, the fix."""
        before = (self.training_from or self.clock()) - self.start
        save = SAFETY * self._final_save_s()
        planned = f", and a save is planned at {format_duration(save)}" if save else ""
        stands = f"; checkpoint {checkpoint} stands as it was" if checkpoint else ""
        return TimeLimitError(
            f"train.time_limit={limit!r} leaves no room for one step: loading, data and warm-up took "
            f"{format_duration(before)} ({format_duration(max(0.0, self.left() or 0.0))} left when training "
            f"could start){planned}; nothing was written{stands}. Raise train.time_limit well above "
            f"{format_duration(before + save)} (the session's length, e.g. '8h'), or null for no limit"
        )

    def nothing_kept_error(self, limit: Any, step: int, checkpoint: str | None) -> TimeLimitExceededError:
        """The run made steps but the limit left no room to checkpoint any: the measured step and save
        times and the limit they need."""
        before = (self.training_from or self.start) - self.start
        step_s, save_s = self._step_s(), self._final_save_s()
        need = before + SAFETY * (step_s + save_s)
        stands = f"checkpoint {checkpoint} stands as it was" if checkpoint else "no checkpoint was written"
        return TimeLimitExceededError(
            f"train.time_limit={limit!r} cannot hold a step and its save: a step took {format_duration(step_s)} "
            f"and a save is planned at {format_duration(save_s)}, so the run stopped at step {step} with none "
            f"of its steps checkpointed ({stands}). Raise train.time_limit above {format_duration(need)} "
            "(loading and warm-up included), or make a step faster (a smaller train.batch_size or "
            "data.max_length)"
        )

    def stop_notice(self, step: int, total: int, checkpoint: str | None, *, resume: bool = True) -> str:
        """What the run says when the limit stops it: where, what was kept, how to go on."""
        limit = format_duration(self.limit_s or 0.0)
        left = format_duration(max(0.0, self.left() or 0.0))
        if checkpoint is None:
            kept = "no checkpoint was written (set train.checkpoint_dir to resume a stopped run)"
            return f"time limit {limit}: stopped at step {step} of {total} with {left} left; {kept}"
        go_on = "(train.resume is on)" if resume else "with train.resume=true"
        return (
            f"time limit {limit}: stopped at step {step} of {total} with {left} left; checkpoint "
            f"{checkpoint} is complete. Re-run the same command to continue from step {step} {go_on}"
        )
