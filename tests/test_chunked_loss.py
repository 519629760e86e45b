"""The loss in chunks of positions (``train.loss_chunk_tokens``, workbench/models/lm_head.py): the
chunk-length rule, and the same loss and gradients as the plain loss on the full logits, on the
CPU and on XLA (single device, a data x fsdp x model mesh, the real Trainer, and the compiler's
memory analysis)."""

from __future__ import annotations

import pytest
import torch

from tests.test_train import tiny_cfg, token_dataset
from tests.tiny import tiny
from workbench.config import ConfigError, LoraConfig
from workbench.data.collate import PackedCollator, pack_sequences
from workbench.families import FAMILY_NAMES
from workbench.models import lm_head
from workbench.models.build import build_model
from workbench.models.lm_head import (
    REFERENCE_MEMORY,
    LossChunkingError,
    chunked_ce_sum,
    lm_head_of,
    logits_bytes,
    loss_chunk_length,
)
from workbench.objectives.distillation import DistillationObjective, DistillSettings
from workbench.train import Trainer
from workbench.train.lora import apply_lora
from workbench.train.objective import CausalLMObjective, LossChunking
from workbench.units import GiB

REL = 1e-5
PLAIN = LossChunking(0)


def chunks_of(positions: int, rows: int) -> LossChunking:
    """An explicit setting giving `positions` positions per chunk for `rows` rows on one device."""
    return LossChunking(positions * rows)


def _batch(rows: int = 2, length: int = 13, vocab: int = 512, seed: int = 0) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, vocab, (rows, length), generator=torch.Generator().manual_seed(seed))
    labels = ids.clone()
    labels[0, 4:7] = -100  # in the middle
    labels[0, :2] = -100  # at the start
    labels[1, -3:] = -100  # at the end
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _run(objective, model, batch) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    for p in [*model.parameters(), *objective.parameters()]:
        p.grad = None
    out = objective(model, batch)
    out["loss_sum"].backward()
    params = [*model.named_parameters(), *(("objective." + n, p) for n, p in objective.named_parameters())]
    grads = {n: p.grad.detach().clone() for n, p in params if p.requires_grad}
    return {k: float(v.detach()) for k, v in out.items()}, grads


def assert_same(plain, chunked) -> None:
    """Every figure and every trainable parameter's gradient within `REL` (relative, by norm)."""
    (p_out, p_grads), (c_out, c_grads) = plain, chunked
    assert p_out.keys() == c_out.keys()
    for key in p_out:
        assert c_out[key] == pytest.approx(p_out[key], rel=REL), key
    assert p_grads.keys() == c_grads.keys() and p_grads
    for name, g in p_grads.items():
        err = float((c_grads[name] - g).norm()) / max(float(g.norm()), 1e-30)
        assert err < REL, f"{name}: relative gradient error {err:.2e}"


def compare(model, batch, positions: int) -> tuple[dict[str, float], dict[str, float]]:
    rows = batch["labels"].shape[0]
    plain = _run(CausalLMObjective(PLAIN), model, batch)
    chunked = _run(CausalLMObjective(chunks_of(positions, rows)), model, batch)
    assert_same(plain, chunked)
    return plain[0], chunked[0]


# ---- the rule -----------------------------------------------------------------------------------


