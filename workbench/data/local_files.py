"""A ``data.source`` read as raw records: a local file, a directory of files, a save_to_disk directory, or
the files of a Hub dataset id (`workbench.hub.dataset_files`: its ``data.subset`` and ``data.split``).

`load_source` loads it through ``datasets`` (the builder by ``data.file_type``, or by the extension under
``'auto'``; a file plainly of another type than the one set is refused naming ``data.file_type``; a
save_to_disk directory is copied into the workbench's cache, its ``data.split`` or its only one) and
returns how to place a record of it (`PlaceRecord`: its file and line, `workbench.data.file_errors`).
A file ``datasets`` cannot parse raises a `DataFileError` naming the file, line and column.
`convert_local` runs an objective's record reader over them (SFT records: `workbench.data.records`,
preference pairs: `workbench.data.preference`, prompts: `workbench.data.prompts`), placing a record it
refuses.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.data import formats
from workbench.data.file_errors import DataFileError, data_file_error, load_errors, record_error
from workbench.data.tokenizer import cache_root
from workbench.hub.dataset_files import dataset_files
from workbench.hub.ids import parse_hub_id

_EXTENSIONS = {
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".txt": "text",
    ".text": "text",
}
"""File extension -> ``datasets`` builder, for ``data.file_type='auto'``."""
_BUILDERS = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "text": "text"}
"""``data.file_type`` -> ``datasets`` builder."""

PlaceRecord = Callable[[formats.RecordError], DataFileError]
"""Turns an unreadable record's error into one naming where the record is in data.source."""


def convert_local(
    data_cfg: Any,
    cache_dir: str | os.PathLike[str] | None,
    convert: Any,
    *,
    objective: str,
    shipped: str,
    kind: str,
) -> Any:
    """``convert(records, data_cfg)`` of the records in ``data.source`` (a local file, directory or
    save_to_disk directory, or a Hub dataset id); a record `convert` refuses raises an error naming its
    file and line. `objective`, `shipped` and `kind` word the error of a source that does not exist."""
    path = Path(data_cfg.source).expanduser()
    if not path.exists() and parse_hub_id(data_cfg.source) is None:
        raise FileNotFoundError(
            f"data.source={str(path)!r} does not exist; train.objective={objective} reads {shipped!r}, a "
            f"local file/directory of {kind} or a Hub dataset id (org/name)"
        )
    records, place = load_source(data_cfg, cache_dir)
    try:
        return convert(records, data_cfg)
    except formats.RecordError as err:
        if err.index is None:
            raise
        raise place(err) from None


def load_source(data_cfg: Any, cache_dir: str | os.PathLike[str] | None) -> tuple[Any, PlaceRecord]:
    """The raw records of ``data.source`` (a local path, else a Hub dataset id: the files of its
    ``data.subset`` and ``data.split``, `workbench.hub.dataset_files`), and how to place a record of them."""
    ref = parse_hub_id(data_cfg.source)
    if ref is None:
        return load_local(Path(data_cfg.source).expanduser(), data_cfg, cache_dir)
    found = dataset_files(ref, data_cfg.subset, data_cfg.split)
    return _load_files(list(found.files), data_cfg, cache_dir)


def load_local(
    path: Path, data_cfg: Any, cache_dir: str | os.PathLike[str] | None
) -> tuple[Any, PlaceRecord]:
    """The raw records of a local file, directory of files or save_to_disk directory, and how to
    place a record of them."""
    if not path.exists():
        raise FileNotFoundError(
            f"data.source={str(path)!r} does not exist; use 'embedded', 'chat-sample', 'math-sample', a local "
            "file/directory or a Hub dataset id (org/name)"
        )
    if path.is_dir() and any((path / name).is_file() for name in ("dataset_dict.json", "state.json")):
        return _load_saved(path, cache_dir, data_cfg.split)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in _EXTENSIONS)
    else:
        files = [path]
    if not files:
        raise ValueError(
            f"data.source={str(path)!r} holds no {'/'.join(sorted(_EXTENSIONS))} files "
            "and is no directory written by save_to_disk"
        )
    return _load_files(files, data_cfg, cache_dir)


