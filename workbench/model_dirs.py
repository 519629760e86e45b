"""What a model directory is, read from its files alone: the directories one command writes and the next takes.

The workbench writes three kinds of model directory, and every command that takes a model
(``generate --model``, ``eval --model``, ``train model.pretrained_path=...``) accepts each:

- **transformers**: a checkpoint with ``config.json`` and weights (``save_pretrained``; a full
  fine-tune or a merged LoRA run from ``train --save-pretrained``).
- **adapter**: a peft LoRA adapter (``adapter_config.json``); its base is found through its own
  files (the workbench's ``workbench_base_model.json``, then peft's ``base_model_name_or_path``)
  or given (``--base DIR``).
- **checkpoint**: a training checkpoint (``train.checkpoint_dir/step-N`` with ``manifest.json`` and
  ``state.json``), or the ``train.checkpoint_dir`` itself (its newest complete step). Its base is the
  run's own ``model.pretrained_path`` (None: a model built from the run's config).

`resolve_model_dir` names the kind and the chain of bases, and `tokenizer_dir` says where the
tokenizer lies (a directory written by ``train --save-pretrained`` has one beside the weights).
Loading the weights is the train layer's job (`workbench.train.start`). This module reads JSON
only: it imports neither torch nor transformers, so the data layer and the CLI can ask it cheaply.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

ModelKind = Literal["transformers", "adapter", "checkpoint"]

BASE_MODEL_FILE = "workbench_base_model.json"
"""Written beside a saved adapter by `workbench.train.lora.save_model`: the base it was trained on."""
ADAPTER_CONFIG = "adapter_config.json"
CHECKPOINT_FILES = ("manifest.json", "state.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
STEP_DIR = re.compile(r"^step-(\d{8,})$")
"""A complete or partial checkpoint's directory name under ``train.checkpoint_dir``."""


class ModelDirError(ValueError):
    """A directory that is no model the workbench can start from; the message says what it holds and what to do."""


@dataclass(frozen=True)
class ModelDir:
    """One model directory and what its weights start from."""

    kind: ModelKind
    path: Path
    base: ModelDir | None = None
    """An adapter's base; a checkpoint's ``model.pretrained_path`` (None: built from its run's config)."""
    run_config: dict[str, Any] | None = None
    """A checkpoint's run config (the ``WorkbenchConfig.to_dict()`` it was written with)."""
    adapter: dict[str, Any] | None = None
    """An adapter's ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``, ...)."""

    @property
    def transformers_root(self) -> Path | None:
        """The transformers checkpoint at the bottom of the chain (None: a model built from a config)."""
        node: ModelDir | None = self
        while node is not None and node.kind != "transformers":
            node = node.base
        return node.path if node is not None else None

    @property
    def lora_rank(self) -> int:
        """Rank of the adapters this directory carries (0: none, the weights are whole)."""
        if self.kind == "adapter":
            return int((self.adapter or {}).get("r") or 0)
        if self.kind == "checkpoint":
            return int(((self.run_config or {}).get("lora") or {}).get("rank") or 0)
        return 0

    def describe(self) -> str:
        """'adapter out (rank 16) on transformers checkpoint /ckpt/qwen' — the chain, in one phrase."""
        if self.kind == "transformers":
            return f"transformers checkpoint {str(self.path)!r}"
        if self.kind == "adapter":
            return f"LoRA adapter {str(self.path)!r} (rank {self.lora_rank}) on {_describe_base(self.base)}"
        step = _step_of(self.path)
        what = f"training checkpoint {str(self.path)!r}" + (f" (step {step})" if step is not None else "")
        lora = f", LoRA rank {self.lora_rank}" if self.lora_rank else ""
        return f"{what}{lora} of a run on {_describe_base(self.base)}"


def _describe_base(base: ModelDir | None) -> str:
    return base.describe() if base is not None else "a model built from its config"


def resolve_model_dir(
    path: str | Path, *, base: str | Path | None = None, field: str = "model directory"
) -> ModelDir:
    """Which kind of model directory `path` is, with its chain of bases; `ModelDirError` when it is none.

    `base` overrides an adapter's recorded base. `field` names where the path came from
    (``--model``, ``model.pretrained_path``) in the errors.
    """
    return _resolve(Path(path).expanduser(), base, field, seen=())


