"""Memory: the estimate's arithmetic (analysis/estimate.py), the batch finder (analysis/batch.py),
the tables (analysis/tables.py), the OOM retry (train/oom.py), and (on XLA:CPU) the estimate
against the compiler's own memory analysis of the real step (analysis/probe.py)."""

from __future__ import annotations

import pytest
import torch

from workbench.analysis.batch import find_batch_size, max_batch_size
from workbench.analysis.estimate import BREAKDOWN_KEYS, estimate, model_shape
from workbench.analysis.tables import estimate_table, fit_across_targets, format_table
from workbench.config import ModelConfig
from workbench.models.build import build_model, count_parameters, hf_config
from workbench.train.oom import is_oom_error, run_with_oom_retry

TINY = ModelConfig(
    hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=512
)


def _cfg(**kw) -> ModelConfig:
    base = dict(
        hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=512
    )
    base.update(kw)
    return ModelConfig(**base)


# ---- the model's shape ---------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        _cfg(family="llama"),
        _cfg(family="llama", tie_word_embeddings=False),
        _cfg(family="qwen2"),
        _cfg(family="mistral"),
        _cfg(family="gemma"),
        _cfg(family="gpt2", num_kv_heads=4, intermediate_size=256),
        _cfg(family="gpt2", num_kv_heads=4, intermediate_size=256, tie_word_embeddings=False),
    ],
    ids=["llama", "llama-untied", "qwen2", "mistral", "gemma", "gpt2", "gpt2-untied"],
)
def test_parameter_count_from_config_matches_the_real_model(cfg):
    model = build_model(cfg)
    shape = model_shape(hf_config(cfg))
    assert shape.num_parameters == count_parameters(model)
    # a model and a workbench ModelConfig are accepted too, and agree
    assert model_shape(model).num_parameters == count_parameters(model)
    assert model_shape(cfg).num_parameters == count_parameters(model)


def test_unsupported_model_config_names_the_type():
    with pytest.raises(ValueError, match=r"model_type='bert'"):
        model_shape(type("Cfg", (), {"model_type": "bert"})())


# ---- the estimate --------------------------------------------------------------------


def test_breakdown_hand_calculation_llama_fp32():
    """Every part by hand for the tiny Llama: H=64, 2 layers, 4 heads x 16, MLP 128, vocab 512, B=2, T=32."""
    est = estimate(TINY, batch_size=2, seq_len=32, precision="fp32", optimizer="adamw")
    # 512*64 tied embedding + 2 layers * (2*64 norms + 64*64 q + 2*32*64 k,v + 64*64 o + 3*128*64 MLP) + 64
    n = 512 * 64 + 2 * (2 * 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 128 * 64) + 64
    assert est.num_parameters == n
    b = est.breakdown
    assert set(BREAKDOWN_KEYS) <= set(b)
    assert b["params"] == 4 * n and b["grads"] == 4 * n and b["optimizer"] == 8 * n
    tokens = 64
    # per layer per token: H + 4H (norms) + 4*h*d + h*T + 4I = 64 + 256 + 256 + 128 + 512
    per_layer = 64 + 256 + 256 + 4 * 32 + 4 * 128
    assert b["activations"] == tokens * (2 * per_layer + 3 * 64) * 4
    assert b["logits"] == tokens * 4 * 512 * 4
    assert b["inputs"] == tokens * 16
    assert est.total_bytes == sum(b.values())


