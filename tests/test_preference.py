"""The DPO objective on plain CPU: its loss against the formula and TRL, its references, its metrics."""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from tests.tiny import tiny
from workbench.analysis.estimate import config_settings, estimate
from workbench.analysis.preference_memory import PairRows
from workbench.config import LoraConfig, WorkbenchConfig
from workbench.data.chat import IGNORE_INDEX
from workbench.models.build import build_model
from workbench.objectives.dpo import (
    DPOObjective,
    DPOSettings,
    adapters_at_start,
    resolve_reference,
    row_logps,
)
from workbench.objectives.preference import reference_mode
from workbench.train.lora import apply_lora

PROMPTS = [3, 5, 2]
"""Prompt tokens of each pair (chosen and rejected share them), so the answers start at different places."""


def pair_batch(seed: int = 0, length: int = 12) -> dict[str, torch.Tensor]:
    """Three pairs interleaved (chosen, rejected, ...), answers of different lengths, right padding."""
    gen = torch.Generator().manual_seed(seed)
    rows = 2 * len(PROMPTS)
    ids = torch.randint(1, 512, (rows, length), generator=gen)
    labels = ids.clone()
    mask = torch.ones_like(ids)
    for pair, prompt in enumerate(PROMPTS):
        ids[2 * pair + 1, :prompt] = ids[2 * pair, :prompt]  # the same prompt
        for row, answer in ((2 * pair, 4 + pair), (2 * pair + 1, 6 - pair)):
            labels[row, :prompt] = IGNORE_INDEX
            end = prompt + answer
            labels[row, end:] = IGNORE_INDEX
            mask[row, end:] = 0
            ids[row, end:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.fixture(scope="module")
def policy_and_base():
    """A tiny Llama with LoRA adapters moved away from their start (so the policy differs from the
    reference), and an untouched copy of its base taken before LoRA: an independent reference."""
    base = build_model(tiny("llama"), seed=0).float().eval()
    reference = copy.deepcopy(base)
    policy = apply_lora(base, LoraConfig(rank=4, alpha=8.0), seed=0)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    policy.eval()
    return policy, reference


def logp_by_hand(model: torch.nn.Module, batch: dict[str, torch.Tensor], row: int) -> float:
    """Σ log p(answer token | what precedes it) of one row, run alone, token by token, in float64."""
    ids, labels, mask = (batch[k][row : row + 1] for k in ("input_ids", "labels", "attention_mask"))
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[0].double()
    total = 0.0
    for t in range(1, ids.shape[1]):
        if labels[0, t] != IGNORE_INDEX:
            total += float(torch.log_softmax(logits[t - 1], dim=-1)[labels[0, t]])
    return total


def answer_length(batch: dict[str, torch.Tensor], row: int) -> int:
    return int((batch["labels"][row, 1:] != IGNORE_INDEX).sum())


def formula(pc: float, pr: float, rc: float, rr: float, beta: float, loss: str, nc: int, nr: int) -> float:
    """The DPO paper's loss (sigmoid) and IPO's (log-probs averaged over the answer), in Python floats."""
    if loss == "sigmoid":
        z = beta * ((pc - rc) - (pr - rr))
        return math.log1p(math.exp(-z))
    h = (pc - rc) / nc - (pr - rr) / nr
    return (h - 1 / (2 * beta)) ** 2


@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_dpo_loss_equals_the_formula_on_independently_computed_log_probs(policy_and_base, loss):
    policy, reference = policy_and_base
    batch = pair_batch()
    settings = DPOSettings(beta=0.1, loss=loss)
    out = DPOObjective(settings, "adapters_off", chunking=None)(policy, batch)
    expected = []
    for pair in range(len(PROMPTS)):
        c, r = 2 * pair, 2 * pair + 1
        pc, pr = logp_by_hand(policy, batch, c), logp_by_hand(policy, batch, r)
        rc, rr = logp_by_hand(reference, batch, c), logp_by_hand(reference, batch, r)
        assert pc != pytest.approx(rc, abs=1e-3)  # the policy really differs from its reference
        nc, nr = answer_length(batch, c), answer_length(batch, r)
        expected.append(formula(pc, pr, rc, rr, 0.1, loss, nc, nr))
    assert float(out["tokens"]) == len(PROMPTS)
    mean = float(out["loss_sum"].detach()) / float(out["tokens"])
    assert mean == pytest.approx(sum(expected) / len(expected), rel=1e-6)  # fp32 logits: relative


def _trl_loss(
    trl_dpo, logps: torch.Tensor, ref: torch.Tensor, completion: torch.Tensor, loss: str, beta: float
):
    """TRL's own ``DPOTrainer._compute_loss`` on given per-row log-probs: [chosen..., rejected...] rows,
    its model replaced by one returning per-token log-probs whose sums are `logps` (its fused head's
    output), its reference precomputed as `ref`. Returns (loss, TRL's logged metrics)."""
    rows, length = completion.shape
    per_token = torch.zeros(rows, length - 1, dtype=torch.float64)
    per_token[:, 0] = logps  # any split over the positions: TRL sums them
    outputs = SimpleNamespace(
        log_probs=per_token,
        entropy=torch.zeros(rows, length - 1),
        mean_logits=torch.zeros(rows, length - 1),
        is_top1=torch.zeros(rows, length - 1, dtype=torch.bool),
    )
    accelerator = SimpleNamespace(device="cpu", gather=lambda t: t, gather_for_metrics=lambda t: t)
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True),
        accelerator=accelerator,
        aux_loss_enabled=False,
        use_weighting=False,
        label_smoothing=0.0,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=[loss],
        loss_weights=[1.0],
        beta=beta,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
    )
    pairs = rows // 2
    inputs = {
        "input_ids": torch.ones(rows, length, dtype=torch.long),
        "attention_mask": torch.ones(rows, length, dtype=torch.long),
        "completion_mask": completion,
        "ref_chosen_logps": ref[:pairs],
        "ref_rejected_logps": ref[pairs:],
    }
    value = trl_dpo._compute_loss(trainer, lambda **_: outputs, inputs, False)
    return float(value), {k: v[-1] for k, v in trainer._metrics["train"].items()}


