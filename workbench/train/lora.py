"""LoRA: turn a `transformers` causal LM into a LoRA model with `peft`.

- `apply_lora(model, cfg.lora, seed=...)`: freeze the base model and add rank-r adapters
  (``peft.get_peft_model`` with a ``peft.LoraConfig``) on the target modules. ``"auto"``
  targets are the attention and MLP projections the family's tensor-parallel plan names
  (``config.base_model_tp_plan``), or, for a family without one (GPT-2), the linears the
  workbench's sharding rules split over the ``model`` axis (`workbench.parallel.rules`);
  never the embeddings or the LM head. Names are checked before peft sees them: a name that
  matches nothing lists the names that exist (deduplicated by suffix: q_proj, k_proj, ...),
  and a rank larger than a targeted layer names the layer and its sizes. The adapters'
  random init is seeded (``lora_B`` starts at zero, so the LoRA model starts as its base).
  Adapters stay fp32 on a bf16 base (peft's default); the step engine and the optimizer see
  only them (`workbench.train.optim` takes trainable parameters only).
- Back into files (`save_model`, `load_adapter`: an adapter directory, or the merged model) is
  `workbench.train.adapter_files`'s.

A quantized base (``model.quantize``: `workbench.models.quantize.QuantizedLinear` layers) takes
adapters like a Linear one: peft wraps each quantized layer with its LoRA ``Linear`` (registered
as a custom module), the adapters stay fp32, and the base counts its logical parameters, so an
adapter trained on it loads onto the plain unquantized base (and back onto a quantized one).

Placement under SPMD is `workbench.parallel.apply.shard_model`'s job: it runs on the LoRA model
like on any other (base weights by their family rules, adapters by theirs). `peft` is imported
only here and in `adapter_files`, and only when a function there runs, so a run with ``lora.rank=0`` never needs it.
"""

from __future__ import annotations

import difflib
import functools
from typing import TYPE_CHECKING, Any

import torch

from workbench.models.layer_stack import per_layer_parameters
from workbench.models.quantize import QuantizedLinear, logical_parameter_count, quantized_layers

if TYPE_CHECKING:  # annotations only
    from workbench.config import LoraConfig

ADAPTER_NAME = "default"


class LoraError(ValueError):
    """LoRA settings that cannot apply to this model, or an adapter that does not belong to it."""


# ---- which modules --------------------------------------------------------------------------


def is_lora(model: Any) -> bool:
    """Whether `model` is a peft model (adapters on a frozen base)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def base_of(model: Any) -> Any:
    """The `transformers` model inside a peft model (with the adapter layers in it); `model` otherwise."""
    return model.get_base_model() if is_lora(model) else model


def _conv1d_type() -> type:
    from transformers.pytorch_utils import Conv1D

    return Conv1D


def layer_sizes(module: Any) -> tuple[int, int] | None:
    """(in, out) features of a layer LoRA can adapt (Linear, a quantized Linear, transformers' Conv1D,
    Embedding); None otherwise."""
    if isinstance(module, (torch.nn.Linear, QuantizedLinear)):
        return module.in_features, module.out_features
    if isinstance(module, _conv1d_type()):  # weight [in, out]
        return int(module.weight.shape[0]), int(module.weight.shape[1])
    if isinstance(module, torch.nn.Embedding):
        return module.num_embeddings, module.embedding_dim
    return None


def _matches(name: str, target: str) -> bool:
    """peft's rule for a list of target names: the whole module name or a dotted suffix of it."""
    return name == target or name.endswith("." + target)


def adaptable_names(model: Any) -> list[str]:
    """The last name part of every layer LoRA can adapt, once each, in model order (q_proj, k_proj, ...)."""
    names = [name.rsplit(".", 1)[-1] for name, m in base_of(model).named_modules() if _adaptable(m)]
    return list(dict.fromkeys(names))


def _adaptable(module: Any) -> bool:
    return layer_sizes(module) is not None


def auto_target_modules(model: Any) -> list[str]:
    """The attention and MLP projections: those the family's tensor-parallel plan names, else
    those the workbench's sharding rules split over the model axis (never embeddings or the LM head)."""
    base = base_of(model)
    config = getattr(base, "config", None)
    plan = getattr(config, "base_model_tp_plan", None) or getattr(type(config), "base_model_tp_plan", None)
    output = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    linears = [
        (name, m)
        for name, m in base.named_modules()
        if name and _adaptable(m) and not isinstance(m, torch.nn.Embedding) and m is not output
    ]
    if plan:
        suffixes = list(dict.fromkeys(key.rsplit(".", 1)[-1] for key in plan))
        found = [s for s in suffixes if any(_matches(name, s) for name, _ in linears)]
        if found:
            return found
    from workbench.parallel.rules import rules_for

    rules = rules_for(base)  # a family without a plan or hand rules gets FSDP-only rules: none split
    found = []
    for name, module in linears:
        ndim = module.weight.dim()
        rule = next((r for r in rules if r.applies(f"{name}.weight", ndim)), None)
        if rule is not None and rule.spec and "model" in _axes(rule.spec):
            found.append(name.rsplit(".", 1)[-1])
    if not found:
        raise LoraError(
            f"lora.target_modules='auto' finds no attention or MLP projections in this "
            f"{getattr(config, 'model_type', type(base).__name__)} model (no tensor-parallel plan, no "
            f"sharding rules for it): name them, e.g. lora.target_modules={adaptable_names(base)[:4]}"
        )
    return list(dict.fromkeys(found))


def _axes(spec: Any) -> list[str]:
    out: list[str] = []
    for entry in spec:
        out += [entry] if isinstance(entry, str) else list(entry or ())
    return out