def test_precision_checkpointing_attention_and_mesh_move_the_right_parts():
    fp32 = estimate(TINY, batch_size=8, seq_len=64, precision="fp32")
    bf16 = estimate(TINY, batch_size=8, seq_len=64, precision="bf16")
    mixed = estimate(TINY, batch_size=8, seq_len=64, precision="bf16-mixed")
    assert bf16.breakdown["params"] * 2 == fp32.breakdown["params"]
    assert bf16.breakdown["optimizer"] * 2 == fp32.breakdown["optimizer"]
    assert mixed.breakdown["params"] == fp32.breakdown["params"]  # fp32 master weights
    assert mixed.breakdown["param_casts"] > 0 and fp32.breakdown["param_casts"] == 0
    assert bf16.breakdown["activations"] < fp32.breakdown["activations"]

    deep = _cfg(num_layers=8)
    plain = estimate(deep, batch_size=8, seq_len=128, precision="fp32")
    ckpt = estimate(deep, batch_size=8, seq_len=128, precision="fp32", gradient_checkpointing=True)
    assert ckpt.breakdown["activations"] < plain.breakdown["activations"] / 3
    assert ckpt.breakdown["params"] == plain.breakdown["params"]

    flash = estimate(TINY, batch_size=8, seq_len=512, precision="fp32", attention="flash")
    eager = estimate(TINY, batch_size=8, seq_len=512, precision="fp32", attention="eager")
    # eager keeps h*T probabilities per token per layer: 2 layers * 4 heads * 512 * 4 bytes * 4096 tokens,
    # and one layer's backward holds two more (the probabilities' and scores' gradients) and the
    # [rows, 1, T, T] mask: 2 * 4 * 512 + 512 fp32 per token, beyond what the freed logits held
    saved = 2 * 4 * 512 * 4 * 8 * 512
    transient = (2 * 4 * 512 + 512) * 4 * 8 * 512
    excess = max(0, transient - eager.breakdown["logits"])
    assert eager.breakdown["activations"] - flash.breakdown["activations"] == saved + excess
    assert eager.scores_bytes == saved + transient and flash.scores_bytes == 0

    sharded = estimate(
        TINY, batch_size=16, seq_len=64, precision="fp32", mesh={"data": 2, "fsdp": 4, "model": 1}
    )
    single = estimate(TINY, batch_size=2, seq_len=64, precision="fp32")
    assert sharded.per_device_batch == 2
    assert sharded.breakdown["activations"] == single.breakdown["activations"]
    assert sharded.breakdown["params"] == pytest.approx(single.breakdown["params"] / 4, abs=1)
    assert sharded.breakdown["gathered_params"] == single.breakdown["params"]  # fp32 compute: one full copy

    accum = estimate(TINY, batch_size=8, seq_len=64, grad_accum=4)
    assert accum.breakdown["grad_accum_buffer"] == accum.breakdown["grads"]

    sgd = estimate(TINY, batch_size=8, seq_len=64, optimizer="sgd")
    ada = estimate(TINY, batch_size=8, seq_len=64, optimizer="adafactor")
    assert (
        sgd.breakdown["optimizer"] == fp32.breakdown["optimizer"] / 2
    )  # one momentum buffer, not two moments
    assert 0 < ada.breakdown["optimizer"] < fp32.breakdown["optimizer"] / 10


def test_a_mesh_spec_object_is_accepted():
    from workbench.parallel.mesh import MeshSpec

    spec = MeshSpec(data=-1, fsdp=4).resolve(8)
    est = estimate(TINY, batch_size=16, seq_len=32, mesh=spec)
    assert est.per_device_batch == 2 and est.mesh == {"data": 2, "fsdp": 4, "model": 1}


def test_a_torch_xla_style_mesh_is_accepted():
    """A built mesh answers ``shape()`` (torch_xla's Mesh: an OrderedDict of axis -> size)."""
    from collections import OrderedDict

    class FakeXlaMesh:
        def shape(self) -> OrderedDict[str, int]:
            return OrderedDict(data=1, fsdp=4, model=2)

    est = estimate(TINY, batch_size=8, seq_len=32, mesh=FakeXlaMesh())
    assert est.per_device_batch == 2 and est.mesh == {"data": 1, "fsdp": 4, "model": 2}
    with pytest.raises(ValueError, match=r"mesh of type object is not allowed.*MeshSpec"):
        estimate(TINY, batch_size=8, seq_len=32, mesh=object())


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"precision": "fp8"}, r"precision='fp8'.*'fp32', 'bf16-mixed', 'bf16'"),
        ({"optimizer": "lion"}, r"optimizer='lion'.*'adamw'"),
        ({"batch_size": 6, "mesh": {"data": 4, "fsdp": 1, "model": 1}}, r"batch_size=6.*multiple of 4"),
        (
            {"batch_size": 2, "mesh": {"data": 4, "fsdp": 1, "model": 1}},
            r"batch_size=2 is not allowed: .* data\(4\) x fsdp\(1\) = 4; use a multiple of 4 \(e\.g\. 4\)$",
        ),
        ({"batch_size": 0}, r"batch_size=0.*int >= 1"),
        ({"mesh": {"data": -1, "fsdp": 2, "model": 1}}, r"data=-1.*resolve"),
        ({"attention": "sparse"}, r"attention='sparse'"),
    ],
)
def test_bad_input_names_the_field(kwargs, pattern):
    kw = {"batch_size": 8, "seq_len": 32, **kwargs}
    with pytest.raises(ValueError, match=pattern):
        estimate(TINY, **kw)


