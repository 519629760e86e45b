"""Every command takes what the others write: model directories (`workbench.model_dirs`) and the
weights they start from (`workbench.train.start`), on plain CPU with a tiny saved checkpoint.

Each kind — a transformers checkpoint, a LoRA adapter, a training checkpoint (a step directory or the
checkpoint root) — is recognised from its files, loads to the same function the run that wrote it
had (logits compared), and a run started from it continues it: an adapter's weights carried into
the run's LoRA, or merged under ``lora.rank=0``. Also: every eval example counted (a bucket's
remainder filled with label-less rows, not dropped), and the errors that name what to pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from workbench.config import WorkbenchConfig
from workbench.data.chat import IGNORE_INDEX
from workbench.data.collate import FillerMasked
from workbench.data.sampler import BucketBatchSampler
from workbench.data.tokenizer import get_tokenizer
from workbench.model_dirs import ModelDirError, resolve_model_dir, tokenizer_dir
from workbench.models.build import build_model
from workbench.train import Trainer
from workbench.train.lora import base_of
from workbench.train.start import load_for_inference

pytest.importorskip("peft")

SIZES = [
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "data.tokenizer_vocab_size=256",
]


def run_cfg(base: Path, *extra: str) -> WorkbenchConfig:
    """A short CPU run on the shipped chat records, from the saved base."""
    return WorkbenchConfig().with_overrides(
        [
            *SIZES,
            f"model.pretrained_path={base}",
            "data.source=chat-sample",
            "data.max_length=64",
            "data.max_examples=24",
            "train.device_type=cpu",
            "train.steps=2",
            "train.batch_size=4",
            "train.learning_rate=0.05",
            "train.warmup_steps=0",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny llama saved with the workbench's chat tokenizer beside it: what a user downloads."""
    path = tmp_path_factory.mktemp("models") / "base"
    cfg = WorkbenchConfig().with_overrides(SIZES)
    tokenizer = get_tokenizer(cfg.data)
    build_model(cfg.model, vocab_size=len(tokenizer), seed=3).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def lora_run(base, tmp_path_factory) -> dict:
    """A LoRA run with a checkpoint at its last step and its adapter saved."""
    out = tmp_path_factory.mktemp("lora")
    cfg = run_cfg(base, "lora.rank=4", f"train.checkpoint_dir={out / 'ckpt'}", "train.checkpoint_every=2")
    trainer = Trainer(cfg)
    trainer.fit()
    adapter = trainer.save_pretrained(out / "adapter")
    return {"trainer": trainer, "adapter": adapter, "checkpoints": out / "ckpt"}


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.tensor([[5, 17, 33, 8, 91, 40, 2, 77]])


# ---- what a directory is ----------------------------------------------------------------------


def test_each_kind_is_recognised_with_its_chain_of_bases(base, lora_run):
    assert resolve_model_dir(base).kind == "transformers"
    adapter = resolve_model_dir(lora_run["adapter"])
    assert adapter.kind == "adapter" and adapter.lora_rank == 4
    assert adapter.base is not None and adapter.base.path.resolve() == base.resolve()
    step = resolve_model_dir(lora_run["checkpoints"] / "step-00000002")
    assert step.kind == "checkpoint" and step.lora_rank == 4 and step.transformers_root == base
    root = resolve_model_dir(lora_run["checkpoints"])  # the checkpoint_dir: its newest complete step
    assert root.path.name == "step-00000002"
    assert "LoRA adapter" in adapter.describe() and "(step 2), LoRA rank 4" in step.describe()
    # the tokenizer lies beside the adapter (train --save-pretrained writes it) and beside the base
    assert tokenizer_dir(adapter) == lora_run["adapter"] and tokenizer_dir(step) == base


def test_an_adapter_records_its_base_as_an_absolute_directory(lora_run, base):
    recorded = json.loads((lora_run["adapter"] / "workbench_base_model.json").read_text())
    assert recorded["name_or_path"] == str(base.resolve())


def test_directories_that_are_no_model_say_what_they_hold_and_what_is_wanted(tmp_path):
    with pytest.raises(ModelDirError, match="does not exist"):
        resolve_model_dir(tmp_path / "missing", field="--model")
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "step-00000004").mkdir()  # a save that never finished
    with pytest.raises(
        ModelDirError, match=r"holds \['notes.txt', 'step-00000004'\].*incomplete.*config.json"
    ):
        resolve_model_dir(tmp_path, field="--model")


def test_an_adapter_whose_base_is_gone_asks_for_base(lora_run, tmp_path, base):
    moved = tmp_path / "adapter"
    moved.mkdir()
    for file in lora_run["adapter"].iterdir():
        (moved / file.name).write_bytes(file.read_bytes())
    record = json.loads((moved / "workbench_base_model.json").read_text())
    (moved / "workbench_base_model.json").write_text(json.dumps({**record, "name_or_path": "/nowhere/base"}))
    config = json.loads((moved / "adapter_config.json").read_text())
    (moved / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": "/nowhere/base"})
    )
    with pytest.raises(ModelDirError, match=r"'/nowhere/base', which is not a directory here.*--base DIR"):
        resolve_model_dir(moved)
    assert resolve_model_dir(moved, base=base).base.path == base


