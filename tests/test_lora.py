"""LoRA fine-tuning (workbench.train.lora): targets, clear errors, the Trainer with a frozen base,
adapter-sized checkpoints and bitwise resume, peft adapter and merged exports on plain CPU; and
the same run sharded over data=2 x fsdp=2 x model=2 on 8 XLA:CPU devices against plain CPU
(tests/xla/lora_sharded.py).

Tolerance of the XLA comparison: 1e-4 absolute on losses near 4.9, as tests/test_sharding.py uses
(fp32; sharded matmuls and all-reduces add in another order).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from tests.test_train import VOCAB, tiny_cfg, token_dataset
from workbench.config import LoraConfig, ModelConfig
from workbench.models.build import build_model
from workbench.train import Trainer
from workbench.train.state_io import CheckpointError

peft = pytest.importorskip("peft")

from workbench.train.adapter_files import load_adapter  # noqa: E402  (after the peft check)
from workbench.train.lora import (  # noqa: E402  (after the peft check)
    LoraError,
    apply_lora,
    auto_target_modules,
    parameter_counts,
)

LOSS_TOLERANCE = 1e-4

LORA_RUN = {
    "lora.rank": 4,
    "lora.alpha": 8.0,
    "train.batch_size": 8,
    "train.steps": 6,
    "train.log_every": 1,
    "train.learning_rate": 1e-2,
    "train.checkpoint_every": 3,
}
"""The LoRA run compared across plain CPU and the sharded XLA mesh."""


def lora_cfg(**overrides):
    return tiny_cfg(**{"lora.rank": 4, **overrides})


def lora_data():
    return token_dataset(48)


def tiny(family: str = "llama", **fields):
    sizes = dict(hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2, vocab_size=VOCAB)
    return build_model(ModelConfig(family=family, **{**sizes, **fields}), seed=0)


def losses(result) -> list[float]:
    return [m["loss"] for m in result.history]


def files_bytes(path: str | Path) -> dict[str, int]:
    return {f: os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)}


# ---- which modules, and the errors --------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("llama", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
        ("phi3", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),  # from the tensor-parallel plan
        ("gpt2", ["c_attn", "c_proj", "c_fc"]),  # no plan: the workbench's sharding rules
    ],
)
def test_auto_targets_are_the_attention_and_mlp_projections(family, expected):
    model = tiny(family)
    assert auto_target_modules(model) == expected
    lora = apply_lora(model, LoraConfig(rank=2))
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert not any("embed" in n or "lm_head" in n or "wte" in n for n in trainable)


def test_a_lora_model_starts_as_its_base_and_its_init_is_seeded():
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    base_logits = tiny()(input_ids=ids).logits
    state = torch.get_rng_state()
    a, b = apply_lora(tiny(), LoraConfig(rank=4), seed=3), apply_lora(tiny(), LoraConfig(rank=4), seed=3)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left alone
    torch.testing.assert_close(a(input_ids=ids).logits, base_logits)  # lora_B starts at zero
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    trainable, total = parameter_counts(a)
    # rank 4 on q, k, v, o (32->32, 32->16, 32->16, 32->32), gate, up (32->64), down (64->32), 2 layers
    assert trainable == 2 * 4 * ((32 + 32) + 2 * (32 + 16) + (32 + 32) + 2 * (32 + 64) + (64 + 32))
    assert total == sum(p.numel() for p in tiny().parameters()) + trainable


def test_targets_that_match_nothing_list_the_modules_that_exist():
    with pytest.raises(LoraError) as err:
        apply_lora(tiny(), LoraConfig(rank=2, target_modules=["q_prj", "v_proj"]))
    message = str(err.value)
    assert "'q_prj' matches no module of this llama model" in message
    assert "did you mean 'q_proj'" in message
    # every adaptable layer once, by its last name part, in model order
    assert "embed_tokens, q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head" in message
    with pytest.raises(LoraError, match=r"'input_layernorm' names LlamaRMSNorm modules"):
        apply_lora(tiny(), LoraConfig(rank=2, target_modules=["input_layernorm"]))


def test_a_rank_larger_than_a_layer_names_the_layer_and_its_sizes():
    with pytest.raises(LoraError) as err:
        apply_lora(tiny(), LoraConfig(rank=20, target_modules=["q_proj", "k_proj"]))
    assert str(err.value).startswith(
        "lora.rank=20 is larger than layer model.layers.0.self_attn.k_proj (Linear, 32 in -> 16 out features): "
        "a rank-r adapter there has at most rank min(32, 16) = 16"
    )
    apply_lora(tiny(), LoraConfig(rank=16, target_modules=["q_proj", "k_proj"]))  # at the limit: fine


def test_the_trainer_builds_a_lora_model_when_the_rank_is_set():
    trainer = Trainer(lora_cfg(), train_dataset=lora_data())
    assert type(trainer.model).__name__ == "PeftModelForCausalLM"
    adapters = [p for p in trainer.model.parameters() if p.requires_grad]
    in_optimizer = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert {id(p) for p in in_optimizer} == {id(p) for p in adapters}
    assert {id(p) for p in trainer.engine.params} == {id(p) for p in adapters}
    plain = Trainer(tiny_cfg(), train_dataset=lora_data())  # rank 0: no peft, every weight trains
    assert not hasattr(plain.model, "peft_config")
    assert all(p.requires_grad for p in plain.model.parameters())


def test_gradient_checkpointing_still_reaches_the_adapters():
    cfg = lora_cfg(**{"train.gradient_checkpointing": True, "train.steps": 2})
    trainer = Trainer(cfg, train_dataset=lora_data())
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".lora_A." in n}
    trainer.fit()
    after = dict(trainer.model.named_parameters())
    assert all(not torch.equal(before[n], after[n]) for n in before)  # every lora_A moved


# ---- a LoRA run on CPU: frozen base, checkpoints, resume, exports ---------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    from workbench.data.tokenizer import train_tokenizer

    return train_tokenizer(["the cat sat on the mat", "a dog sat on a log"] * 20, vocab_size=300)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tokenizer):
    """The LoRA run of LORA_RUN on plain CPU (checkpoints every 3 steps), with the base weights before it."""
    root = tmp_path_factory.mktemp("lora-run")
    cfg = lora_cfg(**LORA_RUN, **{"train.checkpoint_dir": str(root / "ckpt")})
    trainer = Trainer(cfg, train_dataset=lora_data(), tokenizer=tokenizer)
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    result = trainer.fit()
    return {"trainer": trainer, "result": result, "frozen_before": frozen, "root": root, "cfg": cfg}


def test_lora_training_lowers_the_loss_and_leaves_the_base_bit_identical(lora_run):
    trainer, result = lora_run["trainer"], lora_run["result"]
    assert losses(result)[-1] < losses(result)[0]
    frozen = {n: p for n, p in trainer.model.named_parameters() if not p.requires_grad}
    assert frozen.keys() == lora_run["frozen_before"].keys() and len(frozen) > 10
    assert all(torch.equal(p, lora_run["frozen_before"][n]) for n, p in frozen.items())


def test_a_lora_checkpoint_holds_only_the_adapters_and_their_optimizer_state(lora_run, tmp_path):
    trainer, result = lora_run["trainer"], lora_run["result"]
    from safetensors import safe_open

    with safe_open(os.path.join(result.checkpoint_path, "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    adapters = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert set(keys) == adapters
    lora_bytes = files_bytes(result.checkpoint_path)
    full = Trainer(
        tiny_cfg(**{**LORA_RUN, "lora.rank": 0, "train.steps": 3, "train.checkpoint_dir": str(tmp_path)}),
        train_dataset=lora_data(),
        tokenizer=lora_run["trainer"].tokenizer,
    ).fit()
    full_bytes = files_bytes(full.checkpoint_path)
    adapter_params, total_params = parameter_counts(trainer.model)
    # weights: the adapters' fp32 bytes plus the safetensors header; AdamW state: twice that
    assert adapter_params * 4 < lora_bytes["model.safetensors"] < adapter_params * 4 + 8192
    assert lora_bytes["optimizer.safetensors"] < 2 * adapter_params * 4 + 8192
    assert full_bytes["model.safetensors"] > 0.9 * total_params * 4
    assert sum(lora_bytes.values()) < sum(full_bytes.values()) / 4
    print(f"checkpoint bytes: LoRA {lora_bytes}, full {full_bytes}")


def test_a_lora_run_resumes_bitwise(lora_run, tokenizer):
    cfg = lora_run["cfg"].with_overrides({"train.checkpoint_dir": str(lora_run["root"] / "crashed")})

    class Crash(RuntimeError):
        pass

    def crash_after_step_4(metrics: dict) -> None:
        if metrics["step"] == 4:
            raise Crash

    with pytest.raises(Crash):
        Trainer(cfg, train_dataset=lora_data(), tokenizer=tokenizer, callbacks=[crash_after_step_4]).fit()
    resumed = Trainer(cfg, train_dataset=lora_data(), tokenizer=tokenizer).fit()
    assert [m["step"] for m in resumed.history] == [4, 5, 6]
    assert losses(resumed) == losses(lora_run["result"])[3:]  # bitwise


def test_a_full_checkpoint_does_not_resume_a_lora_run(lora_run, tmp_path, tokenizer):
    full_cfg = tiny_cfg(
        **{**LORA_RUN, "lora.rank": 0, "train.steps": 3, "train.checkpoint_dir": str(tmp_path)}
    )
    Trainer(full_cfg, train_dataset=lora_data(), tokenizer=tokenizer).fit()
    lora = Trainer(full_cfg.with_overrides({"lora.rank": 4}), train_dataset=lora_data(), tokenizer=tokenizer)
    with pytest.raises(CheckpointError, match=r"lora\.rank=0 there, 4 here.*train\.resume=false"):
        lora.load_checkpoint()


def test_the_adapter_directory_loads_with_peft_onto_the_base(lora_run, tmp_path):
    trainer = lora_run["trainer"]
    path = trainer.save_pretrained(tmp_path / "adapter")
    names = set(os.listdir(path))
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= names
    assert os.path.getsize(path / "adapter_model.safetensors") < 8192 + 4 * parameter_counts(trainer.model)[0]
    base = build_model(lora_run["cfg"].model, vocab_size=len(trainer.tokenizer), seed=0)
    loaded = peft.PeftModel.from_pretrained(base, str(path)).eval()
    ids = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    trainer.model.eval()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, trainer.model(input_ids=ids).logits)


def test_the_merged_model_gives_the_logits_of_base_plus_adapter(lora_run, tmp_path):
    import transformers as tf

    trainer = lora_run["trainer"]
    path = trainer.save_pretrained(tmp_path / "merged", merged=True)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(path))
    merged = tf.AutoModelForCausalLM.from_pretrained(str(path)).eval()
    assert not any("lora" in n or "base_layer" in n for n, _ in merged.named_parameters())
    ids = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(2))
    trainer.model.eval()
    with torch.no_grad():
        expected = trainer.model(input_ids=ids).logits
        base = build_model(lora_run["cfg"].model, vocab_size=len(trainer.tokenizer), seed=0).eval()
        assert (base(input_ids=ids).logits - expected).abs().max() > 1e-2  # the adapter did change it
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-4, rtol=0)
    # the live LoRA model is untouched by the export
    assert any(".lora_B." in n for n, _ in trainer.model.named_parameters())


def test_without_lora_save_pretrained_writes_the_full_model(tmp_path, tokenizer):
    import transformers as tf

    trainer = Trainer(tiny_cfg(**{"train.steps": 1}), train_dataset=lora_data(), tokenizer=tokenizer)
    trainer.fit()
    path = trainer.save_pretrained(tmp_path / "full")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(path))
    loaded = tf.AutoModelForCausalLM.from_pretrained(str(path)).eval()
    ids = torch.randint(1, VOCAB, (1, 8))
    trainer.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, trainer.model(input_ids=ids).logits)


def test_an_adapter_saved_for_another_base_model_names_both(lora_run, tmp_path):
    path = lora_run["trainer"].save_pretrained(tmp_path / "adapter")
    identity = json.loads((path / "workbench_base_model.json").read_text())
    assert identity["model_type"] == "llama" and identity["hidden_size"] == 32
    wider = tiny(hidden_size=64, intermediate_size=128)
    with pytest.raises(LoraError) as err:
        load_adapter(wider, path)
    message = str(err.value)
    assert "was saved for base model a llama built from a config (llama, hidden 32, 2 layers" in message
    assert "this base model is a llama built from a config (llama, hidden 64, 2 layers" in message
    # an adapter without the workbench's record (saved by peft itself): its tensor shapes say it
    (path / "workbench_base_model.json").unlink()
    with pytest.raises(LoraError) as err:
        load_adapter(wider, path)
    message = str(err.value)
    assert "was saved for base model a base model it does not record; this base model is a llama" in message
    assert re.search(
        r"its adapter for model\.layers\.\d\.\S+ has (in|out)put size \d+; this model's", message
    )
    with pytest.raises(LoraError, match=r"has no adapter_config\.json"):
        load_adapter(wider, tmp_path)
    base = build_model(lora_run["cfg"].model, vocab_size=len(lora_run["trainer"].tokenizer), seed=0)
    assert type(load_adapter(base, path)).__name__ == "PeftModelForCausalLM"  # its own base: fine


# ---- the same LoRA run sharded on XLA:CPU --------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_losses():
    return losses(Trainer(lora_cfg(**LORA_RUN), train_dataset=lora_data()).fit())


@pytest.fixture(scope="module")
def sharded(xla_scenario, tmp_path_factory):
    """tests/xla/lora_sharded.py: the LoRA run on data=2 x fsdp=2 x model=2 over 8 XLA:CPU devices."""
    root = tmp_path_factory.mktemp("lora-xla")
    return xla_scenario("lora_sharded", checkpoint_dir=str(root / "ckpt"), export_dir=str(root / "export"))


@pytest.mark.xla
@pytest.mark.slow
def test_xla_sharded_lora_losses_equal_plain_cpu(sharded, cpu_losses):
    print(f"LoRA losses: XLA data2 x fsdp2 x model2 {sharded['losses']}; CPU {cpu_losses}")
    assert len(sharded["losses"]) == len(cpu_losses) == LORA_RUN["train.steps"]
    assert sharded["losses"] == pytest.approx(cpu_losses, abs=LOSS_TOLERANCE)


@pytest.mark.xla
@pytest.mark.slow
def test_xla_sharded_lora_leaves_the_base_bit_identical(sharded):
    assert sharded["base_unchanged"] and sharded["frozen"] > 10


@pytest.mark.xla
@pytest.mark.slow
def test_xla_sharded_lora_steps_compile_nothing_after_warmup_and_read_only_the_logged_values(sharded):
    # Steps 1-3 and 4-6 compile nothing. The checkpoint save after step 3 does compile (the
    # same ~90 small gather programs a full fine-tune's save compiles on a data=2 mesh, where
    # DCP falls back to safetensors), so the run's compiles_after_warmup is not 0 here.
    at = {int(step): count for step, count in sharded["compiles_at_step"].items()}
    assert at[1] == at[2] == at[3] and at[4] == at[5] == at[6], at
    assert all(t <= 4 for t in sharded["transfers"]), sharded["transfers"]


@pytest.mark.xla
@pytest.mark.slow
def test_xla_sharded_lora_checkpoint_holds_the_adapters_only(sharded):
    files = sharded["checkpoint_files"]
    model_bytes = sum(size for name, size in files.items() if name.startswith("model."))
    assert model_bytes < 64 * 1024, files  # the adapters (about 13 KiB fp32) and DCP metadata


@pytest.mark.xla
@pytest.mark.slow
def test_xla_sharded_lora_exports_an_adapter_and_a_merged_model(sharded):
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(sharded["exports"]["adapter"])
    assert {"config.json", "model.safetensors"} <= set(sharded["exports"]["merged"])


@pytest.mark.xla
@pytest.mark.slow
def test_xla_sharded_lora_base_weights_keep_their_sharding(sharded):
    specs = sharded["specs"]
    base_q = [n for n in specs if n.endswith("layers.0.self_attn.q_proj.base_layer.weight")]
    assert base_q, sorted(specs)[:10]
    print({n: s for n, s in specs.items() if "layers.0.self_attn.q_proj" in n})
    assert "model" in json.dumps(specs[base_q[0]]), specs[base_q[0]]