def test_fits_and_table():
    est = estimate(TINY, batch_size=8, seq_len=32)
    assert (
        est.fits(est.total_bytes * 2)
        and not est.fits(est.total_bytes)
        and est.fits(est.total_bytes, headroom=0)
    )
    assert est.fits(None)
    assert "activations" in est.table() and "total" in est.table()
    # a whole-batch loss: on so small a device 'auto' would chunk the logits (tested with the chunks)
    rows = estimate_table(TINY, [2, 4, 8], [32, 64], memory_bytes=est.total_bytes * 1.5, loss_chunk_tokens=0)
    assert len(rows) == 6
    totals = {(r["batch_size"], r["seq_len"]): r["total_bytes"] for r in rows}
    assert totals[(2, 32)] < totals[(4, 32)] < totals[(8, 32)] < totals[(8, 64)]
    assert {r["fits"] for r in rows} == {True, False}
    assert "batch_size" in format_table(rows)


# ---- the batch finder ----------------------------------------------------------------


def test_max_batch_size_is_the_largest_fitting_multiple():
    budget = 64 * 1024**2
    best = max_batch_size(TINY, seq_len=128, memory_bytes=budget, multiple_of=8, precision="fp32")
    assert best > 0 and best % 8 == 0
    # the device's memory also plans the 'auto' loss chunks, as in the trainer
    kw = dict(seq_len=128, precision="fp32", memory_bytes=budget)
    assert estimate(TINY, batch_size=best, **kw).fits(budget)
    assert not estimate(TINY, batch_size=best + 8, **kw).fits(budget)
    assert max_batch_size(TINY, seq_len=128, memory_bytes=1024, precision="fp32") == 0


def test_the_batch_finders_follow_the_mesh_without_being_told():
    """With only ``mesh=`` (multiple_of and dp_size left at their defaults) the first estimate
    would be batch 1, which a data(2) x fsdp(4) mesh cannot split: the finders must step by 8."""
    budget = 64 * 1024**2
    mesh = {"data": 2, "fsdp": 4, "model": 1}
    best = max_batch_size(TINY, seq_len=128, memory_bytes=budget, precision="fp32", mesh=mesh)
    assert best > 0 and best % 8 == 0
    assert not estimate(
        TINY, batch_size=best + 8, seq_len=128, precision="fp32", mesh=mesh, memory_bytes=budget
    ).fits(budget)
    # a given multiple combines with the mesh's: lcm(3, 8) = 24
    assert max_batch_size(TINY, seq_len=128, memory_bytes=budget, multiple_of=3, mesh=mesh) % 24 == 0

    plan = find_batch_size(TINY, seq_len=128, memory_bytes=budget, precision="fp32", mesh=mesh)
    assert plan.batch_size == best and plan.batch_size % 8 == 0
    assert all(r["batch_size"] % 8 == 0 for r in plan.candidates)
    with pytest.raises(ValueError, match=r"candidate batch size 12 .* multiple of 24 .*dp_size=3.*= 8"):
        find_batch_size(TINY, seq_len=128, memory_bytes=budget, dp_size=3, candidates=[24, 12], mesh=mesh)