def _load_files(
    files: list[Path], data_cfg: Any, cache_dir: str | os.PathLike[str] | None
) -> tuple[Any, PlaceRecord]:
    """The raw records of data `files` (all of one type), and how to place a record of them."""
    import datasets

    # Configs from before data.file_type said data.format='text' for a text file of any extension.
    fallback = "text" if data_cfg.format == "text" and data_cfg.file_type == "auto" else None
    if data_cfg.file_type == "auto":
        kinds = {_EXTENSIONS.get(p.suffix.lower(), fallback) for p in files}
        if None in kinds or len(kinds) != 1:
            raise ValueError(
                f"data.file_type='auto' cannot tell the file type of {[p.name for p in files][:5]}: "
                "set data.file_type to one of jsonl, json, csv, parquet, text"
            )
        builder = kinds.pop()
    else:
        builder = _BUILDERS[data_cfg.file_type]
        _check_file_type(files[:3], data_cfg.file_type)
    try:
        ds = datasets.load_dataset(
            builder,
            data_files=[str(p) for p in files],
            split="train",
            cache_dir=str(cache_root(cache_dir) / "datasets"),
            # Any encoding but "utf-8" makes the json builder decode each chunk strictly, so bytes that
            # are not UTF-8 fail here (where the line is found) instead of in a later map.
            **({"encoding": "utf-8-sig"} if builder == "json" else {}),
        )
    except load_errors() as err:  # re-read in plain Python only once datasets has failed
        raise data_file_error(files, builder, err) from err
    # re-reads the files only once a record has failed
    return ds, lambda err: record_error(files, builder, err.index or 0, err.problem)


_LOOKS_LIKE = {
    "jsonl": "JSON lines (its first line is a JSON object)",
    "json": "JSON (it opens with '[')",
    "parquet": "Parquet (it starts with PAR1)",
}


def _check_file_type(files: list[Path], file_type: str) -> None:
    """`ValueError` blaming ``data.file_type`` when a file plainly is another type than the one set
    (JSON lines read as csv, Parquet read as JSON, ...): its records would reach `data.format`'s
    detection as one odd column, and the error would blame the format. ``text`` reads any file."""
    if file_type == "text":
        return
    for path in files:
        sniffed = _sniff_file_type(path)
        same = {sniffed, file_type} <= {"json", "jsonl"}
        if sniffed is not None and sniffed != file_type and not same:
            raise ValueError(
                f"data.file_type={file_type!r} reads {str(path)!r} as {file_type}, but it looks like "
                f"{_LOOKS_LIKE[sniffed]}: set data.file_type={sniffed} (or auto, which goes by the extension)"
            )
        if sniffed is None and file_type == "parquet":
            raise ValueError(
                f"data.file_type='parquet' reads {str(path)!r} as Parquet, but it does not start with "
                "Parquet's PAR1 marker: set data.file_type to what it is (jsonl, json, csv, text) or auto"
            )


def _sniff_file_type(path: Path) -> str | None:
    """'parquet', 'json' or 'jsonl' when the file's first bytes say so; None when they do not (csv, text)."""
    try:
        with path.open("rb") as f:
            head = f.read(65536)
    except OSError:
        return None  # loading it says what is wrong
    if head.startswith(b"PAR1"):
        return "parquet"
    text = head.decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
    if text.startswith("["):
        return "json"
    first = text.split("\n", 1)[0].strip()
    if first.startswith("{"):
        try:
            return "jsonl" if isinstance(json.loads(first), dict) else None
        except ValueError:
            return "json" if "\n" in text else None  # a pretty-printed object spans lines
    return None


def _load_saved(
    path: Path, cache_dir: str | os.PathLike[str] | None, split: str = "train"
) -> tuple[Any, PlaceRecord]:
    """A directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (its `split`
    (``data.split``), or its only one when that is 'train'; a notice says which), copied into the
    workbench's cache."""
    import datasets

    loaded = datasets.load_from_disk(str(path))
    where = str(path)
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if split not in loaded and (split != "train" or len(splits) != 1):
            raise ValueError(
                f"data.source={str(path)!r} is a DatasetDict with the splits {splits} and none named {split!r}: "
                f"set data.split to one of them, or point data.source at one split's directory, e.g. "
                f"{str(path / splits[0])!r}"
            )
        wanted = split
        split = split if split in loaded else splits[0]
        which = f"its {split!r} split" if split == wanted else f"its only split, {split!r}"
        warnings.warn(
            f"data.source={str(path)!r} is a DatasetDict (splits {', '.join(splits)}): reading {which}, "
            f"{len(loaded[split]):,} records",
            RuntimeWarning,
            stacklevel=4,  # load_records' caller
        )
        loaded, where, path = loaded[split], f"{path} (split {split!r})", path / split
    # Later maps write their cache files beside the data: a copy in the workbench's cache keeps them
    # out of the user's directory (which may be read-only, as a mounted dataset is).
    digest = hashlib.sha256(str(path.resolve()).encode())
    for name in ("state.json", "dataset_info.json"):
        digest.update((path / name).read_bytes())
    copy = cache_root(cache_dir) / "datasets" / "from_disk" / f"{digest.hexdigest()[:16]}.arrow"
    copy.parent.mkdir(parents=True, exist_ok=True)
    ds = loaded.flatten_indices(cache_file_name=str(copy))
    return ds, lambda err: DataFileError(
        f"data.source: {where} record {(err.index or 0) + 1}: {err.problem}", path=path
    )
