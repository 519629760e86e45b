"""LoRA: turn a `transformers` causal LM into a LoRA model with `peft`, and back into files.

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
- `save_model(model, path, merged=...)`: a peft adapter directory (``adapter_config.json`` and
  ``adapter_model.safetensors``; `peft.PeftModel.from_pretrained(base, path)` loads it), or,
  merged (or without LoRA), a full `transformers` model directory whose weights are
  ``W + (alpha / r) B A``; written whole or not at all, never over files the workbench did not write
  nor over the model's own base (`workbench.train.export_dir`). Tensors reach the host through `workbench.train.state_io.host_tensors`
  (one batched transfer under XLA); merging happens on the device, where the weights are.
- `load_adapter(base, path)`: the adapter back onto its base, after checking it was saved for
  this base (the names and shapes recorded beside it, and the adapter's own tensor shapes).

A quantized base (``model.quantize``: `workbench.models.quantize.QuantizedLinear` layers) takes
adapters like a Linear one: peft wraps each quantized layer with its LoRA ``Linear`` (registered
as a custom module), the adapters stay fp32, and the base counts its logical parameters, so an
adapter trained on it loads onto the plain unquantized base (and back onto a quantized one).
Merged, it is written as a bf16 `transformers` checkpoint of the dequantized, merged weights
(`dequantized_state_dict`; a warning says so).

Placement under SPMD is `workbench.parallel.apply.shard_model`'s job: it runs on the LoRA model
like on any other (base weights by their family rules, adapters by theirs). `peft` is imported
only here and only when a function here runs, so a run with ``lora.rank=0`` never needs it.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from workbench.backend.native import process_group
from workbench.model_dirs import BASE_MODEL_FILE
from workbench.models.layer_stack import layer_weights_attached, per_layer_parameters
from workbench.models.quantize import QuantizedLinear, logical_parameter_count, quantized_layers
from workbench.train.export_dir import check_export_dir, staged_export
from workbench.train.state_io import host_tensors

if TYPE_CHECKING:  # annotations only
    from workbench.config import LoraConfig

ADAPTER_NAME = "default"
_ADAPTER_PART = re.compile(r"(^|\.)lora_[A-Za-z_]+(\.|$)")


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
    _know_quantized_layers(config, model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = peft.get_peft_model(model, config)
    peft_model.peft_config[ADAPTER_NAME].base_model_name_or_path = getattr(model, "name_or_path", "") or None
    if any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
        model.enable_input_require_grads()
    return peft_model


def _know_quantized_layers(config: Any, model: Any) -> None:
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
                "(workbench.train.lora.save_model), which writes the dequantized, merged weights in bf16"
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


# ---- and back: files -------------------------------------------------------------------------


def base_model_identity(model: Any) -> dict[str, Any]:
    """What names a base model: its path (if it was loaded from one), family and sizes. The parameter
    count is the unquantized model's (a quantized base names the same model as its plain one)."""
    base = base_of(model)
    config = base.config
    adapters = sum(p.numel() for name, p in base.named_parameters() if _ADAPTER_PART.search(name))
    return {
        "name_or_path": _local_name(getattr(base, "name_or_path", "") or ""),
        "model_type": getattr(config, "model_type", type(base).__name__),
        "hidden_size": getattr(config, "hidden_size", None),
        "num_layers": getattr(config, "num_hidden_layers", None),
        "vocab_size": getattr(config, "vocab_size", None),
        "parameters": logical_parameter_count(base) - adapters,
    }


def _local_name(name: str) -> str:
    """A base's name as recorded: an existing local directory made absolute, so the adapter finds its base
    from any working directory (`workbench.model_dirs`); a Hub cache snapshot as its Hub id pinned to the
    commit (``org/name@<commit>``: found again through any Hub cache); a hub-style name as it is."""
    import os

    from workbench.hub.ids import hub_ref_of_snapshot

    hub = hub_ref_of_snapshot(name) if name and os.path.isdir(name) else None
    if hub is not None:
        return str(hub[1])
    return os.path.abspath(name) if name and os.path.isdir(name) else name