def _resolve(path: Path, base: str | Path | None, field: str, seen: tuple[Path, ...]) -> ModelDir:
    if not path.is_dir():
        what = "is a file, not a directory" if path.exists() else "does not exist"
        raise ModelDirError(f"{field}={str(path)!r} {what}: give a model directory ({_KINDS})")
    if path.resolve() in seen:
        raise ModelDirError(f"{field}={str(path)!r}: its chain of base models loops back to itself")
    seen = (*seen, path.resolve())
    if (path / "config.json").is_file():
        return ModelDir("transformers", path)
    if (path / ADAPTER_CONFIG).is_file():
        adapter = _read_json(path / ADAPTER_CONFIG)
        base_path = Path(base).expanduser() if base is not None else _recorded_base(path, adapter, field)
        return ModelDir(
            "adapter", path, _resolve(base_path, None, "the adapter's base", seen), adapter=adapter
        )
    if all((path / name).is_file() for name in CHECKPOINT_FILES):
        return _checkpoint(path, field, seen)
    steps = _complete_steps(path)
    if steps:
        return _checkpoint(steps[-1], field, seen)
    partial = [p.name for p in path.glob("step-*") if p.is_dir()]
    hint = f"; its {', '.join(sorted(partial)[:3])} are incomplete (no manifest.json)" if partial else ""
    found = sorted(p.name for p in path.iterdir())[:8]
    raise ModelDirError(
        f"{field}={str(path)!r} is no model directory: it holds {found or 'nothing'}{hint}. Expected {_KINDS}"
    )


_KINDS = (
    "a transformers checkpoint with config.json, a LoRA adapter with adapter_config.json, or a training "
    "checkpoint (train.checkpoint_dir or its step-N directory)"
)


def _recorded_base(path: Path, adapter: dict[str, Any], field: str) -> Path:
    """The adapter's base directory from its own files: the workbench's record first, then peft's."""
    recorded = path / BASE_MODEL_FILE
    names = []
    if recorded.is_file():
        names.append(str(_read_json(recorded).get("name_or_path") or ""))
    names.append(str(adapter.get("base_model_name_or_path") or ""))
    for name in filter(None, names):
        candidate = Path(name).expanduser()
        if candidate.is_dir():
            return candidate
    named = next(filter(None, names), None)
    where = f"records its base as {named!r}, which is not a directory here" if named else "records no base"
    raise ModelDirError(
        f"{field}={str(path)!r} is a LoRA adapter that {where}: give the base model's directory "
        "(--base DIR on the command line), or set base_model_name_or_path in its adapter_config.json"
    )


def _checkpoint(path: Path, field: str, seen: tuple[Path, ...]) -> ModelDir:
    config = checkpoint_config(path)
    if config is None:
        raise ModelDirError(
            f"{field}={str(path)!r} is a training checkpoint whose state.json holds no run config: "
            "it was not written by the workbench's Trainer"
        )
    pretrained = (config.get("model") or {}).get("pretrained_path")
    base = (
        _resolve(Path(pretrained).expanduser(), None, "its run's model.pretrained_path", seen)
        if pretrained
        else None
    )
    return ModelDir("checkpoint", path, base, run_config=config)


def checkpoint_config(path: str | Path) -> dict[str, Any] | None:
    """The run config stored in a training checkpoint's ``state.json`` (None when it has none)."""
    try:
        payload = _read_json(Path(path) / "state.json")
        return _plain(payload["state"]["config"])
    except (ModelDirError, KeyError, TypeError):
        return None


def _plain(node: Any) -> Any:
    """`state_io.flatten_state`'s JSON encoding of a tensor-free value, decoded (dicts with any keys, tuples)."""
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, dict):
        if "__items__" in node:
            return {key: _plain(value) for key, value in node["__items__"]}
        if "__tuple__" in node:
            return tuple(_plain(v) for v in node["__tuple__"])
        return {key: _plain(value) for key, value in node.items()}
    return node


def _complete_steps(root: Path) -> list[Path]:
    """``step-N`` directories under `root` whose save finished (they have a manifest), in the order
    `CheckpointManager.checkpoints` keeps: when each was written, then by step."""
    steps = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / "manifest.json").is_file()]
    return sorted(steps, key=lambda p: (checkpoint_written_at(p), _step_of(p)))


def checkpoint_written_at(directory: Path) -> float:
    """When a complete checkpoint was written: its manifest's time, else the manifest file's mtime."""
    manifest = directory / "manifest.json"
    try:
        return float(json.loads(manifest.read_text())["created_unix"])
    except (OSError, ValueError, KeyError, TypeError):
        try:  # an unreadable manifest: loading it will say so; order it by the file's time meanwhile
            return manifest.stat().st_mtime
        except OSError:
            return 0.0


def _step_of(path: Path) -> int | None:
    match = STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


def tokenizer_dir(model: ModelDir) -> Path | None:
    """Where the tokenizer for `model` lies: beside its weights, else its run's ``data.tokenizer_path``
    (a checkpoint), else its base's. None: the run trained the workbench's own tokenizer on the corpus
    (`workbench.data.tokenizer.get_tokenizer` makes the same one again from the run's data settings)."""
    if model.kind != "checkpoint" and any((model.path / name).is_file() for name in TOKENIZER_FILES):
        return model.path
    if model.kind == "checkpoint":
        saved = ((model.run_config or {}).get("data") or {}).get("tokenizer_path")
        if saved:
            return Path(saved).expanduser()
    return tokenizer_dir(model.base) if model.base is not None else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ModelDirError(f"{str(path)!r} cannot be read as JSON: {err}") from None
    if not isinstance(value, dict):
        raise ModelDirError(f"{str(path)!r} holds a JSON {type(value).__name__}, not an object")
    return value
