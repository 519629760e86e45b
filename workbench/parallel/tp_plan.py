"""Sharding rules from `transformers`' own tensor-parallel plans: any family with a plan splits over ``model``.

`transformers` declares a plan per config class (``config.base_model_tp_plan``: module path,
``*`` for a layer number -> style name; about 55 classes in 4.57, over 140 in 5.x) and per model
class (``_tp_plan``: the LM head); a built model carries them merged (``model.tp_plan``, with the
input embedding in transformers 5). `tp_plan_rules` turns that plan into a `RuleTable`, one rule
per entry and parameter rank, through `STYLE_LAYOUTS` (style -> layout) and `layout_spec`
(layout -> `model`-axis spec). nn.Linear stores weight as [out, in] (stacked experts as
[experts, out, in]), so:

===========================  =====================================================  ===============
styles                        weight (2-D; n-D: the last two dims)                   bias / 1-D
===========================  =====================================================  ===============
colwise, colwise_rep,         ``(model, -)``: out features split                     ``(model,)``
colwise_gather_output,
packed_colwise, local_colwise
rowwise, rowwise_rep,         ``(-, model)``: in features split                      replicated
rowwise_split_input,
packed_rowwise, local_rowwise,
local_packed_rowwise
embedding_rowwise             ``(model, -)``: vocabulary split                       -
embedding_colwise             ``(-, model)``: hidden split                           -
grouped_gemm (4.57 experts)   ``(model, ...)``: experts split                        replicated
replicate, sequence_parallel, no model split (FSDP only)                             replicated
replicated_with_grad_allreduce,
mla_kv_a_proj; module-level
styles (moe_tp_experts,
local_params, all_reduce,
gather, local, isolated, ...)
anything else                 FSDP only, and a note in the sharding report           replicated
===========================  =====================================================  ===============

The `_rep`/`gather_output`/`split_input`/`local_` variants differ only in the communication
around the layer, which GSPMD derives itself: the parameter layout is the same. `packed_*`
weights (gate|up fused) split in one contiguous block, so a shard can straddle the two parts;
GSPMD stays correct by resharding at the split (as for GPT-2's fused c_attn), at some
communication cost. After the plan's rules come hand rules for a vocabulary-parallel input
embedding and LM head where the plan does not name them (transformers 5 adds the embedding to
every plan itself; under 4.57 this keeps the table 1/model per device instead of 1/fsdp: for
an 8B Llama, 0.5 B parameters and their optimizer state), then `FSDP_ONLY_RULES` for the rest
(norms, other biases, parameters the plan does not name). The FSDP axis is placed by
`workbench.parallel.plan` as for every table.

Plain Python: `transformers` is imported only to read a plan by model-type string.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from workbench.parallel.sharding_rule import (
    FSDP_FALLBACK,
    FSDP_ONLY_RULES,
    HAND_RULE,
    TP_PLAN,
    AxisEntry,
    PartitionSpec,
    RuleTable,
    ShardingRule,
    rule,
)

_COLWISE = ("colwise", "colwise_rep", "colwise_gather_output", "packed_colwise", "local_colwise")
_ROWWISE = (
    "rowwise",
    "rowwise_rep",
    "rowwise_split_input",
    "packed_rowwise",
    "local_rowwise",
    "local_packed_rowwise",
)
_REPLICATED = (
    "replicate",
    "replicated_with_grad_allreduce",
    "sequence_parallel",
    "mla_kv_a_proj",
    # module-level styles: they change a module's forward, not how its parameters are laid out
    "moe_tp_experts",
    "moe_identity_expert",
    "local_params",
    "all_reduce",
    "gather",
    "local",
    "isolated",
    "ep_router",
)
STYLE_LAYOUTS: Mapping[str, str] = MappingProxyType(
    {
        **dict.fromkeys(_COLWISE, "colwise"),
        **dict.fromkeys(_ROWWISE, "rowwise"),
        "embedding_rowwise": "vocab",
        "embedding_colwise": "hidden",
        "grouped_gemm": "experts",
        **dict.fromkeys(_REPLICATED, "replicated"),
    }
)
"""transformers' style names (4.57 and 5.x) -> the parameter layout they mean here."""

