"""Records to training examples: load the data source, tokenise plain text or chat, split, share by host.

**Records** (`load_records`): "embedded" (the embedded corpus, column ``text``), "chat-sample"
(the shipped chat SFT records, ``messages`` lists and prompt/response pairs; both from
`workbench.data.corpus`) or a local jsonl/json/csv/parquet/text file or directory, loaded
through ``datasets``.

**Tokenising** (`tokenize_records`): plain text becomes ``bos + text + eos`` with labels equal
to the ids; chat records (``messages`` or ``prompt``/``response``) are rendered with the chat
template and their labels are `IGNORE_INDEX` (-100) everywhere except the assistant turns.
Records that teach nothing are left out — texts that are empty, not strings or a single
token, chat records with no assistant token to predict — and counted in one
``RuntimeWarning``. Sequences are not cut here: lengths above ``data.max_length`` are
truncated or dropped by the batch sampler, which counts them (`workbench.data.sampler`).

**The builder** (`build_datasets`): records, tokenised, split into a seeded train and eval
part; each host keeps its equal share of the train part (`workbench.backend.multihost`).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from workbench.backend import runtime
from workbench.backend.multihost import shard_for_host
from workbench.data.corpus import CHAT_SAMPLE, embedded_corpus
from workbench.data.file_errors import data_file_error, load_errors
from workbench.data.tokenizer import cache_root, get_tokenizer

IGNORE_INDEX = -100
"""Label of a token that is not predicted (prompt, padding, packed borders); `torch`'s default ignore_index."""


# ---- records ---------------------------------------------------------------------------------

_FORMATS = {
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".txt": "text",
    ".text": "text",
}


def _read_chat_sample() -> list[dict[str, Any]]:
    with open(CHAT_SAMPLE, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _as_messages(record: dict[str, Any]) -> list[dict[str, str]]:
    if record.get("messages"):
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in record["messages"]]
    if record.get("prompt") is not None and record.get("response") is not None:
        messages = []
        if record.get("system"):
            messages.append({"role": "system", "content": str(record["system"])})
        messages.append({"role": "user", "content": str(record["prompt"])})
        messages.append({"role": "assistant", "content": str(record["response"])})
        return messages
    raise ValueError(f"a chat record needs 'messages' or 'prompt' and 'response'; got keys {sorted(record)}")


def load_records(data_cfg: Any, cache_dir: str | os.PathLike[str] | None = None) -> Any:
    """The raw records for `data_cfg.source` as a `datasets.Dataset` (capped at `max_examples`)."""
    import datasets

    source = data_cfg.source
    if source == "embedded":
        ds = datasets.Dataset.from_dict({"text": embedded_corpus()})
    elif source == "chat-sample":
        ds = datasets.Dataset.from_list([{"messages": _as_messages(r)} for r in _read_chat_sample()])
    else:
        ds = _load_local(Path(source).expanduser(), data_cfg.format, cache_dir)
    if data_cfg.max_examples is not None and len(ds) > data_cfg.max_examples:
        ds = ds.select(range(int(data_cfg.max_examples)))
    return ds


def _load_local(path: Path, fmt: str, cache_dir: str | os.PathLike[str] | None) -> Any:
    import datasets

    if not path.exists():
        raise FileNotFoundError(
            f"data.source={str(path)!r} does not exist; use 'embedded', 'chat-sample' or a local file/directory"
        )
    files = sorted(p for p in path.rglob("*") if p.suffix.lower() in _FORMATS) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"data.source={str(path)!r} holds no {'/'.join(sorted(_FORMATS))} files")
    if fmt == "auto":
        kinds = {_FORMATS.get(p.suffix.lower()) for p in files}
        if None in kinds or len(kinds) != 1:
            raise ValueError(
                f"data.format='auto' cannot tell the format of {[p.name for p in files][:5]}: "
                f"set data.format to one of jsonl, json, csv, parquet, text"
            )
        builder = kinds.pop()
    else:
        builder = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "text": "text"}[fmt]
    try:
        return datasets.load_dataset(
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


# ---- tokenising ------------------------------------------------------------------------------


def _chat_reason(dataset: Any, data_cfg: Any) -> str | None:
    """Why the records count as chat (``data.chat`` or the column that gave it away), or None."""
    names = set(dataset.column_names)
    if data_cfg.chat:
        return "data.chat=True"
    if "messages" in names:
        return "the 'messages' column of the records"
    if {"prompt", "response"} <= names:
        return "the 'prompt' and 'response' columns of the records"
    return None


def _is_chat(dataset: Any, data_cfg: Any) -> bool:
    return _chat_reason(dataset, data_cfg) is not None


def _warn_left_out(dropped: int, total: int, why: str) -> None:
    """One warning for the records tokenising left out, so a shrunken dataset is never a surprise."""
    if dropped:
        warnings.warn(
            f"{dropped} of {total} records were left out when tokenising: {why}",
            RuntimeWarning,
            stacklevel=3,
        )


def chat_token_ids(
    tokenizer: Any, messages: list[dict[str, str]], *, add_generation_prompt: bool = False
) -> list[int]:
    """The token ids of `messages` rendered with the tokenizer's chat template, as a plain list.

    ``apply_chat_template(..., tokenize=True)`` returns a list under transformers 4.x and a
    ``BatchEncoding`` (``input_ids``, ``attention_mask``) under 5.x, whose default became
    ``return_dict=True``; asking for ``return_dict=False`` gives the list under both, and a
    tokenizer that answers with a mapping anyway has its ``input_ids`` taken.
    """
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
    )
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(i) for i in out]


