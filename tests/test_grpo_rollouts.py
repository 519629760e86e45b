"""GRPO's rollouts at the size people run them: a generation batch apart from the training rows and
decoding that stops once every completion has ended.

- On XLA:CPU (tests/xla/grpo_early_stop.py, 2 devices): after a brief SFT on math-sample the
  rollouts stop at the first block of decode steps where every completion has ended (well under the
  128-token budget), with no compile after warm-up and one flag read per block beside the read of the
  completions.
- On plain CPU: TRL's ``steps_per_generation`` and ``generation_batch_size`` (one rollout for several
  micro-steps, its rows cut into whole groups, served as TRL's buffer serves them; the old log-probs
  kept by TRL's rule) and completions cut to the tokens decoded.
"""

from __future__ import annotations

import math

import pytest


@pytest.fixture(scope="module")
def math_sft(tmp_path_factory) -> str:
    """The default tiny model (64 wide, 2 layers) after 50 steps on math-sample's worked solutions
    (plain CPU): it writes the solution's format and ends it."""
    from workbench.config import WorkbenchConfig
    from workbench.train import Trainer

    cfg = WorkbenchConfig().with_overrides(
        {
            "model.hidden_size": 64,
            "model.num_layers": 2,
            "model.intermediate_size": 128,
            "data.source": "math-sample",
            "data.chat": True,
            "data.max_length": 80,
            "data.eval_fraction": 0,
            "bucketing.max_buckets": 1,
            "train.device_type": "cpu",
            "train.steps": 50,
            "train.batch_size": 16,
            "train.learning_rate": 1e-2,
            "train.log_every": 50,
            "train.progress_bar": False,
        }
    )
    trainer = Trainer(cfg)
    trainer.fit()
    return str(trainer.save_pretrained(tmp_path_factory.mktemp("math-sft") / "model"))


@pytest.mark.xla
@pytest.mark.slow
def test_rollouts_stop_once_every_completion_has_ended(xla_scenario, math_sft):
    run = xla_scenario("grpo_early_stop", devices=2, sft_dir=math_sft)
    budget, block = run["budget"], run["block"]
    assert run["compiles_after_warmup"] == 0, run
    for m in run["history"]:
        assert m["compiles"] == 0 and math.isfinite(m["loss"]), m
        # the completions end early, and the rollout stops within a block of the longest
        assert m["completion_length"] < m["completion_length_max"] < budget, m
        steps = m["rollout_decode_steps"]
        assert steps <= 0.6 * budget and steps % block == 0, m
        assert m["completion_length_max"] <= steps < m["completion_length_max"] + block, m
        # one rollout a step (both micro-steps' prompts): its completions' read and a flag per block
        assert m["transfers"] == m["expected_transfers"] == 1 + steps // block, m


# ---- plain CPU ------------------------------------------------------------------------------------


def _cpu_cfg(**overrides):
    from workbench.config import WorkbenchConfig

    return WorkbenchConfig().with_overrides(
        {
            "model.hidden_size": 32,
            "model.num_layers": 1,
            "model.intermediate_size": 64,
            "data.source": "math-sample",
            "data.max_length": 64,
            "data.eval_fraction": 0,
            "bucketing.max_buckets": 2,
            "train.objective": "grpo",
            "train.device_type": "cpu",
            "train.batch_size": 2,
            "grpo.num_generations": 2,
            "grpo.max_completion_length": 20,
            "train.log_every": 1,
            "train.progress_bar": False,
            "lora.rank": 2,
            **overrides,
        }
    )


