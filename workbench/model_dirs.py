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
A Hub id (``org/name`` or ``org/name@revision``, `workbench.hub.ids`) stands for the repo's local
snapshot wherever a directory goes, a base an adapter or checkpoint records included; a local
directory of the same name wins.
Loading the weights is the train layer's job (`workbench.train.start`). This module reads JSON
only: it imports neither torch nor transformers, so the data layer and the CLI can ask it cheaply.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from workbench.hub.ids import hub_ref_of_snapshot
from workbench.hub.resolve import Use, local_dir

ModelKind = Literal["transformers", "adapter", "checkpoint"]

BASE_MODEL_FILE = "workbench_base_model.json"
"""Written beside a saved adapter by `workbench.train.adapter_files.save_model`: the base it was trained on."""
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
        hub = hub_ref_of_snapshot(self.path)
        if self.kind == "transformers" and hub is not None:
            return f"transformers checkpoint {hub[1].repo_id!r} (the Hub, commit {str(hub[1].revision)[:12]})"
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
    path: str | Path,
    *,
    base: str | Path | None = None,
    field: str = "model directory",
    notice: Callable[[str], None] | None = None,
    use: Use = "model",
) -> ModelDir:
    """Which kind of model directory `path` is, with its chain of bases; `ModelDirError` when it is none.

    `base` overrides an adapter's recorded base. `field` names where the path came from
    (``--model``, ``model.pretrained_path``) in the errors. A checkpoint root gives its newest step
    that verifies against its manifest; `notice` hears each newer one skipped as damaged (default: a
    RuntimeWarning, the workbench's notice). Nothing is moved: this only reads. A Hub id is its repo's
    snapshot, fetched where the local cache lacks it (`workbench.hub.HubError` when it cannot be): its
    weights too, or with ``use="config"`` its JSON files alone (each kind and base told apart, the
    shape read, nothing loadable).
    """
    base_dir = local_dir(base, field="--base", use=use) if base is not None else None
    return _resolve(local_dir(path, field=field, use=use), base_dir, field, seen=(), notice=notice, use=use)


def _resolve(
    path: Path,
    base: str | Path | None,
    field: str,
    seen: tuple[Path, ...],
    notice: Callable[[str], None] | None = None,
    use: Use = "model",
) -> ModelDir:
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
        base_path = Path(base).expanduser() if base is not None else _recorded_base(path, adapter, field, use)
        base_dir = _resolve(base_path, None, "the adapter's base", seen, notice, use)
        return ModelDir("adapter", path, base_dir, adapter=adapter)
    if all((path / name).is_file() for name in CHECKPOINT_FILES):
        return _checkpoint(path, field, seen, notice, use)
    steps = _complete_steps(path)
    if steps:
        return _checkpoint(newest_verifying(path, steps, field, notice), field, seen, notice, use)
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


def _recorded_base(path: Path, adapter: dict[str, Any], field: str, use: Use = "model") -> Path:
    """The adapter's base directory from its own files: the workbench's record first, then peft's."""
    recorded = path / BASE_MODEL_FILE
    names = []
    if recorded.is_file():
        names.append(str(_read_json(recorded).get("name_or_path") or ""))
    names.append(str(adapter.get("base_model_name_or_path") or ""))
    for name in filter(None, names):
        # a Hub id: its snapshot
        candidate = local_dir(name, field=f"the base {str(path)!r} records", use=use)
        if candidate.is_dir():
            return candidate
    named = next(filter(None, names), None)
    where = f"records its base as {named!r}, which is not a directory here" if named else "records no base"
    record = f'set "base_model_name_or_path" in {str(path / ADAPTER_CONFIG)!r} to the base model\'s directory'
    if field == "--model":  # generate and eval take --base
        fix = f"add --base DIR (the base model's directory), or {record}"
    elif field == "model.pretrained_path":  # train reads the base from the adapter's files only
        fix = record + (f", or put the base model back at {named!r}" if named else "")
    else:
        fix = (
            f"give the base model's directory (base=DIR here; --base DIR for generate and eval), or {record}"
        )
    raise ModelDirError(f"{field}={str(path)!r} is a LoRA adapter that {where}: {fix}")


