"""A GRPO run's rollout figures for the metrics contract: per rollout on the host, per log interval for callbacks.

Each rollout, after its one read of the completions, sums up what the host already holds as a
`RolloutFigures` (`rollout_figures`: the rewards' mean and within-group spread, each reward
function's mean, completion lengths, the share cut at the budget, the share of groups without
signal, the rollout's seconds, and with ``grpo.log_completions`` its completions as rows,
`workbench.rl.completions`); nothing here reads the device. A completion no reward function scored
(every one returned None or NaN) is left out of every reward figure, as TRL leaves it out; a figure
with nothing scored is None ("n/a"), never 0. `RolloutLog` keeps an interval's rollouts and its training steps'
seconds, and at a log step `RolloutLog.take` (`rollout_metrics`) turns them into the contract's
keys (`workbench.analysis.metrics.ROLLOUT_KEYS`), for the trainer to merge into the interval's
`RunMetrics`: the rewards and lengths averaged over the interval's rollouts, ``rollout_s`` and
``train_s`` per optimizer step, and the rollout's tokens per second.

With ``grpo.num_iterations`` μ above 1 a rollout serves μ steps, so an interval may hold no rollout
(a log every step): its reward figures are then None (nothing was sampled) and ``rollout_s`` 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.analysis.metrics import ROLLOUT_KEYS


@dataclass(frozen=True)
class RolloutFigures:
    """One rollout's host figures (every completion of its prompts)."""

    reward_mean: float
    """Mean total reward of the rollout's scored completions (nan when none was scored)."""
    reward_std: float
    """Mean over its groups of the standard deviation (unbiased, as torch's ``std``) of a group's
    total rewards, its unscored completions left out (nan when no group has two scored)."""
    rewards: Mapping[str, float]
    """Each reward function's mean over the completions it scored (nan where it skipped them all)."""
    completions: int
    """Completions sampled (prompts x ``grpo.num_generations``)."""
    completion_tokens: int
    """Tokens generated over all completions, each up to and including its ending token."""
    longest_completion: int
    """The longest completion's tokens."""
    decode_steps: int
    """Tokens the sampler chose per row before it stopped: the completion budget, or fewer when every
    completion had ended (it checks once per block of decode steps)."""
    zero_std_groups: float
    """Share of the rollout's groups whose rewards were all equal."""
    seconds: float
    """Wall-clock seconds the rollout took (sampling, the read, rewards, advantages, the write)."""
    scored: int = 0
    """Completions some reward function scored (a total reward that is not nan)."""
    clipped: int = 0
    """Completions cut at ``grpo.max_completion_length`` (still going when the budget ran out)."""
    sample: tuple[dict[str, Any], ...] = ()
    """With ``grpo.log_completions``: the completions kept as rows (`workbench.rl.completions`)."""


def rollout_figures(
    total_rewards: Sequence[float] | np.ndarray,
    per_function: Mapping[str, float],
    completion_lengths: Sequence[int] | np.ndarray,
    *,
    num_generations: int,
    zero_std_groups: float,
    seconds: float,
    finished: Sequence[bool] | np.ndarray | None = None,
    sample: Sequence[dict[str, Any]] = (),
    decode_steps: int = 0,
) -> RolloutFigures:
    """A rollout's `RolloutFigures` from what the host holds after scoring it: the total reward of each
    completion (in prompt order, a prompt's `num_generations` completions together; nan where no
    function scored it), each reward function's mean (`workbench.rl.rewards.RewardScores.per_function`),
    each completion's length in tokens, the share of zero-std groups
    (`workbench.rl.advantages.group_advantages`), the seconds, whether each completion ended before the
    budget (`finished`; None: all did), the completions kept as rows (`sample`) and the tokens decoded per
    row (`decode_steps`)."""
    rewards = np.asarray(total_rewards, dtype=np.float64)
    if rewards.size == 0 or rewards.size % num_generations:
        raise ValueError(
            f"total_rewards has {rewards.size} values: expected a positive multiple of "
            f"num_generations={num_generations} (each prompt's completions together)"
        )
    scored = ~np.isnan(rewards)
    groups, counted = rewards.reshape(-1, num_generations), scored.reshape(-1, num_generations)
    spreads = [
        float(np.std(group[ok], ddof=1)) for group, ok in zip(groups, counted, strict=True) if ok.sum() >= 2
    ]
    ended = np.ones(rewards.size, dtype=bool) if finished is None else np.asarray(finished, dtype=bool)
    return RolloutFigures(
        reward_mean=float(rewards[scored].mean()) if scored.any() else math.nan,
        reward_std=float(np.mean(spreads)) if spreads else math.nan,
        rewards={name: float(value) for name, value in per_function.items()},
        completions=int(rewards.size),
        completion_tokens=int(np.sum(completion_lengths)),
        longest_completion=int(np.max(completion_lengths)) if len(completion_lengths) else 0,
        decode_steps=int(decode_steps),
        zero_std_groups=float(zero_std_groups),
        seconds=float(seconds),
        scored=int(scored.sum()),
        clipped=int((~ended).sum()),
        sample=tuple(sample),
    )


