"""The training loop on plain CPU (in process) and on 8 XLA:CPU devices with FSDP (subprocess)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from workbench.analysis.metrics import GRPO_KEYS, METRIC_KEYS
from workbench.backend.hardware import HardwareError
from workbench.config import WorkbenchConfig
from workbench.train import Trainer

VOCAB = 128


def tiny_cfg(**overrides) -> WorkbenchConfig:
    base = {
        "model.vocab_size": VOCAB,
        "model.hidden_size": 32,
        "model.intermediate_size": 64,
        "model.num_heads": 4,
        "model.num_kv_heads": 2,
        "data.max_length": 32,
        "bucketing.max_buckets": 2,
        "bucketing.multiple_of": 8,
        "train.device_type": "cpu",
        "train.steps": 6,
        "train.batch_size": 4,
        "train.log_every": 1,
        "train.warmup_steps": 2,
        "train.progress_bar": False,
    }
    base.update(overrides)
    return WorkbenchConfig().with_overrides(base)


def token_dataset(n: int, seed: int = 0, lo: int = 6, hi: int = 32):
    """Learnable token sequences (arithmetic progressions mod the vocabulary) of varying length."""
    import datasets

    gen = torch.Generator().manual_seed(seed)
    rows = {"input_ids": [], "labels": [], "length": []}
    for _ in range(n):
        length = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        start, stride = (
            int(torch.randint(1, VOCAB, (1,), generator=gen)),
            int(torch.randint(1, 4, (1,), generator=gen)),
        )
        ids = [(start + i * stride) % (VOCAB - 1) + 1 for i in range(length)]
        rows["input_ids"].append(ids)
        rows["labels"].append(list(ids))
        rows["length"].append(length)
    return datasets.Dataset.from_dict(rows)


def _pad(rows: list[list[int]], length: int) -> dict[str, torch.Tensor]:
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    labels = torch.full((len(rows), length), -100, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, row in enumerate(rows):
        row = list(row)[:length]
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _grads_of_one_step(cfg: WorkbenchConfig, batches: list[dict]) -> list[torch.Tensor]:
    trainer = Trainer(cfg, train_dataset=token_dataset(16))
    trainer.engine.init_state()
    captured: list[torch.Tensor] = []
    real_step = trainer.optimizer.step

    def capture(*args, **kwargs):
        captured.extend(p.grad.detach().clone() for p in trainer.engine.params)
        return real_step(*args, **kwargs)

    trainer.optimizer.step = capture
    trainer.engine.train_step(batches)
    return captured


def test_four_micro_batches_give_the_gradients_of_one_four_times_larger_batch():
    data = token_dataset(8, seed=3)
    rows = data["input_ids"]  # different real lengths: the token-mean normalisation matters
    big = _pad(rows, 32)
    small = [_pad(rows[i : i + 2], 32) for i in range(0, 8, 2)]
    one = _grads_of_one_step(
        tiny_cfg(**{"train.batch_size": 8, "train.grad_accum": 1, "train.max_grad_norm": None}), [big]
    )
    four = _grads_of_one_step(
        tiny_cfg(**{"train.batch_size": 2, "train.grad_accum": 4, "train.max_grad_norm": None}), small
    )
    assert len(one) == len(four) > 0
    for a, b in zip(one, four):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # the naive alternative (mean of per-micro-batch means) is measurably different here
    counts = torch.tensor([float((s["labels"][:, 1:] != -100).sum()) for s in small])
    assert counts.max() != counts.min()


def test_loss_falls_and_metrics_reach_callbacks_every_log_interval():
    seen: list[dict] = []
    cfg = tiny_cfg(**{"train.steps": 8, "train.log_every": 4, "train.learning_rate": 1e-2})
    result = Trainer(
        cfg, train_dataset=token_dataset(64), eval_dataset=token_dataset(16, 9), callbacks=[seen.append]
    ).fit()
    assert [m["step"] for m in seen] == [4, 8] and result.history == seen
    keys = {
        "step",
        "loss",
        "lr",
        "step_time_s",
        "tokens_per_s",
        "mfu",
        "compiles",
        "compile_time_s",
        "total_compiles",
    }
    keys |= {"recompiled", "transfers", "host_rss_bytes", "device_memory_bytes", "device_memory_limit_bytes"}
    keys |= {"tokens_seen", "elapsed_s", "eval_loss"}
    assert keys <= set(seen[0])
    assert set(seen[0]) == set(METRIC_KEYS)  # every contract key, GRPO's None in any other run
    assert all(seen[0][key] is None for key in GRPO_KEYS)
    assert seen[-1]["loss"] < seen[0]["loss"]
    assert seen[-1]["tokens_seen"] > seen[0]["tokens_seen"] > 0
    assert result.tokens_per_s and result.tokens_per_s > 0


def test_resume_from_checkpoint_matches_an_uninterrupted_run_bitwise(tmp_path):
    common = {"train.steps": 8, "train.log_every": 1, "train.grad_accum": 2, "train.batch_size": 2}
    data = token_dataset(24)  # 24 rows / (2 x 2 per step): the run crosses an epoch boundary

    straight = Trainer(tiny_cfg(**common), train_dataset=data).fit()
    losses = [m["loss"] for m in straight.history]

    class Crash(RuntimeError):
        pass

    def crash_after_step_5(metrics: dict) -> None:
        if metrics["step"] == 5:
            raise Crash

    cfg = tiny_cfg(**common, **{"train.checkpoint_dir": str(tmp_path), "train.checkpoint_every": 4})
    with pytest.raises(Crash):
        Trainer(cfg, train_dataset=data, callbacks=[crash_after_step_5]).fit()
    resumed_trainer = Trainer(cfg, train_dataset=data)
    resumed = resumed_trainer.fit()
    assert any("resumed from" in n for n in resumed.notices)
    assert [m["step"] for m in resumed.history] == [5, 6, 7, 8]
    assert [m["loss"] for m in resumed.history] == losses[4:]  # bitwise
    assert resumed.steps == 8 and resumed.checkpoint_path.endswith("step-00000008")


def test_out_of_memory_retries_with_half_the_micro_batch_and_the_same_result():
    data = token_dataset(32)
    reference = Trainer(tiny_cfg(), train_dataset=data).fit()

    trainer = Trainer(tiny_cfg(), train_dataset=data)
    real_forward = trainer.model.forward

    def forward(*args, **kwargs):
        if kwargs["input_ids"].shape[0] > 2:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00G")
        return real_forward(*args, **kwargs)

    trainer.model.forward = forward
    result = trainer.fit()
    assert trainer.loop.split == 2 and trainer.engine.micro_steps == 2
    assert any("out of memory" in n and "same effective batch 4" in n for n in result.notices)
    for a, b in zip(reference.history, result.history):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


def test_dynamic_batch_grows_every_n_steps_up_to_the_cap():
    cfg = tiny_cfg(
        **{
            "train.steps": 7,
            "train.batch_size": 2,
            "train.dynamic_batch_every": 2,
            "train.dynamic_batch_factor": 2.0,
            "train.dynamic_batch_max": 8,
        }
    )
    result = Trainer(cfg, train_dataset=token_dataset(64)).fit()
    sizes = [m["batch_size"] for m in result.history]
    assert sizes == [2, 2, 4, 4, 8, 8, 8]
    assert sum("dynamic batch" in n for n in result.notices) == 2


def test_dynamic_batch_never_grows_past_the_memory_estimate():
    import dataclasses

    from workbench.analysis.batch import max_batch_size
    from workbench.backend.hardware import detect
    from workbench.train.ladder import batch_ladder

    cfg = tiny_cfg(**{"train.steps": 40, "train.batch_size": 2, "train.dynamic_batch_every": 2})
    trainer = Trainer(cfg, train_dataset=token_dataset(16))
    budget = 12 * 1024**2  # a pretend 12 MiB device
    hw = dataclasses.replace(detect("cpu"), memory_per_device_bytes=budget)
    ladder = batch_ladder(trainer.model, cfg, hw, mesh=None, dp_size=1, notice=trainer.notices.append)
    cap = max_batch_size(
        trainer.model.config, seq_len=32, memory_bytes=budget, optimizer="adamw", precision="fp32"
    )
    assert 2 <= cap < 2 * 2**19  # the estimate is what stops growth, not the number of steps
    assert ladder[0] == 2 and ladder[-1] <= cap < ladder[-1] * 2
    assert all(b == a * 2 for a, b in itertools.pairwise(ladder))
    # the estimate has the config's settings (`config_settings`), accumulation's gradient buffer among
    # them: a device that just holds a step of `cap` sequences holds fewer under accumulation
    from workbench.analysis.estimate import estimate
    from workbench.train.ladder import memory_batch_cap

    settings = {"optimizer": "adamw", "precision": "fp32", "memory_bytes": budget}
    exact = math.ceil(
        estimate(trainer.model.config, batch_size=cap, seq_len=32, **settings).total_bytes / 0.9
    )
    caps = [
        memory_batch_cap(
            trainer.model,
            cfg.with_overrides({"train.grad_accum": accum}),
            memory_bytes=exact,
            mesh=None,
            dp_size=1,
            notice=trainer.notices.append,
        )
        for accum in (1, 4)
    ]
    assert caps[0] == cap and 0 < caps[1] < cap, caps


def test_adafactor_bf16_mixed_and_gradient_checkpointing_train_on_cpu():
    cfg = tiny_cfg(
        **{
            "train.optimizer": "adafactor",
            "train.precision": "bf16-mixed",
            "train.gradient_checkpointing": True,
            "train.steps": 6,
            "train.learning_rate": 1e-2,
        }
    )
    trainer = Trainer(cfg, train_dataset=token_dataset(32))
    result = trainer.fit()
    losses = [m["loss"] for m in result.history]
    assert all(loss == loss for loss in losses) and losses[-1] < losses[0]
    assert trainer.model.is_gradient_checkpointing


def test_auto_falls_back_and_says_why(monkeypatch):
    from workbench.backend import hardware
    from workbench.backend.xla import presence

    calls = []
    real_detect = hardware._detect_explicit

    def fake_detect(kind):
        calls.append(kind)
        if kind == "tpu":
            raise HardwareError("TPU runtime failed to initialise: device busy")
        return real_detect("cpu")

    monkeypatch.setattr(presence, "xla_installed", lambda: True)
    monkeypatch.setattr(presence, "tpu_present", lambda: True)
    monkeypatch.setattr(presence, "env_requests_xla", lambda: None)
    monkeypatch.setattr(hardware, "_cuda_available", lambda: False)
    monkeypatch.setattr(hardware, "_detect_explicit", fake_detect)
    hardware.detect.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="tpu is present but could not start"):
            hw = hardware.detect("auto")
    finally:
        hardware.detect.cache_clear()
    assert hw.backend == "cpu" and calls == ["tpu"]
    assert "device busy" in hw.notices[0] and "falling back" in hw.notices[0]


@pytest.fixture(scope="module")
def fsdp_run(xla_scenario, tmp_path_factory):
    """tests/xla/fsdp_bucketed_run.py: a bucketed run under FSDP over 8 devices, accumulation vs
    one large batch, and distillation from a sharded teacher, in one process."""
    return xla_scenario("fsdp_bucketed_run", checkpoint_dir=str(tmp_path_factory.mktemp("fsdp-run")))


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_bucketed_run_compiles_nothing_after_warmup(fsdp_run):
    assert fsdp_run["compiles_after_warmup"] == 0, fsdp_run  # evals at steps 5 and 10 included
    assert not any(fsdp_run["recompiled"])


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_bucketed_run_evaluates_positive_losses(fsdp_run):
    assert all(e is not None and e > 0 for e in fsdp_run["eval_losses"])
    assert fsdp_run["eval_loss"] > 0


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_bucketed_run_loss_falls(fsdp_run):
    assert fsdp_run["losses"][-1] < fsdp_run["losses"][0]


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_bucketed_run_transfers_only_the_logged_values(fsdp_run):
    assert all(t <= 4 for t in fsdp_run["transfers"]), fsdp_run["transfers"]  # only at log steps


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_bucketed_run_shards_the_parameters(fsdp_run):
    assert "devices=" in fsdp_run["spec"]


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_bucketed_run_checkpoints_the_last_step(fsdp_run):
    assert fsdp_run["checkpoint"].endswith("step-00000010")


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_accumulation_gives_the_gradients_of_one_large_batch(fsdp_run):
    assert fsdp_run["worst_rel_grad_diff"] < 1e-4  # 4 x 8 rows vs 1 x 32 rows


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_distillation_trains_without_recompiling(fsdp_run):
    assert all(x == x for x in fsdp_run["distill_losses"]) and fsdp_run["distill_compiles_after_warmup"] == 0


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_distillation_teacher_is_sharded_and_frozen(fsdp_run):
    assert "devices=" in fsdp_run["teacher_spec"] and fsdp_run["teacher_frozen"]


@pytest.fixture(scope="module")
def fsdp_resume(xla_scenario, tmp_path_factory):
    """tests/xla/fsdp_resume.py: FSDP runs straight, without prewarm, and crashed at step 4 then
    resumed from the step-3 sharded checkpoint."""
    return xla_scenario("fsdp_resume", checkpoint_dir=str(tmp_path_factory.mktemp("fsdp-resume")))


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_resume_continues_after_the_last_checkpoint(fsdp_resume):
    assert fsdp_resume["steps"] == [4, 5, 6]
    assert any("resumed from" in n for n in fsdp_resume["notices"])


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_checkpoint_is_sharded_through_dcp(fsdp_resume):
    assert "model.dcp" in fsdp_resume["files"] and "optimizer.dcp" in fsdp_resume["files"]


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_prewarm_does_not_change_training(fsdp_resume):
    assert fsdp_resume["unwarmed"] == fsdp_resume["straight"]


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_resume_from_sharded_checkpoint_matches_uninterrupted_run(fsdp_resume):
    assert fsdp_resume["resumed"] == pytest.approx(fsdp_resume["straight"][3:], rel=1e-6)


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_resumed_run_compiles_nothing_after_warmup(fsdp_resume):
    assert fsdp_resume["compiles_after_warmup"] == 0


@pytest.mark.xla
@pytest.mark.slow
def test_xla_fsdp_checkpoint_saves_are_not_reported_as_recompilation(fsdp_resume):
    assert fsdp_resume["recompiled_steps"] == []


@pytest.fixture(scope="module")
def xla_variants(xla_scenario):
    """tests/xla/trainer_variants.py on one device: adafactor + bf16-mixed; bf16 + gradient
    checkpointing + accumulation."""
    return xla_scenario("trainer_variants", devices=1)


@pytest.mark.xla
@pytest.mark.slow
def test_xla_variants_keep_tied_embeddings_tied(xla_variants):
    for name, r in xla_variants.items():
        assert r["tied"], name


@pytest.mark.xla
@pytest.mark.slow
def test_xla_variants_compile_nothing_after_warmup(xla_variants):
    for name, r in xla_variants.items():
        assert r["after"] == 0, (name, r)


@pytest.mark.xla
@pytest.mark.slow
def test_xla_variants_losses_are_finite(xla_variants):
    for name, r in xla_variants.items():
        assert all(x == x for x in r["losses"]), (name, r)


@pytest.mark.xla
@pytest.mark.slow
def test_xla_variants_transfer_only_the_logged_values(xla_variants):
    for name, r in xla_variants.items():
        assert all(t <= 2 for t in r["transfers"]), (name, r)


@pytest.fixture(scope="module")
def logging_every_step(xla_scenario):
    """tests/xla/logging_every_step.py: 5 steps on one device, logged every step.

    The profiler reads the loss and grad norm itself, outside the transfer count: a loop that
    logs every step must not look like one with a `.item()` in it, and `lr` is the rate applied."""
    return xla_scenario("logging_every_step", devices=1)


@pytest.mark.xla
def test_logging_every_step_reads_loss_and_grad_norm_without_loop_transfers(logging_every_step):
    assert logging_every_step["transfers"] == [0] * 5, logging_every_step


@pytest.mark.xla
def test_logging_every_step_reports_positive_grad_norms(logging_every_step):
    assert all(g is not None and g > 0 for g in logging_every_step["grad_norms"]), logging_every_step


@pytest.mark.xla
def test_logging_every_step_gives_no_host_transfer_advice(logging_every_step):
    assert "host_transfer" not in logging_every_step["advice"], logging_every_step


@pytest.mark.xla
def test_logging_every_step_reports_the_applied_learning_rate(logging_every_step):
    assert logging_every_step["lr"] == pytest.approx(logging_every_step["expected_lr"]), logging_every_step
