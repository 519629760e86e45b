"""Sessions that end well: the time budget (`train.time_limit`), checkpoints written in the background
(`train.async_checkpoint`), a cadence in time (`train.checkpoint_every: '20m'`), checkpoint directories
that say what is wrong with them, and the SIGKILL drill (tests/kill_drill.py, real processes)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.test_train import tiny_cfg, token_dataset
from workbench.config import ConfigError
from workbench.train import Trainer, state_io
from workbench.train.checkpoint import CheckpointManager
from workbench.train.clock import SAFETY, TimeBudget
from workbench.train.run_checkpoints import RunCheckpoints
from workbench.train.state_io import CheckpointError
from workbench.units import duration_with_unit, format_duration, parse_duration

REPO = Path(__file__).resolve().parent.parent


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---- durations and config ---------------------------------------------------------------------


def test_durations_read_as_configs_give_them():
    assert parse_duration("8h30m") == 30600 and parse_duration("20m") == 1200 and parse_duration(90) == 90
    assert parse_duration("1.5h") == 5400 and parse_duration("300") == 300
    assert (
        duration_with_unit("20m") == 1200
        and duration_with_unit("20") is None
        and duration_with_unit(5) is None
    )
    assert format_duration(30600) == "8h30m" and format_duration(250) == "4m10s"
    for bad in ("8x", "30m8h", "", "1h1h"):
        with pytest.raises(ValueError, match="is not a duration"):
            parse_duration(bad)


def test_time_limit_and_checkpoint_every_take_durations_and_name_bad_ones():
    cfg = tiny_cfg(**{"train.time_limit": "8h30m", "train.checkpoint_every": "20m"})
    assert cfg.train.time_limit == "8h30m" and cfg.train.checkpoint_every == "20m"
    assert tiny_cfg(**{"train.checkpoint_every": 5}).train.checkpoint_every == 5
    with pytest.raises(ConfigError, match=r"train\.time_limit='soon' is not allowed: must be seconds > 0"):
        tiny_cfg(**{"train.time_limit": "soon"})
    with pytest.raises(ConfigError, match=r"train\.checkpoint_every='often' is not allowed.*'20m'"):
        tiny_cfg(**{"train.checkpoint_every": "often"})


# ---- the budget ------------------------------------------------------------------------------------


def test_budget_stops_when_one_more_iteration_and_the_final_save_no_longer_fit():
    clock = FakeClock()
    budget = TimeBudget(100.0, clock=clock)
    budget.expect_saves(50_000_000)  # 1 s at the assumed 50 MB/s, + 2 s of overhead
    assert budget.assumed_save_s == pytest.approx(3.0)
    assert not budget.must_stop(eval_next=False)  # nothing measured yet: the first step runs
    stops = []
    for _ in range(200):
        clock.now += 5.0  # each iteration takes 5 s
        if budget.must_stop(eval_next=False):
            stops.append(clock.now - budget.start)
            break
    elapsed = stops[0]
    assert 100 - elapsed < SAFETY * (5 + 3)  # one more step and the save would not have fit
    assert 100 - elapsed >= SAFETY * 3  # the save still fits, with its margin
    budget.save_done(20.0)  # a measured save replaces the assumption
    assert budget.must_stop(eval_next=False)


def test_budget_plans_the_stop_step_and_counts_evals_apart():
    clock = FakeClock()
    budget = TimeBudget(1000.0, clock=clock)
    budget.expect_saves(None)
    budget.must_stop(eval_next=False)
    clock.now += 2.0
    budget.timed_eval(lambda: None)
    budget.must_stop(eval_next=False)
    assert list(budget.steps) == [2.0]
    # 998 s left / 1.25 at 2 s a step: 399 more steps
    assert budget.planned_stop_step(10, 10_000, eval_every=0) == 10 + 399
    assert budget.planned_stop_step(10, 100, eval_every=0) == 100
    assert TimeBudget(None).planned_stop_step(3, 10, eval_every=0) is None
    assert not TimeBudget(None).must_stop(eval_next=True)


def test_budget_keeps_room_for_the_rest_of_a_write_in_flight():
    clock = FakeClock()
    budget = TimeBudget(100.0, clock=clock)
    budget.expect_saves(0)
    budget.save_done(20.0)  # saves take 20 s; steps 1 s
    for _ in range(60):  # 40 s left: one step and a save fit ...
        assert not budget.must_stop(eval_next=False)
        clock.now += 1.0
    assert not budget.must_stop(eval_next=False)
    clock.now += 1.0  # ... but not when a write began 5 s ago: the final save waits for its other 15 s
    assert budget.must_stop(eval_next=False, write_in_flight_s=5.0)
    clock.now += 20.0  # the write in flight took longer than planned: no room left for the final save
    assert not budget.final_save_fits()


# ---- background writes -----------------------------------------------------------------------------


def slow_target(monkeypatch, seconds_per_block: float) -> list[float]:
    """Every safetensors block takes this long to write (a slow mount); returns when each was written."""
    written: list[float] = []
    real = state_io.write_block

    def slow(handle, block):
        time.sleep(seconds_per_block)
        written.append(time.monotonic())
        real(handle, block)

    monkeypatch.setattr(state_io, "write_block", slow)
    return written


def run_checkpoints(tmp_path, **train) -> RunCheckpoints:
    cfg = tiny_cfg(**{"train.checkpoint_dir": str(tmp_path), **{f"train.{k}": v for k, v in train.items()}})
    return RunCheckpoints(cfg.train, sharded=False)


def test_a_background_save_returns_before_its_write_and_saves_what_it_copied(tmp_path, monkeypatch):
    slow_target(monkeypatch, 1.0)
    saves = run_checkpoints(tmp_path, keep_checkpoints=3)
    weight = torch.arange(6.0)
    start = time.monotonic()
    path = saves.save(1, lambda: {"model": {"w": weight}, "step": 1})
    stall = time.monotonic() - start
    weight.add_(100.0)  # training goes on changing the live tensor while the write runs
    assert saves.writing and not (path / "manifest.json").exists()
    saves.wait()
    # well under the 1 s write: the loop waited for the copy, not the write (room for a busy machine)
    assert stall < 0.5 and saves.stall_s is not None and saves.stall_s < 0.5
    loaded = CheckpointManager(tmp_path).load(path)
    assert torch.equal(loaded["model"]["w"], torch.arange(6.0)) and loaded["step"] == 1


def test_at_most_one_write_is_in_flight(tmp_path, monkeypatch):
    slow_target(monkeypatch, 0.3)
    saves = run_checkpoints(tmp_path, keep_checkpoints=3)
    saves.save(1, lambda: {"model": {"w": torch.ones(3)}})
    assert saves.writing
    saves.save(2, lambda: {"model": {"w": torch.ones(3) * 2}})  # waits for step 1's write first
    assert (tmp_path / "step-00000001" / "manifest.json").is_file() and saves.writing
    assert saves.stall_s >= 0.3  # the wait for the write in flight is the loop's stall
    saves.wait()
    assert [p.name for p in CheckpointManager(tmp_path).checkpoints()] == ["step-00000001", "step-00000002"]


def test_a_failed_background_write_raises_at_the_next_save_and_leaves_the_previous(tmp_path, monkeypatch):
    saves = run_checkpoints(tmp_path)
    saves.save(1, lambda: {"model": {"w": torch.ones(3)}}, wait=True)

    def disk_full(handle, block):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(state_io, "write_block", disk_full)
    saves.save(2, lambda: {"model": {"w": torch.ones(3)}})
    with pytest.raises(CheckpointError, match=r"checkpoint of step 2 could not be written.*No space left"):
        saves.wait()
    manager = CheckpointManager(tmp_path)
    assert manager.latest().name == "step-00000001" and manager.verify(manager.latest())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_checkpoint_every_in_time_saves_when_the_time_has_passed(tmp_path):
    clock = FakeClock()
    cfg = tiny_cfg(**{"train.checkpoint_dir": str(tmp_path), "train.checkpoint_every": "20m"})
    saves = RunCheckpoints(cfg.train, sharded=False, clock=clock)
    assert saves.every_s == 1200 and not saves.due(7)
    clock.now += 1199
    assert not saves.due(8)
    clock.now += 2
    assert saves.due(9)
    saves.save(9, lambda: {"model": {"w": torch.ones(1)}}, wait=True)
    assert not saves.due(10)  # counted again from the save


# ---- the trainer ------------------------------------------------------------------------------------


def test_a_time_limited_run_stops_in_time_with_a_complete_checkpoint_and_resumes_bitwise(tmp_path):
    steps, data = 40, token_dataset(48)
    common = {"train.steps": steps, "train.checkpoint_dir": str(tmp_path), "train.checkpoint_every": 4}
    began = time.monotonic()
    straight = Trainer(tiny_cfg(**{"train.steps": steps}), train_dataset=data).fit()
    step_s = (
        time.monotonic() - began
    ) / steps  # this machine's step now, loading included: a busy CPU gets more room

    def slow_step(metrics: dict) -> None:  # steps of at least 0.15 s: 40 of them take over 6 s + 40 steps
        time.sleep(0.15)

    limit = 3.0 + 20 * step_s  # room for a few steps and a save, never for all 40 (6 s + 40 x step_s)
    start = time.monotonic()
    trainer = Trainer(
        tiny_cfg(**common, **{"train.time_limit": limit}), train_dataset=data, callbacks=[slow_step]
    )
    stopped = trainer.fit()
    elapsed = time.monotonic() - start
    assert stopped.time_limited and 0 < stopped.steps < steps
    assert elapsed < limit, f"stopped {elapsed - limit:.2f} s past the limit"
    assert stopped.checkpoint_path.endswith(f"step-{stopped.steps:08d}")
    CheckpointManager(tmp_path).verify(stopped.checkpoint_path)  # complete before fit returned
    notice = next(n for n in stopped.notices if n.startswith("time limit"))
    assert f"stopped at step {stopped.steps} of {steps}" in notice and "Re-run the same command" in notice
    last = stopped.history[-1]
    assert last["time_left_s"] is not None and last["planned_stop_step"] <= steps

    resumed = Trainer(tiny_cfg(**common), train_dataset=data).fit()
    assert not resumed.time_limited and resumed.steps == steps
    assert [m["loss"] for m in resumed.history] == [m["loss"] for m in straight.history][stopped.steps :]


def test_metrics_say_nothing_of_a_budget_the_run_does_not_have():
    result = Trainer(tiny_cfg(**{"train.steps": 2}), train_dataset=token_dataset(16)).fit()
    assert result.history[-1]["time_left_s"] is None and result.history[-1]["planned_stop_step"] is None
    assert result.history[-1]["checkpoint_stall_s"] is None and not result.time_limited


# ---- checkpoint directories that say what is wrong ---------------------------------------------


def test_a_checkpoint_from_another_model_names_the_settings_that_differ(tmp_path):
    data = token_dataset(16)
    written = {"train.steps": 2, "train.checkpoint_dir": str(tmp_path)}
    Trainer(tiny_cfg(**written), train_dataset=data).fit()
    other = tiny_cfg(**{**written, "train.steps": 4, "model.hidden_size": 64, "model.intermediate_size": 128})
    with pytest.raises(CheckpointError) as err:
        Trainer(other, train_dataset=data).fit()
    message = str(err.value)
    assert "model.hidden_size=32 there, 64 here" in message and "train.resume=false" in message


def test_partial_and_other_version_checkpoints_say_which_and_what_to_do(tmp_path):
    manager = CheckpointManager(tmp_path)
    good = manager.save(1, {"model": {"w": torch.ones(2)}})
    partial = tmp_path / "step-00000002"
    partial.mkdir()
    with pytest.raises(
        CheckpointError, match=r"incomplete.*did not finish.*newest complete one is .*step-00000001"
    ):
        manager.verify(partial)
    manifest = json.loads((good / "manifest.json").read_text())
    manifest.update(format_version=99, workbench_version="9.9.0")
    (good / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        CheckpointError, match=r"written by workbench 9\.9\.0.*format 99.*xla-workbench==9\.9\.0"
    ):
        manager.load(good)


# ---- the SIGKILL drill ---------------------------------------------------------------------------------


def _drill(args: dict, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.kill_drill", json.dumps(args)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _progress(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def test_sigkill_at_random_moments_with_background_saves_resumes_bitwise(tmp_path):
    """Kill the run (SIGKILL: no cleanup) at random moments, mostly inside a slow background write;
    after every kill the latest checkpoint loads, and the run resumed to the end equals one never killed."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    straight = tmp_path / "straight"
    done = _drill({"checkpoint_dir": str(straight), "progress": str(tmp_path / "p0")}, env)
    assert done.wait(timeout=300) == 0, done.stderr.read()

    drilled, progress = tmp_path / "drilled", tmp_path / "p1"
    rng, kills, mid_write = random.Random(20), 0, 0
    args = {"checkpoint_dir": str(drilled), "progress": str(progress), "seconds_per_block": 0.05}
    for _ in range(4):
        proc = _drill(args, env)
        seen = _progress(progress)
        deadline = time.monotonic() + 120
        while proc.poll() is None and _progress(progress) <= seen and time.monotonic() < deadline:
            time.sleep(0.02)  # each process trains at least one step before it is killed
        time.sleep(rng.uniform(0.0, 0.5))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        mid_write += any(p.name.startswith(".tmp-") for p in drilled.iterdir())
        manager = CheckpointManager(drilled)
        if manager.latest() is not None:
            manager.load()  # the last complete checkpoint loads after every kill
    last = _drill(args, env)
    assert last.wait(timeout=300) == 0, last.stderr.read()
    assert kills >= 3 and mid_write >= 1, (kills, mid_write)
    final, reference = CheckpointManager(drilled).load(), CheckpointManager(straight).load()
    assert final["loop"]["step"] == reference["loop"]["step"] == 12
    for part in ("model", "optimizer"):
        want = state_io.flatten_state(reference[part])[1]
        got = state_io.flatten_state(final[part])[1]
        assert want.keys() == got.keys()
        assert all(torch.equal(want[k], got[k]) for k in want), part


