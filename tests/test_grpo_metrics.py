"""GRPO's rollout figures in the metrics contract: per rollout, then per log interval."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from workbench.analysis.metrics import (
    GRPO_KEYS,
    INTERVAL_KEYS,
    METRIC_KEYS,
    OBJECTIVE_KEYS,
    PREFERENCE_KEYS,
    ROLLOUT_KEYS,
)
from workbench.rl.metrics import RolloutLog, rollout_figures, rollout_metrics


def test_the_grpo_keys_are_contract_keys_split_between_the_objective_and_the_rollouts():
    assert set(GRPO_KEYS) <= set(METRIC_KEYS)
    # the objective's own figures (its stats and its eval's, interval keys) and the rollouts' (run keys)
    assert set(ROLLOUT_KEYS) | (set(OBJECTIVE_KEYS) & set(GRPO_KEYS)) == set(GRPO_KEYS)
    assert not set(ROLLOUT_KEYS) & set(OBJECTIVE_KEYS) and not set(ROLLOUT_KEYS) & set(INTERVAL_KEYS)
    assert set(OBJECTIVE_KEYS) == set(PREFERENCE_KEYS) | (set(GRPO_KEYS) & set(INTERVAL_KEYS))
    assert "expected_transfers" in INTERVAL_KEYS and "expected_transfers" not in GRPO_KEYS  # the profiler's


def test_each_objectives_keys_are_marked_where_the_contract_says_who_fills_them():
    """The groups come from the contract's marks: each marked key's docstring names its objective."""
    from workbench.analysis.metrics import KEYS_ONLY_IN, IntervalMetrics, RunMetrics
    from workbench.config_reference import attribute_docs

    docs = {**attribute_docs(IntervalMetrics), **attribute_docs(RunMetrics)}
    assert set(KEYS_ONLY_IN) == {"preference", "grpo"}
    assert KEYS_ONLY_IN["preference"] == PREFERENCE_KEYS and KEYS_ONLY_IN["grpo"] == GRPO_KEYS
    said = {"preference": "Preference tuning", "grpo": "GRPO"}
    for objective, keys in KEYS_ONLY_IN.items():
        assert all(docs[key].startswith(said[objective]) for key in keys), objective
    unmarked = set(METRIC_KEYS) - set(PREFERENCE_KEYS) - set(GRPO_KEYS)
    assert not [key for key in unmarked if docs[key].startswith(tuple(said.values()))]


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
    assert all(metrics[key] is None for key in PREFERENCE_KEYS)
    plain = StepProfiler(None, log_every=1, warmup_steps=0).step(10, loss=torch.tensor(0.5))
    assert all(plain[key] is None for key in OBJECTIVE_KEYS)


# ---- unscored completions, clipped_ratio and the traps named during a run (issue 42) ----------------


def test_unscored_completions_are_left_out_of_every_reward_figure():
    nan = math.nan
    # group 1: one completion unscored; group 2: none scored
    figures = rollout_figures(
        [1.0, nan, 0.0, nan, nan, nan],
        {"a": 0.5},
        [3, 3, 3, 3, 3, 3],
        num_generations=3,
        zero_std_groups=0.0,
        seconds=1.0,
        finished=[True, True, False, True, False, False],
    )
    assert figures.reward_mean == pytest.approx(0.5) and figures.scored == 2  # not 1/6: nan is not 0
    assert figures.reward_std == pytest.approx(np.std([1.0, 0.0], ddof=1))  # the second group has none
    assert figures.clipped == 3
    nothing = rollout_figures(
        [nan] * 4, {"a": nan}, [2] * 4, num_generations=2, zero_std_groups=0.0, seconds=1.0
    )
    assert math.isnan(nothing.reward_mean) and math.isnan(nothing.reward_std) and nothing.scored == 0
    interval = rollout_metrics([figures, nothing], steps=1, train_seconds=0.0)
    assert interval["reward_mean"] == pytest.approx(0.5)  # over the scored completions of both
    assert interval["clipped_ratio"] == pytest.approx(3 / 10) and interval["rewards"] == {"a": 0.5}
    none = rollout_metrics([nothing], steps=1, train_seconds=0.0)
    assert none["reward_mean"] is None and none["reward_std"] is None and none["rewards"] == {"a": None}
    assert none["clipped_ratio"] == 0.0 and none["completions"] is None


def test_the_traps_of_an_interval_are_named_with_the_key_to_change():
    from workbench.config_grpo import GRPOConfig
    from workbench.rl.traps import TrapNotices, interval_traps, nothing_scored

    grpo = GRPOConfig(max_completion_length=64)
    quiet = {"completion_length": 30.0, "clipped_ratio": 0.5, "zero_std_groups": 0.5, "rewards": {"a": 0.2}}
    assert interval_traps(quiet, grpo, 5) == []  # half is not "more than half"
    assert nothing_scored({**quiet, "reward_mean": 0.2}, ["a"], 5) is None
    loud = {
        **quiet,
        "clipped_ratio": 0.75,
        "zero_std_groups": 0.875,
        "rewards": {"a": 0.2, "math_answer": None},
    }
    traps = {trap.kind: trap.message for trap in interval_traps(loud, grpo, 5)}
    assert set(traps) == {"clipped", "zero_std", "unscored:math_answer"}
    assert traps["clipped"].startswith("step 5: 75% of the interval's completions were cut at ")
    assert "grpo.max_completion_length=64 tokens (clipped_ratio 0.75)" in traps["clipped"]
    assert "raise grpo.max_completion_length" in traps["clipped"]
    assert "88% of the interval's groups" in traps["zero_std"] and "zero_std_groups 0.88" in traps["zero_std"]
    assert (
        "'math_answer' scored none" in traps["unscored:math_answer"]
        and "'answer' column" in traps["unscored:math_answer"]
    )
    stop = nothing_scored({**loud, "reward_mean": None}, ["math_answer"], 5)
    assert stop.startswith("step 5: no completion of the interval was scored") and "data.columns" in stop
    # an interval without a rollout (num_iterations > 1) has no traps and is not "nothing scored"
    assert interval_traps({"completion_length": None}, grpo, 6) == []
    assert nothing_scored({"completion_length": None, "reward_mean": None}, ["a"], 6) is None
    # the first of each kind joins the run's notices, the next ones are lines only
    kept, lines = [], []
    notices = TrapNotices(kept.append, lines.append)
    notices.say(interval_traps(loud, grpo, 5))
    notices.say(interval_traps(loud, grpo, 10))
    assert len(kept) == 3 and len(lines) == 3 and all(m.startswith("step 10") for m in lines)


def test_logged_completions_are_rows_of_what_the_host_holds_and_a_jsonl_per_run(tmp_path):
    import json

    from workbench.rl.completions import CompletionsLog, completion_rows, completions_path

    table = np.asarray([[1.0, np.nan], [np.nan, np.nan]], dtype=np.float32)
    rows = completion_rows(
        ["p", "p"],
        ["#### 4", "?"],
        ["math_answer", "format"],
        table,
        np.asarray([1.0, np.nan]),
        np.asarray([0.7, 0.0]),
        [True, False],
        2,
    )
    assert rows[0] == {
        "group": 0,
        "prompt": "p",
        "completion": "#### 4",
        "rewards": {"math_answer": 1.0, "format": None},
        "reward": 1.0,
        "advantage": pytest.approx(0.7),
        "clipped": False,
    }
    assert rows[1]["reward"] is None and rows[1]["clipped"] is True
    assert completions_path("runs/m.json", "ck") == Path("runs/m.completions.jsonl")
    assert (
        completions_path(None, "ck") == Path("ck/completions.jsonl") and completions_path(None, None) is None
    )

    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (2, 4, 6)))  # an earlier run's
    log = CompletionsLog(path, start_step=4)  # resumed at step 4: steps 2 and 4 stay, 6 goes
    log({"completions": None})
    log({"completions": [{"step": 6, "completion": "é"}]})
    log({"completions": [{"step": 8, "completion": "x"}]})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [2, 4, 6, 8]
    fresh = CompletionsLog(path)  # a run from the start replaces the file
    fresh({"completions": [{"step": 1}]})
    assert path.read_text() == '{"step": 1}\n'
