"""Sharding any `transformers` family by its own tensor-parallel plan (`workbench.parallel.tp_plan`),
PEFT LoRA models included (`workbench.parallel.plan`).

Shapes only here: every plan style's spec, the registry families' plans against the hand tables
they replace, the FSDP-only fallback, LoRA adapters following their base layers. Below, the proof
on 8 virtual XLA:CPU devices (tests/xla/tp_plan_training.py, one process): each family in
`PROVEN` trains three AdamW steps on data=2 x fsdp=2 x model=2 with the losses of plain CPU torch,
each device holding about a quarter of the parameter bytes.
"""

from __future__ import annotations

import warnings

import pytest
import transformers

from tests.tiny import tiny
from tests.xla.tp_plan_training import build
from workbench.models.build import build_model
from workbench.parallel.apply import transposed_weights
from workbench.parallel.plan import lora_spec, plan_sharding, rule_name
from workbench.parallel.rules import DECODER_RULES, rules_for
from workbench.parallel.sharding_rule import (
    FSDP_FALLBACK,
    FSDP_ONLY_RULES,
    HAND_RULE,
    TP_PLAN,
    RuleTable,
    rule,
)
from workbench.parallel.tp_plan import STYLE_LAYOUTS, layout_spec, plan_rules, tp_plan_rules

SIZES = {"data": 1, "fsdp": 2, "model": 2}
LOSS_TOLERANCE = 1e-4  # as tests/test_sharding.py: fp32, sharded sums add in another order (~1e-6 seen)

# Dense decoder LMs whose transformers config declares base_model_tp_plan, proven on XLA below.
PROVEN = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo2",
    "cohere",
    "granite",
    "starcoder2",
    "helium",
    "glm",
    "gpt_neox",
    "phi",
)
NO_PLAN = ("stablelm",)  # no plan, no hand rules: FSDP only, noted, never an error
LORA = ("llama", "gpt2")  # a tp-plan family and the hand-ruled Conv1D family


def params_of(model) -> list[tuple[str, tuple[int, ...], object]]:
    return [(n, tuple(p.shape), p.dtype) for n, p in model.named_parameters()]


def plan(params, rules, sizes=SIZES, **kwargs):
    return plan_sharding(params, sizes, rules, **kwargs)


def installed(names: tuple[str, ...]) -> list[str]:
    return [name for name in names if name in transformers.CONFIG_MAPPING]


# ---- every style, shapes only -----------------------------------------------------------


def test_every_style_maps_to_a_layout_or_fsdp_only():
    # nn.Linear weight [out, in]: colwise splits out (dim 0) and the bias, rowwise in (dim 1).
    assert layout_spec("colwise", 2) == ("model", None) and layout_spec("colwise", 1) == ("model",)
    assert layout_spec("rowwise", 2) == (None, "model") and layout_spec("rowwise", 1) is None
    assert layout_spec("colwise", 3) == (None, "model", None)  # stacked experts [E, out, in]
    assert layout_spec("rowwise", 3) == (None, None, "model")
    assert layout_spec("vocab", 2) == ("model", None) and layout_spec("hidden", 2) == (None, "model")
    assert layout_spec("experts", 3) == ("model", None, None)
    assert layout_spec("replicated", 2) == (None, None) and layout_spec("replicated", 1) is None
    for style in ("colwise", "colwise_rep", "colwise_gather_output", "packed_colwise", "local_colwise"):
        assert STYLE_LAYOUTS[style] == "colwise", style
    for style in ("rowwise", "rowwise_rep", "rowwise_split_input", "packed_rowwise", "local_rowwise"):
        assert STYLE_LAYOUTS[style] == "rowwise", style
    for style in ("replicate", "replicated_with_grad_allreduce", "sequence_parallel", "moe_tp_experts"):
        assert STYLE_LAYOUTS[style] == "replicated", style


