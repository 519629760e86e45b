"""The GRPO loss, its advantages and the reference-free preference losses against TRL's own code.

TRL's functions run unbound on small stand-ins for their trainers (only the attributes they read),
on the same log-probs, old log-probs, reference log-probs, advantages and masks as the workbench's.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.test_preference import PROMPTS, pair_batch
from tests.tiny import tiny
from workbench.config import LoraConfig, WorkbenchConfig
from workbench.config_grpo import GRPOConfig
from workbench.models.build import build_model
from workbench.objectives.dpo import (
    DPOObjective,
    DPOSettings,
    answer_tokens,
    orpo_odds_ratio,
    preference_losses,
    prepare_reference,
    simpo_losses,
)
from workbench.rl.advantages import group_advantages
from workbench.rl.loss import GRPOObjective, completion_logps, grpo_loss_sums, grpo_token_terms
from workbench.train.lora import apply_lora

ROWS, LENGTH, MAX_COMPLETION = 6, 7, 9


def rollout_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """Log-probs of a policy that moved since the rollout (μ > 1), a reference, advantages of both
    signs, and completions of different lengths (one empty) in float64."""
    gen = torch.Generator().manual_seed(seed)
    logps = -torch.rand(ROWS, LENGTH, generator=gen, dtype=torch.float64) * 3
    old = (
        logps + torch.randn(ROWS, LENGTH, generator=gen, dtype=torch.float64) * 0.4
    )  # ratios beyond the clip
    ref = logps + torch.randn(ROWS, LENGTH, generator=gen, dtype=torch.float64) * 0.3
    advantages = torch.randn(ROWS, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([7, 3, 5, 0, 1, 6])
    mask = (torch.arange(LENGTH)[None, :] < lengths[:, None]).to(torch.float64)
    return {"logps": logps, "old": old, "ref": ref, "advantages": advantages, "mask": mask}


def trl_grpo_loss(
    t: dict[str, torch.Tensor], logps: torch.Tensor, *, loss_type, beta, epsilon, epsilon_high, level="token"
):
    """TRL's ``GRPOTrainer._compute_loss`` on `logps` (its model's log-probs replaced by them), with
    one process, no accumulation and every optional feature off; returns (loss, its logged metrics)."""
    from trl import GRPOTrainer

    metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logps, torch.zeros_like(logps), None),
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        loss_type=loss_type,
        epsilon_low=epsilon,
        epsilon_high=epsilon_high,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_COMPLETION,
        accelerator=SimpleNamespace(num_processes=1, reduce=lambda x, reduction: x, gather=lambda x: x),
        _entropy_bonus_enabled=False,
        _metrics=metrics,
    )
    inputs = {
        "prompt_ids": torch.ones(ROWS, 2, dtype=torch.long),
        "prompt_mask": torch.ones(ROWS, 2, dtype=torch.long),
        "completion_ids": torch.ones(ROWS, LENGTH, dtype=torch.long),
        "completion_mask": t["mask"],
        "advantages": t["advantages"],
        "old_per_token_logps": t["old"],
        "ref_per_token_logps": t["ref"],
        "num_items_in_batch": t["mask"].sum(),
    }
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    return loss, {k: v[-1] for k, v in metrics["train"].items()}


@pytest.mark.parametrize("level", ["token", "sequence"])  # sequence: GSPO
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize(("beta", "epsilon_high"), [(0.0, 0.2), (0.04, 0.28)])
def test_the_loss_and_its_gradient_equal_trls(loss_type, beta, epsilon_high, level):
    pytest.importorskip("trl")
    t = rollout_tensors()
    if level == "sequence":  # a policy moved per completion, so some sequence ratios pass the clip too
        t["old"] = t["old"] + torch.tensor([-0.3, 0.5, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)[:, None]
    theirs_logps = t["logps"].clone().requires_grad_(True)
    theirs, logged = trl_grpo_loss(
        t, theirs_logps, loss_type=loss_type, beta=beta, epsilon=0.2, epsilon_high=epsilon_high, level=level
    )
    theirs.backward()

    ours_logps = t["logps"].clone().requires_grad_(True)
    terms = grpo_token_terms(
        ours_logps,
        t["old"],
        t["ref"] if beta else None,
        t["advantages"],
        t["mask"],
        epsilon_low=0.2,
        epsilon_high=epsilon_high,
        beta=beta,
        importance_sampling_level=level,
    )
    loss_sum, count = grpo_loss_sums(terms["per_token_loss"], t["mask"], loss_type, MAX_COMPLETION)
    ours = loss_sum / count
    ours.backward()

    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), abs=1e-6)
    assert torch.allclose(ours_logps.grad, theirs_logps.grad, atol=1e-6, rtol=0)
    assert ours_logps.grad.abs().sum() > 0
    mask = t["mask"]
    if level == "sequence":  # one ratio per completion: TRL's mean over completions
        assert terms["is_clipped"].shape == (ROWS, 1)
        clipped = float(terms["is_clipped"].double().mean())
    else:
        clipped = float((terms["is_clipped"].double() * mask).sum() / mask.sum())
    assert clipped == pytest.approx(logged["clip_ratio/region_mean"], abs=1e-6)
    assert 0 < clipped < 1  # the test's ratios reach past the clip on both sides
    if beta:
        kl = float((terms["per_token_kl"].detach() * mask).sum() / mask.sum())
        assert kl == pytest.approx(logged["kl"], abs=1e-6) and kl > 0
    else:
        assert terms["per_token_kl"] is None and "kl" not in logged


def test_at_mu_1_the_ratio_is_1_and_the_gradient_is_the_advantage_weighted_log_prob():
    t = rollout_tensors(seed=1)
    logps = t["logps"].clone().requires_grad_(True)
    terms = grpo_token_terms(
        logps, logps.detach(), None, t["advantages"], t["mask"], epsilon_low=0.2, epsilon_high=0.2, beta=0.0
    )
    loss_sum, count = grpo_loss_sums(terms["per_token_loss"], t["mask"], "dapo", MAX_COMPLETION)
    (loss_sum / count).backward()
    expected = -t["advantages"][:, None] * t["mask"] / t["mask"].sum()
    assert torch.allclose(logps.grad, expected, atol=1e-12)
    assert not terms["is_clipped"].any()


def test_micro_batches_sum_to_the_whole_batch():
    t = rollout_tensors(seed=2)
    terms = grpo_token_terms(
        t["logps"],
        t["old"],
        t["ref"],
        t["advantages"],
        t["mask"],
        epsilon_low=0.2,
        epsilon_high=0.3,
        beta=0.1,
    )
    for loss_type in ("grpo", "dr_grpo", "dapo"):
        whole = grpo_loss_sums(terms["per_token_loss"], t["mask"], loss_type, MAX_COMPLETION)
        halves = [
            grpo_loss_sums(terms["per_token_loss"][s], t["mask"][s], loss_type, MAX_COMPLETION)
            for s in (slice(0, 2), slice(2, None))
        ]
        assert float(sum(h[0] for h in halves) / sum(h[1] for h in halves)) == pytest.approx(
            float(whole[0] / whole[1]), abs=1e-12
        )


def trl_advantages(
    rewards: torch.Tensor, num_generations: int, scale_rewards: str
) -> tuple[torch.Tensor, float]:
    """The lines of TRL's ``_generate_and_score_completions`` ('sum_then_normalize') that turn summed
    rewards into advantages, with TRL's own ``nanstd``."""
    from trl.trainer.utils import nanstd

    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
        std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    else:
        std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    is_std_zero = torch.isclose(std_rewards, torch.zeros_like(std_rewards))
    return torch.nan_to_num(advantages, nan=0.0), float(is_std_zero.float().mean())


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_advantages_equal_trls(scale_rewards):
    pytest.importorskip("trl")
    # four groups of 4: mixed, all equal (no signal), one unscorable completion (NaN), 0/1 rewards
    rewards = [0.5, 1.0, -0.2, 2.0, 1.0, 1.0, 1.0, 1.0, 0.3, float("nan"), 0.9, 0.1, 0.0, 1.0, 1.0, 0.0]
    ours, zero = group_advantages(np.array(rewards), 4, scale_rewards)
    theirs, their_zero = trl_advantages(torch.tensor(rewards, dtype=torch.float32), 4, scale_rewards)
    assert ours.dtype == np.float32 and ours.shape == (16,)
    np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-6, rtol=0)
    assert zero == pytest.approx(their_zero)
    assert ours[9] == 0 and np.all(ours[4:8] == 0)
    if scale_rewards != "batch":
        assert zero == pytest.approx(0.25)  # the all-equal group
    with pytest.raises(ValueError, match=r"groups of grpo\.num_generations=3"):
        group_advantages(np.zeros(16), 3, scale_rewards)