@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_dpo_loss_and_rewards_equal_trls_on_the_same_log_probs(policy_and_base, loss):
    trl = pytest.importorskip("trl")
    policy, _ = policy_and_base
    batch = pair_batch(seed=3)
    objective = DPOObjective(DPOSettings(beta=0.2, loss=loss), "adapters_off", chunking=None)
    out = objective(policy, batch)
    with torch.no_grad():
        logps = objective.logps(policy, batch).double()
        ref = objective.reference_logps(policy, batch).double()
    order = [*range(0, logps.numel(), 2), *range(1, logps.numel(), 2)]  # interleaved -> TRL's halves
    completion = (batch["labels"] != IGNORE_INDEX).long()[order]
    value, logged = _trl_loss(trl.DPOTrainer, logps[order], ref[order], completion, loss, 0.2)
    pairs = float(out["tokens"])
    assert float(out["loss_sum"].detach()) / pairs == pytest.approx(value, rel=1e-6)
    stats = {k: float(v) / pairs for k, v in out["stats"].items()}
    assert stats["reward_accuracy"] == pytest.approx(logged["rewards/accuracies"], abs=1e-6)
    assert stats["reward_margin"] == pytest.approx(logged["rewards/margins"], abs=1e-6)
    assert stats["chosen_logp"] == pytest.approx(logged["logps/chosen"], abs=1e-5)
    assert stats["rejected_logp"] == pytest.approx(logged["logps/rejected"], abs=1e-5)


def test_row_log_probs_equal_each_row_run_alone(policy_and_base):
    policy, _ = policy_and_base
    batch = pair_batch(seed=5)
    with torch.no_grad():
        sums = row_logps(
            policy(**{k: batch[k] for k in ("input_ids", "attention_mask")}).logits, batch["labels"]
        )
    by_hand = [logp_by_hand(policy, batch, row) for row in range(sums.numel())]
    assert sums.tolist() == pytest.approx(by_hand, abs=1e-4)