STYLE_PLAN = {
    "embed_tokens": "embedding_rowwise",
    "layers.*.attn.q_proj": "colwise",
    "layers.*.attn.k_proj": "colwise_rep",
    "layers.*.attn.v_proj": "colwise_gather_output",
    "layers.*.attn.o_proj": "rowwise_split_input",
    "layers.*.attn.q_norm": "replicated_with_grad_allreduce",
    "layers.*.attn.sinks": "colwise",
    "layers.*.attn": "local_params",
    "layers.*.mlp.gate_up_proj": "packed_colwise",
    "layers.*.mlp.down_proj": "rowwise",
    "layers.*.moe.experts.gate_up_proj": "packed_colwise",
    "layers.*.moe.experts.down_proj": "rowwise",
    "layers.*.moe.experts": "moe_tp_experts",
    "layers.*.moe.grouped": "grouped_gemm",
    "layers.*.odd": "some_future_style",
    "lm_head": "colwise_gather_output",
    "pos_embed": "embedding_colwise",
}
STYLE_PARAMS = [
    ("model.embed_tokens.weight", (64, 16)),
    ("model.pos_embed.weight", (32, 16)),
    ("model.layers.0.attn.q_proj.weight", (16, 16)),
    ("model.layers.0.attn.q_proj.bias", (16,)),
    ("model.layers.0.attn.k_proj.weight", (8, 16)),
    ("model.layers.0.attn.v_proj.weight", (8, 16)),
    ("model.layers.0.attn.o_proj.weight", (16, 16)),
    ("model.layers.0.attn.o_proj.bias", (16,)),
    ("model.layers.0.attn.q_norm.weight", (4,)),
    ("model.layers.0.attn.sinks", (4,)),
    ("model.layers.0.mlp.gate_up_proj.weight", (64, 16)),
    ("model.layers.0.mlp.down_proj.weight", (16, 32)),
    ("model.layers.0.moe.experts.gate_up_proj", (4, 64, 16)),
    ("model.layers.0.moe.experts.down_proj", (4, 16, 32)),
    ("model.layers.0.moe.grouped.weight", (4, 8, 6)),
    ("model.layers.0.odd.weight", (8, 16)),
    ("model.norm.weight", (16,)),
    ("lm_head.weight", (64, 16)),
]
STYLE_SPECS = {
    "model.embed_tokens.weight": ("model", "fsdp"),  # vocabulary split
    "model.pos_embed.weight": ("fsdp", "model"),  # hidden split
    "model.layers.0.attn.q_proj.weight": ("model", "fsdp"),
    "model.layers.0.attn.q_proj.bias": ("model",),
    "model.layers.0.attn.k_proj.weight": ("model", "fsdp"),
    "model.layers.0.attn.v_proj.weight": ("model", "fsdp"),
    "model.layers.0.attn.o_proj.weight": ("fsdp", "model"),
    "model.layers.0.attn.o_proj.bias": (None,),  # added after the reduction
    "model.layers.0.attn.q_norm.weight": (None,),
    "model.layers.0.attn.sinks": ("model",),  # its own key wins over the module's local_params
    "model.layers.0.mlp.gate_up_proj.weight": ("model", "fsdp"),
    "model.layers.0.mlp.down_proj.weight": ("fsdp", "model"),
    "model.layers.0.moe.experts.gate_up_proj": (None, "model", "fsdp"),
    "model.layers.0.moe.experts.down_proj": (None, "fsdp", "model"),
    "model.layers.0.moe.grouped.weight": ("model", "fsdp", None),  # experts split
    "model.layers.0.odd.weight": (None, "fsdp"),  # unknown style: FSDP only
    "model.norm.weight": (None,),
    "lm_head.weight": ("model", "fsdp"),
}


def test_plan_rules_give_each_style_its_spec():
    rules, notes = plan_rules(STYLE_PLAN)
    table = RuleTable([*rules, *FSDP_ONLY_RULES], notes)
    report = plan([(n, s, "float32") for n, s in STYLE_PARAMS], table)
    assert {e.name: e.spec for e in report.entries} == STYLE_SPECS
    assert report.entry("model.layers.0.odd.weight").source == FSDP_FALLBACK
    assert report.entry("model.norm.weight").source == FSDP_FALLBACK
    assert report.entry("model.layers.0.attn.q_proj.weight").source == TP_PLAN
    assert report.notes == [
        "tp plan style 'some_future_style' of 'layers.*.odd' is not mapped here: FSDP only"
    ]
    text = report.table()
    assert (
        "note: tp plan style 'some_future_style'" in text
        and "rules from: tp plan 16, fsdp fallback 2" in text
    )
    assert " source " in text.splitlines()[0]


