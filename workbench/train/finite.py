"""Training that stops at the first number it cannot use: a loss, gradient norm or state that is not finite.

A run whose loss went ``nan`` keeps training on garbage and used to end "successfully". Two checks,
neither adding a device read:

- `FiniteGuard.check`: at each log step the `StepProfiler` has already read the loss and the gradient
  norm to the host (its two transfers per interval); a value there that is not finite stops the run
  with `NonFiniteLossError`, naming the step, the last finite loss and what usually causes it.
- `first_non_finite`: a checkpoint's state is looked at on the host, where the save has copied it
  anyway, before it is written (`CheckpointManager(refuse_non_finite=True)`). A save falls between log
  reads more often than not (``checkpoint_every`` 4, ``log_every`` 10), so waiting for the next read
  would hold every save back; checking the copy itself costs a pass over host memory on the writer
  thread (less than the SHA-256 the write computes anyway) and is exact: the state written is the
  state checked. A non-finite state is never written, so the last good checkpoint is never replaced
  or pruned in its favour.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch


class NonFiniteLossError(RuntimeError):
    """Training produced a number that is not finite (the loss, the gradient norm, or the state a save
    would write); the message names the step, the last finite loss, the likely causes and a fix."""

    def __init__(
        self,
        message: str,
        *,
        step: int,
        what: str,
        value: float | None,
        last_finite_loss: float | None,
        last_finite_step: int | None,
        checkpoint: str | None,
    ) -> None:
        super().__init__(message)
        self.step, self.what, self.value = step, what, value
        self.last_finite_loss, self.last_finite_step = last_finite_loss, last_finite_step
        self.checkpoint = checkpoint
        """The last checkpoint written or resumed from: the good state to go back to (None: none)."""


class NonFiniteStateError(RuntimeError):
    """A checkpoint's state holds a value that is not finite (raised by the write, which then writes nothing)."""

    def __init__(self, step: int, key: str, value: float) -> None:
        super().__init__(f"the state of step {step} holds {value} in {key}: not written")
        self.step, self.key, self.value = step, key, value


class FiniteGuard:
    """Remembers the last finite loss of a run and stops it at the first log read that is not finite.

    `learning_rate` and `precision` are the run's (``train.learning_rate``, ``train.precision``): the
    causes named put the likeliest first."""

    def __init__(self, learning_rate: float | None = None, precision: str = "") -> None:
        self.learning_rate, self.precision = learning_rate, precision
        self.last_loss: float | None = None
        self.last_step: int | None = None

    def check(self, metrics: Mapping[str, Any], last_good: Callable[[], str | None]) -> None:
        """Raise `NonFiniteLossError` if the log step's loss or gradient norm (already on the host) is
        not finite, naming the checkpoint `last_good()` says stands; otherwise remember the loss."""
        step = int(metrics["step"])
        for what, key in (("loss", "loss"), ("gradient norm", "grad_norm")):
            value = metrics.get(key)
            if value is not None and not math.isfinite(value):
                raise self.error(step, what, value, last_good())
        if metrics.get("loss") is not None:
            self.last_loss, self.last_step = float(metrics["loss"]), step

    def error(self, step: int, what: str, value: float | None, checkpoint: str | None) -> NonFiniteLossError:
        """The error for a `what` ('loss', 'gradient norm', 'state in model/...') of `value` at `step`."""
        if self.last_loss is not None:
            last = f"the last finite loss was {self.last_loss:.4f} at step {self.last_step}"
        else:
            last = "no finite loss was read before it"
        kept = (
            f"checkpoint {checkpoint} is the last good state and was kept"
            if checkpoint
            else "no checkpoint was written"
        )
        rate = f"={self.learning_rate:g}" if self.learning_rate is not None else ""
        if self.precision.startswith("bf16"):
            overflow = f"bf16 overflow (train.precision={self.precision}: try train.precision=fp32)"
        else:
            overflow = "fp16 overflow (if the model's weights are fp16: train.precision=fp32 or bf16-mixed)"
        causes = [
            f"a learning rate too high (train.learning_rate{rate}: try 10x lower, "
            "or train.max_grad_norm=1.0 and train.warmup_steps)",
            overflow,
            "bad data (empty or corrupt records: check data.source and data.max_examples)",
        ]
        message = (
            f"step {step}: the {what} is {_number(value)}, not a finite number ({last}); training stopped and "
            f"{kept}. Likely causes: {'; '.join(causes)}. Fix the cause and re-run (after lowering the learning "
            "rate, start over with train.resume=false: a resume keeps the rate its checkpoint was saved with)"
        )
        return NonFiniteLossError(
            message,
            step=step,
            what=what,
            value=value,
            last_finite_loss=self.last_loss,
            last_finite_step=self.last_step,
            checkpoint=checkpoint,
        )


def first_non_finite(parts: Mapping[str, Mapping[str, Any]]) -> tuple[str, float] | None:
    """The first ``part/key`` (and its bad value) among host tensors (or `host_shards`' local shards)
    holding a value that is not finite; None when every floating-point value is finite. Reads host
    memory only: a tensor on a device is looked at only when it is there already (torchrun's DCP saves
    read the live tensors themselves; their local piece is checked where it lies)."""
    for part, tensors in parts.items():
        for key, value in tensors.items():
            for piece in _pieces(value):
                if piece.is_floating_point() and piece.numel() and not bool(torch.isfinite(piece).all()):
                    bad = piece[~torch.isfinite(piece)].flatten()[0].item()
                    return f"{part}/{key}", bad
    return None


def _pieces(value: Any) -> list[torch.Tensor]:
    """The local data of a host tensor, a DTensor or `host_shards`' shards."""
    if hasattr(value, "to_local"):  # an FSDP2 DTensor: this rank's piece
        return [value.to_local()]
    if isinstance(value, torch.Tensor):
        return [value]
    # without the padding of an uneven split: what the save writes (the padding's values are not the state's)
    return [shard.unpadded_data for shard in getattr(value, "shards", ())]


def _number(value: float | None) -> str:
    return "unknown" if value is None else str(value)