def test_references_agree_adapters_off_copy_and_precomputed(policy_and_base):
    policy, base = policy_and_base
    batch = pair_batch(seed=7)
    settings = DPOSettings()
    off = DPOObjective(settings, "adapters_off")(policy, batch)
    copied = DPOObjective(settings, "copy", reference_model=base)(policy, batch)
    with torch.no_grad():
        ref = DPOObjective(settings, "adapters_off").reference_logps(policy, batch)
    pre = DPOObjective(settings, "precompute")(policy, {**batch, "reference_logps": ref})
    for out in (copied, pre):
        assert float(out["loss_sum"]) == pytest.approx(float(off["loss_sum"]), abs=1e-5)
        for name, value in out["stats"].items():
            assert float(value) == pytest.approx(float(off["stats"][name]), abs=1e-4)
    with pytest.raises(ValueError, match="no reference_logps"):
        DPOObjective(settings, "precompute")(policy, batch)


def test_filler_pairs_count_nowhere(policy_and_base):
    policy, _ = policy_and_base
    batch = pair_batch(seed=9)
    filled = {k: v.clone() for k, v in batch.items()}
    filled["labels"][4:] = IGNORE_INDEX  # the third pair is an eval's filler: no labels on either row
    objective = DPOObjective(DPOSettings(), "adapters_off")
    whole, with_filler = objective(policy, batch), objective(policy, filled)
    assert float(with_filler["tokens"]) == 2
    first_two = DPOObjective(DPOSettings(), "adapters_off")(policy, {k: v[:4] for k, v in batch.items()})
    assert float(with_filler["loss_sum"]) == pytest.approx(float(first_two["loss_sum"]), abs=1e-6)
    assert float(whole["tokens"]) == 3


def test_the_loss_trains_only_the_adapters_and_prefers_the_chosen_answers(policy_and_base):
    policy, _ = policy_and_base
    policy = copy.deepcopy(policy).train()
    batch = pair_batch(seed=11)
    objective = DPOObjective(DPOSettings(beta=0.5), "adapters_off")
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    first = None
    for _ in range(15):
        out = objective(policy, batch)
        (out["loss_sum"] / out["tokens"]).backward()
        optimizer.step()
        optimizer.zero_grad()
        first = first if first is not None else float(out["loss_sum"].detach())
    assert all("lora_" in n for n, p in policy.named_parameters() if p.requires_grad)
    assert float(out["loss_sum"].detach()) < first
    assert float(out["stats"]["reward_accuracy"]) == 3  # every pair's chosen reward above its rejected


def test_auto_reference_follows_the_adapters():
    cfg = WorkbenchConfig().with_overrides({"train.objective": "dpo", "lora.rank": 4})
    fresh = apply_lora(build_model(tiny("llama"), seed=0), LoraConfig(rank=4), seed=0)
    assert adapters_at_start(fresh)
    assert resolve_reference(cfg, fresh)[0] == "adapters_off"
    trained = copy.deepcopy(fresh)
    with torch.no_grad():
        next(p for n, p in trained.named_parameters() if "lora_B" in n).fill_(0.1)
    mode, why = resolve_reference(cfg, trained)
    assert mode == "precompute" and "continues trained adapters" in why
    forced = cfg.with_overrides({"train.dpo_reference": "adapters_off"})
    with pytest.raises(ValueError, match="base model the reference"):
        resolve_reference(forced, trained)
    full = WorkbenchConfig().with_overrides({"train.objective": "dpo"})
    assert resolve_reference(full, build_model(tiny("llama"), seed=0))[0] == "copy"