def test_chunk_length_rule():
    # explicit N: N tokens per device, so N // rows positions, at least 1
    assert loss_chunk_length(512, rows=4, length=1024, vocab=1000) == 128
    assert loss_chunk_length(3, rows=4, length=1024, vocab=1000) == 1
    # a chunk as long as the batch, or longer, is no chunking; 0 never chunks
    assert loss_chunk_length(4096, rows=4, length=1024, vocab=1000) is None
    assert loss_chunk_length(4 * 1024, rows=4, length=1024, vocab=1000) is None
    assert loss_chunk_length(0, rows=64, length=8192, vocab=256_000) is None
    # 'auto': 1 x 1024 x 128k x 16 bytes = 2 GiB, above 1/16 of 16 GiB (the CPU's reference)
    assert loss_chunk_length("auto", rows=1, length=1024, vocab=131072) == 256  # 1/32: 512 MiB
    assert 16 * GiB == REFERENCE_MEMORY
    # ... and below 1/16 of 95 GiB, or at a small vocabulary: the plain loss
    assert loss_chunk_length("auto", rows=1, length=1024, vocab=131072, memory_bytes=95 * GiB) is None
    assert loss_chunk_length("auto", rows=2, length=512, vocab=32000) is None
    # the model axis splits the vocabulary: a quarter of the term each
    assert loss_chunk_length("auto", rows=1, length=1024, vocab=131072, model_parallel=4) is None
    assert loss_chunk_length("auto", rows=16, length=1024, vocab=131072, model_parallel=4) == 64
    # multiples of 8 positions where that leaves one
    assert loss_chunk_length("auto", rows=3, length=1024, vocab=131072) == 80
    assert loss_chunk_length("auto", rows=64, length=1024, vocab=131072) == 4
    for bad in (-1, "all", 1.5, True):
        with pytest.raises(ValueError, match=r"train\.loss_chunk_tokens"):
            loss_chunk_length(bad, rows=1, length=8, vocab=10)


def test_chunking_counts_rows_per_device_and_says_how_much_it_saves():
    chunking = LossChunking(512, data_parallel=4, model_parallel=2)
    assert chunking.positions(rows=16, length=1024, vocab=1000) == 128  # 4 rows a device
    assert chunking.positions(rows=2, length=1024, vocab=1000) == 512  # rows round up to 1
    assert logits_bytes(rows=4, positions=1024, vocab=1000, model_parallel=2) == 4 * 1024 * 500 * 16
    text = LossChunking(1024).describe(rows=1, length=1024, vocab=131072, positions=256)
    assert (
        text
        == "loss in chunks of 256 positions (train.loss_chunk_tokens=1024): logits 2.00 GiB → 512.00 MiB per device"
    )


# ---- the same loss and gradients ----------------------------------------------------------------


@pytest.mark.parametrize(("family", "tied"), [("llama", False), ("llama", True), ("gpt2", True)])
def test_chunked_equals_plain(family, tied):
    model = build_model(tiny(family, tie_word_embeddings=tied), seed=0)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    for positions in (5, 1, 12):  # last chunk of 3; one position a chunk; last chunk of 1
        compare(model, _batch(), positions)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_registered_family(family):
    model = build_model(tiny(family, tie_word_embeddings=False), seed=0)
    compare(model, _batch(), 5)


def test_a_trainable_head_over_frozen_hidden_states():
    model = build_model(tiny("llama", tie_word_embeddings=False), seed=0)
    for name, p in model.named_parameters():
        p.requires_grad_(name == "lm_head.weight")
    compare(model, _batch(), 5)


def test_softcapped_logits_are_capped_per_chunk():
    model = build_model(tiny("gemma2"), seed=0)
    with torch.no_grad():  # logits of a few units, which a cap of 1 changes
        model.get_output_embeddings().weight.mul_(50)
    model.config.final_logit_softcapping = 1.0
    capped, _ = compare(model, _batch(), 4)
    assert lm_head_of(model).softcap == 1.0
    model.config.final_logit_softcapping = None
    uncapped, _ = compare(model, _batch(), 4)
    assert abs(capped["loss_sum"] - uncapped["loss_sum"]) > 1.0


def test_lora_adapters_get_the_same_gradients():
    lora = LoraConfig(rank=4, target_modules=["q_proj", "v_proj", "lm_head"])  # the head itself adapted
    model = apply_lora(build_model(tiny("llama"), seed=0), lora, seed=1)
    with torch.no_grad():  # B starts at zero, which would leave A's gradient zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("lm_head.lora_A" in n for n in trainable) and all("lora_" in n for n in trainable)
    compare(model, _batch(), 5)


@pytest.mark.parametrize("attention", ["position_ids", "mask4d"])
def test_packed_rows(attention):
    seqs = [list(range(3 + i, 3 + i + n)) for i, n in enumerate([5, 7, 3, 9, 4, 6])]
    batch = PackedCollator(0, 16, attention=attention)(pack_sequences(seqs, 16))
    assert "position_ids" in batch and (batch["labels"] == -100).any()
    model = build_model(tiny("llama"), seed=0)
    compare(model, batch, 6)