def _chat_example(messages: list[dict[str, str]], tokenizer: Any) -> dict[str, list[int]]:
    """Ids of the rendered conversation; labels only on the assistant turns.

    Each assistant turn's label span is found by rendering the conversation up to the turn
    with the generation prompt (the prefix) and up to its end: the tokens in between are the
    answer. Works with any chat template whose renders of a prefix are token prefixes.
    """

    def render(msgs: list[dict[str, str]], prompt: bool) -> list[int]:
        return chat_token_ids(tokenizer, msgs, add_generation_prompt=prompt)

    ids = render(messages, False)
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

    Records with nothing to predict are left out and counted in one ``RuntimeWarning``.
    """
    reason = _chat_reason(dataset, data_cfg)
    if reason is not None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"the records are chat records (from {reason}), which need a tokenizer with a chat template; "
                f"data.tokenizer_path={data_cfg.tokenizer_path!r} has none: give one with a chat template, "
                "or set data.text_field to train on a text column without data.chat"
            )
        names = set(dataset.column_names)
        if not ("messages" in names or {"prompt", "response"} <= names):
            raise ValueError(
                f"{reason} needs chat records: a 'messages' column or 'prompt' and 'response' columns; "
                f"found {sorted(names)}"
            )

        def chat(record: dict[str, Any]) -> dict[str, Any]:
            return _chat_example(_as_messages(record), tokenizer)

        out = dataset.map(chat, remove_columns=dataset.column_names, desc=None)
        # Label 0 is never predicted (nothing precedes it): a record needs a label after it.
        kept = out.filter(lambda r: any(x != IGNORE_INDEX for x in r["labels"][1:]))
        _warn_left_out(
            len(out) - len(kept),
            len(out),
            "chat records with no assistant token to predict (no assistant turn, or empty ones)",
        )
        return kept

    field = data_cfg.text_field
    if field not in dataset.column_names:
        raise ValueError(
            f"data.text_field={field!r} is not a column; the records have {dataset.column_names}"
        )
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


def build_datasets(
    cfg: Any, tokenizer: Any = None, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[Any, Any, Any]:
    """(train, eval or None, tokenizer) for `cfg`: load, tokenise, split, and shard train by host.

    The eval split is a seeded random `data.eval_fraction` of the examples (at least one when
    the fraction is above 0); on a multi-host run each host keeps its equal share of the train
    split (`workbench.backend.multihost.shard_for_host`; the remainder is left out).
    """
    tokenizer = tokenizer if tokenizer is not None else get_tokenizer(cfg.data, cache_dir)
    records = load_records(cfg.data, cache_dir)
    tokenized = tokenize_records(records, tokenizer, cfg.data)
    if len(tokenized) == 0:
        raise ValueError(f"data.source={cfg.data.source!r} gave no usable examples after tokenisation")
    eval_ds = None
    fraction = float(cfg.data.eval_fraction)
    if fraction > 0 and len(tokenized) >= 2:
        n_eval = max(1, round(len(tokenized) * fraction))
        split = tokenized.train_test_split(test_size=n_eval, seed=int(cfg.train.seed), shuffle=True)
        train_ds, eval_ds = split["train"], split["test"]
    else:
        train_ds = tokenized.shuffle(seed=int(cfg.train.seed))
    count, index = _host_share()
    return shard_for_host(train_ds, count, index), eval_ds, tokenizer
