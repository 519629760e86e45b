"""The family registry (`workbench.families`): every entry builds, estimates and shards.

Each family in the registry builds a tiny model from a `ModelConfig` through its entry; the
model's parameters match what the memory estimator derives from the entry (count and every
tensor's shape), and the family's sharding rules cover every parameter on a mesh with both
fsdp and model axes. A family whose config class the installed `transformers` lacks is skipped.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
import warnings

import pytest
import transformers

from tests.tiny import tiny
from workbench.analysis.estimate import estimate, model_shape
from workbench.config import ConfigError, ModelConfig, ModelFamily, WorkbenchConfig
from workbench.families import FAMILIES, FAMILY_NAMES, Layout
from workbench.models import build
from workbench.models.build import build_model, count_parameters, hf_config
from workbench.parallel.plan import plan_sharding
from workbench.parallel.rules import RULE_TABLES, TP_PLAN_TABLE, rules_for
from workbench.parallel.sharding_rule import TP_PLAN

# Adding a family: its registry entry, and its name here.
EXPECTED = ("llama", "qwen2", "mistral", "gemma", "gpt2", "gemma2", "gemma3_text", "qwen3", "phi3")
SIZES = {"data": 1, "fsdp": 2, "model": 2}


def available(name: str):
    """The family's name as a test parameter, skipped where transformers lacks its config class."""
    cls = FAMILIES[name].config_class
    missing = not hasattr(transformers, cls)
    reason = f"transformers {transformers.__version__} has no {cls}"
    return pytest.param(name, id=name, marks=pytest.mark.skipif(missing, reason=reason))


ALL = [available(name) for name in FAMILY_NAMES]


@pytest.fixture(scope="module")
def models():
    cache: dict[tuple[str, bool], object] = {}

    def get(family: str, tied: bool = True):
        if (family, tied) not in cache:
            cache[family, tied] = build_model(tiny(family, tie_word_embeddings=tied))
        return cache[family, tied]

    return get


def test_the_registry_is_the_list_of_families():
    assert FAMILY_NAMES == EXPECTED
    assert tuple(FAMILIES) == EXPECTED
    assert all(name == family.name for name, family in FAMILIES.items())
    # config.py's literal comes from the registry (what a widget lists as the options)
    assert typing.get_args(ModelFamily) == FAMILY_NAMES
    assert typing.get_args(typing.get_type_hints(ModelConfig)["family"]) == FAMILY_NAMES
    for name in FAMILY_NAMES:
        assert WorkbenchConfig().with_overrides([f"model.family={name}"]).model.family == name
    allowed = ", ".join(repr(name) for name in FAMILY_NAMES)
    with pytest.raises(ConfigError, match=f"model.family='bert' is not allowed: expected one of {allowed}$"):
        WorkbenchConfig().with_overrides(["model.family=bert"])


def test_every_family_names_a_rule_table_and_a_layout():
    for family in FAMILIES.values():
        if family.sharding == TP_PLAN_TABLE:  # rules from transformers' own plan
            assert any(rule.source == TP_PLAN for rule in rules_for(family.name)), family.name
        else:
            assert rules_for(family.name) is RULE_TABLES[family.sharding], family.name
        assert family.layout in typing.get_args(Layout)
        assert family.gated_mlp != family.gpt2_style
        assert family.norms_per_layer >= 2


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_every_family_builds_the_model_its_estimate_describes(models, name, tied):
    cfg = tiny(name, tie_word_embeddings=tied)
    model = models(name, tied)
    assert model.config.model_type == name
    family = FAMILIES[name]
    for ours, theirs in family.fields.items():
        assert getattr(model.config, theirs) == getattr(cfg, ours), (ours, theirs)
    for attr in family.head_dim_fields:
        assert getattr(model.config, attr) == cfg.hidden_size // cfg.num_heads, attr
    n = count_parameters(model)
    shape = model_shape(cfg)
    assert shape.family == name and shape.tied == tied
    assert shape.num_parameters == n
    assert model_shape(hf_config(cfg)).num_parameters == n
    assert model_shape(model).num_parameters == n
    # every tensor, not only the total (the Adafactor state depends on the shapes)
    unique = {id(p): tuple(p.shape) for p in model.parameters()}
    assert sorted(unique.values()) == sorted(s for _, s in shape.parameter_shapes())
    assert estimate(cfg, batch_size=2, seq_len=32, optimizer="adafactor").num_parameters == n


@pytest.mark.parametrize("name", ALL)
def test_every_family_has_sharding_rules_for_all_its_parameters(models, name):
    model = models(name)
    params = [(n, tuple(p.shape), p.dtype) for n, p in model.named_parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a parameter no rule matches warns
        report = plan_sharding(params, SIZES, rules_for(model))
    assert report.fallbacks == []
    assert report.total_bytes == sum(p.numel() * 4 for p in model.parameters())
    for entry in report.entries:
        if len(entry.shape) == 2 and "wpe" not in entry.name:  # GPT-2's position table: fsdp only
            assert entry.fraction == pytest.approx(1 / (SIZES["fsdp"] * SIZES["model"])), entry


def test_a_config_class_transformers_lacks_is_named(monkeypatch):
    fake = dataclasses.replace(FAMILIES["llama"], config_class="NoSuchConfig")
    monkeypatch.setattr(build, "FAMILIES", {**FAMILIES, "llama": fake})
    with pytest.raises(ValueError, match=r"model.family='llama' needs transformers.NoSuchConfig"):
        hf_config(tiny("llama"))
    with pytest.raises(ValueError, match=r"model.family='bert' is not allowed: expected one of 'llama'"):
        hf_config(dataclasses.replace(tiny("llama"), family="bert"))


def test_the_registry_and_the_config_import_neither_torch_nor_transformers():
    code = (
        "import sys, workbench.families, workbench.config, workbench.models.build\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