@pytest.mark.parametrize("hidden_weight", [0.0, 0.5])
def test_distillation_chunks_both_models(hidden_weight):
    teacher = build_model(tiny("llama", hidden_size=96, num_heads=4, intermediate_size=128), seed=1)
    student = build_model(tiny("llama", tie_word_embeddings=True), seed=2)
    batch = _batch()
    settings = DistillSettings(alpha=0.3, temperature=2.0, hidden_weight=hidden_weight)
    plain = DistillationObjective(teacher, student, settings, chunking=PLAIN)
    chunked = DistillationObjective(teacher, student, settings, chunking=chunks_of(5, 2))
    if plain.projection is not None:
        chunked.projection.load_state_dict(plain.projection.state_dict())
    p_run, c_run = _run(plain, student, batch), _run(chunked, student, batch)
    assert_same(p_run, c_run)
    assert {"kl_sum", "ce_sum"} <= p_run[0].keys() and p_run[0]["kl_sum"] > 0
    assert all(p.grad is None for p in teacher.parameters())


def test_eval_without_gradients_and_bf16_autocast():
    model = build_model(tiny("llama"), seed=0)
    batch = _batch()
    with torch.no_grad():
        plain = CausalLMObjective(PLAIN)(model, batch)["loss_sum"]
        chunked = CausalLMObjective(chunks_of(4, 2))(model, batch)["loss_sum"]
    assert float(chunked) == pytest.approx(float(plain), rel=REL)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the head in bf16, the loss in fp32
        out = CausalLMObjective(chunks_of(4, 2))(model, batch)
    out["loss_sum"].backward()
    assert out["loss_sum"].dtype == torch.float32
    assert float(out["loss_sum"].detach()) == pytest.approx(float(plain), rel=2e-2)


def test_chunked_sum_matches_hidden_states_directly():
    model = build_model(tiny("gpt2"), seed=0)
    batch = _batch()
    head = lm_head_of(model)
    assert head.decoder is model.transformer and head.head is model.lm_head
    hidden = head.hidden_states({"input_ids": batch["input_ids"]}).last_hidden_state
    logits = model(input_ids=batch["input_ids"]).logits
    expected = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, 512),
        batch["labels"][:, 1:].reshape(-1),
        ignore_index=-100,
        reduction="sum",
    )
    assert float(chunked_ce_sum(head, hidden, batch["labels"], 3)) == pytest.approx(float(expected), rel=REL)


# ---- what cannot be chunked, and the notice -----------------------------------------------------


def test_unknown_family_errors_explicitly_and_auto_keeps_the_plain_loss(monkeypatch):
    model = build_model(tiny("llama"), seed=0)
    batch = _batch()
    monkeypatch.setattr(lm_head, "FAMILIES", {})
    with pytest.raises(
        LossChunkingError, match=r"train.loss_chunk_tokens .* family 'llama'.*loss_chunk_tokens: 0"
    ):
        CausalLMObjective(chunks_of(4, 2))(model, batch)
    assert issubclass(LossChunkingError, ConfigError)
    heard: list[str] = []
    auto = LossChunking("auto", memory_bytes=1024)  # would chunk this batch
    assert auto.positions(2, 13, 512) is not None
    out = CausalLMObjective(auto, notice=heard.append)(model, batch)
    assert float(out["loss_sum"]) == pytest.approx(float(CausalLMObjective(PLAIN)(model, batch)["loss_sum"]))
    assert len(heard) == 1 and "'auto' keeps the plain loss" in heard[0]


def test_one_notice_per_objective():
    model = build_model(tiny("llama"), seed=0)
    heard: list[str] = []
    objective = CausalLMObjective(chunks_of(4, 2), notice=heard.append)
    for seed in range(2):
        objective(model, _batch(seed=seed))
    assert heard == [objective.chunking.describe(2, 13, 512, 4)]
    CausalLMObjective(PLAIN, notice=heard.append)(model, _batch())  # the plain loss says nothing
    assert len(heard) == 1


