"""Training: the `Trainer` and the components it coordinates (step, stream, warm-up, OOM policy,
batch ladder, checkpoints, optimizers, objectives and distillation)."""

from workbench.train.trainer import Trainer, TrainResult, train

__all__ = ["TrainResult", "Trainer", "train"]