def _checkpoint(
    path: Path,
    field: str,
    seen: tuple[Path, ...],
    notice: Callable[[str], None] | None = None,
    use: Use = "model",
) -> ModelDir:
    config = checkpoint_config(path)
    if config is None:
        raise ModelDirError(
            f"{field}={str(path)!r} is a training checkpoint whose state.json holds no run config: "
            "it was not written by the workbench's Trainer"
        )
    pretrained = (config.get("model") or {}).get("pretrained_path")
    field = "its run's model.pretrained_path"
    base = (
        _resolve(local_dir(pretrained, field=field, use=use), None, field, seen, notice, use)
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


def newest_verifying(
    root: Path, steps: list[Path], field: str, notice: Callable[[str], None] | None = None
) -> Path:
    """The newest of a checkpoint root's complete `steps` whose files match its manifest, read-only:
    each newer damaged one is skipped with a notice naming it and what is wrong; `ModelDirError` when
    none verifies. Hashes only as far back as the first one that verifies."""
    damaged = []
    for step in reversed(steps):
        damage = checkpoint_damage(step)
        if damage is None:
            for message in damaged:
                (notice or _warn)(f"{field}={str(root)!r}: skipped damaged {message}; using {step.name}")
            return step
        damaged.append(f"{step.name} ({damage})")
    raise ModelDirError(
        f"{field}={str(root)!r}: no checkpoint there verifies against its manifest: {'; '.join(damaged)}. "
        "Point it at another model directory, or train again (train.resume moves damaged checkpoints aside)"
    )


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def checkpoint_damage(step_dir: Path) -> str | None:
    """What is wrong with a complete checkpoint's files (one with a ``manifest.json``), or None when
    every file the manifest lists is there with its size and SHA-256. A manifest written by another
    checkpoint format still lists its files: those are checked the same way."""
    try:
        listed = manifest_files(json.loads((step_dir / "manifest.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"manifest.json is unreadable: {type(err).__name__}: {err}"
    damage = files_damage(step_dir, listed)
    return damage[1] if damage is not None else None


def manifest_files(manifest: dict[str, Any]) -> list[tuple[str, int, str]]:
    """(name, bytes, sha256) of each file a checkpoint's manifest lists; KeyError, TypeError, ValueError or
    AttributeError when the manifest is not one."""
    return [(str(name), int(meta["bytes"]), str(meta["sha256"])) for name, meta in manifest["files"].items()]


def files_damage(step_dir: Path, listed: list[tuple[str, int, str]]) -> tuple[str, str] | None:
    """The first of the (name, bytes, sha256) files under `step_dir` that is missing, of another size or
    another content: (``missing`` | ``truncated`` | ``corrupted``, what is wrong in words); None when all
    match. Sizes are checked first (a truncated file costs no hash), and a directory whose files verified
    earlier in this process, unchanged since (size and time of each), is not hashed again: a resume and
    its load, or a command's lookup and its load, hash it once."""
    stamps = []
    for name, size, _ in listed:
        file = step_dir / name
        if not file.is_file():
            return "missing", f"{name} is missing"
        stat = file.stat()
        if stat.st_size != size:
            return (
                "truncated",
                f"{name} is truncated or overwritten ({stat.st_size} bytes on disk, {size} written)",
            )
        stamps.append((name, stat.st_size, stat.st_mtime_ns))
    key = (str(step_dir.resolve()), tuple(listed))
    if _VERIFIED.get(key) == stamps:
        return None
    for name, _, digest in listed:
        if file_sha256(step_dir / name) != digest:
            return "corrupted", f"{name} is corrupted (its SHA-256 does not match the manifest)"
    _VERIFIED[key] = stamps
    return None


_VERIFIED: dict[tuple[str, tuple[tuple[str, int, str], ...]], list[tuple[str, int, int]]] = {}
"""Checkpoint directories whose files matched their manifest in this process, with each file's size and time then."""


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """The SHA-256 of a file's bytes, read in 4 MiB blocks (what a checkpoint's manifest records)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


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