def test_find_batch_size_uses_the_compiled_figure_to_step_down():
    budget = 64 * 1024**2
    best = max_batch_size(TINY, seq_len=128, memory_bytes=budget, multiple_of=8, precision="fp32")
    probed: list[int] = []

    def compiled(batch: int) -> int:
        probed.append(batch)
        # the "compiler" needs 50% more than the estimate: only smaller sizes fit
        est = estimate(TINY, batch_size=batch, seq_len=128, precision="fp32", memory_bytes=budget)
        return int(est.total_bytes * 1.5)

    plan = find_batch_size(
        TINY, seq_len=128, memory_bytes=budget, dp_size=8, compiled_bytes=compiled, precision="fp32"
    )
    assert all(r["batch_size"] % 8 == 0 for r in plan.candidates)
    assert 0 < plan.batch_size < best
    assert plan.compiled_bytes is not None and plan.compiled_bytes <= budget * 0.9
    assert probed[0] == best  # the estimate's best was tried first, then smaller ones
    reasons = {r["batch_size"]: r["reason"] for r in plan.candidates}
    assert reasons[best] == "compiled program over budget"

    no_probe = find_batch_size(TINY, seq_len=128, memory_bytes=budget, dp_size=8, precision="fp32")
    assert no_probe.batch_size == best and no_probe.compiled_bytes is None
    with pytest.raises(ValueError, match=r"candidate batch size 12.*dp_size=8"):
        find_batch_size(TINY, seq_len=128, memory_bytes=budget, dp_size=8, candidates=[8, 12])


# ---- out-of-memory -------------------------------------------------------------------

XLA_OOM = (
    "Bad StatusOr access: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate "
    "1.00G. That was not possible. There are 512.00M free.; (0x0x0_HBM0)"
)
CUDA_OOM = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.77 GiB"


def test_is_oom_error_recognises_xla_and_cuda_errors():
    assert is_oom_error(RuntimeError(XLA_OOM))
    assert is_oom_error(torch.OutOfMemoryError(CUDA_OOM))
    assert is_oom_error(
        RuntimeError("XLA:TPU compile permanent error. Ran out of memory in memory space hbm.")
    )
    wrapped = ValueError("step failed")
    wrapped.__cause__ = RuntimeError(XLA_OOM)
    assert is_oom_error(wrapped)
    assert not is_oom_error(ValueError("shape mismatch: [2, 3] vs [3, 2]"))
    assert not is_oom_error(RuntimeError("INVALID_ARGUMENT: bad shape"))


def test_oom_retry_keeps_the_effective_batch_and_the_gradient():
    """A real accumulation step on the CPU; micro-batches above 4 raise the injected OOM errors."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    x, y = torch.randn(32, 16), torch.randn(32, 4)

    def full_grad() -> torch.Tensor:
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        return model.weight.grad.clone()

    expected = full_grad()
    errors = iter([RuntimeError(XLA_OOM), torch.OutOfMemoryError(CUDA_OOM), RuntimeError(XLA_OOM)])
    calls: list[tuple[int, int]] = []

    def step(micro: int, accum: int) -> torch.Tensor:
        calls.append((micro, accum))
        assert micro * accum == 32
        model.zero_grad()
        for i in range(accum):
            if micro > 4:
                raise next(errors)
            sl = slice(i * micro, (i + 1) * micro)
            (torch.nn.functional.mse_loss(model(x[sl]), y[sl]) / accum).backward()
        return model.weight.grad.clone()

    result = run_with_oom_retry(step, micro_batch=32, grad_accum=1)
    assert calls == [(32, 1), (16, 2), (8, 4), (4, 8)]
    assert (result.micro_batch, result.grad_accum, result.effective_batch) == (4, 8, 32)
    torch.testing.assert_close(result.value, expected)
    assert [a["error"] is None for a in result.attempts] == [False, False, False, True]


def test_oom_retry_gives_up_and_passes_other_errors():
    def always_oom(micro: int, accum: int) -> None:
        raise RuntimeError(XLA_OOM)

    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        run_with_oom_retry(always_oom, micro_batch=8, grad_accum=1, min_micro_batch=2)

    seen: list[int] = []

    def oom_then_other(micro: int, accum: int) -> None:
        seen.append(micro)
        raise RuntimeError(XLA_OOM) if micro == 16 else KeyError("input_ids")

    with pytest.raises(KeyError):
        run_with_oom_retry(oom_then_other, micro_batch=16, grad_accum=1)
    assert seen == [16, 8]

    # halving 24 -> 12 would leave the data-parallel multiple of 8: stop there
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        run_with_oom_retry(always_oom, micro_batch=24, grad_accum=1, multiple_of=8)
    with pytest.raises(ValueError, match=r"micro_batch=6.*multiple_of=4"):
        run_with_oom_retry(always_oom, micro_batch=6, grad_accum=1, multiple_of=4)


# ---- against the compiler (XLA:CPU) ----------------------------------------------------


def _compile_memory_log(tmp_path_factory, name):
    """The environment that makes torch_xla log each compiled program's memory analysis."""
    log = tmp_path_factory.mktemp(name) / "compile.log"
    return {"PT_XLA_DEBUG_LEVEL": "1", "PT_XLA_DEBUG_FILE": str(log)}