def resolve_target_modules(model: Any, targets: str | list[str]) -> list[str]:
    """The module names the adapters go on: ``"auto"`` resolved, a list checked against the model."""
    base = base_of(model)
    names = auto_target_modules(base) if targets == "auto" else list(dict.fromkeys(targets))
    modules = [(name, m) for name, m in base.named_modules() if name]
    kind = getattr(getattr(base, "config", None), "model_type", type(base).__name__)
    existing = adaptable_names(base)
    missing = [t for t in names if not any(_matches(name, t) for name, _ in modules)]
    if missing:
        close = {t: difflib.get_close_matches(t.rsplit(".", 1)[-1], existing, n=1) for t in missing}
        hints = "; ".join(f"did you mean {c[0]!r} for {t!r}?" for t, c in close.items() if c)
        raise LoraError(
            f"lora.target_modules: {', '.join(map(repr, missing))} match{'es' if len(missing) == 1 else ''} "
            f"no module of this {kind} model{'; ' + hints if hints else ''} (its layers LoRA can adapt: "
            f"{', '.join(existing)})"
        )
    for t in names:
        wrong = [(name, m) for name, m in modules if _matches(name, t) and layer_sizes(m) is None]
        if wrong:
            name, m = wrong[0]
            raise LoraError(
                f"lora.target_modules: {t!r} names {type(m).__name__} modules (e.g. {name}), which LoRA "
                f"cannot adapt; name linear layers instead: {', '.join(existing)}"
            )
    return names


def check_rank(model: Any, targets: list[str], rank: int) -> None:
    """Raise when `rank` is larger than a targeted layer (naming the smallest such layer and its sizes)."""
    too_small = []
    for name, m in base_of(model).named_modules():
        sizes = layer_sizes(m)
        if sizes is not None and any(_matches(name, t) for t in targets) and rank > min(sizes):
            too_small.append((min(sizes), name, type(m).__name__, sizes))
    if too_small:
        limit, name, kind, (n_in, n_out) = min(too_small)
        raise LoraError(
            f"lora.rank={rank} is larger than layer {name} ({kind}, {n_in} in -> {n_out} out features): "
            f"a rank-r adapter there has at most rank min({n_in}, {n_out}) = {limit}; use lora.rank <= "
            f"{limit} or leave {name.rsplit('.', 1)[-1]!r} out of lora.target_modules"
        )


# ---- into a LoRA model ----------------------------------------------------------------------


def apply_lora(model: Any, lora: LoraConfig, *, seed: int = 0) -> Any:
    """Freeze `model` and add rank ``lora.rank`` adapters to its target modules; returns the peft model.

    Call it before the model is placed (on the host): the adapters' init is seeded with `seed`
    and does not touch the global RNG, so every device and run starts from the same adapters.
    With gradient checkpointing on, the embedding output is made to require grad (the frozen
    base would otherwise cut the gradient at the first checkpointed layer).
    """
    if lora.rank < 1:
        raise LoraError(f"lora.rank={lora.rank} is not allowed here: apply_lora needs a rank >= 1")
    if is_lora(model):
        raise LoraError("the model already has LoRA adapters (a peft model): apply LoRA once")
    import peft

    targets = resolve_target_modules(model, lora.target_modules)
    check_rank(model, targets, lora.rank)
    conv1d = any(
        isinstance(m, _conv1d_type()) and any(_matches(name, t) for t in targets)
        for name, m in model.named_modules()
    )
    config = peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
        fan_in_fan_out=conv1d,  # GPT-2's Conv1D stores weights [in, out]
    )
    know_quantized_layers(config, model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = peft.get_peft_model(model, config)
    peft_model.peft_config[ADAPTER_NAME].base_model_name_or_path = getattr(model, "name_or_path", "") or None
    if any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
        model.enable_input_require_grads()
    return peft_model


def know_quantized_layers(config: Any, model: Any) -> None:
    """Have peft wrap `QuantizedLinear` base layers with its LoRA Linear (`_lora_on_quantized`), when
    `model` has any: peft's own dispatch knows only its layer types (``_register_custom_module``)."""
    if quantized_layers(base_of(model)):
        config._register_custom_module({QuantizedLinear: _lora_on_quantized()})


@functools.cache
def _lora_on_quantized() -> type:
    """peft's LoRA ``Linear`` for a `QuantizedLinear` base: its sizes from the layer (peft reads them
    only from the layer types it knows) and merging into the integers refused (`merged_state_dict`
    dequantizes and merges on the way out instead). Built on first use: peft is imported lazily."""
    from peft.tuners.lora.layer import Linear

    class QuantizedLoraLinear(Linear):
        def _get_in_out_features(self, module: Any) -> tuple[int, int]:
            return module.in_features, module.out_features

        def merge(self, safe_merge: bool = False, adapter_names: Any = None) -> None:
            raise LoraError(
                "adapters cannot be merged into int8/int4 base weights in place: save with merged=True "
                "(workbench.train.adapter_files.save_model), which writes the dequantized, merged weights in bf16"
            )

    return QuantizedLoraLinear


def trainable_parameters(model: Any) -> dict[str, torch.Tensor]:
    """Name -> tensor (detached) for every parameter that trains (the adapters of a LoRA model), under
    per-layer names: a stacked layer weight (``model.scan_layers``) gives each layer's slice."""
    return {name: tensor for name, tensor, trainable in per_layer_parameters(model) if trainable}


def parameter_counts(model: Any) -> tuple[int, int]:
    """(trainable, total) parameters, tied weights once; a quantized weight counts as the ``out x in``
    parameters it stands for (`workbench.models.quantize.logical_parameter_count`)."""
    seen: dict[int, torch.nn.Parameter] = {}
    for p in model.parameters():
        seen.setdefault(id(p), p)
    return sum(p.numel() for p in seen.values() if p.requires_grad), logical_parameter_count(model)
