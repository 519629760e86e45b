"""Hub ids to local directories: ``huggingface_hub.snapshot_download`` with the files a use needs.

`local_dir(value, use=..., field=...)` is a local path as it is, or the snapshot of the Hub repo a
Hub id names (`workbench.hub.ids`): a model's weights, config and tokenizer files (an adapter repo's
adapter files), a tokenizer's files alone, a repo's JSON files alone (``use="config"``: its shape and
an adapter's base, what the memory estimate and ``plan`` read, never the weights), or a dataset repo's
files matching the patterns asked for.
The local cache (``HF_HUB_CACHE``) and ``HF_HUB_OFFLINE`` are ``huggingface_hub``'s own; a repo
resolved once in a process is not asked for again.

Every failure is a `HubError` with one line naming the field, the id and the fix: no such repo (or a
private one without a token), a gated repo without access, a revision it lacks, no network (or
``HF_HUB_OFFLINE``) with the repo not in the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from workbench.hub.auth import WHERE_TOKENS_COME_FROM, hub_token
from workbench.hub.ids import HubError, HubRef, RepoType, parse_hub_id

Use = Literal["model", "tokenizer", "config"]

TOKENIZER_PATTERNS = (
    "tokenizer*",
    "*.model",
    "*.tiktoken",
    "vocab*",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template*",
    "config.json",  # AutoTokenizer reads the model type from it when tokenizer_config.json names no class
)
"""A tokenizer's files: what ``AutoTokenizer.from_pretrained`` reads."""
MODEL_PATTERNS = (
    *TOKENIZER_PATTERNS,
    "*.json",  # config, generation config, safetensors index, adapter_config, the workbench's records
    "*.safetensors",
    "*.jinja",
)
"""A model's weights, config and tokenizer (an adapter repo's adapter files too): never its other files."""
CONFIG_PATTERNS = ("*.json",)
"""A repo's JSON files alone: config.json (the model's shape), an adapter's adapter_config.json and the
workbench's records of its base: what an estimate reads, kilobytes where the weights are gigabytes."""
_PATTERNS: dict[str, tuple[str, ...]] = {
    "model": MODEL_PATTERNS,
    "tokenizer": TOKENIZER_PATTERNS,
    "config": CONFIG_PATTERNS,
}
BIN_WEIGHTS = ("pytorch_model*.bin",)
"""Weights of a repo that has no safetensors (fetched only then)."""

_RESOLVED: dict[tuple[str, str, str | None, tuple[str, ...]], Path] = {}


def local_dir(value: str | Path, *, use: Use = "model", field: str = "model.pretrained_path") -> Path:
    """`value` as a local path, or the snapshot directory of the Hub repo it names (see the module's docstring)."""
    ref = parse_hub_id(str(value))
    if ref is None:
        return Path(value).expanduser()
    patterns = _PATTERNS[use]
    folder = hub_snapshot(ref, "model", patterns, field=field)
    if use == "model" and (folder / "config.json").is_file() and not any(folder.glob("*.safetensors")):
        folder = hub_snapshot(ref, "model", (*patterns, *BIN_WEIGHTS), field=field)
    if use == "model" and not has_weights(folder):
        # offline, a snapshot a plan's look left (its JSON files alone) comes back as it is
        fix = (
            "unset HF_HUB_OFFLINE to download them"
            if offline()
            else "the repo has none (*.safetensors, pytorch_model*.bin): give a model repo"
        )
        raise HubError(
            f"{field}={str(value)!r}: the local Hub cache ({cache_dir()}) holds {ref}'s JSON files but no "
            f"weights: {fix}, or give a local directory"
        )
    return folder


def has_weights(folder: Path) -> bool:
    """Whether a model snapshot holds weights (a model's or an adapter's), not only the JSON files an
    estimate fetched (``use="config"``)."""
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))


def hub_snapshot(ref: HubRef, repo_type: RepoType, patterns: Sequence[str], *, field: str) -> Path:
    """The local snapshot of `ref` with the files matching `patterns`, downloaded where missing."""
    key = (repo_type, ref.repo_id, ref.revision, tuple(patterns))
    if key in _RESOLVED:
        return _RESOLVED[key]
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            ref.repo_id,
            repo_type=repo_type,
            revision=ref.revision,
            allow_patterns=list(patterns),
            token=hub_token(),
        )
    except Exception as err:
        raise HubError(describe_failure(err, ref, repo_type, field)) from None
    _RESOLVED[key] = Path(folder)
    return _RESOLVED[key]