def describe_base(identity: dict[str, Any]) -> str:
    """'/models/llama (llama, hidden 4096, 32 layers, vocab 32000, 6738.4M parameters)'."""
    sizes = (
        f"{identity.get('model_type')}, hidden {identity.get('hidden_size')}, {identity.get('num_layers')} "
        f"layers, vocab {identity.get('vocab_size')}, {identity.get('parameters', 0) / 1e6:.1f}M parameters"
    )
    name = identity.get("name_or_path")
    if "hidden_size" not in identity:  # an adapter saved without the workbench's record
        return repr(name) if name else "a base model it does not record"
    return f"{name!r} ({sizes})" if name else f"a {identity.get('model_type')} built from a config ({sizes})"


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Host copies of the base model's weights with every adapter merged in (``W + scale * B A``),
    under the base model's own parameter names. A quantized base (`QuantizedLinear` layers) comes
    out dequantized, merged and in bf16 (`dequantized_state_dict`)."""
    from peft.tuners.lora import LoraLayer

    base = base_of(model)
    if quantized_layers(base):
        return dequantized_state_dict(model)
    merged: dict[str, torch.Tensor] = {}
    with torch.no_grad(), layer_weights_attached(base):
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer) and ADAPTER_NAME in module.scaling:
                weight = module.get_base_layer().weight
                delta = module.get_delta_weight(ADAPTER_NAME)
                merged[f"{name}.weight"] = (weight + delta.to(weight.device)).to(weight.dtype)
        tensors = {}
        for key, value in base.state_dict().items():
            if _ADAPTER_PART.search(key):
                continue
            clean = key.replace(".base_layer.", ".")
            tensors[clean] = merged.get(clean, value)
    return host_tensors(tensors)


MERGED_DTYPE = torch.bfloat16
"""What a quantized base's merged (or plain) export is written in: its integers hold at most 8 bits."""


def dequantized_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Host tensors of a model with `QuantizedLinear` layers as a plain `transformers` checkpoint in
    bf16: each quantized weight dequantized with its scales, its adapter (if any) merged in fp32,
    ``weight_scale`` entries gone, every floating tensor bf16, names without peft's wrappers.

    The model's tensors reach the host in one batched transfer (integers: the smallest form); the
    dequantizing and merging happen there, layer by layer, so the device never holds a bf16 copy.
    """
    from workbench.models.quantize import dequantize_weight

    base = base_of(model)
    layers = quantized_layers(base)
    state = host_tensors(dict(base.state_dict()))
    merged: dict[str, torch.Tensor] = {}
    for name, layer in layers.items():
        weight = dequantize_weight(state.pop(f"{name}.weight"), state.pop(f"{name}.weight_scale"), layer.mode)
        owner = name.removesuffix(".base_layer")
        a, b = (
            state.get(f"{owner}.lora_A.{ADAPTER_NAME}.weight"),
            state.get(f"{owner}.lora_B.{ADAPTER_NAME}.weight"),
        )
        if a is not None and b is not None:
            scaling = base.get_submodule(owner).scaling[ADAPTER_NAME]
            weight += scaling * (b.float() @ a.float())
        merged[f"{owner}.weight"] = weight.to(MERGED_DTYPE)
        del weight
    for key, value in state.items():
        if not _ADAPTER_PART.search(key):
            merged[key.replace(".base_layer.", ".")] = (
                value.to(MERGED_DTYPE) if value.is_floating_point() else value
            )
    return merged


def save_model(
    model: Any,
    path: str | Path,
    *,
    merged: bool = False,
    tokenizer: Any = None,
    write: bool = True,
    overwrite: bool = False,
    protected: Mapping[Path, str] | None = None,
) -> Path:
    """Write `model` to directory `path`: a peft adapter (a LoRA model, ``merged=False``), else a full
    `transformers` model (merged adapters included); `tokenizer` (when given) beside it. Returns the path.

    `path` must be new, empty or an earlier export (`workbench.train.export_dir`; `overwrite` replaces
    any other directory), never the model's own base nor a `protected` directory; the files appear
    there complete or not at all. Under torchrun every rank calls it (an FSDP2 model's shards are
    gathered) and only the one with `write` writes."""
    path = check_export_dir(path, overwrite=overwrite, protected={**_own_base(model), **(protected or {})})
    adapter = is_lora(model) and not merged
    with staged_export(path, kind="adapter" if adapter else "transformers", write=write) as staging:
        _write_model(model, staging, adapter=adapter, write=write, shown_as=path)
        if tokenizer is not None and write:
            tokenizer.save_pretrained(str(staging))
    if process_group.current() is not None:  # under torchrun: no rank reads it before the writer is done
        process_group.barrier()
    return path


def _own_base(model: Any) -> dict[Path, str]:
    """The local directory `model`'s base weights were loaded from (an export must not replace it)."""
    name = getattr(base_of(model), "name_or_path", "") or ""
    if not name or not Path(name).is_dir():  # built from a config, or named on the hub
        return {}
    return {Path(name): "the directory this model's base weights were loaded from"}


