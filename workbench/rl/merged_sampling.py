"""Sampling with the LoRA adapters merged: each adapted linear as one plain matmul while a rollout decodes.

A decode step multiplies a few rows by every weight, so on an eager backend (CPU, a GPU) its time is
the calls more than the arithmetic, and peft's LoRA linear makes three matmuls and a handful of Python
checks of each one. `merged_linears` puts, for the rollout's duration, a plain linear holding
``W + scale x B A`` (`peft`'s own ``get_delta_weight``) where each LoRA linear sits, and puts the
adapters' modules back afterwards: the trained weights and adapters are never touched, so nothing
drifts, and the sampler is the policy to fp32 rounding (its log-probs agree with the training
forward's to 1e-6 on the tests' models).

`merges_for_sampling` decides when: an eager backend (a traced one would compile the merge's
programs, and a matmul costs it no call), one process (FSDP2 shards the weights the merge would
read), an fp32 base (merged into bf16, a small adapter delta would round away: the sampler would not
be the policy) and a copy of the adapted weights within `MERGE_SHARE` of a device's memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

MERGE_SHARE = 0.1
"""The most of a device's memory the merged copies of the adapted weights may take."""


def _lora_linears(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, Any]]:
    """(parent, attribute, module) of every peft LoRA linear a plain merge can stand in for: one active,
    vanilla adapter, not merged already, over an ``nn.Linear``."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # no peft: no adapters to merge
        return []
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if not isinstance(child, LoraLinear) or child.merged or child.disable_adapters:
                continue
            active = [a for a in child.active_adapters if a in child.lora_A]
            base = child.get_base_layer()
            if len(active) == 1 and active[0] not in child.lora_variant and type(base) is torch.nn.Linear:
                found.append((parent, name, child))
    return found


class MergedLinear(torch.nn.Module):
    """A linear of fixed tensors (no parameters): ``x W^T + b``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight, self.bias)


def merges_for_sampling(
    model: torch.nn.Module, *, eager: bool, processes: int, memory_bytes: int | None
) -> bool:
    """Whether a rollout samples with the adapters merged (see the module docstring)."""
    if not eager or processes != 1:
        return False
    linears = _lora_linears(model)
    if not linears or any(child.get_base_layer().weight.dtype != torch.float32 for _, _, child in linears):
        return False
    extra = sum(child.get_base_layer().weight.nbytes for _, _, child in linears)
    return memory_bytes is None or extra <= MERGE_SHARE * memory_bytes


@contextlib.contextmanager
def merged_linears(model: torch.nn.Module) -> Iterator[int]:
    """Each LoRA linear of `model` replaced by a `MergedLinear` of its merged weight while inside; yields
    how many. Nothing needs gradients here: call it under ``torch.no_grad``."""
    swapped: list[tuple[torch.nn.Module, str, Any]] = []
    try:
        for parent, name, child in _lora_linears(model):
            (adapter,) = [a for a in child.active_adapters if a in child.lora_A]
            base = child.get_base_layer()
            merged = base.weight + child.get_delta_weight(adapter).to(base.weight.dtype)
            parent._modules[name] = MergedLinear(merged, base.bias)
            swapped.append((parent, name, child))
        yield len(swapped)
    finally:
        for parent, name, child in reversed(swapped):
            parent._modules[name] = child
