"""GRPO's rollout figures in the metrics contract: per rollout, then per log interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.analysis.metrics import GRPO_KEYS, METRIC_KEYS, OBJECTIVE_KEYS, ROLLOUT_KEYS
from workbench.rl.metrics import RolloutLog, rollout_figures, rollout_metrics


def test_the_grpo_keys_are_contract_keys_split_between_the_objective_and_the_rollouts():
    assert set(GRPO_KEYS) <= set(METRIC_KEYS)
    assert set(ROLLOUT_KEYS) | {"clip_ratio", "kl", "eval_reward_mean"} == set(GRPO_KEYS)
    assert not set(ROLLOUT_KEYS) & set(OBJECTIVE_KEYS)


def test_a_rollouts_figures_follow_trl():
    # two prompts x 3 completions: the second group all equal (no signal)
    figures = rollout_figures(
        [1.0, 0.0, 0.0, 0.5, 0.5, 0.5],
        {"math_answer": 1 / 3, "format": math.nan},
        [4, 6, 2, 8, 8, 8],
        num_generations=3,
        zero_std_groups=0.5,
        seconds=2.0,
    )
    assert figures.reward_mean == pytest.approx(2.5 / 6)
    # TRL's reward_std: the mean of each group's unbiased std
    expected_std = (np.std([1.0, 0.0, 0.0], ddof=1) + 0.0) / 2
    assert figures.reward_std == pytest.approx(expected_std)
    assert figures.completions == 6 and figures.completion_tokens == 36
    with pytest.raises(ValueError, match="num_generations=4"):
        rollout_figures([1.0] * 6, {}, [1] * 6, num_generations=4, zero_std_groups=0.0, seconds=1.0)


def test_an_interval_averages_its_rollouts_and_times_per_step():
    first = rollout_figures(
        [1.0, 0.0],
        {"math_answer": 0.5, "format": math.nan},
        [10, 20],
        num_generations=2,
        zero_std_groups=0.0,
        seconds=3.0,
    )
    second = rollout_figures(
        [1.0, 1.0],
        {"math_answer": 1.0, "format": math.nan},
        [30, 40],
        num_generations=2,
        zero_std_groups=1.0,
        seconds=1.0,
    )
    figures = rollout_metrics([first, second], steps=4, train_seconds=2.0)
    assert set(figures) == set(ROLLOUT_KEYS)
    assert figures["reward_mean"] == pytest.approx(0.75)
    assert figures["reward_std"] == pytest.approx(np.std([1.0, 0.0], ddof=1) / 2)
    assert figures["rewards"] == {"math_answer": pytest.approx(0.75), "format": None}  # all skipped: None
    assert figures["completion_length"] == pytest.approx(25.0)
    assert figures["zero_std_groups"] == pytest.approx(0.5)
    assert figures["rollout_s"] == pytest.approx(1.0) and figures["train_s"] == pytest.approx(0.5)
    assert figures["rollout_tokens_per_s"] == pytest.approx(100 / 4.0)


def test_an_interval_without_a_rollout_reports_time_but_no_rewards():
    # num_iterations > 1 and a log every step: some intervals reuse an earlier rollout
    log = RolloutLog()
    log.add(rollout_figures([0.0, 1.0], {}, [5, 5], num_generations=2, zero_std_groups=0.0, seconds=4.0))
    log.trained(1.0)
    assert log.take(1)["rollout_s"] == pytest.approx(4.0)
    log.trained(1.5)
    figures = log.take(1)
    assert figures["rollout_s"] == 0.0 and figures["train_s"] == pytest.approx(1.5)
    assert all(figures[k] is None for k in ROLLOUT_KEYS if k not in ("rollout_s", "train_s"))
    with pytest.raises(ValueError, match="steps=0"):
        rollout_metrics([], steps=0, train_seconds=0.0)


def test_the_profiler_reads_the_objectives_clip_ratio_kl_and_eval_reward():
    import torch

    from workbench.analysis.profiler import StepProfiler
    from workbench.train.step import EvalLoss

    profiler = StepProfiler(None, log_every=1, warmup_steps=0, stat_names=("clip_ratio", "kl"))
    metrics = profiler.step(
        10,
        loss=torch.tensor(0.5),
        stats=torch.tensor([0.125, 0.01]),
        eval_loss=EvalLoss(0.75, {"reward_mean": 0.75}),
    )
    assert metrics["clip_ratio"] == 0.125 and metrics["kl"] == pytest.approx(0.01)
    assert metrics["eval_reward_mean"] == 0.75
    assert all(metrics[key] is None for key in ("reward_accuracy", "eval_reward_accuracy"))
    plain = StepProfiler(None, log_every=1, warmup_steps=0).step(10, loss=torch.tensor(0.5))
    assert all(plain[key] is None for key in ("clip_ratio", "kl", "eval_reward_mean"))