def _write_model(model: Any, path: Path, *, adapter: bool, write: bool, shown_as: Path) -> None:
    """`save_model`'s files into `path` (`shown_as` is where they end up, for the notices)."""
    if adapter:
        adapters = host_tensors(trainable_parameters(model))
        if write:
            model.save_pretrained(str(path), state_dict=adapters, save_embedding_layers=False)
            (path / BASE_MODEL_FILE).write_text(json.dumps(base_model_identity(model), indent=1))
    elif quantized_layers(base_of(model)):
        modes = sorted({layer.mode for layer in quantized_layers(base_of(model)).values()})
        state = dequantized_state_dict(model)
        if write:
            base_of(model).save_pretrained(str(path), state_dict=state)
            _set_config_dtype(path, MERGED_DTYPE)
            warnings.warn(
                f"{'merged ' if is_lora(model) else ''}model saved to {str(shown_as)!r} dequantized from "
                f"{'/'.join(modes)} to {str(MERGED_DTYPE).removeprefix('torch.')}: its base weights were "
                "quantized, so this is a plain transformers checkpoint of the dequantized (and merged) weights",
                UserWarning,
                stacklevel=3,
            )
    else:
        state = merged_state_dict(model) if is_lora(model) else host_tensors(dict(model.state_dict()))
        if write:
            base_of(model).save_pretrained(str(path), state_dict=state)


def _set_config_dtype(path: Path, dtype: torch.dtype) -> None:
    """Record `dtype` in a saved model's ``config.json`` (transformers writes the live model's)."""
    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def load_adapter(base: Any, path: str | Path, *, is_trainable: bool = False) -> Any:
    """`peft.PeftModel.from_pretrained(base, path)`, after checking the adapter was saved for `base`."""
    path = Path(path)
    if not (path / "adapter_config.json").is_file():
        raise LoraError(f"{str(path)!r} is not a LoRA adapter directory: it has no adapter_config.json")
    check_adapter_fits(base, path)
    import peft

    if not quantized_layers(base_of(base)):
        return peft.PeftModel.from_pretrained(base, str(path), is_trainable=is_trainable)
    config = peft.LoraConfig.from_pretrained(str(path))
    _know_quantized_layers(config, base)  # onto a quantized base as onto its plain one
    return peft.PeftModel.from_pretrained(base, str(path), is_trainable=is_trainable, config=config)


def check_adapter_fits(base: Any, path: str | Path) -> None:
    """Raise `LoraError`, naming both base models, when the adapter at `path` was saved for another one."""
    path = Path(path)
    ours = base_model_identity(base)
    recorded = path / BASE_MODEL_FILE
    theirs = json.loads(recorded.read_text()) if recorded.is_file() else None
    if theirs is None:
        config = json.loads((path / "adapter_config.json").read_text())
        theirs = {"name_or_path": config.get("base_model_name_or_path") or ""}
    sizes = ("model_type", "hidden_size", "num_layers", "vocab_size", "parameters")
    mismatch = recorded.is_file() and any(theirs.get(k) != ours.get(k) for k in sizes)
    detail = "" if mismatch else _shape_mismatch(base, path)
    if mismatch or detail:
        raise LoraError(
            f"the adapter at {str(path)!r} was saved for base model {describe_base(theirs)}; this base "
            f"model is {describe_base(ours)}{detail}: load it onto the model it was trained from"
        )
    if (
        theirs["name_or_path"]
        and ours["name_or_path"]
        and _local_name(theirs["name_or_path"]) != ours["name_or_path"]
    ):
        warnings.warn(
            f"the adapter at {str(path)!r} was saved for {theirs['name_or_path']!r}; loading it onto "
            f"{ours['name_or_path']!r}, which has the same shape",
            RuntimeWarning,
            stacklevel=3,
        )


def _shape_mismatch(base: Any, path: Path) -> str:
    """' (its adapter for X ...)' when the adapter's tensors do not fit `base`'s layers; '' when they do."""
    from safetensors import safe_open

    weights = path / "adapter_model.safetensors"
    if not weights.is_file():
        return ""
    modules = dict(base_of(base).named_modules())
    with safe_open(str(weights), framework="pt") as f:
        keys = f.keys()  # a safetensors handle is not iterable
        for key in keys:
            match = re.match(r"^(?:base_model\.model\.)?(.+)\.lora_(A|B)\.weight$", key)
            if not match:
                continue
            name, part = match.groups()
            module = modules.get(name)
            if module is not None and hasattr(module, "get_base_layer"):
                module = module.get_base_layer()
            sizes = layer_sizes(module)
            shape = tuple(f.get_slice(key).get_shape())
            got = shape[1] if part == "A" else shape[0]
            if sizes is None:
                return f" (its adapter is for a layer {name}, which this model does not have)"
            if got != (sizes[0] if part == "A" else sizes[1]):
                side = "input" if part == "A" else "output"
                return (
                    f" (its adapter for {name} has {side} size {got}; this model's {name} is "
                    f"{sizes[0]} in -> {sizes[1]} out)"
                )
    return ""