@pytest.fixture(scope="module")
def compiler_memory(xla_scenario, tmp_path_factory):
    """tests/xla/memory_vs_compiler.py: the compiler's memory analysis of the real training step vs
    the estimate, unsharded; and the compile-only probe that the batch finder uses (it compiles
    without executing)."""
    return xla_scenario("memory_vs_compiler", env=_compile_memory_log(tmp_path_factory, "memory"))


@pytest.mark.slow
@pytest.mark.xla
def test_compiled_training_step_is_two_programs(compiler_memory):
    for _b, _t, _compiler, _est, programs in compiler_memory["rows"]:
        assert programs == 2  # first step (creates the AdamW state), then the steady-state step


@pytest.mark.slow
@pytest.mark.xla
def test_estimate_within_15_percent_of_the_compiler(compiler_memory):
    for b, t, compiler, est, _programs in compiler_memory["rows"]:
        assert abs(est - compiler) / compiler <= 0.15, (b, t, compiler, est)


@pytest.mark.slow
@pytest.mark.xla
def test_compile_only_probe_never_executes(compiler_memory):
    assert compiler_memory["probe_executed"] == 0  # compiled, never run


@pytest.mark.slow
@pytest.mark.xla
def test_estimate_within_15_percent_of_the_compile_only_probe(compiler_memory):
    assert abs(compiler_memory["est16"] - compiler_memory["probed"]) / compiler_memory["probed"] <= 0.15


@pytest.mark.slow
@pytest.mark.xla
def test_batch_finder_with_the_probe_picks_the_batch_that_fits(compiler_memory):
    batch, compiled = compiler_memory["plan"]
    assert batch == 16 and compiled is not None and compiled <= compiler_memory["est16"] * 1.2


@pytest.fixture(scope="module")
def compiler_memory_fsdp(xla_scenario, tmp_path_factory):
    """tests/xla/memory_vs_compiler_fsdp.py: the same step under FSDP over 8 devices."""
    return xla_scenario("memory_vs_compiler_fsdp", env=_compile_memory_log(tmp_path_factory, "memory-fsdp"))


@pytest.mark.slow
@pytest.mark.xla
def test_estimate_within_15_percent_of_the_compiler_under_fsdp(compiler_memory_fsdp):
    compiler, est = compiler_memory_fsdp["compiler"], compiler_memory_fsdp["estimate"]
    assert abs(est - compiler) / compiler <= 0.15


@pytest.mark.slow
@pytest.mark.xla
def test_compiler_sees_an_eighth_of_weights_and_state_under_fsdp(compiler_memory_fsdp):
    args, params = compiler_memory_fsdp["arguments"], compiler_memory_fsdp["params"]
    assert args < 4 * params  # the compiler sees 1/8 of the weights and state per device


