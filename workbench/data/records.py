"""Records to training examples: load the data source, tokenise plain text or chat, split, share by host.

**Records** (`load_records`): "embedded" (the embedded corpus, column ``text``), "chat-sample"
(the shipped chat SFT records, from `workbench.data.corpus`), "math-sample" (the arithmetic word
problems of `workbench.data.math_sample` as question/solution chat turns), a local jsonl/json/csv/parquet/text
file or directory (``data.file_type``), loaded through ``datasets``, a directory written by
``save_to_disk``, or a Hub dataset id (the files of its ``data.subset`` and ``data.split``, read the same way). Whatever their shape, `workbench.data.formats` reads them (``data.format``,
``data.columns``, ``data.filter``) into one ``messages`` column (chat) or the text column.

**Tokenising** (`tokenize_records`): plain text becomes ``bos + text + eos`` with labels equal
to the ids; chat records (any chat format) are rendered with the chat template and their labels
are `IGNORE_INDEX` (-100) everywhere except the assistant turns.
Records that teach nothing are left out — texts that are empty, not strings or a single
token, chat records with no assistant token to predict — and counted in one
``RuntimeWarning``. Sequences are not cut here: lengths above ``data.max_length`` are
truncated or dropped by the batch sampler, which counts them (`workbench.data.sampler`).

**The builder** (`build_datasets`): records, tokenised, split into a seeded train and eval
part; each host keeps its equal share of the train part (`workbench.backend.multihost`).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.backend.multihost import shard_for_host
from workbench.backend.xla import runtime
from workbench.data import formats
from workbench.data.corpus import CHAT_SAMPLE, embedded_corpus
from workbench.data.file_errors import DataFileError, data_file_error, load_errors, record_error
from workbench.data.tokenizer import cache_root, get_tokenizer, missing_chat_template, tokenizer_setting
from workbench.hub.dataset_files import dataset_files
from workbench.hub.ids import parse_hub_id

IGNORE_INDEX = -100
"""Label of a token that is not predicted (prompt, padding, packed borders); `torch`'s default ignore_index."""


# ---- records ---------------------------------------------------------------------------------

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

_Place = Callable[[formats.RecordError], DataFileError]
"""Turns an unreadable record's error into one naming where the record is in data.source."""


def _read_chat_sample() -> list[dict[str, Any]]:
    with open(CHAT_SAMPLE, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def load_records(data_cfg: Any, cache_dir: str | os.PathLike[str] | None = None) -> Any:
    """The records of `data_cfg.source` as a `datasets.Dataset` with one column: ``messages`` for
    chat records, the text column for plain text (`workbench.data.formats.prepare_records`:
    ``data.columns`` applied, ``data.filter`` and ``data.max_examples`` too).

    A record its format cannot read raises an error naming the file and line when the records
    come from files.
    """
    import datasets

    source = data_cfg.source
    place: _Place | None = None
    if source == "embedded":
        ds = datasets.Dataset.from_dict({"text": embedded_corpus()})
    elif source == "chat-sample":  # a mix of messages and prompt/response records
        rows = [
            formats.record_messages(r, "messages" if "messages" in r else "prompt_response")
            for r in _read_chat_sample()
        ]
        ds = datasets.Dataset.from_list([{"messages": m} for m in rows])
    elif source == "math-sample":  # its questions and solutions as chat turns: the fine-tune before GRPO
        from workbench.data.math_sample import math_sample_records, sft_messages

        ds = datasets.Dataset.from_list([{"messages": m} for m in sft_messages(math_sample_records())])
    else:
        ds, place = _load_source(data_cfg, cache_dir)
    try:
        # the shipped sources are known shapes: the format notice is for the user's own data
        return formats.prepare_records(ds, data_cfg, announce=place is not None)
    except formats.RecordError as err:
        if place is None or err.index is None:
            raise
        raise place(err) from None


def convert_local(
    data_cfg: Any,
    cache_dir: str | os.PathLike[str] | None,
    convert: Any,
    *,
    objective: str,
    shipped: str,
    kind: str,
) -> Any:
    """``convert(records, data_cfg)`` of the records in the local ``data.source`` (a file, directory or
    save_to_disk directory); a record `convert` refuses raises an error naming its file and line.
    `objective`, `shipped` and `kind` word the error of a source that does not exist."""
    path = Path(data_cfg.source).expanduser()
    if not path.exists() and parse_hub_id(data_cfg.source) is None:
        raise FileNotFoundError(
            f"data.source={str(path)!r} does not exist; train.objective={objective} reads {shipped!r}, a "
            f"local file/directory of {kind} or a Hub dataset id (org/name)"
        )
    records, place = _load_source(data_cfg, cache_dir)
    try:
        return convert(records, data_cfg)
    except formats.RecordError as err:
        if err.index is None:
            raise
        raise place(err) from None


def _load_source(data_cfg: Any, cache_dir: str | os.PathLike[str] | None) -> tuple[Any, _Place]:
    """The raw records of ``data.source`` (a local path, else a Hub dataset id: the files of its
    ``data.subset`` and ``data.split``, `workbench.hub.dataset_files`), and how to place a record of them."""
    ref = parse_hub_id(data_cfg.source)
    if ref is None:
        return _load_local(Path(data_cfg.source).expanduser(), data_cfg, cache_dir)
    found = dataset_files(ref, data_cfg.subset, data_cfg.split)
    return _load_files(list(found.files), data_cfg, cache_dir)


def _load_local(path: Path, data_cfg: Any, cache_dir: str | os.PathLike[str] | None) -> tuple[Any, _Place]:
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
) -> tuple[Any, _Place]:
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
) -> tuple[Any, _Place]:
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


