"""GRPO end to end: rollouts on the device, rewards, advantages and the loss, through the `Trainer`.

The task (`tests.grpo_data`): plain prompts ``"<letter> <digit>"`` whose right completion is the
digit. A module fixture fine-tunes the default tiny model on texts that give the right digit 30% of
the time (plain CPU); GRPO with `digit_reward` must then raise the held-out greedy reward from
about 0 to 1. On 8 XLA:CPU devices (data x fsdp x model = 2 x 2 x 2, LoRA) one scenario run
(``tests/xla/grpo_training.py``) checks the learning, 0 compiles after warm-up and the transfers
(one read per rollout, one per eval batch, nothing else), then mu = 2 (the sampler's log-probs as the
old ones, equal to a forward of the training program) and beta > 0. Under torchrun (2 gloo ranks,
``tests/dist/grpo.py``) the same learning on FSDP2 and a short DDP run, each rank rolling out its own
prompts. On plain CPU: a short run, a reward function that raises, ``module:function`` rewards from
the config and the CLI.
"""

from __future__ import annotations

import math
import os

import pytest

from tests.grpo_data import digit_prompts, digit_reward, sft_model, write_jsonl


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory) -> str:
    """The starting model: 120 SFT steps on texts that answer right 30% of the time (plain CPU)."""
    return sft_model(tmp_path_factory.mktemp("grpo-sft"))


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory) -> tuple[str, str]:
    work = tmp_path_factory.mktemp("grpo-prompts")
    train = write_jsonl(digit_prompts(), work / "prompts.jsonl")
    held = write_jsonl(digit_prompts(held_out=True), work / "held.jsonl")
    return str(train), str(held)


@pytest.fixture(scope="module")
def mesh_run(xla_scenario, sft_dir) -> dict:
    """The XLA scenario: GRPO learning on the 2 x 2 x 2 mesh, then short mu = 2 and beta > 0 runs."""
    return xla_scenario("grpo_training", sft_dir=sft_dir, steps=20)


def test_grpo_on_a_mesh_raises_the_held_out_reward_without_recompiling(mesh_run):
    run = mesh_run["learning"]
    history = run["history"]
    evals = [m["eval_reward_mean"] for m in history]
    assert run["before"] <= 0.3, run["before"]
    assert evals[-1] >= 0.8, evals
    assert run["compiles_after_warmup"] == 0, run
    assert all(m["compiles"] == 0 for m in history), [m["compiles"] for m in history]
    # two prompt buckets, each with its rollout and step compiled in warm-up (and the eval's)
    assert len(mesh_run["prompt_shapes"]) == 2 and len(mesh_run["eval_shapes"]) == 2, mesh_run
    # per rollout one read of the completions, per eval batch (a bucket's held-out prompts in 64 rows)
    # one read; the profiler's own reads of the loss are not counted: nothing else crossed
    reads = [m["steps_in_interval"] + mesh_run["eval_batches"] for m in history]
    assert [m["transfers"] for m in history] == reads, history
    assert [m["expected_transfers"] for m in history] == reads  # so the host-transfer advice stays quiet
    for m in history:
        assert m["rewards"] is not None and set(m["rewards"]) == {"digit_reward"}
        assert m["reward_mean"] == pytest.approx(m["rewards"]["digit_reward"])
        assert m["eval_loss"] is None and m["kl"] is None and m["clip_ratio"] == 0.0
        assert 1.0 <= m["completion_length"] <= 4.0
        assert m["rollout_s"] > 0 and m["train_s"] > 0 and m["rollout_tokens_per_s"] > 0
        assert 0.0 <= m["zero_std_groups"] <= 1.0 and math.isfinite(m["loss"])
        # grpo.log_completions: the interval's last rollout, 8 prompts x 8, with no read of their own
        assert len(m["completions"]) == 64 and {r["step"] for r in m["completions"]} == {m["step"]}
        assert {r["group"] for r in m["completions"]} == set(range(8)) and 0.0 <= m["clipped_ratio"] <= 1.0


