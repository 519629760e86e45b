"""A Hub dataset repo's data files for one subset and split (``data.subset``, ``data.split``).

The repo's own declaration comes first: a README whose YAML header lists ``configs`` (each a
``config_name``, its ``data_files`` as patterns, per split or all ``train``; one marked ``default``)
is read as the Hub's dataset viewer reads it. A repo that declares none is read by its layout, as
``datasets`` does: a subset is a top-level directory, and a file belongs to the split its path names
(``train``/``training``, ``validation``/``valid``/``val``/``dev``, ``test``/``testing``/``eval``); with no
split named anywhere every file is ``train``.

Only the README is fetched first; then only the files of the chosen subset and split. The files are
read by the workbench's own loaders (`workbench.data.records`), so an unreadable record is still
named by its file and line. A subset or split the repo lacks is a `HubError` naming the ones it has.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.hub.ids import HubError, HubRef
from workbench.hub.resolve import hub_snapshot

DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt")
"""The data files the workbench's loaders read (`workbench.data.records`)."""
SPLIT_NAMES = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "testing", "eval", "evaluation"),
}
"""The names a file's path may give its split, by the split they mean (``datasets``' conventions)."""
_README = "README.md"


@dataclass(frozen=True)
class DatasetFiles:
    """The files of one subset and split of a Hub dataset repo, in the local snapshot."""

    ref: HubRef
    files: tuple[Path, ...]
    subset: str | None
    split: str

    def describe(self) -> str:
        """'openai/gsm8k (subset main, split train)'."""
        subset = f"subset {self.subset}, " if self.subset else ""
        return f"{self.ref} ({subset}split {self.split})"


def dataset_files(ref: HubRef, subset: str | None, split: str, *, field: str = "data.source") -> DatasetFiles:
    """The local files of `subset` (None: the repo's default or only one) and `split` of the dataset `ref`."""
    what = f"{field}={str(ref)!r}"
    card = hub_snapshot(ref, "dataset", [_README], field=field) / _README
    configs = _declared_configs(card)
    if configs:
        name, patterns_by_split = _choose_config(configs, subset, what)
        patterns = patterns_by_split.get(split)
        if patterns is None:
            raise HubError(
                f"{what}: {_in(name)}has no split {split!r}: set data.split to one of "
                f"{', '.join(sorted(patterns_by_split))}"
            )
        folder = hub_snapshot(ref, "dataset", patterns, field=field)
        files = _matching(folder, patterns)
    else:
        patterns = [f"{subset}/*{suffix}" if subset else f"*{suffix}" for suffix in DATA_SUFFIXES]
        folder = hub_snapshot(ref, "dataset", patterns, field=field)
        found = _matching(folder, patterns)
        if subset and not found:
            raise HubError(
                f"{what}: has no subset {subset!r} (it declares no subsets and holds no directory {subset}/ "
                "with data files): leave data.subset unset, or check the name on the repo's page"
            )
        by_split = _split_by_path(folder, found)
        if split not in by_split:
            listed = ", ".join(sorted(by_split)) or "none"
            raise HubError(
                f"{what}: {_in(subset)}has no split {split!r}: its splits are {listed} (data.split)"
            )
        files, name = by_split[split], subset
    if not files:
        raise HubError(
            f"{what}: {_in(name)}split {split!r} lists no {'/'.join(DATA_SUFFIXES)} files the workbench reads"
        )
    return DatasetFiles(ref, tuple(files), name, split)


def _in(subset: str | None) -> str:
    return f"subset {subset!r} " if subset else ""


def _declared_configs(card: Path) -> list[dict[str, Any]]:
    """The ``configs`` of a dataset card's YAML header ([] without a card or header)."""
    import yaml

    if not card.is_file():
        return []
    text = card.read_text(encoding="utf-8", errors="replace")
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.DOTALL)
    if match is None:
        return []
    try:
        header = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError:
        return []
    configs = header.get("configs") if isinstance(header, dict) else None
    return [c for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []


def _choose_config(
    configs: list[dict[str, Any]], subset: str | None, what: str
) -> tuple[str, dict[str, list[str]]]:
    """(name, split -> file patterns) of the declared config `subset` names, or of the default one."""
    names = [str(c.get("config_name", "default")) for c in configs]
    if subset is None:
        defaults = [c for c in configs if c.get("default")] or [
            c for c in configs if c.get("config_name", "default") == "default"
        ]
        if len(configs) == 1:
            chosen = configs[0]
        elif len(defaults) == 1:
            chosen = defaults[0]
        else:
            raise HubError(
                f"{what}: the repo has several subsets: set data.subset to one of {', '.join(names)}"
            )
    else:
        matches = [c for c, n in zip(configs, names) if n == subset]
        if not matches:
            raise HubError(f"{what}: has no subset {subset!r}: set data.subset to one of {', '.join(names)}")
        chosen = matches[0]
    return str(chosen.get("config_name", "default")), _split_patterns(chosen.get("data_files"))


def _split_patterns(data_files: Any) -> dict[str, list[str]]:
    """A config's ``data_files`` as split -> patterns (a bare pattern or list of them: all ``train``)."""
    if isinstance(data_files, str):
        return {"train": [data_files]}
    if isinstance(data_files, dict):
        return {str(k): [v] if isinstance(v, str) else [str(p) for p in v] for k, v in data_files.items()}
    out: dict[str, list[str]] = {}
    for entry in data_files or []:
        if isinstance(entry, str):
            out.setdefault("train", []).append(entry)
        elif isinstance(entry, dict) and "path" in entry:
            paths = entry["path"]
            out.setdefault(str(entry.get("split", "train")), []).extend(
                [paths] if isinstance(paths, str) else [str(p) for p in paths]
            )
    return out


def _matching(folder: Path, patterns: list[str]) -> list[Path]:
    """The data files under `folder` whose repo path matches one of `patterns`, sorted."""
    found = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if not path.is_file() or relative.startswith(".") or not relative.lower().endswith(DATA_SUFFIXES):
            continue
        if any(fnmatch.fnmatch(relative, pattern) for pattern in patterns):
            found.append(path)
    return found


def _split_by_path(folder: Path, files: list[Path]) -> dict[str, list[Path]]:
    """The files by the split their paths name; every file is ``train`` when no path names a split."""
    named: dict[str, list[Path]] = {}
    for path in files:
        words = re.split(r"[^a-z]+", path.relative_to(folder).with_suffix("").as_posix().lower())
        split = next((s for s, aliases in SPLIT_NAMES.items() if any(w in aliases for w in words)), None)
        if split is not None:
            named.setdefault(split, []).append(path)
    return named if named else ({"train": files} if files else {})