# ---- the same function, whichever directory it comes from --------------------------------------


def test_adapter_and_checkpoint_load_to_the_trained_model(lora_run):
    trained = logits(lora_run["trainer"].model, IDS)
    for path in (lora_run["adapter"], lora_run["checkpoints"] / "step-00000002", lora_run["checkpoints"]):
        model, tokenizer = load_for_inference(path)
        assert len(tokenizer) == base_of(model).config.vocab_size
        torch.testing.assert_close(logits(model, IDS), trained, rtol=0, atol=1e-5)


def test_a_full_fine_tune_checkpoint_loads_its_weights(base, tmp_path):
    trainer = Trainer(run_cfg(base, f"train.checkpoint_dir={tmp_path}", "train.checkpoint_every=2"))
    trainer.fit()
    model, _ = load_for_inference(tmp_path)
    torch.testing.assert_close(logits(model, IDS), logits(trainer.model, IDS), rtol=0, atol=1e-5)
    assert model.name_or_path == str(tmp_path / "step-00000002")  # an adapter on it records it as its base


# ---- a run that starts from one ---------------------------------------------------------------


def test_a_lora_run_on_an_adapter_continues_its_weights(lora_run, base):
    cfg = run_cfg(base, "lora.rank=4").with_overrides([f"model.pretrained_path={lora_run['adapter']}"])
    trainer = Trainer(cfg)
    torch.testing.assert_close(
        logits(trainer.model, IDS), logits(lora_run["trainer"].model, IDS), rtol=0, atol=1e-5
    )
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)


def test_other_lora_settings_name_only_what_differs(lora_run, base):
    cfg = run_cfg(base, "lora.rank=8").with_overrides([f"model.pretrained_path={lora_run['adapter']}"])
    with pytest.raises(
        ModelDirError, match=r"asks for lora.rank=8\. To continue its adapters pass lora.rank=4;"
    ):
        Trainer(cfg)


def test_a_full_fine_tune_on_an_adapter_trains_the_merged_weights_and_says_so(lora_run, base):
    cfg = run_cfg(base).with_overrides([f"model.pretrained_path={lora_run['adapter']}"])
    with pytest.warns(RuntimeWarning, match="lora.rank=0 trains every weight .* set lora.rank=4 to continue"):
        trainer = Trainer(cfg)
    assert all(p.requires_grad for p in trainer.model.parameters())
    assert not any("lora_" in n for n, _ in trainer.model.named_parameters())
    torch.testing.assert_close(
        logits(trainer.model, IDS), logits(lora_run["trainer"].model, IDS), rtol=0, atol=1e-5
    )


# ---- evaluation counts every example ----------------------------------------------------------


def test_a_fill_last_sampler_batches_every_example_in_full_shapes():
    sampler = BucketBatchSampler([5, 6, 7, 30], [8, 32], batch_size=4, fill_last=True, shuffle=False)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b if i >= 0) == [0, 1, 2, 3]
    assert all(len(b) == 4 for b in batches) and sampler.batch_shapes() == [(4, 8), (4, 32)]
    filled = FillerMasked([{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}])
    assert filled[-1] == {"input_ids": [1, 2, 3], "labels": [IGNORE_INDEX] * 3} and filled[0]["labels"] == [
        1,
        2,
        3,
    ]


def test_eval_of_fewer_examples_than_a_batch_is_their_mean_token_loss(base, tmp_path, capsys):
    from workbench.__main__ import main

    records = [
        json.loads(line)
        for line in Path("workbench/data/assets/chat_sample.jsonl").read_text().splitlines()[:3]
    ]
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["eval", "--model", str(base), "--data", str(data), "--json", "train.device_type=cpu"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["examples"] == 3
    # the same figure by hand: summed next-token loss over the assistant tokens of each record
    from workbench.data.records import load_records, tokenize_records

    cfg = WorkbenchConfig().with_overrides([f"data.source={data}"])
    model, tokenizer = load_for_inference(base)
    total, count = 0.0, 0
    for example in tokenize_records(load_records(cfg.data), tokenizer, cfg.data):
        ids, labels = torch.tensor([example["input_ids"]]), torch.tensor(example["labels"][1:])
        out = logits(model, ids)[0, :-1]
        total += torch.nn.functional.cross_entropy(
            out, labels, ignore_index=IGNORE_INDEX, reduction="sum"
        ).item()
        count += int((labels != IGNORE_INDEX).sum())
    assert report["loss"] == pytest.approx(total / count, rel=1e-5)


def test_a_run_without_a_tokenizer_path_takes_the_one_beside_its_model(lora_run, base):
    from workbench.data.records import build_datasets

    cfg = WorkbenchConfig().with_overrides(
        [
            f"model.pretrained_path={lora_run['adapter']}",
            "data.source=chat-sample",
            "data.tokenizer_vocab_size=1024",
        ]
    )
    _, _, tokenizer = build_datasets(cfg)  # a trained tokenizer would have 1024 tokens
    assert tokenizer.get_vocab() == get_tokenizer(WorkbenchConfig().with_overrides(SIZES).data).get_vocab()
    assert len(tokenizer) == len(
        get_tokenizer(WorkbenchConfig().with_overrides([f"data.tokenizer_path={base}"]).data)
    )