def test_mu_above_one_reuses_each_rollout_with_the_samplers_log_probs(mesh_run):
    run = mesh_run["mu2"]
    history = run["history"]
    assert run["compiles_after_warmup"] == 0, run
    # grad_accum 2: one rollout (one read) samples both micro-batches' prompts (steps_per_generation
    # = grad_accum), every second step; the step that reuses them samples nothing
    assert [m["transfers"] for m in history] == [1, 0, 1, 0], history
    assert [m["expected_transfers"] for m in history] == [1, 0, 1, 0]
    assert history[0]["completion_length"] is not None
    assert [m["reward_mean"] is None for m in history] == [False, True, False, True]
    assert all(math.isfinite(m["loss"]) for m in history)
    # the second step's ratio is off 1 (the first step moved the policy): the clip acts on it
    assert history[1]["clip_ratio"] > 0 and history[0]["clip_ratio"] == 0.0
    # the sampler's log-probs are what a forward of the training program gives (fp32)
    assert run["logps_max_diff"] < 1e-4, run["logps_max_diff"]


def test_beta_above_zero_adds_the_kl_to_the_adapters_off_reference(mesh_run):
    run = mesh_run["beta"]
    history = run["history"]
    assert run["compiles_after_warmup"] == 0, run
    kls = [m["kl"] for m in history]
    assert all(k is not None and math.isfinite(k) and k >= 0 for k in kls), kls
    assert (
        kls[0] == pytest.approx(0.0, abs=1e-6) and kls[-1] > 0
    )  # fresh adapters: the policy is the reference
    assert all(math.isfinite(m["loss"]) for m in history)
    assert [m["transfers"] for m in history] == [1, 1, 1]


# ---- torchrun: one process per device ------------------------------------------------------------


@pytest.fixture(scope="module")
def rank_runs(sft_dir, tmp_path_factory) -> dict:
    """`tests/dist/grpo.py` under torchrun with 2 gloo ranks: the learning run on FSDP2, then DDP."""
    import json

    from tests.test_distributed import Launch, dist_env, succeeded, torchrun

    root = tmp_path_factory.mktemp("grpo-ranks")
    out = root / "ranks.json"
    command = torchrun(2, "-m", "tests.dist.grpo", str(out), sft_dir, "fsdp_learning", "ddp_short")
    succeeded(Launch(command, root / "logs", dist_env()).wait(), "GRPO under torchrun")
    return json.loads(out.read_text())


@pytest.mark.slow
def test_grpo_under_torchrun_raises_the_reward_each_rank_rolling_out_its_own_prompts(rank_runs):
    run = rank_runs["fsdp_learning"]
    assert (run["strategy"], run["world_size"]) == ("fsdp", 2)
    evals = [m["eval_reward_mean"] for m in run["history"]]
    assert run["before"] <= 0.3 and evals[-1] >= 0.8, (run["before"], evals)
    assert all(math.isfinite(m["loss"]) for m in run["history"])
    # each rank sampled its own half of every step's 8 prompts (whole groups), none twice
    first, second = run["sampled"]
    assert len(first) == len(second) == 20 and all(len(a) == len(b) == 4 for a, b in zip(first, second))
    assert all(set(a).isdisjoint(b) for a, b in zip(first, second))


@pytest.mark.slow
def test_grpo_under_ddp_takes_a_generation_for_two_micro_steps(rank_runs):
    run = rank_runs["ddp_short"]
    assert (run["strategy"], run["world_size"]) == ("ddp", 2)
    # one rollout of both micro-steps' prompts (4 per rank), trained twice (mu = 2)
    assert [len(r) for r in run["sampled"][0]] == [8] and [len(r) for r in run["sampled"][1]] == [8]
    assert [m["reward_mean"] is None for m in run["history"]] == [False, True]
    assert all(math.isfinite(m["loss"]) for m in run["history"])