@pytest.mark.slow
@pytest.mark.xla
def test_fsdp_step_needs_under_a_third_of_the_unsharded_memory(compiler_memory_fsdp):
    assert compiler_memory_fsdp["compiler"] < compiler_memory_fsdp["single"] / 3


def test_a_pretrained_path_is_read_from_its_own_config(tmp_path):
    model = build_model(_cfg(family="qwen2", hidden_size=32, intermediate_size=64))
    model.save_pretrained(tmp_path / "ckpt")
    cfg = ModelConfig(family="llama", pretrained_path=str(tmp_path / "ckpt"))  # family/sizes come from disk
    shape = model_shape(cfg)
    assert shape.family == "qwen2" and shape.hidden == 32
    assert shape.num_parameters == count_parameters(model)


def test_compile_memory_log_is_parsed(tmp_path, monkeypatch):
    """The block torch_xla 2.9 writes after each compile (debug_util.cpp), values in GiB."""
    from workbench.backend.xla import compile_log

    log = tmp_path / "compile.log"
    monkeypatch.setenv("PT_XLA_DEBUG_LEVEL", "0")
    monkeypatch.setenv("PT_XLA_DEBUG_FILE", "")
    assert compile_log.compile_memory_log_path() is None
    monkeypatch.delenv("PT_XLA_DEBUG_LEVEL")
    compile_log.enable_compile_log(log)
    assert compile_log.compile_memory_log_path() == str(log)
    assert compile_log.compiled_memory_records() == []
    block = (
        "\nComputation hash: 1f2e\n\nPost Compilation Analysis: " + "=" * 80 + "\n"
        "Post Compilation Analysis: Graph input size: 0.001562 GB\n"
        "Post Compilation Analysis: Graph output size: 0.001560 GB\n"
        "Post Compilation Analysis: Aliased Input size: 0.001560 GB\n"
        "Post Compilation Analysis: Intermediate tensor size: 0.004768 GB\n"
        "Post Compilation Analysis: Compiled program size: 0.000100 GB\n"
        "Post Compilation Analysis: " + "-" * 80 + "\n"
    )
    log.write_text("Compilation Analysis: noise\n" + block + block.replace("0.004768", "0.009537"))
    first, second = compile_log.compiled_memory_records()
    assert first.argument_bytes == round(0.001562 * 2**30) and first.temp_bytes == round(0.004768 * 2**30)
    assert (
        first.peak_bytes == first.argument_bytes + first.output_bytes - first.alias_bytes + first.temp_bytes
    )
    assert second.temp_bytes > first.temp_bytes


def test_fit_across_targets_plans_each_slice_with_fsdp_over_its_devices():
    from types import SimpleNamespace

    cfg = ModelConfig(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512)
    gib = 1024**3
    targets = {
        "one chip": SimpleNamespace(num_devices=1, memory_per_device_bytes=16 * gib),
        "eight chips": SimpleNamespace(num_devices=8, memory_per_device_bytes=16 * gib),
        "tiny": SimpleNamespace(num_devices=1, memory_per_device_bytes=1024),
        "unknown": SimpleNamespace(num_devices=2, memory_per_device_bytes=None),
    }
    rows = {r["target"]: r for r in fit_across_targets(cfg, targets, batch_size=6, seq_len=128)}
    one, eight = rows["one chip"], rows["eight chips"]
    assert (one["batch_size"], eight["batch_size"]) == (6, 8)  # rounded up to whole sequences per device
    single = estimate(cfg, batch_size=6, seq_len=128)
    assert one["gib_per_device"] == round(single.total_gib, 3) and one["fits"]
    assert eight["gib_per_device"] < one["gib_per_device"]  # FSDP spreads weights and state
    assert eight["largest_batch"] % 8 == 0 and eight["largest_batch"] > one["largest_batch"]
    assert rows["tiny"]["fits"] is False and rows["tiny"]["largest_batch"] == 0
    assert rows["unknown"]["fits"] is None and rows["unknown"]["largest_batch"] is None


