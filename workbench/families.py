"""The model families the workbench knows, in one registry: `FAMILIES`.

**To add a family, add an entry here** (one `Family(...)` in `_REGISTRY`); tests/test_families.py
then builds a tiny model from it, checks its parameter count against the memory estimator and
plans its sharding, so add the new name to that file's expected list too. Nothing else keeps
a list of families: every consumer reads this registry.

Who reads which field of a `Family`:

- `workbench.config`: the names (`FAMILY_NAMES`, in registry order) are the allowed values of
  ``ModelConfig.family`` (the `ModelFamily` literal) and the list a bad value's error shows.
- `workbench.models.build.hf_config`: `config_class`, `fields`, `fixed` and `head_dim_fields`,
  through `Family.config_kwargs`, to build the `transformers` config of a `ModelConfig`.
- `workbench.analysis.estimate.model_shape`: `fields` (to read the sizes back from any
  `transformers` config of the family) and the layout facts `layout`, `qkv_bias`,
  `norms_per_layer`, `qk_norm`, `fused_projections` and `tied_default`, from which the
  estimator knows every parameter tensor and the activations a layer saves.
- `workbench.parallel.rules.rules_for`: `sharding`, ``"tp_plan"`` for a family sharded by the
  tensor-parallel plan its `transformers` config declares (`workbench.parallel.tp_plan`), or
  the name of a hand table in `workbench.parallel.rules.RULE_TABLES` where transformers has no
  plan (GPT-2). A model whose family is not in the registry is sharded all the same: by its
  plan if it has one, else by FSDP alone.

The registry is keyed by the `transformers` ``model_type`` (``config.model_type``), which is
also the value ``ModelConfig.family`` takes, so a model loaded from disk finds its entry too.

This module imports only the standard library (no torch, no transformers, nothing from the
workbench): it sits at the bottom, beside the config, which imports it without cost and validates
``model.family`` against it (`cfg` in `Family.config_kwargs` is a `workbench.config.ModelConfig`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

Layout = Literal["decoder", "gpt2"]
"""'decoder': Llama-style blocks (RMSNorm, bias-free linears, rotary positions, gated MLP with
gate/up/down); 'gpt2': GPT-2 blocks (LayerNorm with biases, biased Conv1D linears, learned
position embeddings, plain fc -> act -> proj MLP)."""


@dataclass(frozen=True)
class SizeFields:
    """The `transformers` config attributes that carry a `ModelConfig`'s size fields.

    Each attribute is named after the `ModelConfig` field it receives. `num_kv_heads` is None
    for a family without grouped-query attention (its key/value heads equal its heads and
    ``ModelConfig.num_kv_heads`` is ignored).
    """

    hidden_size: str = "hidden_size"
    num_layers: str = "num_hidden_layers"
    num_heads: str = "num_attention_heads"
    num_kv_heads: str | None = "num_key_value_heads"
    intermediate_size: str = "intermediate_size"
    max_position_embeddings: str = "max_position_embeddings"

    def items(self) -> list[tuple[str, str]]:
        """``(ModelConfig field, transformers attribute)`` pairs, those the family has."""
        pairs = [
            ("hidden_size", self.hidden_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ]
        return [(ours, theirs) for ours, theirs in pairs if theirs is not None]


DECODER_FIELDS = SizeFields()
"""Llama's attribute names, which Qwen, Mistral, Gemma and Phi-3 share."""
GPT2_FIELDS = SizeFields(
    hidden_size="n_embd",
    num_layers="n_layer",
    num_heads="n_head",
    num_kv_heads=None,
    intermediate_size="n_inner",
    max_position_embeddings="n_positions",
)

_DECODER_FIXED: Mapping[str, Any] = MappingProxyType({"attention_dropout": 0.0})