def test_one_rollout_serves_the_micro_steps_of_a_generation_as_trls_buffer_does():
    from workbench.train import Trainer

    # 2 micro-steps a step, a rollout for 4: every second step rolls out, and the policy that trains the
    # later micro-batches has moved, so the batches carry the sampler's log-probs (TRL's rule)
    trainer = Trainer(_cpu_cfg(**{"train.steps": 4, "train.grad_accum": 2, "grpo.steps_per_generation": 4}))
    calls, served, widths = [], [], []
    run, next_batch = trainer.data.rollouts.run, trainer.data.stream

    def recorded(hosts, seed, **kwargs):
        batches, figures, tokens = run(hosts, seed, **kwargs)
        calls.append(([h["input_ids"].shape for h in hosts], [b["input_ids"].shape for b in batches]))
        widths.append((figures.decode_steps, [b["completion_mask"].shape[1] for b in batches]))
        return batches, figures, tokens

    def stream(*args, **kwargs):
        s = next_batch(*args, **kwargs)
        take = s.next

        def taken():
            item = take()
            served.append(id(item[0]))
            return item

        s.next = taken
        return s

    trainer.data.rollouts.run, trainer.data.stream = recorded, stream
    result = trainer.fit()
    assert len(calls) == 2, calls  # 8 micro-steps, 4 per rollout
    for hosts, batches in calls:
        assert len(hosts) == 4 and all(h[0] == 2 for h in hosts)  # 4 micro-steps' prompt batches
        assert len(batches) == 4 and all(b[0] == 2 * 2 for b in batches)  # each: its 2 prompts x G rows
    assert len(served) == 8 and len(set(served[:4])) == 4 and set(served[:4]).isdisjoint(served[4:])
    assert trainer.data.rollouts.old_logps
    history = result.history
    assert [m["reward_mean"] is None for m in history] == [False, True, False, True]
    assert all(math.isfinite(m["loss"]) for m in history)
    assert history[0]["rollout_decode_steps"] <= 20 and history[0]["completion_length_max"] <= 20
    # the profiler is told of the rollouts' reads, and their seconds are the step's work, not a wait on input
    assert [m["expected_transfers"] for m in history][1::2] == [0, 0]
    assert all(m["expected_transfers"] > 0 and m["input_wait_s"] < m["rollout_s"] for m in history[::2])
    # eager (nothing compiled per shape): the completion columns are the tokens decoded, not the
    # sampler's cache budget of 32
    assert all(cols == [steps] * 4 and steps <= 20 for steps, cols in widths), widths


def test_the_generation_batch_takes_trls_names_and_checks():
    from workbench.config import ConfigError
    from workbench.config_grpo import keeps_old_logps, steps_per_generation

    base = _cpu_cfg(**{"train.grad_accum": 4})
    assert steps_per_generation(base) == 4 and not keeps_old_logps(base)  # one rollout per step
    by_rows = base.with_overrides({"grpo.generation_batch_size": 2 * 2 * 8})  # completions, as TRL's
    assert steps_per_generation(by_rows) == 8 and keeps_old_logps(by_rows)
    assert not keeps_old_logps(base.with_overrides({"grpo.steps_per_generation": 2}))  # two per step
    assert keeps_old_logps(base.with_overrides({"grpo.steps_per_generation": 2, "grpo.num_iterations": 4}))
    with pytest.raises(
        ConfigError, match=r"grpo\.generation_batch_size=6 is not allowed: must be a multiple of"
    ):
        base.with_overrides({"grpo.generation_batch_size": 6})
    with pytest.raises(ConfigError, match=r"cannot be set with steps_per_generation=2"):
        base.with_overrides({"grpo.generation_batch_size": 8, "grpo.steps_per_generation": 2})


def test_sampling_with_the_adapters_merged_is_the_policy_and_leaves_it_untouched():
    import torch

    from tests.tiny import tiny
    from workbench.config import LoraConfig
    from workbench.models.build import build_model
    from workbench.rl.merged_sampling import merged_linears, merges_for_sampling
    from workbench.train.lora import apply_lora

    policy = apply_lora(
        build_model(tiny("llama", vocab_size=256), seed=0).float(), LoraConfig(rank=4), seed=0
    )
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    ids = torch.randint(3, 256, (3, 9), generator=gen)
    with torch.no_grad():
        adapted = policy(input_ids=ids).logits
        with merged_linears(policy) as swapped:
            merged = policy(input_ids=ids).logits
    assert swapped == 2 * 7  # every projection of both layers
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=1e-5)
    assert all(torch.equal(v, before[k]) for k, v in policy.state_dict().items())  # nothing touched
    assert not any(type(m).__name__ == "MergedLinear" for m in policy.modules())
    # eager, one process, an fp32 base whose merged copy is small: merged; otherwise not
    assert merges_for_sampling(policy, eager=True, processes=1, memory_bytes=None)
    assert not merges_for_sampling(policy, eager=False, processes=1, memory_bytes=None)
    assert not merges_for_sampling(policy, eager=True, processes=2, memory_bytes=None)
    assert not merges_for_sampling(policy, eager=True, processes=1, memory_bytes=1024)
    assert not merges_for_sampling(policy.to(torch.bfloat16), eager=True, processes=1, memory_bytes=None)
