"""The weights a run or a command starts from: any model directory the workbench writes, loaded.

`workbench.model_dirs` says what a directory is (a transformers checkpoint, a LoRA adapter, a
training checkpoint); this module turns it into a model:

- `load_for_inference(path, base=None)` -> (model, tokenizer) for ``generate`` and ``eval``: the
  base with its adapters on (a peft model) or the whole weights, on the host.
- `starting_model(cfg, tokenizer)` -> `StartingModel` for the `Trainer` when ``model.pretrained_path``
  names any of the three. A run with LoRA (``lora.rank > 0``) on an adapter, or on a checkpoint of a
  LoRA run, **continues those adapters**: the base is loaded, the trainer applies its LoRA, and
  `StartingModel.carry_into` copies the adapter weights in (rank, alpha and target modules must
  match, or the error names the overrides that do). A full fine-tune (``lora.rank=0``) on an adapter
  trains every weight of the merged model, and says so. A checkpoint of a full fine-tune gives its
  weights; a checkpoint of a run built from a config (no ``pretrained_path``) is built the same way.

Only the model part of a training checkpoint is read (its manifest is verified first); its
optimizer state is left alone: a run that starts from a checkpoint is a new run (``train.resume``
is how a run continues its own).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.config import LoraConfig, WorkbenchConfig
from workbench.model_dirs import ModelDir, ModelDirError, resolve_model_dir, tokenizer_dir
from workbench.models.build import build_model
from workbench.train.adapter_files import check_adapter_fits
from workbench.train.lora import ADAPTER_NAME, apply_lora, resolve_target_modules
from workbench.train.state import load_model_state

_ADAPTER_KEY = re.compile(r"\.(lora_[A-Za-z_]+)\.(weight|bias)$")


@dataclass(frozen=True)
class CarriedAdapter:
    """Adapter weights to put back once the run's LoRA is applied, under the live model's names."""

    lora: LoraConfig
    """The adapters' rank, alpha and target modules as they were trained."""
    tensors: dict[str, torch.Tensor]
    """``base_model.model....lora_A.default.weight`` -> host tensor (`trainable_parameters` names)."""
    source: ModelDir


@dataclass
class StartingModel:
    """The model a run builds on, before `prepare_model`, and the adapters to carry into it after."""

    model: Any
    carried: CarriedAdapter | None = None

    def carry_into(self, model: Any) -> None:
        """Copy the carried adapter weights into `model`'s live adapters (after LoRA is applied)."""
        if self.carried is not None:
            load_model_state(model, self.carried.tensors)


def load_for_inference(
    path: str | Path,
    *,
    base: str | Path | None = None,
    attn_implementation: str = "eager",
    notice: Callable[[str], None] | None = None,
) -> tuple[Any, Any]:
    """(model, tokenizer) from any model directory; a `ModelDirError` (a ValueError) says what is wrong.
    A checkpoint root gives its newest step that verifies; `notice` hears each damaged newer one skipped
    (read-only: nothing is moved)."""
    model_dir = resolve_model_dir(path, base=base, field="--model", notice=notice)
    try:
        tokenizer = load_tokenizer(model_dir)
        model, carried = _weights(model_dir, tokenizer, attn_implementation)
    except ModelDirError:
        raise
    except (OSError, ValueError, KeyError) as err:  # transformers' own, from a damaged directory
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelDirError(
            f"cannot load a causal LM and tokenizer from {model_dir.describe()}: {first}"
        ) from err
    if carried is not None:
        if model_dir.kind == "adapter":  # the adapter's own record of its base, with its clear errors
            check_adapter_fits(model, model_dir.path)
        model = apply_lora(model, carried.lora)
        load_model_state(model, carried.tensors)
    model.config.use_cache = True  # built for training with the cache off; generation wants it
    return model, tokenizer


def starting_model(
    cfg: WorkbenchConfig, tokenizer: Any, notice: Callable[[str], None] | None = None
) -> StartingModel:
    """The Trainer's model for `cfg`: built or loaded as ``model.pretrained_path`` says (see the docstring)."""
    vocab = len(tokenizer) if tokenizer is not None else None
    path = cfg.model.pretrained_path
    model_dir = resolve_model_dir(path, field="model.pretrained_path") if path else None
    if model_dir is None or model_dir.kind == "transformers":
        return StartingModel(build_model(cfg.model, vocab_size=vocab, seed=cfg.train.seed))
    model, carried = _weights(model_dir, tokenizer, "eager", seed=cfg.train.seed)
    if carried is None:
        return StartingModel(model)
    if cfg.lora.rank == 0:
        merged = apply_lora(model, carried.lora)
        load_model_state(merged, carried.tensors)
        if notice is not None:
            notice(
                f"model.pretrained_path is a {model_dir.describe()}: lora.rank=0 trains every weight of the "
                f"base with its adapters merged in; set lora.rank={carried.lora.rank} to continue the adapters"
            )
        model = merged.merge_and_unload()
        model.requires_grad_(True)  # LoRA froze the base; a full fine-tune trains all of it
        return StartingModel(model)
    _check_same_adapters(model, cfg.lora, carried)
    return StartingModel(model, carried)