# ---- plain CPU (the GPU/CPU fallback) ---------------------------------------------------------


def _cpu_cfg(sft_dir: str, train_file: str, **overrides):
    from workbench.config import WorkbenchConfig

    return WorkbenchConfig().with_overrides(
        {
            "train.objective": "grpo",
            "train.device_type": "cpu",
            "data.source": train_file,
            "model.pretrained_path": sft_dir,
            "data.max_length": 16,
            "model.max_position_embeddings": 64,
            "data.eval_fraction": 0.1,
            "bucketing.max_buckets": 1,
            "train.batch_size": 2,
            "grpo.num_generations": 4,
            "grpo.max_completion_length": 4,
            "train.progress_bar": False,
            "lora.rank": 4,
            **overrides,
        }
    )


def test_grpo_runs_on_plain_cpu_with_rewards_named_in_the_config(sft_dir, prompt_files):
    from workbench.train import Trainer

    cfg = _cpu_cfg(
        sft_dir,
        prompt_files[0],
        **{
            "train.steps": 2,
            "train.log_every": 1,
            "train.eval_every": 2,
            "grpo.num_iterations": 2,
            "grpo.reward_funcs": ["tests.grpo_data:digit_reward", "format"],
            "grpo.format_pattern": "[0-9]",
        },
    )
    trainer = Trainer(cfg)
    result = trainer.fit()
    first, second = result.history
    assert set(first["rewards"]) == {"digit_reward", "format"}
    assert second["reward_mean"] is None  # mu = 2: the second step reuses the first rollout
    assert math.isfinite(first["loss"]) and math.isfinite(second["loss"])
    assert second["eval_reward_mean"] is not None and result.eval_loss.stats["reward/format"] >= 0
    # the old log-probs a reused rollout carries are the sampler's: a forward gives the same
    import torch

    data = trainer.data
    host = next(iter(data.loader(data.train_dataset, 2)[0]))
    (batch,), _, _ = data.rollouts.run([host], 7)
    with torch.no_grad():
        forward = trainer.objective.policy_logps(trainer.model, batch)
    gap = ((forward - batch["old_logps"]).abs() * batch["completion_mask"]).max()
    assert float(gap) < 1e-4


def test_a_reward_function_that_raises_stops_the_run_naming_it_and_the_prompt(sft_dir, prompt_files):
    from workbench.rl.rewards import RewardError
    from workbench.train import Trainer

    def picky(prompts, completions, answer, **columns):
        raise KeyError("no such column")

    cfg = _cpu_cfg(sft_dir, prompt_files[0], **{"train.steps": 2, "data.eval_fraction": 0})
    with pytest.raises(RewardError) as caught:
        Trainer(cfg, rewards=[digit_reward, picky]).fit()
    message = str(caught.value)
    assert "'picky'" in message and "KeyError" in message
    assert any(f"{c} {d}" in message for c in "abcdefghijklmnopqrstuvwxyz" for d in range(10)), message


def test_the_cli_trains_grpo_with_reward_functions_from_the_command_line(sft_dir, prompt_files, tmp_path):
    import json

    from workbench.__main__ import main

    out = tmp_path / "metrics.json"
    argv = [
        "train",
        f"data.source={prompt_files[0]}",
        f"model.pretrained_path={sft_dir}",
        "train.objective=grpo",
        "train.device_type=cpu",
        "train.steps=1",
        "train.batch_size=2",
        "grpo.num_generations=2",
        "grpo.max_completion_length=2",
        "grpo.reward_funcs=tests.grpo_data:digit_reward,format",
        "data.max_length=16",
        "model.max_position_embeddings=64",
        "data.eval_fraction=0",
        "bucketing.max_buckets=1",
        "lora.rank=2",
        "--metrics-out",
        str(out),
    ]
    assert main(argv) == 0
    history = json.loads(out.read_text())["history"]
    assert set(history[-1]["rewards"]) == {"digit_reward", "format"}
    assert os.path.isfile(out)
