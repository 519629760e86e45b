"""What the configured model needs from the machine: bytes of one checkpoint, bytes to load it.

A checkpoint (`workbench.train.checkpoint`) holds the trained weights and their optimizer
state: every parameter in a full fine-tune, only the adapters (fp32, as peft keeps them) under
LoRA. Parameter and optimizer-state counts come from `workbench.analysis` (`model_shape`,
`optimizer_state_elements`, `lora_adapter_shapes`), the same figures the memory estimate uses.

Loading needs host memory for the weights: their bytes in the training precision for a model
built from the config, the size of its weight files for ``model.pretrained_path``.

Nothing here imports transformers (whose import pulls in torch_xla, the very thing a broken
install crashes on): a config built from ``model.*`` is described to `model_shape` through the
family registry, a checkpoint's through its ``config.json`` read as JSON. `workbench.analysis`
imports torch, so sizing is done only when the doctor is given a config.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from workbench.doctor.checks import Check
from workbench.doctor.roots import DoctorRoots
from workbench.hub.ids import parse_hub_id
from workbench.hub.resolve import cached_dir
from workbench.units import format_bytes

PARAMETER_BYTES = {"fp32": 4, "bf16-mixed": 4, "bf16": 2}
"""Bytes of a weight and of an optimizer-state element per ``train.precision`` (bf16-mixed keeps fp32 masters)."""
ADAPTER_BYTES = 4
"""LoRA adapters and their optimizer state stay fp32 whatever the precision."""
WEIGHT_SUFFIXES = (".bin", ".pt", ".pth")
"""Weight files other than safetensors (read when a checkpoint has no ``*.safetensors``)."""


class SizingError(ValueError):
    """The model's needs cannot be worked out; the message names the setting and why."""


class MissingCheckpoint(SizingError):
    """``model.pretrained_path`` is not a checkpoint directory: the run cannot start either."""


@dataclass(frozen=True)
class ModelNeeds:
    """The configured model's parameters, its checkpoint's size and what loading it takes."""

    parameters: int
    trainable: int
    checkpoint_bytes: int
    """One checkpoint: the trained weights and their optimizer state."""
    load_bytes: int
    """Host memory to hold the weights while loading (before they reach the device)."""
    description: str


def count_text(n: int) -> str:
    """``1.24B``, ``494.0M``, ``106.8K``: a parameter count for people."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _weight_files(directory: Path) -> list[Path]:
    """The checkpoint's weight files: its safetensors, else its torch pickles (what from_pretrained reads)."""
    files = sorted(p for p in directory.glob("*.safetensors") if p.is_file())
    return files or sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def safetensors_shapes(files: list[Path]) -> list[tuple[int, ...]]:
    """The shape of every tensor in safetensors `files`, read from their JSON headers (no tensor is read)."""
    shapes: list[tuple[int, ...]] = []
    for path in files:
        with path.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            if not 0 < size < 1 << 30:
                raise SizingError(f"{path} is not a safetensors file (header size {size})")
            header = json.loads(handle.read(size))
        shapes += [tuple(entry["shape"]) for key, entry in header.items() if key != "__metadata__"]
    return shapes


def _config_view(cfg: Any, roots: DoctorRoots) -> tuple[SimpleNamespace, Path | None]:
    """What `model_shape` reads, without transformers: the checkpoint's config.json, or the
    family registry's arguments for ``model.*``; and the checkpoint directory, if any."""
    model = cfg.model
    if model.pretrained_path:
        directory = roots.resolve(model.pretrained_path)
        if not directory.exists() and parse_hub_id(model.pretrained_path) is not None:
            cached = cached_dir(model.pretrained_path)  # the Hub cache only: the doctor downloads nothing
            if cached is None:
                raise SizingError(
                    f"model.pretrained_path={model.pretrained_path!r} is a Hub id not in the local Hub cache yet: "
                    "the run downloads it (its size is not known before)"
                )
            directory = cached
        config_file = directory / "config.json"
        if not config_file.is_file():
            raise MissingCheckpoint(
                f"model.pretrained_path={model.pretrained_path!r}: no config.json in {directory}; expected a "
                "transformers checkpoint directory (config.json and weights), or None to build from model.*"
            )
        try:
            return SimpleNamespace(**json.loads(config_file.read_text())), directory
        except (OSError, ValueError, TypeError) as err:
            raise MissingCheckpoint(
                f"model.pretrained_path={model.pretrained_path!r}: {config_file} unreadable ({err})"
            ) from err
    from workbench.families import FAMILIES, FAMILY_NAMES

    family = FAMILIES.get(model.family)
    if family is None:
        raise SizingError(f"model.family={model.family!r} is not allowed: one of {', '.join(FAMILY_NAMES)}")
    return SimpleNamespace(model_type=family.name, **family.config_kwargs(model)), None