def cached_dir(value: str, *, use: Use = "model") -> Path | None:
    """The local snapshot of the Hub id `value` when the cache already holds it, asking no network (the
    doctor's look); None when `value` is no Hub id or the cache lacks it."""
    from huggingface_hub import snapshot_download

    ref = parse_hub_id(value)
    if ref is None:
        return None
    patterns = _PATTERNS[use]
    try:
        folder = Path(
            snapshot_download(
                ref.repo_id, revision=ref.revision, allow_patterns=list(patterns), local_files_only=True
            )
        )
    except Exception:  # not cached (LocalEntryNotFoundError), or cached incompletely
        return None
    if use == "model" and not has_weights(folder):
        return None  # only the JSON files an estimate fetched: the weights are still to download
    return folder


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) keeps ``huggingface_hub`` off the network."""
    from huggingface_hub import constants

    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def cache_dir() -> str:
    """Where ``huggingface_hub`` keeps its cache (``HF_HUB_CACHE``, or under ``HF_HOME``)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def describe_failure(err: BaseException, ref: HubRef, repo_type: RepoType, field: str) -> str:
    """One line naming `field`, the id and the fix for a failed ``snapshot_download`` of `ref`."""
    from huggingface_hub import errors

    what = f"{field}={str(ref)!r}"
    kind = "dataset repo" if repo_type == "dataset" else "model repo"
    url = ref.dataset_url if repo_type == "dataset" else ref.url
    cause = err.__cause__ or err.__context__
    if isinstance(err, errors.GatedRepoError):
        return (
            f"{what}: {ref.repo_id} is a gated {kind}: accept its terms at {url} with your account, then "
            f"{WHERE_TOKENS_COME_FROM} with a token of that account"
        )
    if isinstance(err, errors.RevisionNotFoundError):
        return f"{what}: {ref.repo_id} has no revision {ref.revision!r}: give a branch, tag or commit it has ({url})"
    if isinstance(err, errors.RepositoryNotFoundError) or _status(err) == 401:
        return (
            f"{what}: no {kind} {ref.repo_id!r} on the Hub and no local directory of that name: check the "
            f"spelling (org/name), or for a private repo {WHERE_TOKENS_COME_FROM}"
        )
    if isinstance(err, errors.OfflineModeIsEnabled) or isinstance(cause, errors.OfflineModeIsEnabled):
        return _not_cached(what, ref, kind, "HF_HUB_OFFLINE is set", "unset HF_HUB_OFFLINE to download it")
    if isinstance(err, errors.LocalEntryNotFoundError):
        if offline():
            return _not_cached(
                what, ref, kind, "HF_HUB_OFFLINE is set", "unset HF_HUB_OFFLINE to download it"
            )
        reason = f"the Hub cannot be reached ({_first_line(cause) if cause is not None else 'no network'})"
        return _not_cached(what, ref, kind, reason, "connect to the network and run it again")
    if type(err).__name__ == "IncompleteSnapshotError":
        return (
            f"{what}: the cached snapshot of {ref.repo_id} lacks files this needs and the Hub cannot be "
            f"reached: run it again with network access (and HF_HUB_OFFLINE unset) to complete it"
        )
    if isinstance(err, errors.HfHubHTTPError):
        return f"{what}: the Hub answered {_first_line(err)}: try again later, or give a local directory"
    if isinstance(err, OSError):
        return f"{what}: reading {ref.repo_id} from the Hub failed: {_first_line(err)}"
    return f"{what}: {type(err).__name__}: {_first_line(err)}"


def _not_cached(what: str, ref: HubRef, kind: str, reason: str, fix: str) -> str:
    revision = f" at revision {ref.revision!r}" if ref.revision else ""
    return (
        f"{what}: the {kind} {ref.repo_id}{revision} is not in the local Hub cache ({cache_dir()}) and "
        f"{reason}: {fix}, point HF_HUB_CACHE at a cache that holds it, or give a local directory"
    )


def _status(err: BaseException) -> int | None:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).strip().splitlines()[:1]) or type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def forget_resolved() -> None:
    """Forget this process's resolved snapshots (a later call asks ``huggingface_hub`` again)."""
    _RESOLVED.clear()
