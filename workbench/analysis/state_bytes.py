"""Bytes per element of a training step's tensors, by precision, and the optimizer's state, by optimizer.

What `workbench.analysis.estimate.estimate` multiplies its element counts by: `bytes_for` a precision
(``train.precision``: the weights, gradients, activations and optimizer state each in their dtype) and
`optimizer_state_elements` / `state_elements` for an optimizer (``train.optimizer``: what
`workbench.train.optim.build_optimizer` creates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from workbench.analysis.shape import ModelShape

Precision = Literal["fp32", "bf16-mixed", "bf16"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16-mixed", "bf16")
OPTIMIZERS: tuple[str, ...] = ("adamw", "adafactor", "sgd")


@dataclass(frozen=True)
class StepBytes:
    param: int
    grad: int
    compute: int
    """Activations and the weights as the matmuls see them."""
    state: int
    """One optimizer state element."""


def bytes_for(precision: str) -> StepBytes:
    if precision == "fp32":
        return StepBytes(param=4, grad=4, compute=4, state=4)
    if precision == "bf16-mixed":  # fp32 master weights, grads and state; bf16 autocast compute
        return StepBytes(param=4, grad=4, compute=2, state=4)
    if precision == "bf16":  # everything in bf16
        return StepBytes(param=2, grad=2, compute=2, state=2)
    raise ValueError(f"precision={precision!r} is not allowed: one of {', '.join(map(repr, PRECISIONS))}")


def optimizer_state_elements(shape: ModelShape, optimizer: str) -> int:
    """Optimizer state elements for the whole model.

    What `workbench.train.optim.build_optimizer` creates: adamw, two moments per parameter;
    adafactor (no momentum), a row and a column second-moment vector per matrix, the full
    second moment for vectors; sgd (momentum 0.9), one momentum buffer per parameter.
    """
    if optimizer in ("adamw", "sgd"):  # counted from the real model's parameter total when there is one
        return (2 if optimizer == "adamw" else 1) * shape.num_parameters
    return state_elements([s for _, s in shape.parameter_shapes()], optimizer)


def state_elements(shapes: list[tuple[int, ...]], optimizer: str) -> int:
    """Optimizer state elements for parameters of `shapes` (see `optimizer_state_elements`)."""
    n = sum(math.prod(s) for s in shapes)
    if optimizer == "adamw":
        return 2 * n
    if optimizer == "sgd":
        return n
    if optimizer == "adafactor":
        return sum(s[0] + s[1] if len(s) == 2 else math.prod(s) for s in shapes)
    raise ValueError(f"optimizer={optimizer!r} is not allowed: one of {', '.join(map(repr, OPTIMIZERS))}")
