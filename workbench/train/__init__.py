"""Training: the `Trainer` and the components it coordinates (step, stream, warm-up, OOM policy,
batch ladder, checkpoints, optimizers, objectives and distillation), and the errors a run stops with
on purpose (a loss that is not finite, a time limit that holds no step)."""

from workbench.train.clock import TimeLimitError, TimeLimitExceededError
from workbench.train.finite import NonFiniteLossError
from workbench.train.trainer import Trainer, TrainResult, train

__all__ = [
    "NonFiniteLossError",
    "TimeLimitError",
    "TimeLimitExceededError",
    "TrainResult",
    "Trainer",
    "train",
]
