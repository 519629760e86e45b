"""The objective seam: objectives registered by name, an objective of one's own trained end to end (the
docs' example, docs/how-to/examples/length_normalised.py), and the settings of an objective a run does not
train named, never silently ignored."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO
from workbench import objective_registry as registry
from workbench.config import ConfigError, WorkbenchConfig
from workbench.objective_registry import idle_settings, objective_for, objective_names

TINY = {
    "model.hidden_size": 32,
    "model.num_layers": 1,
    "model.num_heads": 2,
    "model.num_kv_heads": 1,
    "model.intermediate_size": 64,
    "model.max_position_embeddings": 128,
    "data.tokenizer_vocab_size": 256,
    "data.max_length": 48,
    "data.max_examples": 24,
    "train.batch_size": 4,
    "train.steps": 3,
    "train.log_every": 1,
    "train.device_type": "cpu",
    "train.precision": "fp32",
    "train.progress_bar": False,
}


@pytest.fixture(scope="module")
def example():
    """The docs' example objective, imported from its file (it registers itself)."""
    path = REPO / "docs" / "how-to" / "examples" / "length_normalised.py"
    spec = importlib.util.spec_from_file_location("length_normalised", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    registry._REGISTRY.pop(module.LengthNormalised.name)  # the other test files' processes see the built-ins


def test_the_built_in_objectives_are_registered_in_order_and_a_bad_name_lists_them():
    assert objective_names()[:3] == ("sft", "dpo", "grpo")
    with pytest.raises(ConfigError, match=r"train\.objective.*'spft'.*one of sft, dpo, grpo"):
        WorkbenchConfig().with_overrides({"train.objective": "spft"})


def test_an_objective_of_ones_own_trains_with_nothing_else_changed(example, tmp_path):
    from workbench.analysis.estimate import config_settings, estimate
    from workbench.data.records import build_datasets
    from workbench.train import Trainer

    cfg = WorkbenchConfig().with_overrides({**TINY, "train.objective": "sft_length_normalised"})
    assert "sft_length_normalised" in objective_names() and objective_for(cfg).summary
    # the estimate prices it as the next-token loss's rows: it has no memory term of its own
    sft = cfg.with_overrides({"train.objective": "sft"})
    assert estimate(cfg.model, batch_size=4, seq_len=48, **config_settings(cfg)).total_bytes == (
        estimate(sft.model, batch_size=4, seq_len=48, **config_settings(sft)).total_bytes
    )
    train, held_out, tokenizer = build_datasets(cfg, cache_dir=tmp_path)
    trainer = Trainer(cfg, tokenizer=tokenizer, train_dataset=train, eval_dataset=held_out)
    assert isinstance(trainer.objective_run, example.LengthNormalisedRun)
    loader, _ = trainer.data.loader(train, 4)
    batch = next(iter(loader))  # on the CPU a host batch is the step's
    out = trainer.objective(trainer.model, batch)
    # each row's own mean, then the rows': what plain SFT's token mean is not
    logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"][:, 1:]
    per_row = [
        torch.nn.functional.cross_entropy(logits[r, :-1][labels[r] != -100], labels[r][labels[r] != -100])
        for r in range(labels.shape[0])
        if (labels[r] != -100).any()
    ]
    expected = float(torch.stack(per_row).mean())
    assert float(out["loss_sum"] / out["tokens"]) == pytest.approx(expected, rel=1e-5)
    result = trainer.fit()
    losses = [m["loss"] for m in result.history]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


def test_another_objectives_settings_are_named_once_each():
    cfg = WorkbenchConfig().with_overrides(
        {
            "grpo.beta": 0.2,
            "grpo.reward_funcs": ["format"],
            "train.dpo_loss": "simpo",
            "train.distill_alpha": 0.9,
        }
    )
    notices = idle_settings(cfg)
    assert len(notices) == 4, notices
    assert any(n.startswith("grpo.beta=0.2 is read by train.objective=grpo;") for n in notices)
    assert any(n.startswith("grpo.reward_funcs=['format'] is read by train.objective=grpo;") for n in notices)
    assert any(n.startswith("train.dpo_loss='simpo' is read by train.objective=dpo;") for n in notices)
    assert any("train.distill_alpha=0.9 is read by distillation" in n and "no teacher" in n for n in notices)
    assert idle_settings(cfg, teacher=torch.nn.Linear(1, 1))[-1:] != notices[-1:]  # a teacher reads distill_*
    # within an objective: a setting its chosen loss does not read
    dpo = WorkbenchConfig().with_overrides(
        {
            "train.objective": "dpo",
            "train.simpo_gamma": 0.8,
            "train.dpo_reference": "copy",
            "train.dpo_loss": "orpo",
        }
    )
    assert sorted(idle_settings(dpo)) == [
        "train.dpo_reference='copy': train.dpo_loss='orpo' takes no reference; it is ignored",
        "train.simpo_gamma=0.8: only train.dpo_loss='simpo' reads it, not 'orpo'; it is ignored",
    ]
    assert idle_settings(WorkbenchConfig()) == []


def test_the_command_line_names_a_setting_of_an_objective_the_run_does_not_train(tmp_path):
    """The issue's case: ``train.dpo_loss=simpo`` without ``train.objective=dpo`` trained plain SFT with no
    word; ``grpo.*`` keys under SFT were ignored."""
    args = [f"{k}={v}" for k, v in TINY.items() if k != "train.steps"]
    done = subprocess.run(
        [sys.executable, "-m", "workbench", "train", *args, "train.steps=1", "train.dpo_loss=simpo",
         "grpo.reward_funcs=format", "--metrics-out", str(tmp_path / "m.json")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if "it is ignored" in line]
    assert len([x for x in lines if "train.dpo_loss='simpo' is read by train.objective=dpo" in x]) == 1, lines
    assert len([x for x in lines if "grpo.reward_funcs=['format'] is read by train.objective=grpo" in x]) == 1