_SPLITS = {
    "colwise": "output features split",
    "rowwise": "input features split",
    "vocab": "vocabulary split",
    "hidden": "hidden features split",
    "experts": "experts split",
}

MAX_RANK = 4
"""Rules are written for parameters of 1 to MAX_RANK dimensions (higher ranks fall through to FSDP)."""


def layout_spec(layout: str, ndim: int) -> PartitionSpec | None:
    """The `model`-axis spec of a parameter of `ndim` dimensions under a layout (None: replicated).

    A layout of the last two dims (colwise, rowwise, vocab, hidden) leaves leading dims (stacked
    experts) free; a 1-D parameter is a bias, split with the outputs (colwise) or replicated.
    """
    spec: list[AxisEntry] = [None] * ndim
    if layout == "colwise" or (layout == "vocab" and ndim >= 2):
        spec[-2 if ndim >= 2 else 0] = "model"
    elif layout in ("rowwise", "hidden", "experts") and ndim >= 2:
        spec[0 if layout == "experts" else -1] = "model"
    elif ndim == 1:
        return None  # a bias after a reduction, a norm scale: tiny, replicated
    return tuple(spec)


def _key_pattern(key: str) -> str:
    """A plan key (``layers.*.self_attn.q_proj``) as a regex for the names of its parameters: the
    key itself (a parameter: ``...experts.gate_up_proj``) or the key's own direct parameters, under
    any prefix (``model.``, PEFT's ``base_model.model.``)."""
    return r"(?:^|\.)" + re.escape(key).replace(r"\*", r"[^.]+") + r"(?:\.[^.]+)?$"


def plan_rules(plan: Mapping[str, str]) -> tuple[list[ShardingRule], list[str]]:
    """Rules for every entry of a tensor-parallel plan (most specific key first), and notes on the
    styles that could not be mapped (those parameters get FSDP only)."""
    rules: list[ShardingRule] = []
    notes: list[str] = []
    # A longer key is more specific: 'experts.gate_up_proj' (a parameter) before 'experts' (its module).
    for key, style in sorted(plan.items(), key=lambda kv: -kv[0].count(".")):
        pattern = _key_pattern(key)
        layout = STYLE_LAYOUTS.get(style)
        if layout is None:
            notes.append(f"tp plan style {style!r} of {key!r} is not mapped here: FSDP only")
            rules.append(
                rule(pattern, tuple(), f"tp plan {style!r}: not mapped, FSDP only", source=FSDP_FALLBACK)
            )
            continue
        if layout in ("rowwise", "experts"):
            bias = pattern.replace(r"(?:\.[^.]+)?$", r"\.bias$")
            rules.append(rule(bias, None, f"{style}: bias added after the reduction", source=TP_PLAN))
        for ndim in range(1, MAX_RANK + 1):
            spec = layout_spec(layout, ndim)
            # a split bias stays whole over fsdp (as the hand tables have it): it is tiny
            fsdp = not (ndim == 1 and spec is not None)
            note = f"{style}: {_SPLITS[layout] if spec and any(spec) else 'not split over model'}"
            rules.append(rule(pattern, spec, note, fsdp=fsdp, source=TP_PLAN, ndim=ndim))
    return rules, notes


