"""[from sharding] Declarative SPMD meshes and parameter sharding, validated before anything runs.

Three pieces, kept apart so each can be checked without the others:

- `MeshSpec`: the named mesh axes ``data x fsdp x model`` (at most one ``-1`` filled from
  the device count). `resolve` validates the sizes in pure Python and spells the product
  out when it is wrong; `build` switches torch_xla into SPMD mode in the order it needs and
  returns the torch_xla mesh (a hybrid ICI x DCN mesh when `num_slices > 1`).
- Sharding rules as data: per model family, an ordered list of (parameter-name regex ->
  tensor-parallel partition spec). The FSDP axis is then placed on the largest dimension
  the rule leaves free. A parameter no rule matches is replicated and *reported*.
- `plan_sharding` (pure Python, shapes only) -> `ShardingReport`; `shard_model` applies a
  plan to a real model with ``mark_sharding``; `shard_batch` splits inputs over data x fsdp.

Every torch_xla call goes through `workbench.runtime`. Importing this module starts nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from workbench.models.families import FAMILIES

if TYPE_CHECKING:  # imported for annotations only: no runtime cost, no cycles
    pass

AxisEntry = str | tuple[str, ...] | None
"""One entry of a partition spec: a mesh axis, several axes (major first) or None (replicated)."""
PartitionSpec = tuple[AxisEntry, ...]


class ShardingError(ValueError):
    """A sharding that cannot be applied; the message names the parameter, dimension and axis."""


# ---- rules as data -------------------------------------------------------------------


@dataclass(frozen=True)
class ShardingRule:
    """Parameters whose name matches `pattern` (``re.search``) get `spec` over the `model` axis.

    `spec` has one entry per tensor dimension (a mesh axis, a tuple of axes, or None), or is
    None for "replicate everywhere". With `fsdp=True` the `fsdp` axis then goes on the largest
    dimension the spec leaves free (one that divides by the fsdp size).
    """

    pattern: str
    spec: PartitionSpec | None
    note: str = ""
    fsdp: bool = True


def rule(pattern: str, spec: PartitionSpec | None, note: str = "", *, fsdp: bool = True) -> ShardingRule:
    return ShardingRule(pattern, spec, note, fsdp)


# Llama, Mistral, Qwen2/3 and Gemma 1/2/3 share module names in `transformers` (the extra norms
# of Gemma 2/3 and Qwen3 end in `norm.weight` too). Which family uses which table is its entry
# in `workbench.models.families` (`Family.sharding`, a key of RULE_TABLES). nn.Linear stores
# weight as [out_features, in_features]: column-parallel shards dim 0, row-parallel dim 1.
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

# Phi-3 fuses q|k|v into qkv_proj and gate|up into gate_up_proj (nn.Linear, so column-parallel
# shards dim 0). As with GPT-2's c_attn, a model-axis shard can straddle the boundaries of the
# fused parts; GSPMD reshards at the split. Everything else is named as in DECODER_RULES.
PHI3_RULES: tuple[ShardingRule, ...] = (
    rule(r"self_attn\.qkv_proj\.weight$", ("model", None), "column-parallel (fused q|k|v)"),
    rule(r"mlp\.gate_up_proj\.weight$", ("model", None), "column-parallel (fused gate|up)"),
    *DECODER_RULES,
)

FSDP_ONLY_RULES: tuple[ShardingRule, ...] = (
    rule(r"(norm|ln_\w+)\.(weight|bias)$", None, "norm: tiny, replicated"),
    rule(r"\.bias$", None, "bias: tiny, replicated"),
    rule(r".", tuple(), "FSDP: largest dimension over fsdp"),
)
"""Family-agnostic rules: FSDP on every weight, no tensor parallelism (`model` must be 1)."""

RULE_TABLES: Mapping[str, tuple[ShardingRule, ...]] = MappingProxyType(
    {"decoder": DECODER_RULES, "gpt2": GPT2_RULES, "phi3": PHI3_RULES}
)
"""The per-family tables by the name a `workbench.models.families.Family` gives as its `sharding`."""


def rules_for(model_or_type: Any) -> tuple[ShardingRule, ...]:
    """The rule table for a model (by ``config.model_type``) or a model-type string.

    Which table a family uses is its registry entry's `sharding` (`workbench.models.families`).
    """
    model_type = model_or_type if isinstance(model_or_type, str) else _model_type(model_or_type)
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise ShardingError(
            f"no sharding rules for model_type={model_type!r}: known families are "
            f"{', '.join(sorted(FAMILIES))}; pass rules=FSDP_ONLY_RULES for FSDP without tensor "
            "parallelism, or your own list of (pattern, spec) rules"
        )
    return RULE_TABLES[family.sharding]


def _model_type(model: Any) -> str | None:
    config = getattr(model, "config", None)
    if config is None and hasattr(model, "get_base_model"):  # PEFT wrappers
        config = getattr(model.get_base_model(), "config", None)
    return getattr(config, "model_type", None)


def as_rules(rules: Iterable[Any]) -> list[ShardingRule]:
    out = []
    for item in rules:
        if isinstance(item, ShardingRule):
            out.append(item)
        elif isinstance(item, Sequence) and len(item) in (2, 3) and isinstance(item[0], str):
            out.append(ShardingRule(item[0], None if item[1] is None else tuple(item[1]), *item[2:]))
        else:
            raise ShardingError(f"rule {item!r} is not allowed: expected ShardingRule or (pattern, spec)")
    return out