def rollout_metrics(
    rollouts: Sequence[RolloutFigures], *, steps: int, train_seconds: float
) -> dict[str, Any]:
    """The contract's rollout keys (`ROLLOUT_KEYS`) for a log interval of `steps` optimizer steps that
    ran `rollouts` and spent `train_seconds` in its training steps (outside the rollouts).

    ``reward_mean`` is the mean over the interval's scored completions (None when none was scored);
    the reward's spread, per-function rewards and zero-std groups are means over the interval's
    rollouts (a function's mean over those where it scored something; None where it scored nothing);
    ``completion_length`` and ``clipped_ratio`` are over its completions, ``completion_length_max`` the
    longest and ``rollout_decode_steps`` the mean tokens the sampler decoded per rollout; ``rollout_s`` and
    ``train_s`` are seconds per step; ``rollout_tokens_per_s`` is the completion tokens over the
    rollouts' seconds; ``completions`` the last rollout's rows kept (None when none were). An
    interval without a rollout has None for the figures of one.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} is not allowed: an int >= 1 (the interval's optimizer steps)")
    rollout_seconds = sum(r.seconds for r in rollouts)
    figures: dict[str, Any] = dict.fromkeys(ROLLOUT_KEYS)
    figures.update(rollout_s=rollout_seconds / steps, train_s=float(train_seconds) / steps)
    if not rollouts:
        return figures
    names = list(dict.fromkeys(name for r in rollouts for name in r.rewards))
    tokens = sum(r.completion_tokens for r in rollouts)
    completions, scored = sum(r.completions for r in rollouts), sum(r.scored for r in rollouts)
    figures.update(
        reward_mean=sum(r.reward_mean * r.scored for r in rollouts if r.scored) / scored if scored else None,
        reward_std=_mean(r.reward_std for r in rollouts),
        rewards={name: _mean(r.rewards.get(name, math.nan) for r in rollouts) for name in names},
        completion_length=tokens / max(1, completions),
        clipped_ratio=sum(r.clipped for r in rollouts) / max(1, completions),
        completion_length_max=max(r.longest_completion for r in rollouts),
        rollout_decode_steps=_mean(r.decode_steps for r in rollouts),
        zero_std_groups=_mean(r.zero_std_groups for r in rollouts),
        rollout_tokens_per_s=tokens / rollout_seconds if rollout_seconds > 0 else None,
        completions=list(rollouts[-1].sample) or None,
    )
    return figures


def _mean(values: Any) -> float | None:
    """The mean of the finite values; None when there is none (JSON has no nan)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


@dataclass
class RolloutLog:
    """One log interval's rollouts and training-step seconds, turned into metrics at the log step.

    The rollout stream calls `add` after each rollout and the loop `trained` after each optimizer
    step with the seconds it spent outside the rollout; `take` returns the interval's
    `rollout_metrics` and starts the next interval. `take_rollout_seconds` hands each step's rollout
    seconds to the step profiler (its ``input_work_s``: a rollout runs inside the stream's ``next()``). On XLA a step runs on the device after its sync
    returns and the next rollout's read waits for it: time a rollout from after
    ``runtime.wait_device_ops()``, or the step's device time is counted as the rollout's.
    """

    rollouts: list[RolloutFigures] = field(default_factory=list)
    train_seconds: float = 0.0
    untaken_rollout_seconds: float = 0.0
    """Rollout seconds since the last `take_rollout_seconds` (counted apart from the interval's)."""

    def add(self, figures: RolloutFigures) -> None:
        """A rollout finished (its figures from `rollout_figures`)."""
        self.rollouts.append(figures)
        self.untaken_rollout_seconds += figures.seconds

    def trained(self, seconds: float) -> None:
        """An optimizer step spent `seconds` in training, outside its rollout."""
        self.train_seconds += float(seconds)

    def take_rollout_seconds(self) -> float:
        """The seconds the rollouts added since the last call took (0.0 when none ran)."""
        seconds, self.untaken_rollout_seconds = self.untaken_rollout_seconds, 0.0
        return seconds

    def take(self, steps: int) -> dict[str, Any]:
        """The interval's `rollout_metrics` over its `steps` optimizer steps; the log starts empty again."""
        figures = rollout_metrics(self.rollouts, steps=steps, train_seconds=self.train_seconds)
        self.rollouts, self.train_seconds = [], 0.0
        return figures
