"""Rewards into advantages: each completion's reward against its group's (TRL's formula).

A rollout samples G completions per prompt, in consecutive rows. A completion's advantage is
its reward minus its group's mean, scaled by ``grpo.scale_rewards``:

- 'group': divided by the group's standard deviation + 1e-4 (TRL's default);
- 'batch': divided by the whole batch's standard deviation + 1e-4 (PPO Lite);
- 'none': not divided (Dr. GRPO: no bias towards easy or hard prompts).

Standard deviations are unbiased (torch's ``.std()``, TRL's ``nanstd``). A group whose rewards
are all equal carries no signal: its advantages are 0, and `group_advantages` reports the share
of such groups (TRL's ``frac_reward_zero_std``). A completion with no reward at all (NaN: every
reward function returned None) is left out of its group's mean and std and gets advantage 0, as
TRL does. Host side, on the rewards the rollout read back: numpy and CPU torch only.
"""

from __future__ import annotations

import numpy as np
import torch

SCALE_REWARDS = ("group", "batch", "none")
"""The ``grpo.scale_rewards`` values."""

STD_EPSILON = 1e-4
"""Added to the standard deviation before dividing (TRL's constant)."""


def _nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The unbiased standard deviation ignoring NaNs (TRL's ``nanstd``)."""
    mean = torch.nanmean(values, dim=dim, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(values)).sum(dim=dim, keepdim=True)
    variance = variance * count / (count - 1)
    return torch.sqrt(variance).squeeze(dim) if dim is not None else torch.sqrt(variance).reshape(())


def group_advantages(
    rewards: np.ndarray | torch.Tensor | list[float], num_generations: int, scale_rewards: str
) -> tuple[np.ndarray, float]:
    """``(advantages [N] float32, zero_std_groups)`` of `rewards` ``[N]`` in groups of `num_generations`
    consecutive rows; `zero_std_groups` is the share of groups whose rewards do not vary."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(
            f"grpo.scale_rewards={scale_rewards!r} is not allowed: one of {', '.join(SCALE_REWARDS)}"
        )
    values = torch.as_tensor(np.asarray(rewards, dtype=np.float32)).reshape(-1)
    if num_generations < 1 or values.numel() % num_generations:
        raise ValueError(
            f"{values.numel()} rewards do not make groups of grpo.num_generations={num_generations}: "
            "the rollout gives each prompt exactly that many completions"
        )
    grouped = values.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if num_generations > 1:
        group_std = _nanstd(grouped, dim=1).repeat_interleave(num_generations)
    else:
        group_std = torch.zeros_like(values)
    if scale_rewards == "batch":
        std = _nanstd(values).expand_as(values) if values.numel() > 1 else torch.zeros_like(values)
    else:
        std = group_std
    advantages = values - mean
    if scale_rewards != "none":
        advantages = advantages / (std + STD_EPSILON)
    advantages = torch.nan_to_num(advantages, nan=0.0)
    # TRL's frac_reward_zero_std: per row whether the std used (the group's, or the batch's) is ~0
    zero = torch.isclose(std, torch.zeros_like(std)).view(-1, num_generations)[:, 0]
    return advantages.numpy().astype(np.float32), float(zero.float().mean())