# ---- tokenising ------------------------------------------------------------------------------


def _warn_left_out(dropped: int, total: int, why: str) -> None:
    """One warning for the records tokenising left out, so a shrunken dataset is never a surprise."""
    if dropped:
        warnings.warn(
            f"{dropped} of {total} records were left out when tokenising: {why}",
            RuntimeWarning,
            stacklevel=3,
        )


def chat_token_ids(
    tokenizer: Any,
    messages: list[dict[str, str]],
    *,
    add_generation_prompt: bool = False,
    named_by: str = "the one given",
    other_way: str = "or render the text yourself",
) -> list[int]:
    """The token ids of `messages` rendered with the tokenizer's chat template, as a plain list;
    `ValueError` when it has none, naming the tokenizer (`named_by`: where it came from) and the fixes
    (`other_way`: the caller's way around, e.g. "or leave out --chat").

    ``apply_chat_template(..., tokenize=True)`` returns a list under transformers 4.x and a
    ``BatchEncoding`` (``input_ids``, ``attention_mask``) under 5.x, whose default became
    ``return_dict=True``; asking for ``return_dict=False`` gives the list under both, and a
    tokenizer that answers with a mapping anyway has its ``input_ids`` taken.
    """
    missing = missing_chat_template(tokenizer, named_by)
    if missing is not None:
        raise ValueError(
            f"rendering chat turns needs a tokenizer with a chat template; {missing}, {other_way}"
        )
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
    )
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(i) for i in out]