def test_config_refuses_what_dpo_cannot_do():
    from workbench.config import ConfigError

    with pytest.raises(ConfigError, match=r"adapters_off.*needs LoRA"):
        WorkbenchConfig().with_overrides({"train.objective": "dpo", "train.dpo_reference": "adapters_off"})
    with pytest.raises(ConfigError, match=r"bucketing\.packing"):
        WorkbenchConfig().with_overrides({"train.objective": "dpo", "bucketing.packing": True})
    with pytest.raises(ConfigError, match=r"data\.pair_by"):
        WorkbenchConfig().with_overrides({"data.pair_by": "helpfulness"})
    with pytest.raises(ConfigError, match="dpo_beta"):
        WorkbenchConfig().with_overrides({"train.objective": "dpo", "train.dpo_beta": 0})


def test_the_estimate_counts_two_rows_a_pair_and_the_frozen_copy():
    model = tiny("llama", num_layers=4)
    kwargs = dict(seq_len=64, precision="bf16-mixed", loss_chunk_tokens=0)
    sft = estimate(model, batch_size=4, **kwargs)
    pairs = estimate(model, batch_size=2, objective=PairRows("adapters_off"), **kwargs)
    for part in ("activations", "logits", "inputs"):
        assert pairs.breakdown[part] == sft.breakdown[part]
    assert pairs.breakdown["reference"] == 0
    copied = estimate(model, batch_size=2, objective=PairRows("copy"), **kwargs)
    assert copied.breakdown["reference"] == pytest.approx(
        sft.num_parameters * 4, rel=1e-6
    )  # fp32 master weights
    assert copied.total_bytes - pairs.total_bytes == copied.breakdown["reference"]
    cfg = WorkbenchConfig().with_overrides({"train.objective": "dpo"})
    assert reference_mode(cfg) == "copy" and config_settings(cfg)["objective"] == PairRows("copy")
    assert reference_mode(cfg.with_overrides({"lora.rank": 8})) == "adapters_off"
    assert config_settings(WorkbenchConfig())["objective"].rows_per_example == 1  # SFT: a row an example
    with pytest.raises(ValueError, match="reference='both'"):
        PairRows("both")


# ---- on 8 XLA:CPU devices ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def xla_runs(xla_scenario):
    """tests/xla/preference_training.py: LoRA DPO on data x fsdp x model until the held-out pairs are
    measured, then short runs with a precomputed reference and with a frozen copy."""
    return xla_scenario("preference_training", steps=30)


@pytest.mark.xla
@pytest.mark.slow
def test_xla_lora_dpo_learns_the_rule_on_held_out_pairs(xla_runs):
    run = xla_runs["adapters_off"]
    assert run["eval_stats"]["reward_accuracy"] >= 0.9, run
    assert run["eval_reward_accuracy"][-1] == run["eval_stats"]["reward_accuracy"]
    assert run["eval_perplexity"] is None  # a DPO loss has no perplexity
    assert run["losses"][-1] < run["losses"][0] < math.log(2) + 1e-3  # starts at log 2: policy = reference
    assert run["reward_margin"][-1] > run["reward_margin"][0] > 0
    assert run["chosen_logp"][-1] > run["rejected_logp"][-1]
    assert run["reference"] == [
        "DPO reference: adapters_off (fresh LoRA adapters: the reference is the same weights with the adapters off)"
    ]


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["adapters_off", "adapters_off_short", "precompute", "chunked", "copy"])
def test_xla_dpo_compiles_nothing_after_warmup_and_reads_only_at_log_steps(xla_runs, mode):
    run = xla_runs[mode]
    assert run["compiles_after_warmup"] == 0, run
    assert not any(run["recompiled"]), run
    # the loop's own reads: none between log steps; the eval's one read in its interval
    assert all(t == 0 for t in run["transfers"][:-1]) and run["transfers"][-1] <= 1, run["transfers"]
    assert all(v is not None for v in run["reward_accuracy"]), run


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["adapters_off_short", "precompute", "chunked", "copy"])
def test_xla_every_reference_starts_at_the_policy_itself(xla_runs, mode):
    run = xla_runs[mode]
    assert run["losses"][0] == pytest.approx(math.log(2), abs=1e-5)  # step 1: policy = reference
    assert run["reward_accuracy"][0] == 0.0 and run["reward_margin"][0] == pytest.approx(0.0, abs=1e-6)
    assert run["losses"][-1] < run["losses"][0]


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["precompute", "chunked"])
def test_xla_a_precomputed_reference_and_a_chunked_loss_train_as_the_plain_run(xla_runs, mode):
    plain, run = xla_runs["adapters_off_short"], xla_runs[mode]
    assert run["losses"] == pytest.approx(plain["losses"], rel=1e-5)
    assert run["reward_margin"] == pytest.approx(plain["reward_margin"], rel=1e-4, abs=1e-6)
    assert run["eval_stats"] == pytest.approx(plain["eval_stats"], rel=1e-4, abs=1e-6)


