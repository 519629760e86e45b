"""LoRA adapters and merged models as files: written whole or not at all, and read back onto the base they fit.

- `save_model(model, path, merged=...)`: a peft adapter directory (``adapter_config.json`` and
  ``adapter_model.safetensors``; `peft.PeftModel.from_pretrained(base, path)` loads it) with the base it
  was trained on recorded beside it (`base_model_identity`), or, merged (or without LoRA), a full
  `transformers` model directory whose weights are ``W + (alpha / r) B A`` (`merged_state_dict`); never
  over files the workbench did not write nor over the model's own base (`workbench.train.export_dir`).
  Tensors reach the host through `workbench.train.state_io.host_tensors` (one batched transfer under
  XLA); merging happens on the device, where the weights are. A quantized base is written as a bf16
  checkpoint of the dequantized, merged weights (`dequantized_state_dict`; a warning says so).
- `load_adapter(base, path)`: the adapter back onto its base, after checking it was saved for this
  base (`check_adapter_fits`: the names and shapes recorded beside it, and the adapter's own tensor shapes).

Making a model a LoRA model is `workbench.train.lora`'s.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from workbench.backend.native import process_group
from workbench.model_dirs import BASE_MODEL_FILE
from workbench.models.layer_stack import layer_weights_attached
from workbench.models.quantize import logical_parameter_count, quantized_layers
from workbench.train.export_dir import check_export_dir, staged_export
from workbench.train.lora import (
    ADAPTER_NAME,
    LoraError,
    base_of,
    is_lora,
    know_quantized_layers,
    layer_sizes,
    trainable_parameters,
)
from workbench.train.state_io import host_tensors

_ADAPTER_PART = re.compile(r"(^|\.)lora_[A-Za-z_]+(\.|$)")


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
    know_quantized_layers(config, base)  # onto a quantized base as onto its plain one
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