def fold_system_turn(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The opening system turn as the head of the first user turn (a blank line between): what a chat
    template that refuses a system role (Gemma 2's) can render, with the instructions kept."""
    system, rest = messages[0], messages[1:]
    if rest and rest[0]["role"] == "user":
        merged = {"role": "user", "content": f"{system['content']}\n\n{rest[0]['content']}"}
        return [merged, *rest[1:]]
    return [{"role": "user", "content": system["content"]}, *rest]


def _chat_example(messages: list[dict[str, str]], tokenizer: Any) -> dict[str, list[int]]:
    """Ids of the rendered conversation; labels only on the assistant turns.

    Each assistant turn's label span is found by rendering the conversation up to the turn
    with the generation prompt (the prefix) and up to its end: the tokens in between are the
    answer. Works with any chat template whose renders of a prefix are token prefixes. A template
    that refuses a system turn gets it folded into the first user turn (`fold_system_turn`).
    """

    def render(msgs: list[dict[str, str]], prompt: bool) -> list[int]:
        return chat_token_ids(tokenizer, msgs, add_generation_prompt=prompt)

    try:
        ids = render(messages, False)
    except Exception as err:  # the template's own raise_exception (a jinja2 TemplateError)
        if messages and messages[0]["role"] == "system" and "system" in str(err).lower():
            return _chat_example(fold_system_turn(messages), tokenizer)
        raise
    labels = [IGNORE_INDEX] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = render(messages[:i], True) if i else []
        upto = render(messages[: i + 1], False)
        start, end = len(prefix), len(upto)
        if ids[:start] != prefix or ids[:end] != upto:
            raise ValueError(
                "the tokenizer's chat template does not render conversation prefixes as token prefixes; "
                "cannot locate assistant turns to label"
            )
        labels[start:end] = ids[start:end]
    return {"input_ids": ids, "labels": labels, "length": len(ids)}


def tokenize_records(dataset: Any, tokenizer: Any, data_cfg: Any) -> Any:
    """Columns ``input_ids``, ``labels`` (-100 on chat prompts), ``length``; no truncation here.

    Takes records as `load_records` gives them, or records of any format whose columns bear the
    format's own names (``data.columns`` and ``data.filter`` are `load_records`' part). Records
    with nothing to predict are left out and counted in one ``RuntimeWarning``.
    """
    detected = formats.detect_format(dataset.column_names, data_cfg)
    if detected.chat:
        missing = missing_chat_template(tokenizer, tokenizer_setting(data_cfg))
        if missing is not None:
            raise ValueError(
                f"the records are chat records (from {detected.reason}), which need a tokenizer with a chat "
                f"template; {missing}, give data.tokenizer_path=DIR of a tokenizer that has one, or set "
                "data.format=text to train on a text column"
            )

        def chat(record: dict[str, Any], index: int) -> dict[str, Any]:
            try:
                return _chat_example(detected.messages(record), tokenizer)
            except formats.RecordError as err:
                raise formats.RecordError(err.problem, index) from None

        out = dataset.map(chat, with_indices=True, remove_columns=dataset.column_names, desc=None)
        # Label 0 is never predicted (nothing precedes it): a record needs a label after it.
        kept = out.filter(lambda r: any(x != IGNORE_INDEX for x in r["labels"][1:]))
        _warn_left_out(
            len(out) - len(kept),
            len(out),
            "chat records with no assistant token to predict (no assistant turn, or empty ones)",
        )
        return kept

    field = detected.columns[0]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id

    def text(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        texts = [t if isinstance(t, str) else "" for t in batch[field]]
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
        ids = [
            ([bos] if bos is not None else []) + e + ([eos] if eos is not None else []) for e in encoded if e
        ]
        # Empty texts and single tokens teach nothing (no next token): left out, and counted
        # below from the row counts (a batched map may shrink), not in here.
        ids = [x for x in ids if len(x) >= 2]
        return {"input_ids": ids, "labels": [list(x) for x in ids], "length": [len(x) for x in ids]}

    out = dataset.map(text, batched=True, remove_columns=dataset.column_names)
    _warn_left_out(
        len(dataset) - len(out),
        len(dataset),
        f"their data.text_field={field!r} was empty or not a string, or gave fewer than 2 tokens (nothing to predict)",
    )
    return out


# ---- the one-call builder ----------------------------------------------------------------------


def _host_share() -> tuple[int, int]:
    """(process count, index) when the XLA runtime already runs; (1, 0) otherwise.

    Building datasets never starts the runtime (a data-only notebook or the config panel stays
    free of it); on a multi-host run the trainer has started it, detecting the hardware, first.
    """
    if runtime.runtime_started():
        return runtime.xla_process_count(), runtime.xla_process_index()
    return 1, 0


def split_eval(examples: Any, fraction: float, seed: int) -> tuple[Any, Any]:
    """(train, eval or None): a seeded random `fraction` of `examples` held out (at least one when
    `fraction` is above 0 and there are two), the rest shuffled by the same seed."""
    if float(fraction) > 0 and len(examples) >= 2:
        n_eval = max(1, round(len(examples) * float(fraction)))
        split = examples.train_test_split(test_size=n_eval, seed=int(seed), shuffle=True)
        return split["train"], split["test"]
    return examples.shuffle(seed=int(seed)), None


def build_datasets(
    cfg: Any, tokenizer: Any = None, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[Any, Any, Any]:
    """(train, eval or None, tokenizer) for `cfg`: load, tokenise, split, and shard train by host.

    Under ``train.objective: dpo`` the examples are preference pairs
    (`workbench.data.preference.load_pairs`, `tokenize_pairs`); under ``grpo`` tokenised prompts
    with their answers (`workbench.data.prompts.build_prompts`); otherwise SFT records.

    The eval split is a seeded random `data.eval_fraction` of the examples (at least one when
    the fraction is above 0); on a multi-host run each host keeps its equal share of the train
    split (`workbench.backend.multihost.shard_for_host`; the remainder is left out).
    """
    tokenizer = (
        tokenizer if tokenizer is not None else get_tokenizer(cfg.data, cache_dir, cfg.model.pretrained_path)
    )
    if cfg.train.objective == "dpo":
        # preference pairs (`workbench.data.preference`, which builds on this module: imported here)
        from workbench.data import preference

        tokenized = preference.tokenize_pairs(preference.load_pairs(cfg.data, cache_dir), tokenizer, cfg.data)
    elif cfg.train.objective == "grpo":
        # prompts with their answers (`workbench.data.prompts`, which builds on this module: imported here)
        from workbench.data import prompts

        tokenized = prompts.build_prompts(cfg, tokenizer, cache_dir)
    else:
        tokenized = tokenize_records(load_records(cfg.data, cache_dir), tokenizer, cfg.data)
    if len(tokenized) == 0:
        raise ValueError(f"data.source={cfg.data.source!r} gave no usable examples after tokenisation")
    train_ds, eval_ds = split_eval(tokenized, cfg.data.eval_fraction, cfg.train.seed)
    count, index = _host_share()
    return shard_for_host(train_ds, count, index), eval_ds, tokenizer
