"""The bucket plan that counts compile time: `choose_buckets` exact against brute force and against the
per-K planner, its errors, `max_buckets: auto` through the loader, and an auto run on XLA:CPU."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.config import ConfigError, WorkbenchConfig
from workbench.data import BucketChoice, choose_buckets, training_epochs
from workbench.data.buckets import padded_tokens_for, plan_buckets, round_up
from workbench.data.loader import make_loader, plan_for_config


def _brute_force(lengths, multiple, max_length, compile_s, token_s, epochs) -> tuple[float, int]:
    """(least predicted seconds, fewest shapes reaching it) over every subset of candidate boundaries."""
    arr = np.asarray(lengths)
    limit = max_length if max_length is not None else int(arr.max())
    clipped = np.minimum(arr, limit)
    top = int(round_up(limit, multiple))
    candidates = sorted({int(v) for v in round_up(clipped, multiple)} - {top})
    costs = {}
    for extra in range(len(candidates) + 1):
        for chosen in itertools.combinations(candidates, extra):
            bounds = [*chosen, top]
            cost = epochs * token_s * padded_tokens_for(clipped, bounds) + len(bounds) * compile_s
            costs[len(bounds)] = min(costs.get(len(bounds), float("inf")), cost)
    best = min(costs.values())
    fewest = min(k for k, c in costs.items() if c <= best * (1 + 1e-12))
    return best, fewest


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 70), min_size=1, max_size=25),
    multiple=st.sampled_from([1, 4, 8]),
    max_length=st.one_of(st.none(), st.integers(16, 80)),
    compile_s=st.one_of(st.just(0.0), st.floats(0.01, 500.0)),
    token_s=st.floats(1e-3, 2.0),
    epochs=st.floats(0.1, 5.0),
)
def test_choose_buckets_is_the_exact_minimum_over_every_boundary_subset(
    lengths, multiple, max_length, compile_s, token_s, epochs
):
    limit = max_length if max_length is not None else max(lengths)
    if len(set(round_up(np.minimum(lengths, limit), multiple).tolist())) > 12:
        # keep the brute force (2^candidates) small: a cap on the lengths alone let an example with a
        # max_length and ~25 distinct values try millions of subsets (0.5 s to 130 s between runs)
        lengths = lengths[:12]
    plan = choose_buckets(
        lengths,
        compile_seconds=compile_s,
        seconds_per_padded_token=token_s,
        epochs=epochs,
        multiple_of=multiple,
        max_length=max_length,
    )
    best, fewest = _brute_force(lengths, multiple, max_length, compile_s, token_s, epochs)
    predicted = epochs * token_s * plan.padded_tokens + plan.num_shapes * compile_s
    assert predicted == pytest.approx(best, rel=1e-9, abs=1e-9)
    assert plan.num_shapes == fewest  # equal predictions: the fewest shapes win
    assert plan.choice.predicted_total_s == pytest.approx(predicted, rel=1e-12)
    assert plan.padded_tokens == padded_tokens_for(np.minimum(lengths, plan.boundaries[-1]), plan.boundaries)


def test_choose_buckets_agrees_with_the_per_k_planner_for_every_k():
    rng = np.random.default_rng(3)
    lengths = np.concatenate(
        [rng.integers(8, 60, 400), rng.integers(200, 512, 80), rng.integers(60, 200, 150)]
    )
    for compile_s in (0.0, 0.2, 3.0, 40.0, 1e4):
        plan = choose_buckets(
            lengths, compile_seconds=compile_s, seconds_per_padded_token=1e-4, epochs=2.0, multiple_of=8
        )
        choice = plan.choice
        per_k = [plan_buckets(lengths, k, multiple_of=8).padded_tokens for k in range(1, 33)]
        assert choice.padded_tokens == per_k
        best_fixed = min(2.0 * 1e-4 * p + k * compile_s for k, p in enumerate(per_k, start=1))
        assert choice.predicted_total_s <= best_fixed * (1 + 1e-12)
        if plan.num_shapes <= 32:  # the chosen plan is the per-K planner's plan for its K
            assert plan.boundaries == plan_buckets(lengths, plan.num_shapes, multiple_of=8).boundaries
    # more compile cost never asks for more shapes
    shapes = [
        choose_buckets(lengths, compile_seconds=c, seconds_per_padded_token=1e-4, multiple_of=8).num_shapes
        for c in (0.0, 0.01, 0.1, 1.0, 10.0, 1e3, 1e6)
    ]
    assert shapes == sorted(shapes, reverse=True)
    assert shapes[0] == len(set(round_up(lengths, 8).tolist()))  # no compile cost: fewest padded tokens
    assert shapes[-1] == 1  # compiles dominate: pad to the maximum


def test_choice_carries_the_trade_off_curve():
    lengths = [10, 12, 30, 31, 64, 100, 100, 128]
    plan = choose_buckets(
        lengths, compile_seconds=5.0, seconds_per_padded_token=0.01, epochs=3.0, multiple_of=8
    )
    choice = plan.choice
    assert isinstance(choice, BucketChoice) and plan.strategy == "auto"
    assert choice.chosen == plan.num_shapes and choice.chosen_padded_tokens == plan.padded_tokens
    rows = choice.curve()
    assert [r["shapes"] for r in rows] == list(range(1, len(choice.padded_tokens) + 1))
    for r in rows:
        assert r["compile_s"] == pytest.approx(5.0 * r["shapes"])
        assert r["total_s"] == pytest.approx(r["compile_s"] + r["steps_s"])
    assert min(r["total_s"] for r in rows) == pytest.approx(choice.predicted_total_s)
    summary = plan.summary()["choice"]
    assert summary["chosen_shapes"] == plan.num_shapes and summary["curve"] == rows
    line = choice.describe()
    assert f"{plan.num_shapes} shapes" in line and "5 s/shape" in line


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"compile_seconds": -1.0}, "compile_seconds=-1.0 is not allowed: must be a finite number >= 0"),
        ({"compile_seconds": float("nan")}, "compile_seconds=nan"),
        (
            {"seconds_per_padded_token": 0.0},
            "seconds_per_padded_token=0.0 is not allowed: must be a finite number > 0",
        ),
        ({"epochs": 0}, "epochs=0 is not allowed: must be a finite number > 0"),
        ({"epochs": "2"}, "epochs='2' is not allowed"),
        ({"multiple_of": 0}, "multiple_of=0 is not allowed: must be an int >= 1"),
        ({"max_length": 0}, "max_length=0 is not allowed"),
    ],
)
def test_choose_buckets_rejects_bad_arguments(kwargs, message):
    args = {"compile_seconds": 1.0, "seconds_per_padded_token": 1e-3, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        choose_buckets([5, 9, 20], **args)


def test_choose_buckets_is_fast_on_a_million_lengths():
    import time

    lengths = np.random.default_rng(0).lognormal(5.0, 0.8, 1_000_000).astype(int) + 1
    start = time.perf_counter()
    plan = choose_buckets(lengths, compile_seconds=20.0, seconds_per_padded_token=1e-6, max_length=2048)
    assert time.perf_counter() - start < 30  # O(distinct lengths) per pass: a few hundred values here
    assert 1 <= plan.num_shapes <= 256 and plan.boundaries[-1] == 2048


# ---- through the config and the loader ----------------------------------------------------------


def _dataset(n: int = 200, seed: int = 0):
    import datasets

    rng = np.random.default_rng(seed)
    ids = [rng.integers(3, 200, size=int(k)).tolist() for k in rng.integers(4, 120, size=n)]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids, "length": [len(x) for x in ids]})


def test_loader_plans_auto_with_the_configured_costs():
    ds = _dataset()
    base = {"data.max_length": 128, "bucketing.max_buckets": "auto", "train.batch_size": 8, "train.steps": 50}
    cfg = WorkbenchConfig().with_overrides(
        {**base, "bucketing.compile_seconds": 2.0, "bucketing.seconds_per_padded_token": 1e-4}
    )
    lengths = np.asarray(ds["length"])
    assert training_epochs(lengths, cfg) == pytest.approx(50 * 8 / 200)
    plan = plan_for_config(lengths, cfg)
    expected = choose_buckets(
        lengths, compile_seconds=2.0, seconds_per_padded_token=1e-4, epochs=2.0, multiple_of=8, max_length=128
    )
    assert plan.boundaries == expected.boundaries and plan.choice.source == "config"
    _, sampler = make_loader(ds, cfg, pad_token_id=0)
    assert sorted({n for _, n in sampler.batch_shapes()}) == plan.boundaries
    assert sampler.report()["bucket_choice"]["chosen_shapes"] == plan.num_shapes
    # more passes over the data make padding dearer: never fewer shapes
    longer = plan_for_config(lengths, cfg.with_overrides({"train.steps": 5000}))
    assert longer.num_shapes >= plan.num_shapes


def test_loader_auto_without_costs_means_no_compile_cost():
    ds = _dataset()
    cfg = WorkbenchConfig().with_overrides({"data.max_length": 128, "bucketing.max_buckets": "auto"})
    plan = plan_for_config(np.asarray(ds["length"]), cfg)
    assert plan.choice.source == "no compile cost" and plan.choice.compile_seconds == 0.0
    assert plan.choice.describe().startswith(
        f"bucketing auto: {plan.num_shapes} shapes, the fewest padded tokens"
    )
    assert plan.boundaries == sorted(set(round_up(np.minimum(ds["length"], 128), 8).tolist()) | {128})


def test_auto_needs_the_optimal_strategy():
    with pytest.raises(
        ConfigError, match=re.escape("bucketing.strategy='pow2' is not allowed: max_buckets 'auto'")
    ):
        WorkbenchConfig().with_overrides({"bucketing.max_buckets": "auto", "bucketing.strategy": "pow2"})
    cfg = WorkbenchConfig().with_overrides({"bucketing.strategy": "pow2"})
    cfg.bucketing.max_buckets = "auto"  # set past validation: the planner refuses it too
    with pytest.raises(
        ValueError,
        match=re.escape("bucketing.strategy='pow2' is not allowed with bucketing.max_buckets='auto'"),
    ):
        plan_for_config([5, 10, 40], cfg)


# ---- an auto run on XLA:CPU ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def auto_run(xla_scenario):
    """tests/xla/auto_buckets.py: a tiny llama trained by the Trainer with max_buckets 'auto'."""
    return xla_scenario("auto_buckets", devices=1)


@pytest.mark.xla
@pytest.mark.slow
def test_auto_run_measures_the_costs_and_reports_the_choice(auto_run):
    choice, measured = auto_run["choice"], auto_run["choice"]["measurement"]
    assert choice["source"] == "measured"
    assert choice["compile_seconds"] == 0.02  # given in the config: only the per-token cost is measured
    assert choice["seconds_per_padded_token"] == measured["seconds_per_padded_token"] > 0
    assert measured["compile_seconds"] > 0 and measured["programs"] >= 1 and measured["shape"] == [8, 128]
    assert auto_run["plan_choice"]["curve"] == choice["curve"]  # the loader planned with the measured cost
    lines = [n for n in auto_run["notices"] if n.startswith("bucketing auto:")]
    assert len(lines) == 1 and f"{choice['chosen_shapes']} shapes" in lines[0] and "(measured)" in lines[0]


@pytest.mark.xla
@pytest.mark.slow
def test_auto_run_trains_on_the_chosen_plan_and_compiles_nothing_after_warmup(auto_run):
    assert auto_run["steps"] == auto_run["expected_steps"]
    assert auto_run["compiles_after_warmup"] == 0
    assert (
        auto_run["boundaries"][-1] == 128
        and len(auto_run["boundaries"]) == auto_run["choice"]["chosen_shapes"]
    )
    assert len(auto_run["boundaries"]) >= 2  # a small compile cost: several shapes are worth it
    # one plan whatever the batch (a growing batch keeps its boundaries)
    assert auto_run["boundaries_at_double_batch"] == auto_run["boundaries"]


@pytest.mark.xla
@pytest.mark.slow
def test_auto_run_with_its_programs_already_compiled_does_not_read_a_zero_compile_cost(auto_run):
    measured = auto_run["again_measurement"]
    assert measured["programs"] == 0  # the shape was compiled by the first run in this process
    assert measured["compile_seconds"] > 0.05  # this process's mean compile, not a ~0 figure
    assert auto_run["again_shapes"] <= len(auto_run["boundaries"]) + 1
    assert auto_run["again_compiles_after_warmup"] == 0
    assert auto_run["lengths_trained"] == auto_run["boundaries"]
    # warm-up compiled the other shapes; the measured one (the full length) was already compiled
    assert auto_run["warmup_compiles"] == len(auto_run["boundaries"]) - 1