# ---- LoRA -----------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gpt2", "phi3"])
def test_lora_estimate_counts_the_adapters_a_real_lora_model_trains(family):
    peft = pytest.importorskip("peft")  # noqa: F841
    from workbench.config import LoraConfig
    from workbench.train.lora import apply_lora, parameter_counts

    cfg = _cfg(family=family)
    lora = apply_lora(build_model(cfg, seed=0), LoraConfig(rank=8))
    trainable, total = parameter_counts(lora)
    est = estimate(cfg, batch_size=2, seq_len=64, lora_rank=8, precision="fp32")
    assert est.trainable_parameters == trainable and est.num_parameters == total - trainable
    only_q = estimate(
        cfg, batch_size=2, seq_len=64, lora_rank=8, lora_targets=["c_attn" if family == "gpt2" else "o_proj"]
    )
    assert 0 < only_q.trainable_parameters < est.trainable_parameters


def test_lora_frozen_weights_have_no_gradients_or_optimizer_state():
    kw = dict(batch_size=4, seq_len=128, precision="bf16", optimizer="adamw")
    full, lora = estimate(TINY, **kw), estimate(TINY, lora_rank=4, **kw)
    adapters = lora.trainable_parameters
    # rank 4 on q, k, v, o, gate, up, down of 2 layers (hidden 64, kv 32, MLP 128)
    assert adapters == 2 * 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 128))
    assert lora.breakdown["params"] == full.breakdown["params"] + 4 * adapters  # adapters stay fp32
    assert lora.breakdown["grads"] == 4 * adapters
    assert lora.breakdown["optimizer"] == 2 * 4 * adapters  # AdamW: two fp32 moments per adapter weight
    for part in ("activations", "logits", "inputs"):  # the backward pass still runs through every layer
        assert lora.breakdown[part] == full.breakdown[part]
    sgd = estimate(TINY, lora_rank=4, **{**kw, "optimizer": "sgd"})
    assert sgd.breakdown["optimizer"] == 4 * adapters
    assert full.lora_rank == 0 and full.trainable_parameters == full.num_parameters
    with pytest.raises(ValueError, match=r"lora_targets \['q_prj'\] match no matrix of this llama model"):
        estimate(TINY, lora_rank=4, lora_targets=["q_prj"], **kw)
    with pytest.raises(ValueError, match=r"lora_rank=-1 is not allowed"):
        estimate(TINY, lora_rank=-1, **kw)


def test_a_7b_model_with_lora_fits_a_v5e_1_where_full_fine_tuning_does_not():
    """Llama-2-7B's shape with its real vocabulary (32000) on one v5e chip (16 GiB): bf16 weights,
    AdamW, gradient checkpointing, 512-token sequences, LoRA rank 16 on every projection."""
    from workbench.backend.targets import TARGETS
    from workbench.models.presets import MODEL_PRESETS

    cfg = ModelConfig(**MODEL_PRESETS["Llama-2-7B shape"], vocab_size=32000)
    memory = TARGETS["v5e-1"].memory_per_device_bytes
    kw = dict(seq_len=512, precision="bf16", optimizer="adamw", gradient_checkpointing=True)
    lora = estimate(cfg, batch_size=1, lora_rank=16, **kw)
    full = estimate(cfg, batch_size=1, **kw)
    assert lora.fits(memory) and not full.fits(memory)
    assert 39e6 < lora.trainable_parameters < 41e6  # rank 16 on q, k, v, o, gate, up, down: 40.0M
    assert 13 < lora.total_gib < 14.4 < 50 < full.total_gib
    assert max_batch_size(cfg, memory_bytes=memory, lora_rank=16, **kw) == 2
    assert max_batch_size(cfg, memory_bytes=memory, **kw) == 0
    plan = find_batch_size(cfg, memory_bytes=memory, lora_rank=16, **kw)
    assert plan.batch_size == 2 and plan.estimate.lora_rank == 16
    assert find_batch_size(cfg, memory_bytes=memory, **kw).batch_size == 0