def test_plan_keys_match_under_any_prefix_and_through_peft_wrappers():
    rules, _ = plan_rules({"layers.*.self_attn.q_proj": "colwise"})
    names = [
        ("layers.3.self_attn.q_proj.weight", (16, 8)),
        ("model.layers.3.self_attn.q_proj.weight", (16, 8)),
        ("base_model.model.model.layers.3.self_attn.q_proj.base_layer.weight", (16, 8)),
        ("model.layers.3.self_attn.q_proj_extra.weight", (16, 8)),  # another module
        ("model.layers.3.self_attn.q_proj.inner.weight", (16, 8)),  # a child's parameter
    ]
    report = plan([(n, s, "float32") for n, s in names], [*rules, *FSDP_ONLY_RULES])
    assert [e.spec for e in report.entries] == [("model", "fsdp")] * 3 + [("fsdp", None)] * 2
    assert rule_name("a.q_proj.base_layer.weight") == "a.q_proj.weight"
    assert rule_name("lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert rule_name("lm_head.original_module.weight") == "lm_head.weight"


# ---- the registry's families: plan == the hand tables it replaces -------------------------

REGISTRY_PLAN_FAMILIES = ("llama", "qwen2", "mistral", "gemma", "gemma2", "gemma3_text", "qwen3", "phi3")
PHI3_FUSED = (
    rule(r"self_attn\.qkv_proj\.weight$", ("model", None)),
    rule(r"mlp\.gate_up_proj\.weight$", ("model", None)),
)


@pytest.mark.parametrize("family", installed(REGISTRY_PLAN_FAMILIES))
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_registry_families_plan_as_the_hand_tables_did(family, tied):
    model = build_model(tiny(family, tie_word_embeddings=tied))
    params = params_of(model)
    hand = (*PHI3_FUSED, *DECODER_RULES) if family == "phi3" else DECODER_RULES
    derived = plan(params, rules_for(model), {"data": 2, "fsdp": 2, "model": 2})
    by_hand = plan(params, hand, {"data": 2, "fsdp": 2, "model": 2})
    assert [e.spec for e in derived.entries] == [e.spec for e in by_hand.entries]
    assert derived.entry("model.layers.0.self_attn.o_proj.weight").source == TP_PLAN
    by_type = plan(params, rules_for(family), {"data": 2, "fsdp": 2, "model": 2})  # no model at hand
    assert [e.spec for e in by_type.entries] == [e.spec for e in derived.entries]


def test_gpt2_keeps_its_hand_table():
    model = build_model(tiny("gpt2"))
    report = plan(params_of(model), rules_for(model))
    assert set(report.sources()) == {HAND_RULE}
    assert tp_plan_rules(model) is None  # transformers declares no plan for GPT-2


@pytest.mark.parametrize("model_type", installed(NO_PLAN))
def test_a_family_without_plan_or_hand_rules_gets_fsdp_only_and_a_note(model_type):
    model = build(model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = plan(params_of(model), rules_for(model))
    assert set(report.sources()) == {FSDP_FALLBACK} and report.fallbacks == []
    assert not any("model" in str(e.spec) for e in report.entries)
    assert report.notes and f"{model_type!r} has no tensor-parallel plan" in report.notes[0]
    assert "note: model_type" in report.table()


@pytest.mark.parametrize("model_type", installed(PROVEN))
def test_proven_families_declare_a_plan_that_covers_every_linear(model_type):
    model = build(model_type)
    report = plan(params_of(model), rules_for(model))
    assert report.fallbacks == []
    for e in report.entries:
        if len(e.shape) == 2:  # every matrix: split over model and fsdp
            assert e.fraction == pytest.approx(1 / 4), e
            assert e.source in (TP_PLAN, HAND_RULE), e


# ---- LoRA adapters, shapes only -----------------------------------------------------------


def test_lora_spec_follows_the_base_layer():
    col, row = ("model", "fsdp"), ("fsdp", "model")
    # Linear [out, in]; lora_A [r, in], lora_B [out, r]
    assert lora_spec("lora_A", (8, 64), (128, 64), col, False) == (None, None)
    assert lora_spec("lora_B", (128, 8), (128, 64), col, False) == ("model", None)
    assert lora_spec("lora_A", (8, 128), (64, 128), row, False) == (None, "model")
    assert lora_spec("lora_B", (64, 8), (64, 128), row, False) == (None, None)
    # Conv1D [in, out]: named, or told apart by the shapes when not square
    assert lora_spec("lora_B", (64, 8), (64, 64), ("fsdp", "model"), True) == ("model", None)
    assert lora_spec("lora_B", (192, 8), (64, 192), ("fsdp", "model"), False) == ("model", None)
    # embedding [vocab, hidden]: lora_embedding_A [r, vocab], lora_embedding_B [hidden, r]
    assert lora_spec("lora_embedding_A", (8, 256), (256, 64), col, False) == (None, "model")
    assert lora_spec("lora_embedding_B", (64, 8), (256, 64), col, False) == (None, None)
    assert lora_spec("lora_magnitude_vector", (128,), (128, 64), col, False) == ("model",)


LORA_PARAMS = [
    ("m.embed_tokens.base_layer.weight", (256, 64)),
    ("m.embed_tokens.lora_embedding_A.default", (8, 256)),
    ("m.embed_tokens.lora_embedding_B.default", (64, 8)),
    ("m.layers.0.self_attn.q_proj.base_layer.weight", (64, 64)),
    ("m.layers.0.self_attn.q_proj.lora_A.default.weight", (8, 64)),
    ("m.layers.0.self_attn.q_proj.lora_B.default.weight", (64, 8)),
    ("m.layers.0.self_attn.o_proj.lora_A.default.weight", (8, 64)),  # before its base: order is free
    ("m.layers.0.self_attn.o_proj.base_layer.weight", (64, 64)),
    ("m.layers.0.self_attn.o_proj.lora_B.default.weight", (64, 8)),
    ("m.layers.0.mlp.up_proj.base_layer.weight", (128, 64)),
    ("m.layers.0.mlp.up_proj.lora_A.default.weight", (3, 64)),  # an odd rank
    ("m.layers.0.mlp.up_proj.lora_B.default.weight", (128, 3)),
    ("m.layers.0.mlp.down_proj.weight", (64, 128)),  # not adapted
]
LORA_SPECS = {
    "m.embed_tokens.base_layer.weight": ("model", "fsdp"),
    "m.embed_tokens.lora_embedding_A.default": ("fsdp", "model"),
    "m.embed_tokens.lora_embedding_B.default": ("fsdp", None),
    "m.layers.0.self_attn.q_proj.base_layer.weight": ("model", "fsdp"),
    "m.layers.0.self_attn.q_proj.lora_A.default.weight": (None, "fsdp"),
    "m.layers.0.self_attn.q_proj.lora_B.default.weight": ("model", "fsdp"),
    "m.layers.0.self_attn.o_proj.lora_A.default.weight": ("fsdp", "model"),
    "m.layers.0.self_attn.o_proj.base_layer.weight": ("fsdp", "model"),
    "m.layers.0.self_attn.o_proj.lora_B.default.weight": ("fsdp", None),
    "m.layers.0.mlp.up_proj.base_layer.weight": ("model", "fsdp"),
    "m.layers.0.mlp.up_proj.lora_A.default.weight": (None, "fsdp"),
    "m.layers.0.mlp.up_proj.lora_B.default.weight": ("model", None),  # rank 3: no fsdp, no error
    "m.layers.0.mlp.down_proj.weight": ("fsdp", "model"),
}


def test_lora_adapters_get_specs_consistent_with_their_base():
    report = plan([(n, s, "float32") for n, s in LORA_PARAMS], tp_plan_rules("llama"))
    assert {e.name: e.spec for e in report.entries} == LORA_SPECS
    assert [e.name for e in report.entries] == [n for n, _ in LORA_PARAMS]
    adapter = report.entry("m.layers.0.self_attn.q_proj.lora_B.default.weight")
    assert adapter.source == TP_PLAN and "like its base" in adapter.note
    # no model axis: adapters are FSDP-only like everything else
    flat = plan([(n, s, "float32") for n, s in LORA_PARAMS], tp_plan_rules("llama"), {"fsdp": 4, "model": 1})
    assert flat.entry("m.layers.0.self_attn.q_proj.lora_B.default.weight").spec == ("fsdp", None)


def _without_peft(name: str) -> str:
    return rule_name(name).removeprefix("base_model.model.")


@pytest.mark.parametrize("model_type", LORA)
def test_a_peft_model_shards_its_base_weights_as_without_lora(model_type):
    pytest.importorskip("peft")
    plain = build(model_type)
    lora = build(model_type, lora=True)
    sizes = {"data": 2, "fsdp": 2, "model": 2}
    expected = {e.name: e.spec for e in plan(params_of(plain), rules_for(plain), sizes).entries}
    report = plan(params_of(lora), rules_for(lora), sizes, transposed=transposed_weights(lora))
    adapters = [e for e in report.entries if ".lora_" in e.name]
    assert adapters and report.fallbacks == []
    for e in report.entries:
        if ".lora_" not in e.name:
            assert e.spec == expected[_without_peft(e.name)], e.name
    # column-parallel bases: lora_B split like the output; row-parallel: lora_A like the input
    for e in adapters:
        kind = "A" if ".lora_A." in e.name else "B"
        layer = e.name.split(f".lora_{kind}.")[0].rsplit(".", 1)[-1]
        if layer in ("q_proj", "c_attn"):  # column-parallel: lora_B [out, r] split like the output
            assert e.spec == (("model", "fsdp") if kind == "B" else (None, "fsdp")), e.name
        if layer in ("o_proj", "c_proj"):  # row-parallel: lora_A [r, in] split like the input
            assert e.spec == (("fsdp", "model") if kind == "A" else ("fsdp", None)), e.name


# ---- the proof: real SPMD on 8 virtual XLA:CPU devices ------------------------------------


@pytest.fixture(scope="module")
def trained(xla_scenario):
    """tests/xla/tp_plan_training.py: every family here, one after another, in one SPMD process."""
    peft_missing = False
    try:
        import peft  # noqa: F401
    except ImportError:
        peft_missing = True
    return xla_scenario(
        "tp_plan_training",
        timeout=2400,
        families=installed(PROVEN + NO_PLAN),
        lora_families=[] if peft_missing else list(LORA),
    )


def _runs(trained, names, section="families"):
    runs = [(name, trained[section].get(name)) for name in names]
    missing = [name for name, run in runs if run is None]
    if missing:
        pytest.skip(f"not run here (transformers/peft lacks them): {missing}")
    return runs


def test_at_least_twelve_families_are_proven():
    assert len(set(PROVEN)) >= 12 and not set(PROVEN) & set(NO_PLAN)


@pytest.mark.slow
@pytest.mark.xla
@pytest.mark.parametrize("model_type", PROVEN + NO_PLAN)
def test_sharded_losses_equal_plain_cpu_torch(trained, model_type):
    ((_name, run),) = _runs(trained, [model_type])
    assert run["cpu"][-1] < run["cpu"][0], "the reference run must learn"
    assert run["xla"] == pytest.approx(run["cpu"], abs=LOSS_TOLERANCE)


@pytest.mark.slow
@pytest.mark.xla
@pytest.mark.parametrize("model_type", PROVEN)
def test_tensor_parallelism_is_really_used(trained, model_type):
    ((_name, run),) = _runs(trained, [model_type])
    # fsdp x model = 4: a quarter of every matrix, plus the small replicated norms and biases
    assert run["max_device_fraction"] < 0.3, run["max_device_fraction"]
    assert len(run["split_over_model"]) >= 2 * 4, run["split_over_model"]  # 2 layers x attention + MLP
    assert run["sources"].get("tp plan", 0) > 0 and run["fallbacks"] == [] and run["notes"] == []
    assert run["wrong_shape"] == [], "XLA holds shards of another shape than the plan says"


@pytest.mark.slow
@pytest.mark.xla
@pytest.mark.parametrize("model_type", NO_PLAN)
def test_a_family_without_plan_trains_fsdp_only(trained, model_type):
    ((_name, run),) = _runs(trained, [model_type])
    assert run["split_over_model"] == [] and set(run["sources"]) == {FSDP_FALLBACK}
    assert run["notes"] and run["wrong_shape"] == []
    assert run["max_device_fraction"] < 0.55  # fsdp=2 only


@pytest.mark.slow
@pytest.mark.xla
@pytest.mark.parametrize("model_type", LORA)
def test_lora_models_train_sharded_like_on_cpu(trained, model_type):
    ((_name, run),) = _runs(trained, [model_type], section="lora")
    assert run["xla"] == pytest.approx(run["cpu"], abs=LOSS_TOLERANCE)
    assert run["cpu"][-1] < run["cpu"][0]
    assert run["wrong_shape"] == [] and run["fallbacks"] == []
    assert run["max_device_fraction"] < 0.3
    assert any(".lora_B." in name for name in run["split_over_model"])
    assert any(".lora_A." in name for name in run["split_over_model"])