@pytest.mark.xla
@pytest.mark.slow
def test_xla_precomputed_and_copied_references_are_the_ones_asked_for(xla_runs):
    assert "precompute" in xla_runs["precompute"]["reference"][0]
    assert any("computed for every pair" in n for n in xla_runs["precompute"]["reference"])
    assert xla_runs["copy"]["reference"][0].startswith("DPO reference: copy (a full fine-tune")


@pytest.fixture(scope="module")
def pair_data(tmp_path_factory):
    """Tokenised learnable pairs (train) and held-out ones, and their tokenizer."""
    from tests.preference_data import learnable_pairs, write_jsonl
    from workbench.data.records import build_datasets

    work = tmp_path_factory.mktemp("pairs")
    train_file = write_jsonl(learnable_pairs(48, seed=0), work / "train.jsonl")
    held_file = write_jsonl(learnable_pairs(16, seed=1, held_out=True), work / "held.jsonl")
    cfg = WorkbenchConfig().with_overrides({"train.objective": "dpo", "data.source": str(train_file)})
    cfg = cfg.with_overrides({"data.eval_fraction": 0})
    train, _, tokenizer = build_datasets(cfg, cache_dir=work)
    held, _, _ = build_datasets(cfg.with_overrides({"data.source": str(held_file)}), tokenizer=tokenizer)
    return train, held, tokenizer


def dpo_cfg(**overrides):
    from tests.test_train import tiny_cfg

    base = {
        "model.vocab_size": 512,
        "train.objective": "dpo",
        "data.max_length": 48,
        "lora.rank": 4,
        "train.learning_rate": 3e-3,
        "train.steps": 8,
        "train.grad_accum": 2,
        "train.batch_size": 2,
    }
    return tiny_cfg(**{**base, **overrides})


@pytest.mark.parametrize("reference", ["adapters_off", "precompute", "copy"])
def test_a_dpo_run_resumes_bitwise_with_each_reference(tmp_path, pair_data, reference):
    from workbench.train import Trainer

    train, held, tokenizer = pair_data
    common = {"train.dpo_reference": reference, **({"lora.rank": 0} if reference == "copy" else {})}
    data = dict(train_dataset=train, eval_dataset=held, tokenizer=tokenizer)
    straight = Trainer(dpo_cfg(**common), **data).fit()
    history = straight.history

    class Crash(RuntimeError):
        pass

    def crash_after_step_5(metrics: dict) -> None:
        if metrics["step"] == 5:
            raise Crash

    cfg = dpo_cfg(**common, **{"train.checkpoint_dir": str(tmp_path), "train.checkpoint_every": 4})
    with pytest.raises(Crash):
        Trainer(cfg, callbacks=[crash_after_step_5], **data).fit()
    resumed = Trainer(cfg, **data).fit()
    assert [m["step"] for m in resumed.history] == [5, 6, 7, 8]
    for key in ("loss", "reward_accuracy", "reward_margin", "chosen_logp", "rejected_logp"):
        assert [m[key] for m in resumed.history] == [m[key] for m in history[4:]], key  # bitwise
    assert history[-1]["loss"] < history[0]["loss"]
    assert f"DPO reference: {reference}" in " ".join(straight.notices)


