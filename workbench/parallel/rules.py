"""Sharding rules as data: per model family, parameter-name patterns -> tensor-parallel partition specs.

A table is an ordered list of `ShardingRule` (parameter-name regex -> partition spec over the
``model`` axis, `workbench.parallel.sharding_rule`); the first rule that matches a parameter wins. `rules_for` picks a model's
table: a hand table named by its family's registry entry (`workbench.families`, a key
of `RULE_TABLES`), else rules derived from transformers' own tensor-parallel plan
(`workbench.parallel.tp_plan`), else `FSDP_ONLY_RULES`. The FSDP axis is then placed on the
largest dimension the rule leaves free, and a parameter no rule matches is replicated and
*reported* (both by `workbench.parallel.plan`).

Plain Python: nothing here touches torch_xla.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from workbench.families import FAMILIES
from workbench.parallel import tp_plan
from workbench.parallel.sharding_rule import FSDP_ONLY_RULES, RuleTable, ShardingRule, as_rules, rule

# Llama, Mistral, Qwen2/3 and Gemma 1/2/3 share module names in `transformers` (the extra norms
# of Gemma 2/3 and Qwen3 end in `norm.weight` too); these families now shard by transformers'
# plan, which gives the same specs (see RULE_TABLES below). nn.Linear stores weight as
# [out_features, in_features]: column-parallel shards dim 0, row-parallel dim 1.
DECODER_RULES: tuple[ShardingRule, ...] = (
    rule(r"embed_tokens\.weight$", ("model", None), "vocab-parallel embedding"),
    rule(r"self_attn\.(q|k|v)_proj\.weight$", ("model", None), "column-parallel"),
    rule(r"self_attn\.(q|k|v)_proj\.bias$", ("model",), "column-parallel bias (qwen2)", fsdp=False),
    rule(r"self_attn\.o_proj\.weight$", (None, "model"), "row-parallel"),
    rule(r"mlp\.(gate|up)_proj\.weight$", ("model", None), "column-parallel"),
    rule(r"mlp\.down_proj\.weight$", (None, "model"), "row-parallel"),
    rule(r"(o|down)_proj\.bias$", None, "row-parallel bias: added after the reduction"),
    rule(r"norm\.weight$", None, "norm scale: tiny, replicated"),
    rule(r"lm_head\.weight$", ("model", None), "vocab-parallel output"),
)

# GPT-2 uses transformers' Conv1D, which stores weight as [in_features, out_features] (the
# transpose of nn.Linear): column-parallel shards dim 1 and row-parallel dim 0. c_attn fuses
# q|k|v along its output, so a model-axis shard can straddle the q/k/v boundary; GSPMD keeps
# that correct by resharding at the split, at some communication cost.
GPT2_RULES: tuple[ShardingRule, ...] = (
    rule(r"wte\.weight$", ("model", None), "vocab-parallel embedding"),
    rule(r"wpe\.weight$", (None, None), "position embedding: FSDP only"),
    rule(r"attn\.c_attn\.weight$", (None, "model"), "column-parallel (Conv1D [in, out])"),
    rule(r"attn\.c_attn\.bias$", ("model",), "column-parallel bias", fsdp=False),
    rule(r"mlp\.c_fc\.weight$", (None, "model"), "column-parallel (Conv1D [in, out])"),
    rule(r"mlp\.c_fc\.bias$", ("model",), "column-parallel bias", fsdp=False),
    rule(r"(attn|mlp)\.c_proj\.weight$", ("model", None), "row-parallel (Conv1D [in, out])"),
    rule(r"(attn|mlp)\.c_proj\.bias$", None, "row-parallel bias: added after the reduction"),
    rule(r"ln_(1|2|f)\.(weight|bias)$", None, "layer norm: tiny, replicated"),
    rule(r"lm_head\.weight$", ("model", None), "vocab-parallel output"),
)

# Which rules a family gets (`rules_for`): transformers' own tensor-parallel plan wherever the
# config class declares one (`workbench.parallel.tp_plan`; a registry entry says so with
# ``sharding=TP_PLAN_TABLE``), a hand table where transformers has none (GPT-2), FSDP only
# where neither exists. DECODER_RULES is no family's table any more: for Llama, Qwen2/3,
# Mistral, Gemma 1/2/3 and Phi-3 the plan gives the same specs (tests/test_tp_plan.py checks
# it); it stays as an explicit table a caller may pass (``rules=DECODER_RULES``).
RULE_TABLES: Mapping[str, tuple[ShardingRule, ...]] = MappingProxyType(
    {"decoder": DECODER_RULES, "gpt2": GPT2_RULES}
)
"""The hand tables by the name a `workbench.families.Family` gives as its `sharding`."""
TP_PLAN_TABLE = "tp_plan"
"""`Family.sharding` of a family sharded by transformers' own plan (`workbench.parallel.tp_plan`)."""