# ---- on XLA: FSDP over 8 devices, background saves through DCP ------------------------------------


@pytest.fixture(scope="module")
def time_limited_xla(xla_scenario, tmp_path_factory):
    """tests/xla/time_limit.py: a 60-step FSDP run with steps slowed to 0.5 s under a 30 s limit,
    checkpointing every 4 s in the background; then resumed to the end."""
    return xla_scenario("time_limit", checkpoint_dir=str(tmp_path_factory.mktemp("time-limit")))


@pytest.mark.xla
def test_xla_time_limit_stops_before_the_limit_with_a_complete_checkpoint(time_limited_xla):
    run = time_limited_xla
    assert run["time_limited"] and 0 < run["stopped_steps"] < 60
    assert run["elapsed_s"] < run["limit_s"]
    assert run["stopped_checkpoint"].endswith(f"step-{run['stopped_steps']:08d}")
    assert any(n.startswith("time limit 30.0s: stopped at step") for n in run["notices"])
    assert "model.dcp" in run["files"] and "optimizer.dcp" in run["files"]


@pytest.mark.xla
def test_xla_time_cadence_saved_in_the_background(time_limited_xla):
    run = time_limited_xla
    assert len(run["stalls"]) >= 1 and max(run["stalls"]) < 5.0
    # The plan is re-made from measured step times at each log step; a busy machine (the suite's other
    # workers) can slow the last steps after the last plan, so it may overshoot the stop by a few steps.
    assert (
        all(p is None or p <= 60 for p in run["planned"]) and run["planned"][-1] <= run["stopped_steps"] + 3
    )