def test_an_sft_run_refuses_pairs_and_a_dpo_run_refuses_a_teacher(pair_data):
    from workbench.train import Trainer

    train, _, tokenizer = pair_data
    with pytest.raises(ValueError, match=r"rejected answers too: set train\.objective=dpo"):
        Trainer(dpo_cfg(**{"train.objective": "sft"}), train_dataset=train, tokenizer=tokenizer)
    teacher = build_model(tiny("llama", hidden_size=32, intermediate_size=64), seed=1)
    with pytest.raises(ValueError, match="takes no teacher"):
        Trainer(dpo_cfg(), train_dataset=train, tokenizer=tokenizer, teacher=teacher)


def test_the_stream_counts_pairs_so_a_grown_batch_resumes_its_epoch_in_place(pair_data):
    from workbench.train import Trainer

    train, held, tokenizer = pair_data
    trainer = Trainer(dpo_cfg(), train_dataset=train, eval_dataset=held, tokenizer=tokenizer)
    stream = trainer.data.stream(2, epoch=0, skip=0)
    batch, info = stream.next()
    stream.close()
    assert batch["input_ids"].shape[0] == 4 and info.sequences == 2  # two pairs, four rows
    import dataclasses

    trainer.loop.step_done([dataclasses.replace(info, index=i) for i in range(3)])  # six pairs at batch 2
    trainer.loop.resize_batch(3)
    assert trainer.loop.batch_in_epoch == 2  # past six pairs at batch 3, not twelve


def test_an_out_of_memory_split_keeps_pairs_whole(pair_data):
    from workbench.train import Trainer

    train, _, tokenizer = pair_data
    trainer = Trainer(dpo_cfg(), train_dataset=train, tokenizer=tokenizer)
    trainer.loop.split = 2
    rows = {k: v[:6] for k, v in pair_batch().items()}  # three pairs cannot halve
    with pytest.raises(ValueError, match="a batch of 3 pairs into 2 equal micro-batches"):
        trainer.engine.split_batch(rows)
    halves = trainer.engine.split_batch({k: v[:4] for k, v in pair_batch().items()})
    assert [h["input_ids"].shape[0] for h in halves] == [2, 2]


def test_precompute_runs_on_one_host_and_needs_a_dataset(policy_and_base):
    policy, _ = policy_and_base
    cfg = WorkbenchConfig().with_overrides({"train.objective": "dpo", "lora.rank": 4})
    trained = copy.deepcopy(policy)  # its adapters are away from their start
    assert resolve_reference(cfg, trained, hosts=2)[0] == "copy"
    with pytest.raises(ValueError, match="runs on one host; this run has 2"):
        resolve_reference(cfg.with_overrides({"train.dpo_reference": "precompute"}), trained, hosts=2)
    from workbench.objectives.dpo import precompute_reference

    data = SimpleNamespace(cfg=cfg, train_dataset=[{"input_ids": [1, 2]}], eval_dataset=None)
    objective = DPOObjective(DPOSettings(), "precompute")
    with pytest.raises(ValueError, match=r"columns of a datasets\.Dataset; the train dataset is a list"):
        precompute_reference(objective, trained, data, autocast=lambda: None, notice=print)


def test_a_copied_reference_is_the_policy_exactly_under_bf16_mixed(pair_data):
    from workbench.train import Trainer

    train, held, tokenizer = pair_data
    cfg = dpo_cfg(**{"lora.rank": 0, "train.precision": "bf16-mixed", "train.steps": 1})
    trainer = Trainer(cfg, train_dataset=train, eval_dataset=held, tokenizer=tokenizer)
    copied = trainer.objective_run.reference.model
    assert next(copied.parameters()).dtype == next(trainer.model.parameters()).dtype == torch.float32
    first = trainer.fit().history[0]
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6) and first["reward_accuracy"] == 0.0