@dataclass(frozen=True)
class Family:
    """One model family: what building it, estimating its memory and sharding it need to know."""

    name: str
    """The `transformers` ``model_type``; also the ``ModelConfig.family`` value."""
    config_class: str
    """Name of the `transformers` config class (``transformers.<config_class>``) that `hf_config` builds."""
    layout: Layout
    """Block layout: 'decoder' (Llama-style, gated MLP) or 'gpt2' (see `Layout`)."""
    sharding: str
    """``"tp_plan"`` (rules from transformers' own tensor-parallel plan) or the name of a hand
    table in `workbench.parallel.rules.RULE_TABLES`."""
    fields: SizeFields = DECODER_FIELDS
    """Where the config class keeps each `ModelConfig` size field."""
    fixed: Mapping[str, Any] = field(default_factory=lambda: _DECODER_FIXED)
    """Extra config-class arguments, the same for every model built (dropout off, so losses
    compare across devices; a special-token id the tiny vocabularies cannot hold switched off)."""
    head_dim_fields: tuple[str, ...] = ()
    """Config attributes set to ``hidden_size // num_heads``, where the class's own default is a
    fixed number instead (Gemma's ``head_dim=256``), so the model matches the `ModelConfig`."""
    qkv_bias: bool = False
    """q/k/v projections always have biases (Qwen2); other decoders follow ``config.attention_bias``."""
    norms_per_layer: int = 2
    """RMSNorms per block on the residual stream: 2, or 4 where the MLP is also wrapped (Gemma 2 and 3)."""
    qk_norm: bool = False
    """An RMSNorm over each head's query and key (Qwen3, Gemma 3): two ``head_dim`` weights per block."""
    fused_projections: bool = False
    """q, k and v in one ``qkv_proj`` and gate and up in one ``gate_up_proj`` (Phi-3)."""
    tied_default: bool = False
    """Whether the input embedding and LM head are tied when a config does not say."""

    @property
    def gated_mlp(self) -> bool:
        """SwiGLU/GeGLU MLP (gate, up, down) rather than GPT-2's fc -> act -> proj."""
        return self.layout == "decoder"

    @property
    def gpt2_style(self) -> bool:
        """LayerNorm with biases, biased linears, learned position embeddings."""
        return self.layout == "gpt2"

    def config_kwargs(self, cfg: Any, vocab_size: int | None = None) -> dict[str, Any]:
        """Keyword arguments for ``transformers.<config_class>`` describing `cfg` (`vocab_size`
        replaces ``cfg.vocab_size`` when given)."""
        kwargs: dict[str, Any] = {theirs: getattr(cfg, ours) for ours, theirs in self.fields.items()}
        for name in self.head_dim_fields:
            kwargs[name] = cfg.hidden_size // cfg.num_heads
        kwargs.update(self.fixed)
        kwargs["vocab_size"] = vocab_size or cfg.vocab_size
        kwargs["tie_word_embeddings"] = cfg.tie_word_embeddings
        return kwargs


_REGISTRY: tuple[Family, ...] = (
    # The first five, in this order, are the families the workbench has always offered.
    Family("llama", "LlamaConfig", "decoder", sharding="tp_plan"),
    Family("qwen2", "Qwen2Config", "decoder", sharding="tp_plan", qkv_bias=True),
    Family("mistral", "MistralConfig", "decoder", sharding="tp_plan"),
    Family(
        "gemma",
        "GemmaConfig",
        "decoder",
        sharding="tp_plan",
        head_dim_fields=("head_dim",),
        tied_default=True,
    ),
    Family(
        "gpt2",
        "GPT2Config",
        "gpt2",
        sharding="gpt2",
        fields=GPT2_FIELDS,
        fixed=MappingProxyType({"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}),
        tied_default=True,
    ),
    Family(
        "gemma2",
        "Gemma2Config",
        "decoder",
        sharding="tp_plan",
        # query_pre_attn_scalar: the attention scale is its inverse square root (256 by default)
        head_dim_fields=("head_dim", "query_pre_attn_scalar"),
        norms_per_layer=4,
        tied_default=True,
    ),
    Family(
        "gemma3_text",
        "Gemma3TextConfig",
        "decoder",
        sharding="tp_plan",
        head_dim_fields=("head_dim", "query_pre_attn_scalar"),
        norms_per_layer=4,
        qk_norm=True,
        tied_default=True,
    ),
    Family(
        "qwen3", "Qwen3Config", "decoder", sharding="tp_plan", head_dim_fields=("head_dim",), qk_norm=True
    ),
    Family(
        "phi3",
        "Phi3Config",
        "decoder",
        sharding="tp_plan",
        # Phi3Config's pad_token_id (32000) is an embedding row a small vocabulary lacks
        fixed=MappingProxyType(
            {"attention_dropout": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "pad_token_id": None}
        ),
        fused_projections=True,
    ),
)

FAMILIES: Mapping[str, Family] = MappingProxyType({f.name: f for f in _REGISTRY})
"""Every family by name (its `transformers` model_type), in registry order."""
FAMILY_NAMES: tuple[str, ...] = tuple(FAMILIES)
"""The allowed values of ``ModelConfig.family``, in registry order."""

if len(FAMILIES) != len(_REGISTRY):  # pragma: no cover - guards the registry itself
    raise RuntimeError("workbench.families: two registry entries share a name")

__all__ = ["DECODER_FIELDS", "FAMILIES", "FAMILY_NAMES", "GPT2_FIELDS", "Family", "Layout", "SizeFields"]