# ---- the objective on a model ----------------------------------------------------------------


def rollout_batch(
    prompt: int = 4, completion: int = 5, rows: int = 4, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Left-padded prompts and completions that end at different places, as a rollout builds them."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 256, (rows, prompt + completion), generator=gen)
    attention = torch.ones_like(ids)
    attention[1, :2] = 0  # a shorter prompt, left-padded
    ends = torch.tensor([5, 2, 4, 1])[:rows]
    completion_mask = (torch.arange(completion)[None, :] < ends[:, None]).float()
    attention[:, prompt:] = completion_mask.long()
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -0.5, 0.25, -0.75])[:rows],
    }


@pytest.fixture(scope="module")
def lora_policy():
    base = build_model(tiny("llama", vocab_size=256), seed=0).float()
    policy = apply_lora(base, LoraConfig(rank=4, alpha=8.0), seed=0)
    with torch.no_grad():  # adapters away from their start: the policy differs from its reference
        gen = torch.Generator().manual_seed(1)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return policy.eval()


def test_the_objective_takes_trls_log_probs_and_its_reference_is_the_adapters_off(lora_policy):
    from trl.trainer.utils import selective_log_softmax

    batch = rollout_batch()
    settings = GRPOConfig(beta=0.05, temperature=0.7, loss_type="grpo", max_completion_length=5)
    objective = GRPOObjective(settings)
    with torch.no_grad():
        logits = lora_policy(**{k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}).logits
        theirs = selective_log_softmax(logits[:, 3:-1], batch["input_ids"][:, 4:], temperature=0.7)
        ours = completion_logps(logits, batch["input_ids"], 5, 0.7)
        with lora_policy.disable_adapter():
            base_logits = lora_policy(
                **{k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
            ).logits
        ref = completion_logps(base_logits, batch["input_ids"], 5, 0.7)
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert torch.allclose(objective.reference_logps(lora_policy, batch), ref, atol=1e-6)
    assert not torch.allclose(ref, ours, atol=1e-3)

    out = objective(lora_policy, batch)
    terms = grpo_token_terms(
        ours,
        ours,
        ref,
        batch["advantages"],
        batch["completion_mask"],
        epsilon_low=0.2,
        epsilon_high=0.2,
        beta=0.05,
    )
    expected, count = grpo_loss_sums(terms["per_token_loss"], batch["completion_mask"], "grpo", 5)
    assert float(out["tokens"]) == 4 == float(count)
    assert float(out["loss_sum"].detach()) == pytest.approx(float(expected), abs=1e-6)
    kl = (terms["per_token_kl"] * batch["completion_mask"]).sum() / batch["completion_mask"].sum()
    assert float(out["stats"]["kl"] / out["tokens"]) == pytest.approx(float(kl), abs=1e-6)
    assert set(out["stats"]) == set(objective.stat_names) == {"clip_ratio", "kl"}
    out["loss_sum"].backward()
    trained = [p for n, p in lora_policy.named_parameters() if p.grad is not None]
    assert trained and all("lora_" in n for n, p in lora_policy.named_parameters() if p.grad is not None)
    lora_policy.zero_grad(set_to_none=True)


def test_old_log_probs_from_the_batch_move_the_ratio(lora_policy):
    batch = rollout_batch(seed=1)
    objective = GRPOObjective(GRPOConfig(num_iterations=2, epsilon_high=0.28))
    with torch.no_grad():
        now = objective.policy_logps(lora_policy, batch)
        same = objective(lora_policy, {**batch, "old_logps": now})
        moved = objective(lora_policy, {**batch, "old_logps": now + 0.5})
    assert float(same["loss_sum"]) == pytest.approx(
        float(objective(lora_policy, batch)["loss_sum"]), abs=1e-6
    )
    assert float(moved["loss_sum"]) != pytest.approx(float(same["loss_sum"]), abs=1e-3)
    assert float(moved["stats"]["clip_ratio"]) > 0 == float(same["stats"]["clip_ratio"])


def test_xla_the_objective_compiles_once_per_shape_and_reads_nothing(xla_scenario):
    result = xla_scenario("grpo_objective", devices=1)
    assert result["compiles"] == [1, 0]  # the second batch of the shape runs the first one's program
    assert result["transfers"] == [0, 0]
    assert result["xla_loss"] == pytest.approx(result["cpu_loss"], abs=1e-5)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_log_probs_in_chunks_of_positions_equal_the_whole_logits(lora_policy, loss_type, level):
    """β > 0 and μ > 1 (old log-probs from the batch): the loss, its stats and every LoRA gradient are
    those of the unchunked objective (the head on every completion position at once) and of the
    logits of the whole rows (today's TRL way), within 1e-5 relative."""
    from workbench.train.objective import LossChunking

    batch = {**rollout_batch(seed=2), "old_logps": torch.full((4, 5), -5.0)}
    settings = GRPOConfig(
        beta=0.05,
        num_iterations=2,
        loss_type=loss_type,
        max_completion_length=5,
        temperature=0.7,
        importance_sampling_level=level,
    )
    runs = {}
    for name, setting in (("whole", 0), ("chunked", 8)):  # 8 tokens / 4 rows: chunks of 2 positions
        notices: list[str] = []
        objective = GRPOObjective(settings, LossChunking(setting), notices.append)
        lora_policy.zero_grad(set_to_none=True)
        out = objective(lora_policy, batch)
        out["loss_sum"].backward()
        grads = {n: p.grad.clone() for n, p in lora_policy.named_parameters() if p.grad is not None}
        runs[name] = (out, grads, notices)
    lora_policy.zero_grad(set_to_none=True)
    (whole, whole_grads, _), (chunked, chunked_grads, notices) = runs["whole"], runs["chunked"]
    assert notices and "chunks of 2 positions" in notices[0]
    loss = float(whole["loss_sum"].detach())
    assert float(chunked["loss_sum"].detach()) == pytest.approx(loss, rel=1e-5)
    for name in ("clip_ratio", "kl"):
        assert float(chunked["stats"][name]) == pytest.approx(float(whole["stats"][name]), rel=1e-5, abs=1e-7)
    assert set(chunked_grads) == set(whole_grads) and all("lora_" in n for n in whole_grads)
    for name, grad in whole_grads.items():
        gap = (chunked_grads[name] - grad).norm() / grad.norm()
        assert gap < 1e-5, (name, float(gap))
    # the whole rows' logits (every position, TRL's `selective_log_softmax` way) give the same log-probs
    with torch.no_grad():
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
        full = completion_logps(lora_policy(**inputs).logits, batch["input_ids"], 5, 0.7)
        ours = GRPOObjective(settings, LossChunking(8)).policy_logps(lora_policy, batch)
    assert torch.allclose(ours, full, atol=1e-6)


def test_beta_without_adapters_is_refused():
    model = build_model(tiny("llama", vocab_size=256), seed=0)
    with pytest.raises(ValueError, match=r"grpo.beta=0.1 .* no adapters: set lora.rank >= 1 or grpo.beta=0"):
        GRPOObjective(GRPOConfig(beta=0.1))(model, rollout_batch())


# ---- reference-free preference losses -------------------------------------------------------------


def preference_logps(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``[pairs, 2]`` summed answer log-probs and answer token counts."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.tensor([[4.0, 6.0], [5.0, 5.0], [6.0, 4.0], [1.0, 3.0]])
    return -torch.rand(4, 2, generator=gen, dtype=torch.float64) * tokens * 2, tokens.double()


def test_simpo_equals_trls_cpo_loss():
    pytest.importorskip("trl")
    from trl.experimental.cpo import CPOTrainer

    summed, tokens = preference_logps()
    average = summed / tokens
    trainer = SimpleNamespace(
        alpha=0.0, loss_type="simpo", simpo_gamma=0.7, beta=2.0, label_smoothing=0.0,
        accelerator=SimpleNamespace(device="cpu"),
    )  # fmt: skip
    losses, chosen_rewards, rejected_rewards = CPOTrainer.cpo_loss(trainer, average[:, 0], average[:, 1])
    settings = DPOSettings(beta=2.0, loss="simpo", simpo_gamma=0.7)
    ours, rewards = preference_losses(summed, None, tokens, settings)
    assert torch.allclose(ours, losses, atol=1e-6, rtol=0)
    assert torch.allclose(simpo_losses(average[:, 0], average[:, 1], 2.0, 0.7), losses, atol=1e-6)
    assert torch.allclose(rewards[:, 0], chosen_rewards) and torch.allclose(rewards[:, 1], rejected_rewards)


def test_orpo_equals_trls_odds_ratio_loss_plus_the_chosen_nll():
    pytest.importorskip("trl")
    from trl.experimental.orpo import ORPOTrainer

    summed, tokens = preference_logps(seed=1)
    average = summed / tokens
    trainer = SimpleNamespace(beta=0.25, accelerator=SimpleNamespace(device="cpu"))
    losses, chosen_rewards, rejected_rewards, _, _ = ORPOTrainer.odds_ratio_loss(
        trainer, average[:, 0], average[:, 1]
    )
    assert torch.allclose(orpo_odds_ratio(average[:, 0], average[:, 1], 0.25), losses.float(), atol=1e-6)
    ours, rewards = preference_losses(summed, None, tokens, DPOSettings(beta=0.25, loss="orpo"))
    # TRL's total: its NLL (a token mean over the batch's chosen answers) minus the mean odds-ratio term
    nll = -summed[:, 0].sum() / tokens[:, 0].sum()
    assert float(ours.mean()) == pytest.approx(float(nll - losses.mean()), abs=1e-6)
    assert torch.allclose(rewards[:, 0], chosen_rewards.double()) and torch.allclose(
        rewards[:, 1], rejected_rewards.double()
    )


@pytest.mark.parametrize("loss", ["simpo", "orpo"])
def test_reference_free_dpo_runs_on_the_tiny_model_without_a_reference(loss):
    model = build_model(tiny("llama"), seed=0).float().eval()
    cfg = WorkbenchConfig().with_overrides({"train.objective": "dpo", "train.dpo_loss": loss, "lora.rank": 0})
    notices: list[str] = []
    reference = prepare_reference(cfg, model, notices.append)  # a full fine-tune: 'auto' would copy
    assert reference.mode == "none" and reference.model is None
    assert notices == [f"DPO reference: none (train.dpo_loss={loss!r} takes no reference model)"]
    settings = DPOSettings(beta=0.5, loss=loss)
    objective = DPOObjective(settings, reference.mode)
    batch = pair_batch()
    out = objective(model, batch)
    summed = objective.logps(model, batch).view(-1, 2)
    expected, _ = preference_losses(summed, None, answer_tokens(batch["labels"]).view(-1, 2), settings)
    assert float(out["tokens"]) == len(PROMPTS)
    assert float(out["loss_sum"]) == pytest.approx(float(expected.sum()), rel=1e-6)
    out["loss_sum"].backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match="takes no reference"):
        DPOObjective(settings, "adapters_off")
