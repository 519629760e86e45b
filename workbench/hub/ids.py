"""What a Hub id is, told apart from a local path: ``org/name`` or ``org/name@revision``.

A value names a local path when something exists there (a local directory of the same name wins, as in
transformers), when it is written as a path (absolute, ``./``, ``../``, ``~``, a backslash), or when
it ends in a file extension (``data/train.jsonl`` is a missing file, not a repo). Anything else of
the form ``org/name`` is a Hub id; ``@revision`` names a branch, tag or commit (default ``main``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

RepoType = Literal["model", "dataset"]

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"^(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[^\s@]+))?$")
_FILE_SUFFIXES = (
    ".jsonl",
    ".json",
    ".csv",
    ".parquet",
    ".txt",
    ".text",
    ".gz",
    ".yaml",
    ".yml",
    ".safetensors",
    ".bin",
    ".gguf",
    ".arrow",
)
DEFAULT_REVISION = "main"


class HubError(ValueError):
    """A Hub id that cannot be used here and now: the message is one line naming the id and the fix."""


@dataclass(frozen=True)
class HubRef:
    """A repo on the Hub at a revision (None: its default branch)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision}" if self.revision else self.repo_id

    @property
    def url(self) -> str:
        """The repo's page (a model's; `dataset_url` for a dataset)."""
        return f"https://huggingface.co/{self.repo_id}"

    @property
    def dataset_url(self) -> str:
        return f"https://huggingface.co/datasets/{self.repo_id}"


def parse_hub_id(value: str | Path | None) -> HubRef | None:
    """The `HubRef` `value` names, or None when it is a local path (see the module's docstring)."""
    if value is None or isinstance(value, Path):
        return None
    text = str(value).strip()
    if not text or text.startswith(("/", "./", "../", "~", ".")) or "\\" in text:
        return None
    match = _HUB_ID.match(text)
    if match is None:
        return None
    repo = match.group("repo")
    if "--" in repo or ".." in repo or repo.lower().endswith(_FILE_SUFFIXES):
        return None
    if Path(text).expanduser().exists() or Path(repo).expanduser().exists():
        return None  # a local directory (or file) of the same name wins
    return HubRef(repo, match.group("revision"))


def hub_ref_of_snapshot(path: str | Path) -> tuple[RepoType, HubRef] | None:
    """The repo a Hub cache snapshot directory holds (``.../models--org--name/snapshots/<commit>``,
    or a directory inside one), pinned to that commit; None for any other path."""
    parts = Path(path).expanduser().absolute().parts
    for index in range(len(parts) - 2, 0, -1):
        if parts[index] != "snapshots":
            continue
        kind, _, name = parts[index - 1].partition("--")
        if kind in ("models", "datasets") and "--" in name:
            org, _, repo = name.partition("--")
            repo_type: RepoType = "model" if kind == "models" else "dataset"
            return repo_type, HubRef(f"{org}/{repo}", parts[index + 1])
    return None