def model_needs(cfg: Any, roots: DoctorRoots) -> ModelNeeds:
    """The needs of the model `cfg` (a `WorkbenchConfig`) trains; `SizingError` when they cannot be known."""
    view, directory = _config_view(cfg, roots)
    try:
        from workbench.analysis.estimate import lora_adapter_shapes, optimizer_state_elements, state_elements
        from workbench.analysis.objective_memory import NEXT_TOKEN
        from workbench.analysis.shape import model_shape
        from workbench.objective_registry import objective_for
    except Exception as err:  # a broken torch: the version checks say which
        raise SizingError(f"cannot size the model: importing workbench.analysis failed ({err})") from err
    optimizer, precision = cfg.train.optimizer, cfg.train.precision
    weight_bytes = PARAMETER_BYTES.get(precision, 4)
    files = _weight_files(directory) if directory is not None else []
    if directory is not None and not files:
        raise MissingCheckpoint(
            f"model.pretrained_path={cfg.model.pretrained_path!r}: no weight files (*.safetensors, *.bin) in {directory}"
        )
    shape: Any = None
    try:
        shape = model_shape(view)
        parameters = shape.num_parameters
    except (ValueError, AttributeError, TypeError) as err:
        # a family the registry does not know, or a config.json without its sizes at the top level:
        # count the checkpoint's own tensors
        safetensors = [p for p in files if p.suffix == ".safetensors"]
        if not safetensors or cfg.lora.rank:
            raise SizingError(f"cannot size the model: {err}") from err
        tensor_shapes = safetensors_shapes(safetensors)
        parameters = sum(math.prod(s) for s in tensor_shapes)
    if cfg.lora.rank:
        adapters = [s for _, s in lora_adapter_shapes(shape, cfg.lora.rank, cfg.lora.target_modules)]
        trainable = sum(math.prod(s) for s in adapters)
        checkpoint = (trainable + state_elements(adapters, optimizer)) * ADAPTER_BYTES
        mode = f"LoRA r{cfg.lora.rank}: {count_text(trainable)} trainable"
    else:
        trainable = parameters
        state = (
            optimizer_state_elements(shape, optimizer)
            if shape is not None
            else state_elements(tensor_shapes, optimizer)
        )
        checkpoint = (parameters + state) * weight_bytes
        mode = "full fine-tune"
    if directory is not None:
        load = sum(p.stat().st_size for p in files)
        source = f"{directory} ({len(files)} weight file(s), {format_bytes(load)})"
    else:
        load = parameters * weight_bytes
        source = f"model.family={cfg.model.family!r} from the config"
    copies = (objective_for(cfg).memory(cfg) or NEXT_TOKEN).weight_copies  # DPO's frozen reference copy
    if copies:  # a second copy on the host, then the device
        copy_bytes = copies * parameters * weight_bytes
        load += copy_bytes
        mode += f", {cfg.train.objective} with a frozen reference copy (+{format_bytes(copy_bytes)})"
    description = (
        f"{source}: {count_text(parameters)} parameters, {mode}, {optimizer}, {precision}; one checkpoint "
        f"{format_bytes(checkpoint)}, loading {format_bytes(load)}"
    )
    return ModelNeeds(parameters, trainable, checkpoint, load, description)


def model_check(cfg: Any, roots: DoctorRoots) -> tuple[Check, ModelNeeds | None]:
    """The "model" check (fail for a checkpoint that is not there, warn when it cannot be sized) and its needs."""
    try:
        needs = model_needs(cfg, roots)
    except (ValueError, OSError) as err:  # SizingError, LoRA targets that match no matrix, unreadable weights
        status = "fail" if isinstance(err, MissingCheckpoint) else "warn"
        fix = (
            "set model.pretrained_path to a transformers checkpoint directory (config.json + weights)"
            if status == "fail"
            else "the disk and memory checks below cannot compare with the model: check them by hand"
        )
        return Check("model", status, str(err), fix), None
    return Check("model", "ok", needs.description), needs