def rules_for(model_or_type: Any) -> tuple[ShardingRule, ...]:
    """The rule table for a model (a `transformers` model, a PEFT wrapper of one) or a model type.

    A registry family (`workbench.families`) with a hand table gets it (GPT-2). Any other
    model whose `transformers` config declares a tensor-parallel plan gets rules derived from
    it (`workbench.parallel.tp_plan.tp_plan_rules`: the model's own full plan, LM head and
    embeddings included). Anything else gets `FSDP_ONLY_RULES` with a note for the sharding
    report saying so: never an error. Rules see through PEFT's wrappers (``base_layer``), and
    LoRA adapters follow their base layer (`workbench.parallel.plan`).
    """
    model_type = model_or_type if isinstance(model_or_type, str) else _model_type(model_or_type)
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is not None and family.sharding in RULE_TABLES:
        return RULE_TABLES[family.sharding]
    derived = tp_plan.tp_plan_rules(model_or_type)
    if derived is not None:
        return derived
    return RuleTable(
        FSDP_ONLY_RULES,
        [
            f"model_type {model_type!r} has no tensor-parallel plan in transformers and no hand rules "
            "here: FSDP only (the model axis holds replicas); pass rules=[...] to shard over it"
        ],
    )


EMBEDDING_WEIGHTS = r"(?:^|\.)(?:embed_tokens|wte|word_embeddings|embed_in|lm_head|embed_out)\.weight$"
"""The input embedding and LM head ([vocab, hidden]) by their usual names."""


def rules_for_mesh(rules: Iterable[Any], axis_sizes: Mapping[str, int]) -> RuleTable:
    """`rules` as a mesh of `axis_sizes` should apply them: on a mesh with both a ``data`` and an
    ``fsdp`` axis and no ``model`` axis, the input embedding and LM head go over ``fsdp`` on their
    hidden dimension rather than their vocabulary.

    Why: split over ``fsdp`` on the vocabulary (the largest dimension, FSDP's default) and
    replicated over ``data``, the LM head gives logits split by vocabulary over fsdp only, while
    the loss's one-hot label mask is split by rows over data x fsdp; GSPMD cannot reshard between
    the two and gathers the whole ``[tokens, vocab]`` mask and index tensors onto every device
    (its "Involuntary full rematerialization" warning). Measured on 8 XLA:CPU devices, tiny Llama,
    8 x 32 tokens: data(2) x fsdp(4) moved 3.17 MB per device per step, 1.28 MB with this rule
    (vocabulary 512); 33.7 MB and 8.3 MB with a vocabulary of 8192. Without a data axis the
    vocabulary split is kept: there the logits and the mask reshard by an all-to-all, and the LM head
    runs vocabulary-parallel with no gradient reduction at all (1.5 MB against 8.5 MB at 8192).
    """
    table = list(as_rules(rules))
    notes = tuple(getattr(rules, "notes", ()))
    sizes = {str(k): int(v) for k, v in axis_sizes.items()}
    if sizes.get("data", 1) > 1 and sizes.get("fsdp", 1) > 1 and sizes.get("model", 1) == 1:
        embedding = rule(
            EMBEDDING_WEIGHTS,
            (None, "fsdp"),
            "embedding/LM head: fsdp on hidden (data x fsdp mesh: keeps the loss's label mask from being gathered whole)",
            ndim=2,
        )
        table = [embedding, *table]
    return RuleTable(table, notes)


def _model_type(model: Any) -> str | None:
    config = getattr(model, "config", None)
    if config is None and hasattr(model, "get_base_model"):  # PEFT wrappers
        config = getattr(model.get_base_model(), "config", None)
    return getattr(config, "model_type", None)