def load_tokenizer(model_dir: ModelDir) -> Any:
    """The tokenizer beside `model_dir` or its base; a checkpoint of a run that trained the workbench's
    own tokenizer gets the same one from its run's data settings."""
    from workbench.data.tokenizer import get_tokenizer

    found = tokenizer_dir(model_dir)
    if found is not None:
        return get_tokenizer(dataclasses.replace(WorkbenchConfig().data, tokenizer_path=str(found)))
    run_config = run_config_of(model_dir)
    if run_config is None:
        raise ModelDirError(
            f"{model_dir.describe()} has no tokenizer beside it or its base: save one there "
            "(tokenizer.save_pretrained(DIR)) or point data.tokenizer_path at one"
        )
    return get_tokenizer(WorkbenchConfig.from_dict(run_config).data)


def run_config_of(model_dir: ModelDir | None) -> dict[str, Any] | None:
    """The run config of the nearest checkpoint in `model_dir`'s chain (None when there is none)."""
    while model_dir is not None and model_dir.run_config is None:
        model_dir = model_dir.base
    return model_dir.run_config if model_dir is not None else None


def _weights(
    model_dir: ModelDir, tokenizer: Any, attn_implementation: str, seed: int | None = None
) -> tuple[Any, CarriedAdapter | None]:
    """The base model with any whole weights loaded, and the adapters still to put on (or None)."""
    root = model_dir.transformers_root
    run_config = run_config_of(model_dir)
    if root is not None:
        model_cfg = dataclasses.replace(WorkbenchConfig().model, pretrained_path=str(root))
    else:  # a run built from its config: the same shapes and seed give the same base
        assert run_config is not None  # a chain without a transformers root ends at a checkpoint
        model_cfg = WorkbenchConfig.from_dict(run_config).model
        seed = int(run_config.get("train", {}).get("seed", 0)) if seed is None else seed
    vocab = len(tokenizer) if tokenizer is not None else None
    model = build_model(model_cfg, vocab_size=vocab, seed=seed or 0, attn_implementation=attn_implementation)
    if model_dir.kind == "adapter":
        return model, _adapter_from_files(model_dir)
    if model_dir.kind != "checkpoint":
        return model, None
    tensors = _checkpoint_model_tensors(model_dir.path)
    if model_dir.lora_rank:
        lora = WorkbenchConfig.from_dict(model_dir.run_config or {}).lora
        return model, CarriedAdapter(lora, tensors, model_dir)
    model.load_state_dict(tensors)
    model.name_or_path = str(model_dir.path)  # an adapter trained on these weights records them as its base
    return model, None


def _adapter_from_files(model_dir: ModelDir) -> CarriedAdapter:
    """A peft adapter directory's weights under the live model's parameter names, and its LoRA settings."""
    from safetensors.torch import load_file

    adapter = model_dir.adapter or {}
    weights = model_dir.path / "adapter_model.safetensors"
    if not weights.is_file():
        raise ModelDirError(f"LoRA adapter {str(model_dir.path)!r} has no adapter_model.safetensors")
    targets = adapter.get("target_modules")
    if isinstance(targets, str):
        raise ModelDirError(
            f"LoRA adapter {str(model_dir.path)!r} names its target modules by a pattern ({targets!r}); "
            "the workbench continues adapters whose target_modules is a list of names"
        )
    lora = LoraConfig(rank=int(adapter.get("r") or 0), alpha=float(adapter.get("lora_alpha") or 16.0))
    lora.target_modules = sorted(targets or [])
    tensors = {
        _ADAPTER_KEY.sub(rf".\1.{ADAPTER_NAME}.\2", key): value
        for key, value in load_file(str(weights)).items()
    }
    return CarriedAdapter(lora, tensors, model_dir)


def _checkpoint_model_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The ``model`` part of a training checkpoint, on the host (the manifest verified first)."""
    from workbench.train.checkpoint import CheckpointManager
    from workbench.train.state_io import CheckpointError

    try:
        state = CheckpointManager(path.parent).load(path, parts=("model",))
    except CheckpointError as err:  # damaged or from another format: the user's to fix, not a crash
        raise ModelDirError(str(err)) from None
    return dict(state["model"])


def _check_same_adapters(model: Any, lora: LoraConfig, carried: CarriedAdapter) -> None:
    """Refuse to continue adapters under other LoRA settings, naming the overrides that match them."""
    had, wanted = carried.lora, lora
    settings = {
        "lora.rank": (had.rank, wanted.rank),
        "lora.alpha": (f"{had.alpha:g}", f"{wanted.alpha:g}"),
        "lora.target_modules": tuple(
            "[" + ",".join(sorted(resolve_target_modules(model, x.target_modules))) + "]"
            for x in (had, wanted)
        ),
    }
    differ = {name: pair for name, pair in settings.items() if pair[0] != pair[1]}
    if not differ:
        return
    asked = " ".join(f"{name}={now}" for name, (_, now) in differ.items())
    fix = " ".join(f"{name}={was}" for name, (was, _) in differ.items())
    raise ModelDirError(
        f"model.pretrained_path is a {carried.source.describe()}; this run asks for {asked}. To continue its "
        f"adapters pass {fix}; lora.rank=0 trains every weight of the merged model instead"
    )