def test_trainer_passes_the_setting_to_both_objectives_and_says_so():
    cfg = tiny_cfg(**{"train.loss_chunk_tokens": 24, "train.steps": 3, "train.eval_every": 3})
    trainer = Trainer(cfg, train_dataset=token_dataset(16), eval_dataset=token_dataset(8, seed=1))
    assert trainer.objective.chunking == LossChunking(
        24, memory_bytes=None, data_parallel=1, model_parallel=1
    )
    assert trainer.engine.eval_objective.chunking == trainer.objective.chunking
    result = trainer.fit()
    chunked_losses = [m["loss"] for m in result.history]
    assert any(n.startswith("loss in chunks of 6 positions") for n in result.notices)
    plain = Trainer(
        tiny_cfg(**{"train.loss_chunk_tokens": 0, "train.steps": 3, "train.eval_every": 3}),
        train_dataset=token_dataset(16),
        eval_dataset=token_dataset(8, seed=1),
    )
    plain_result = plain.fit()
    assert chunked_losses == pytest.approx([m["loss"] for m in plain_result.history], rel=REL)
    assert trainer.last_eval_loss == pytest.approx(plain.last_eval_loss, rel=REL)
    assert not any("loss in chunks" in n for n in plain_result.notices)


# ---- on XLA (scenarios in tests/xla/) -----------------------------------------------------------


@pytest.mark.xla
@pytest.mark.parametrize(
    ("devices", "mesh"), [(1, None), (8, {"data": 2, "fsdp": 2, "model": 2})], ids=["one device", "2x2x2"]
)
def test_xla_chunked_equals_plain(xla_scenario, devices, mesh):
    result = xla_scenario("chunked_equality", devices=devices, mesh=mesh)
    for objective in ("ce", "distill"):
        got = result[objective]
        assert got["loss_chunked"] == pytest.approx(got["loss_plain"], rel=REL), objective
        assert got["grad_error"] < REL, f"{objective}: {got['worst']} off by {got['grad_error']:.2e}"
        assert got["params"] == 21  # every parameter of the 2-layer model
        plain_spec, chunked_spec = got["head_grad_sharding"]
        assert chunked_spec == plain_spec and (mesh is None) == (plain_spec == "")
    if mesh is None:
        head_only = result["head_only"]
        assert head_only["params"] == 1 and head_only["grad_error"] < REL
        assert head_only["loss_chunked"] == pytest.approx(head_only["loss_plain"], rel=REL)


@pytest.mark.xla
def test_xla_trainer_chunks_without_recompiles(xla_scenario):
    result = xla_scenario("chunked_trainer", tokens=8)
    chunked, plain = result["chunked"], result["plain"]
    assert chunked["after"] == plain["after"] == 0
    assert chunked["losses"] == pytest.approx(plain["losses"], rel=REL)
    assert chunked["eval_loss"] == pytest.approx(plain["eval_loss"], rel=REL)
    assert [n for n in chunked["notices"] if n.startswith("loss in chunks of 8 positions")]
    assert not [n for n in plain["notices"] if "loss in chunks" in n]


@pytest.mark.xla
def test_xla_chunks_drop_the_logits_term_from_the_compiled_step(xla_scenario):
    result = xla_scenario("chunked_memory", devices=1, positions=[128, 64])
    plain = result["plain"]
    assert result["programs"] == 3
    for way in ("chunks of 128", "chunks of 64"):
        got = result[way]
        assert got["loss"] == pytest.approx(plain["loss"], rel=REL)
        # the temporaries lose the whole logits term and keep one chunk's (measured: 264.1 MiB
        # plain, 136.7 and 73.0 MiB chunked, against terms of 256, 128 and 64 MiB)
        saved = plain["temp_bytes"] - got["temp_bytes"]
        assert saved > 0.9 * (plain["logits_term"] - got["logits_term"]), way
        assert got["temp_bytes"] < got["logits_term"] + 0.1 * plain["logits_term"], way