def tp_plan_rules(model_or_type: Any) -> RuleTable | None:
    """The rule table from a model's (or a model type's) tensor-parallel plan; None without one.

    A model's plan is its own merged plan (``tp_plan``/``_tp_plan``, full parameter paths), its
    class's ``_tp_plan`` and its config's ``base_model_tp_plan``; a PEFT model is read through
    ``get_base_model()``. A family "has a plan" when its config (or its text config) declares
    ``base_model_tp_plan``: an LM-head entry alone does not make one.
    """
    if isinstance(model_or_type, str):
        plan, embeddings = _type_plan(model_or_type), _GENERIC_EMBEDDINGS
    else:
        model = _unwrap(model_or_type)
        plan = _model_plan(model) if _declares_plan(getattr(model, "config", None)) else {}
        embeddings = _embedding_paths(model) or _GENERIC_EMBEDDINGS
    if not plan:
        return None
    rules, notes = plan_rules(plan)
    for path in embeddings:
        rules.append(
            rule(
                path,
                ("model", None),
                "vocabulary split (hand rule: the tp plan does not name it)",
                source=HAND_RULE,
                ndim=2,
            )
        )
    return RuleTable([*rules, *FSDP_ONLY_RULES], notes)


_GENERIC_EMBEDDINGS = (
    r"(?:^|\.)(?:embed_tokens|wte|word_embeddings|embed_in|embeddings)\.weight$",
    r"(?:^|\.)(?:lm_head|embed_out)\.weight$",
)
"""Input embedding and LM head by their usual names, where no model is at hand to ask."""


def _unwrap(model: Any) -> Any:
    """The `transformers` model inside PEFT's wrappers (``PeftModel.get_base_model()``)."""
    for _ in range(4):
        inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
        if inner is model:
            break
        model = inner
    return model


def _declares_plan(config: Any) -> bool:
    if config is None:
        return False
    configs = [config]
    if callable(getattr(config, "get_text_config", None)):
        configs.append(config.get_text_config())
    return any(getattr(c, "base_model_tp_plan", None) for c in configs)


def _plans_of(model: Any) -> Iterator[Any]:
    for attr in ("tp_plan", "_tp_plan"):
        try:
            yield getattr(model, attr, None)
        except Exception:  # a property that raises where nothing is distributed
            yield None
    yield getattr(type(model), "_tp_plan", None)
    config = getattr(model, "config", None)
    yield getattr(config, "base_model_tp_plan", None)
    if callable(getattr(config, "get_text_config", None)):
        yield getattr(config.get_text_config(), "base_model_tp_plan", None)


def _model_plan(model: Any) -> dict[str, str]:
    plan: dict[str, str] = {}
    for source in _plans_of(model):
        if isinstance(source, Mapping):
            for key, style in source.items():
                plan.setdefault(str(key), str(style))
    # 'layers.*.x' beside 'model.layers.*.x' with the same style adds nothing
    return {
        key: style
        for key, style in plan.items()
        if not any(k.endswith("." + key) and s == style for k, s in plan.items())
    }


def _type_plan(model_type: str) -> dict[str, str]:
    """The plan of a model type by name: its config class's, and its causal-LM class's own (LM head)."""
    try:
        from transformers import CONFIG_MAPPING
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        return {}
    try:
        config_class = CONFIG_MAPPING[model_type]
    except KeyError:
        return {}
    plan = dict(getattr(config_class, "base_model_tp_plan", None) or {})
    if not plan:
        return {}
    head = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if isinstance(head, str):
        import transformers

        try:
            head_plan = getattr(getattr(transformers, head), "_tp_plan", None) or {}
        except (AttributeError, ImportError):
            head_plan = {}
        plan = {**head_plan, **plan}
    return plan


def _embedding_paths(model: Any) -> tuple[str, ...]:
    """Patterns for the model's own input embedding and LM head weights (by module path)."""
    paths = []
    modules = {id(m): name for name, m in model.named_modules()} if hasattr(model, "named_modules") else {}
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        try:
            module = getattr(model, getter)()
        except Exception:  # not implemented by every model class
            module = None
        name = modules.get(id(module)) if module is not None else None
        if name:
            paths.append(r"(?:^|\.)" + re.escape(name) + r"\.weight$")
    return tuple(paths)
