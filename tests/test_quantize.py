"""``model.quantize``: frozen base weights as int8 / packed int4 under LoRA (workbench/models/quantize.py).

The numbers (round trips, packing), the layer (forward and input gradient equal a Linear with the
dequantized weight; only integers saved for backward), the model swap (layer by layer, tied head
kept), LoRA on top (trains on CPU, exports merged bf16 and adapters the plain base loads), the
sharding plan (scales follow their weight), the quality bound on the quickstart's trained model,
and on XLA:CPU the real Trainer on one device and on a data x fsdp x model mesh
(tests/xla/quantize_training.py) and the compiler's memory figures (tests/xla/quantize_memory.py).
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import weakref

import pytest
import torch
import torch.nn.functional as F

from tests.test_lora import lora_cfg, lora_data, tiny
from tests.test_train import VOCAB
from workbench.backend.xla.runtime import XLA_CPU_MEMORY_SCHEDULER
from workbench.models.quantize import (
    QuantizedLinear,
    dequantize_weight,
    int4_block_size,
    pack_int4,
    quantize_model,
    quantize_weight,
    quantized_layers,
    quantized_weight_bytes,
    unpack_int4,
)
from workbench.train import Trainer

peft = pytest.importorskip("peft")

from workbench.train.adapter_files import (  # noqa: E402  (after the peft check)
    base_model_identity,
    load_adapter,
)
from workbench.train.lora import parameter_counts  # noqa: E402  (after the peft check)

MODES = ("int8", "int4")


def gaussian(out_features: int, in_features: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed))


# ---- the numbers ------------------------------------------------------------------------------------


def test_int8_round_trip_is_within_half_a_step_of_each_row():
    w = gaussian(48, 96)
    w[3] = 0.0  # an all-zero row: scale 1, zeros back
    q, scale = quantize_weight(w, "int8")
    assert (
        q.dtype == torch.int8
        and q.shape == (48, 96)
        and scale.dtype == torch.float32
        and scale.shape == (48,)
    )
    torch.testing.assert_close(scale[:3], w[:3].abs().amax(1) / 127)
    assert scale[3] == 1 and not q[3].any()
    error = (dequantize_weight(q, scale, "int8") - w).abs()
    assert (error <= scale[:, None] / 2 + 1e-6).all()
    assert error.norm() / w.norm() < 0.01  # about 0.5% for Gaussian rows


@pytest.mark.parametrize(("in_features", "block"), [(256, 128), (192, 64), (36, 4)])
def test_int4_round_trip_is_within_half_a_step_of_each_block(in_features, block):
    w = gaussian(8, in_features)
    assert int4_block_size(in_features) == block
    packed, scale = quantize_weight(w, "int4")
    assert packed.dtype == torch.uint8 and packed.shape == (8, in_features // 2)
    assert scale.shape == (8, in_features // block)
    blocks = w.reshape(8, -1, block)
    torch.testing.assert_close(scale, blocks.abs().amax(-1) / 7)
    error = (dequantize_weight(packed, scale, "int4") - w).reshape(8, -1, block).abs()
    assert (error <= scale[..., None] / 2 + 1e-6).all()
    assert quantized_weight_bytes(8, in_features, "int4") == packed.numel() + scale.numel() * 4


def test_int4_packs_the_even_element_in_the_low_nibble():
    values = torch.tensor([[-8, -1, 0, 7, 3, -5]], dtype=torch.int8)
    packed = pack_int4(values)
    # (-1 << 4 | -8 & 0xF) = 0xF8, (7 << 4 | 0) = 0x70, (-5 & 0xF) << 4 | 3 = 0xB3
    assert packed.tolist() == [[0xF8, 0x70, 0xB3]]
    every = torch.arange(-8, 8, dtype=torch.int8).repeat(3, 2)
    assert torch.equal(unpack_int4(pack_int4(every)), every)
    # a shard of the packed dimension unpacks on its own into the matching unpacked columns
    assert torch.equal(unpack_int4(pack_int4(every)[:, 4:8]), every[:, 8:16])


def test_int4_refuses_an_odd_number_of_input_features_naming_the_layer():
    with pytest.raises(ValueError, match=r"in_features=33 \(33 in -> 8 out\).*use model.quantize=int8"):
        QuantizedLinear.from_linear(torch.nn.Linear(33, 8), "int4")
    model = torch.nn.Sequential(torch.nn.Linear(8, 33), torch.nn.Linear(33, 4))
    with pytest.raises(ValueError, match=r"^layer 1: model.quantize='int4' cannot store"):
        quantize_model(model, "int4")
    quantize_model(model, "int8")  # int8 has no such limit
    assert isinstance(model[1], QuantizedLinear)


# ---- the layer --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bias", [False, True])
def test_forward_and_input_gradient_equal_a_linear_with_the_dequantized_weight(mode, bias):
    linear = torch.nn.Linear(64, 24, bias=bias)
    layer = QuantizedLinear.from_linear(linear, mode)
    weight = layer.dequantize(torch.float32)
    x = torch.randn(3, 5, 64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y = layer(x)
    y_ref = F.linear(x_ref, weight, linear.bias)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    dy = torch.randn_like(y)
    y.backward(dy)
    y_ref.backward(dy)
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
    assert layer.weight.grad is None and layer.weight_scale.grad is None
    # bf16 activations: the matmul runs in bf16, as a bf16 Linear would
    y16 = layer(x.detach().bfloat16())
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.float(), y_ref.detach(), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("mode", MODES)
def test_backward_saves_the_integers_and_scales_never_a_dequantized_weight(mode):
    layer = QuantizedLinear.from_linear(torch.nn.Linear(64, 32), mode)
    saved: list[torch.Tensor] = []
    x = torch.randn(4, 64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        layer(x).sum().backward()
    big = [(t.dtype, tuple(t.shape)) for t in saved if t.numel() >= 64 * 32 // 2]
    assert big == [(layer.weight.dtype, tuple(layer.weight.shape))], big
    assert all(t.data_ptr() in (layer.weight.data_ptr(), layer.weight_scale.data_ptr()) for t in saved)


def test_weights_and_scales_are_frozen_parameters_under_the_linear_names():
    layer = QuantizedLinear.from_linear(torch.nn.Linear(64, 32, bias=True), "int4")
    params = dict(layer.named_parameters())
    assert list(params) == ["weight", "weight_scale", "bias"]
    assert not params["weight"].requires_grad and not params["weight_scale"].requires_grad
    assert (layer.in_features, layer.out_features, layer.block_size) == (64, 32, 64)
    assert "mode=int4, block_size=64" in repr(layer)


# ---- the model --------------------------------------------------------------------------------------


def test_quantize_model_frees_each_full_precision_weight_before_the_next_layer(monkeypatch):
    model = tiny()
    originals = [
        weakref.ref(m.weight)
        for n, m in model.named_modules()
        if type(m) is torch.nn.Linear and n != "lm_head"
    ]
    alive_at_each_layer: list[int] = []
    from_linear = QuantizedLinear.from_linear.__func__

    def counting(cls, linear, mode):
        alive_at_each_layer.append(sum(r() is not None for r in originals))
        return from_linear(cls, linear, mode)

    monkeypatch.setattr(QuantizedLinear, "from_linear", classmethod(counting))
    summary = quantize_model(model, "int8")
    n = len(originals)
    assert summary.layers == n == 14
    assert alive_at_each_layer == list(range(n, 0, -1))  # one fewer alive at each layer
    assert all(r() is None for r in originals)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tied head is the embedding
    assert summary.kept == ["lm_head (tied to the input embedding)"]
    assert summary.bytes_before == 4 * summary.parameters
    assert summary.bytes_after == summary.parameters + 4 * sum(
        m.out_features for m in quantized_layers(model).values()
    )
    assert "model.quantize=int8: 14 linear layers (18,432 parameters)" in summary.notice()


def test_an_untied_lm_head_is_quantized_too():
    model = tiny(tie_word_embeddings=False)
    summary = quantize_model(model, "int4")
    assert summary.layers == 15 and not summary.kept
    assert isinstance(model.lm_head, QuantizedLinear)
    ids = torch.randint(1, VOCAB, (2, 8))
    assert torch.isfinite(model(input_ids=ids).logits).all()


def test_gpt2s_conv1d_projections_are_kept_and_said_so():
    summary = quantize_model(tiny("gpt2", tie_word_embeddings=False), "int8")
    assert summary.layers == 1  # the untied head
    assert summary.kept == ["8 Conv1D layers (transformer.h.0.attn.c_attn, ...: only nn.Linear is quantized)"]


def test_a_bf16_checkpoint_loads_and_quantizes_without_an_fp32_copy_on_the_host(tmp_path):
    from workbench.config import ModelConfig
    from workbench.models.build import build_model

    tiny().to(torch.bfloat16).save_pretrained(tmp_path)
    cfg = ModelConfig(pretrained_path=str(tmp_path))
    model = build_model(cfg)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # as saved, not upcast to fp32
    summary = quantize_model(model, "int8")
    assert summary.bytes_before == 2 * summary.parameters
    assert {p.dtype for n, p in model.named_parameters() if "proj" not in n} == {torch.bfloat16}


@pytest.mark.parametrize("mode", MODES)
def test_the_quantized_model_keeps_the_base_identity_and_logical_parameter_count(mode):
    plain, quantized = tiny(), tiny()
    quantize_model(quantized, mode)
    assert base_model_identity(quantized) == base_model_identity(plain)
    assert parameter_counts(quantized)[1] == parameter_counts(plain)[1]


# ---- LoRA on a quantized base, on CPU ---------------------------------------------------------------


QUANT_RUN = {"train.batch_size": 8, "train.steps": 8, "train.log_every": 2, "train.learning_rate": 3e-2}


@pytest.fixture(scope="module", params=MODES)
def qlora_run(request):
    """A LoRA run on a quantized tiny llama on plain CPU, with its frozen tensors before it."""
    cfg = lora_cfg(**QUANT_RUN, **{"model.quantize": request.param})
    trainer = Trainer(cfg, train_dataset=lora_data())
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    trainable = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    result = trainer.fit()
    return {
        "mode": request.param,
        "cfg": cfg,
        "trainer": trainer,
        "result": result,
        "frozen": frozen,
        "trainable": trainable,
    }


def test_lora_on_a_quantized_base_trains_only_the_adapters(qlora_run):
    trainer, result, mode = qlora_run["trainer"], qlora_run["result"], qlora_run["mode"]
    losses = [m["loss"] for m in result.history]
    assert losses[-1] < losses[0] - 0.02, losses
    assert any(n.startswith(f"model.quantize={mode}: 14 linear layers") for n in result.notices)
    params = dict(trainer.model.named_parameters())
    assert "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight_scale" in params
    wrapped = trainer.model.base_model.model.model.layers[0].self_attn.q_proj
    assert type(wrapped).__name__ == "QuantizedLoraLinear" and isinstance(wrapped.base_layer, QuantizedLinear)
    assert all(p.dtype == torch.float32 for n, p in params.items() if ".lora_" in n)  # adapters stay fp32
    assert all(torch.equal(params[n], before) for n, before in qlora_run["frozen"].items())
    ints = [n for n, t in qlora_run["frozen"].items() if not t.is_floating_point()]
    assert len(ints) == 14
    assert all(
        not torch.equal(params[n], before) for n, before in qlora_run["trainable"].items() if ".lora_B." in n
    )


def test_the_merged_export_is_a_bf16_checkpoint_of_the_dequantized_merged_weights(qlora_run, tmp_path):
    import transformers as tf

    trainer, mode = qlora_run["trainer"], qlora_run["mode"]
    with pytest.warns(UserWarning, match=rf"dequantized from {mode} to bfloat16"):
        path = trainer.save_pretrained(tmp_path / "merged", merged=True)
    assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"
    merged = tf.AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    assert {p.dtype for p in merged.parameters()} == {torch.bfloat16}
    assert not any("lora" in n or "base_layer" in n or "scale" in n for n, _ in merged.named_parameters())
    # the reference, built by hand: each layer dequantized in fp32, W + (alpha / r) B A, then bf16;
    # embeddings and norms: the frozen base's own (tiny() builds the same), in bf16
    expected = {k: v.bfloat16() for k, v in tiny().state_dict().items()}
    live = trainer.model.base_model.model
    for name, module in live.named_modules():
        if isinstance(module, QuantizedLinear):
            owner = live.get_submodule(name.removesuffix(".base_layer"))
            delta = owner.scaling["default"] * (
                owner.lora_B["default"].weight @ owner.lora_A["default"].weight
            )
            weight = (module.dequantize(torch.float32) + delta).bfloat16()
            assert not torch.equal(weight, expected[name.removesuffix(".base_layer") + ".weight"])
            expected[name.removesuffix(".base_layer") + ".weight"] = weight
    written = merged.state_dict()
    assert written.keys() == expected.keys()
    assert all(torch.equal(written[k], expected[k]) for k in expected)
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    trainer.model.eval()
    with torch.no_grad():
        # and it is the live quantized LoRA model, up to bf16 rounding
        live_logits = trainer.model(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits.float(), live_logits, atol=0.05, rtol=0)


def test_the_adapter_loads_onto_the_plain_base_and_onto_a_quantized_one(qlora_run, tmp_path):
    trainer, mode = qlora_run["trainer"], qlora_run["mode"]
    path = trainer.save_pretrained(tmp_path / "adapter")
    assert "base_layer" not in json.dumps(json.loads((path / "adapter_config.json").read_text()))
    assert os.path.getsize(path / "adapter_model.safetensors") < 8192 + 4 * parameter_counts(trainer.model)[0]
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    trainer.model.eval()
    with torch.no_grad():
        live = trainer.model(input_ids=ids).logits
        plain = peft.PeftModel.from_pretrained(tiny(), str(path)).eval()
        checked = load_adapter(tiny(), path).eval()  # the identity check passes: same logical base
        torch.testing.assert_close(plain(input_ids=ids).logits, checked(input_ids=ids).logits)
        error = (plain(input_ids=ids).logits - live).abs().max().item()
        assert error < (0.02 if mode == "int8" else 0.3), error  # the unquantized base, same adapter
        base = tiny()
        quantize_model(base, mode)
        again = load_adapter(base, path).eval()
        torch.testing.assert_close(again(input_ids=ids).logits, live)


def test_generate_runs_on_a_quantized_lora_model_as_transformers_does(qlora_run):
    from workbench.generate import generate

    model = qlora_run["trainer"].model
    prompts = [[5, 6, 7, 8, 9], [20, 22, 24]]
    ours = generate(model, prompts, max_new_tokens=5, eos_token_id=None).token_ids
    model.eval()
    with torch.no_grad():
        for prompt, tokens in zip(prompts, ours):
            ids = torch.tensor([prompt])
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=5,
                do_sample=False,
                use_cache=True,
            )
            assert out[0, len(prompt) :].tolist() == tokens


def test_scan_accepts_a_quantized_lora_model():
    from workbench.models.scan import check_scannable
    from workbench.train.model_setup import prepare_model

    cfg = lora_cfg(**{"model.quantize": "int4", "model.scan_layers": True})
    model = prepare_model(tiny(), cfg.train, cfg.model, xla=True, lora=cfg.lora)
    assert len(check_scannable(model)) == 2 and len(quantized_layers(model)) == 14


# ---- sharding ---------------------------------------------------------------------------------------


def test_the_plan_gives_scales_their_weights_spec_and_adapters_their_plain_spec():
    from workbench.parallel.plan import plan_sharding
    from workbench.parallel.rules import rules_for
    from workbench.train.lora import apply_lora

    sizes = {"data": 2, "fsdp": 2, "model": 2}

    def plan(mode):
        model = tiny(hidden_size=64, intermediate_size=256, num_heads=4, num_kv_heads=4)
        if mode != "none":
            quantize_model(model, mode)
        lora = apply_lora(model, lora_cfg().lora)
        params = [(n, tuple(p.shape), p.dtype) for n, p in lora.named_parameters()]
        return plan_sharding(params, sizes, rules_for(lora), warn_fallback=False)

    plain, int8, int4 = plan("none"), plan("int8"), plan("int4")
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    down = "base_model.model.model.layers.0.mlp.down_proj"
    assert int8.entry(f"{q}.base_layer.weight").spec == ("model", "fsdp")
    assert int8.entry(f"{q}.base_layer.weight_scale").spec == ("model",)  # per channel: the weight's dim 0
    assert int8.entry(f"{down}.base_layer.weight").spec == ("fsdp", "model")
    assert int8.entry(f"{down}.base_layer.weight_scale").spec == ("fsdp",)
    # int4: down_proj's 256 inputs are 2 blocks of 128, split over model=2: one block a device
    assert int4.entry(f"{down}.base_layer.weight").shape == (64, 128)
    assert int4.entry(f"{down}.base_layer.weight_scale").spec == ("fsdp", "model")
    # q_proj's 64 inputs are one block: its scales cannot split along fsdp and stay whole there
    assert int4.entry(f"{q}.base_layer.weight_scale").shape == (64, 1)
    assert int4.entry(f"{q}.base_layer.weight_scale").spec == ("model", None)
    for report in (int8, int4):  # adapters exactly as on the plain base (the packed shape fools nothing)
        for entry in plain.entries:
            if ".lora_" in entry.name:
                assert report.entry(entry.name).spec == entry.spec, entry.name
        weights = [e for e in report.entries if e.name.endswith("base_layer.weight")]
        logical = sum(plain.entry(e.name).numel for e in weights)
        assert sum(e.bytes for e in weights) / logical == (1.0 if report is int8 else 0.5)


# ---- quality ----------------------------------------------------------------------------------------


def eval_loss(model: torch.nn.Module, batches: list[dict]) -> float:
    from workbench.models.inputs import model_inputs

    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch in batches:
            logits = model(**model_inputs(batch, model)).logits.float()
            labels = batch["labels"][:, 1:]
            total += F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]),
                labels.reshape(-1),
                ignore_index=-100,
                reduction="sum",
            ).item()
            count += int((labels != -100).sum())
    return total / count


def test_the_quickstarts_trained_model_loses_little_eval_loss_quantized():
    from pathlib import Path

    from workbench import WorkbenchConfig

    quickstart = Path(__file__).resolve().parent.parent / "configs" / "quickstart.yaml"
    cfg = WorkbenchConfig.from_yaml(quickstart).with_overrides(
        {"train.device_type": "cpu", "train.steps": 20, "train.progress_bar": False, "data.max_length": 128}
    )
    trainer = Trainer(cfg)
    trainer.fit()
    batches = list(trainer.data.eval_batches(8))
    base = eval_loss(trainer.model, batches)
    change = {}
    for mode in MODES:
        model = copy.deepcopy(trainer.model)
        quantize_model(model, mode)
        change[mode] = eval_loss(model, batches) / base - 1
    print(
        f"quickstart eval loss {base:.4f}; quantized: "
        + ", ".join(f"{m} {c:+.3%}" for m, c in change.items())
    )
    assert abs(change["int8"]) < 0.005 and abs(change["int4"]) < 0.03


@pytest.mark.parametrize(("mode", "bound"), [("int8", 0.01), ("int4", 0.15)])
def test_a_layer_of_real_width_keeps_its_outputs(mode, bound):
    # Llama-1B widths (2048 -> 8192) with a Gaussian weight at its init scale and Gaussian inputs
    linear = torch.nn.Linear(2048, 8192, bias=False)
    torch.nn.init.normal_(linear.weight, std=0.02, generator=torch.Generator().manual_seed(0))
    x = torch.randn(16, 2048, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = linear(x)
        got = QuantizedLinear.from_linear(linear, mode)(x)
    error = ((got - expected).norm() / expected.norm()).item()
    print(f"{mode}: relative output error {error:.4f} at 2048 -> 8192")
    assert error < bound


# ---- on XLA:CPU -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_device(xla_scenario):
    return xla_scenario("quantize_training", devices=1, modes=list(MODES), mesh=False, scan=True)


@pytest.fixture(scope="module")
def mesh(xla_scenario):
    return xla_scenario("quantize_training", modes=list(MODES), mesh=True)


def _check_run(run: dict, mode: str) -> None:
    losses = run["losses"]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 0.02, losses
    assert run["compiles_after_warmup"] == 0
    # two reads a log interval (loss and grad norm, at the log step): none in the steps between
    at = run["transfers_at_log"]
    assert [b - a for a, b in itertools.pairwise(at)] == [2] * (len(at) - 1), at
    assert run["base_unchanged"] and run["layers"] == 14
    assert run["integer_dtypes"] == ["torch.int8" if mode == "int8" else "torch.uint8"]


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_xla_one_device_quantized_lora_trains_without_recompiles_or_transfers(one_device, mode):
    _check_run(one_device[mode], mode)
    first, again, compiles = one_device[mode]["generated"]
    assert first == again and compiles == 0 and all(len(t) == 6 for t in first)


@pytest.mark.xla
@pytest.mark.slow
def test_xla_scanned_layers_train_a_quantized_base_like_the_unrolled_stack(one_device):
    _check_run(one_device["int4-scan"], "int4")
    assert one_device["int4-scan"]["losses"] == pytest.approx(one_device["int4"]["losses"], abs=1e-4)


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_xla_mesh_quantized_lora_shards_integers_and_scales(mesh, mode):
    run = mesh[mode]
    _check_run(run, mode)
    assert not run["fallbacks"]
    assert run["bytes_per_param"] == (1.0 if mode == "int8" else 0.5)
    assert run["device_bytes_per_param"] == run["bytes_per_param"] / 4  # split over model x fsdp
    q = "base_model.model.model.layers.0.self_attn.q_proj.base_layer"
    assert run["specs"][f"{q}.weight"] == ["model", "fsdp"]
    assert run["specs"][f"{q}.weight_scale"][0] == "model"
    packed = 16 if mode == "int4" else 32  # q_proj is 32 -> 32: [32, 32] int8 or [32, 16] packed
    assert run["local_shapes"][f"{q}.weight"] == [16, packed // 2]
    assert run["local_shapes"][f"{q}.weight_scale"][0] == 16


@pytest.mark.xla
@pytest.mark.slow
def test_xla_compiled_step_holds_integers_and_no_full_precision_copy_of_the_base(xla_scenario):
    flags = {"XLA_FLAGS": XLA_CPU_MEMORY_SCHEDULER}  # see the scenario
    runs = xla_scenario("quantize_memory", devices=1, env=flags)
    none = runs["none"]
    params = runs["int8"]["quantized_params"]
    for mode, per_param in (("int8", 1.0), ("int4", 0.5)):
        run = runs[mode]
        # the base's argument bytes: the run's, less everything that is not the base (the fp32 run's
        # arguments less its fp32 base)
        base_bytes = run["argument_bytes"] - (none["argument_bytes"] - 4 * params)
        print(
            f"{mode}: base {base_bytes / params:.3f} bytes/param (args {run['argument_bytes']}), temp "
            f"{run['temp_bytes']} vs unquantized {none['temp_bytes']}, base fp32 {4 * params}"
        )
        assert base_bytes == pytest.approx(params * per_param + run["scale_bytes"], rel=0.02)
        # temporaries: at most half a bf16 copy of the base above the unquantized step's
        assert run["temp_bytes"] - none["temp_bytes"] < params