@pytest.mark.xla
def test_xla_time_limited_run_resumes_as_if_never_stopped(time_limited_xla):
    run = time_limited_xla
    k = run["stopped_steps"]
    assert run["resumed_steps"] == list(range(k + 1, 61))
    assert run["resumed"] == pytest.approx(run["straight"][k:], rel=1e-6)
    assert run["resumed_compiles_after_warmup"] == 0


class RolloutStreamClock:
    """A GRPO stream on a fake clock: ``next()`` spends a rollout's seconds every `every` steps (as
    `workbench.rl.rollout.RolloutStream` samples inside it), the step after it its training seconds."""

    def __init__(self, clock: FakeClock, *, rollout_s: float, train_s: float, every: int) -> None:
        self.clock, self.rollout_s, self.train_s, self.every, self.served = (
            clock,
            rollout_s,
            train_s,
            every,
            0,
        )

    def step(self) -> None:
        if self.served % self.every == 0:
            self.clock.now += self.rollout_s  # the rollout, inside next()
        self.served += 1
        self.clock.now += self.train_s  # the training step


@pytest.mark.parametrize("every", [1, 4, 40])
def test_a_grpo_steps_rollout_is_planned_with_it_and_the_run_stops_in_time(every):
    clock = FakeClock()
    budget = TimeBudget(2000.0, clock=clock)
    budget.expect_saves(0)  # a save is planned at 2 s
    budget.expect_rollouts(every)  # grpo.num_iterations
    stream = RolloutStreamClock(clock, rollout_s=9.0, train_s=1.0, every=every)
    while not budget.must_stop(eval_next=False):
        stream.step()
        if stream.served == every + 1:  # a rollout cycle measured: the next step is planned as a rollout's
            assert budget._step_s() == pytest.approx(10.0)
            # the long haul: a rollout's 9 s shared by its `every` steps
            per_step = 1.0 + 9.0 / every
            left = budget.left()
            assert budget.planned_stop_step(0, 10**6, eval_every=0) == int((left / SAFETY - 2.0) // per_step)
    used = clock.now - budget.start
    # a step with its rollout and the save would not have fit; the save still does, and the run never
    # planned a step without the rollout it might need, however many steps a rollout serves
    assert 2000 - used < SAFETY * (10.0 + 2.0) and 2000 - used >= SAFETY * 2.0
    assert budget._step_s() == pytest.approx(10.0)


def test_without_expect_rollouts_a_long_cycle_falls_out_of_the_window():
    clock = FakeClock()
    budget = TimeBudget(None, clock=clock)
    stream = RolloutStreamClock(clock, rollout_s=9.0, train_s=1.0, every=40)
    for _ in range(20):
        budget.must_stop(eval_next=False)
        stream.step()
    budget.must_stop(eval_next=False)
    assert budget._step_s() == 1.0  # 16 steps remembered: the rollout forgotten
    budget.expect_rollouts(40)
    assert budget.steps.maxlen == 80
