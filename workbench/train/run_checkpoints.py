"""A run's checkpoints: when a save is due (every N steps or every so long), and saves that do not stall training.

A save has two parts. The copy of the state to the host (`CheckpointManager.snapshot`) happens at
the step boundary: it is all the training loop waits for. The write (`CheckpointManager.write`:
files, fsyncs, manifest, the atomic rename, pruning) then runs on a background thread while the next
steps train (``train.async_checkpoint``, on by default). At most one write is in flight: a save due
while the previous one still writes waits for it first. A write that fails raises at the next save
or at `wait`, never silently. A process killed during a write leaves a temporary directory that
`CheckpointManager.latest` ignores: the previous checkpoint stays the one a re-run resumes from.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from workbench.backend.protocol import Replicas
from workbench.config import TrainConfig
from workbench.train.checkpoint import CheckpointManager, HostSnapshot
from workbench.train.finite import FiniteGuard, NonFiniteLossError, NonFiniteStateError
from workbench.train.state_io import CheckpointError
from workbench.units import duration_with_unit


class RunCheckpoints:
    """Checkpoints under ``train.checkpoint_dir`` at ``train.checkpoint_every`` (steps, or a duration
    such as '20m'), written in the background when ``train.async_checkpoint``; sharded under SPMD.
    `replicas`: the run's processes (None: this one alone); across several a save is collective, written
    on the training thread (its `CheckpointManager.store` says so), never beside it."""

    def __init__(
        self,
        train: TrainConfig,
        *,
        sharded: bool,
        replicas: Replicas | None = None,
        guard: FiniteGuard | None = None,
        clock: Callable[[], float] = time.monotonic,
        notice: Callable[[str], None] | None = None,
    ) -> None:
        self.manager = CheckpointManager(
            train.checkpoint_dir,
            keep=train.keep_checkpoints,
            sharded=sharded,
            replicas=replicas,
            refuse_non_finite=True,  # a state holding inf or nan never replaces a good checkpoint
        )
        self.notice = notice or (lambda message: warnings.warn(message, RuntimeWarning, stacklevel=3))
        """Hears a damaged checkpoint moved aside by `latest`."""
        self.guard = guard
        """The run's `FiniteGuard`: a save refused for inf or nan raises its `NonFiniteLossError`."""
        every = train.checkpoint_every
        self.every_s = duration_with_unit(every)
        self.every_steps = every if isinstance(every, int) else 0
        self.background = bool(train.async_checkpoint) and self.manager.store.background
        self.clock = clock
        self.path: str | None = None
        """The last checkpoint saved (complete once `wait` returns) or loaded."""
        self.step: int | None = None
        """The step whose state `path` holds (no need to save it again)."""
        self.stall_s: float | None = None
        """How long the last save held the training loop (the host copy, when written in the background)."""
        self.on_saved: Callable[[float], None] | None = None
        """Hears each finished save's whole time (copy and write), from the thread that wrote it."""
        # a time cadence counts from the run's start: loading and warm-up are session time
        self._since = clock()
        self._writer: threading.Thread | None = None
        self._write_started: float | None = None
        self._failure: tuple[int, BaseException] | None = None
        self._before: tuple[str | None, int | None] = (None, None)

    def due(self, step: int) -> bool:
        """Whether the loop should save after `step`: its step cadence, or its time cadence elapsed. A
        background write that failed raises here, at the next step, not at the next save."""
        if self._failure is not None and not self.writing:
            self.wait()
        if self.every_steps:
            return step % self.every_steps == 0
        return self.every_s is not None and self.clock() - self._since >= self.every_s

    def save(self, step: int, state: Callable[[], Mapping[str, Any]], *, wait: bool = False) -> Path:
        """Checkpoint `step`: `state()` is copied to the host now, then written (in the background unless
        `wait` or ``train.async_checkpoint`` is off). Returns the directory it is (or will be) in."""
        start = self.clock()
        self.wait()  # one write in flight at most; a failed one raises here
        copied = self.clock()
        self._before = (self.path, self.step)  # what stands if this write is refused
        snap = self.manager.snapshot(step, state(), copy=self.background and not wait)
        self.path, self.step = str(self.manager.path_for(step)), step
        if self.background and not wait:
            self._writer = threading.Thread(target=self._write, args=(snap, copied), name="checkpoint-writer")
            self._write_started = self.clock()
            self._writer.start()
        else:
            self._write(snap, copied)
            self._raise_failure()
        self.stall_s = self.clock() - start
        self._since = self.clock()
        return Path(self.path)

    def _write(self, snap: HostSnapshot, start: float) -> None:
        try:
            self.manager.write(snap)
        except BaseException as err:  # raised on the training thread by the next `save` or `wait`
            self._failure = (snap.step, err)
            return
        if self.on_saved is not None:
            try:
                self.on_saved(self.clock() - start)
            except Exception as err:  # a listener's bug must not read as a failed checkpoint
                warnings.warn(f"checkpoint save listener failed: {err!r}", RuntimeWarning, stacklevel=1)

    def in_flight_s(self) -> float:
        """How long the write in flight has been running (0 without one): the time budget keeps room for
        the rest of it, since the final save waits for it."""
        if not self.writing or self._write_started is None:
            return 0.0
        return self.clock() - self._write_started

    def wait(self) -> None:
        """Block until the write in flight (if any) is complete; raise `CheckpointError` if it failed."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        self._raise_failure()

    def settled_path(self, notice: Callable[[str], None]) -> str | None:
        """The newest checkpoint written whole and finite, after the write in flight: one refused for inf
        or nan leaves the one before it; one that failed is said through `notice` (and leaves none)."""
        try:
            self.wait()
        except NonFiniteLossError:
            pass
        except CheckpointError as err:
            notice(str(err))
        return self.path

    def settle(self, notice: Callable[[str], None]) -> None:
        """`wait`, at the end of training. When training is failing already (called while its exception
        propagates), a failed write does not replace that error: `notice` says it beside it."""
        failing = sys.exc_info()[0] is not None
        try:
            self.wait()
        except (CheckpointError, NonFiniteLossError) as err:
            if not failing:
                raise
            notice(str(err))

    def _raise_failure(self) -> None:
        if self._failure is None:
            return
        step, err = self._failure
        self._failure = None
        if isinstance(err, NonFiniteStateError):  # not a failed write: training went wrong
            self.path, self.step = self._before  # the last good checkpoint stands
            guard = self.guard or FiniteGuard()
            raise guard.error(step, f"state to checkpoint ({err.key})", err.value, self.path)
        self.path = self.step = None
        raise CheckpointError(
            f"the checkpoint of step {step} could not be written under {str(self.manager.root)!r}: "
            f"{type(err).__name__}: {err}; the previous checkpoint there is intact"
        ) from err

    @property
    def writing(self) -> bool:
        """A background write is in flight."""
        return self._writer is not None and self._writer.is_alive()

    def latest(self) -> Path | None:
        """The checkpoint a resume would load (after the write in flight, if any, completes): the newest
        that verifies, each newer damaged one moved aside with a notice (`CheckpointManager.newest_verified`)."""
        self.wait()
        return self.manager.newest_verified(self.notice)

    def loaded(self, path: Path, step: int) -> None:
        """Record that the live state is checkpoint `path` (a resume): no need to save it again."""
        self.path, self.step = str(path), step
