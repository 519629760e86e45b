"""[from data] Text in, token ids out: the embedded corpus, a locally trained tokenizer, user data, chat SFT records.

**The embedded corpus** (`embedded_corpus`) is real English technical prose that ships with
Python itself, so the defaults need no download: the 79 topics of ``pydoc_data.topics`` (the
language reference pages behind ``help("if")`` etc.), split at their reST headings into
sections, plus the docstrings of ~110 standard-library modules and of their public classes,
methods and functions. Pieces longer than ``max_chars`` (500) are split at paragraph breaks,
then line breaks, then spaces; pieces under 40 characters are left out and identical texts
are kept once; the order is fixed. On CPython 3.11 that gives about 4,000 documents, 1.0 M
characters. With the default 512-token BPE trained on it their lengths in tokens (bos/eos
included) are long-tailed: median ~125, p90 ~240, p99 ~295, max ~430, about 4% above the
default ``data.max_length`` of 256 — short docstrings next to long reference sections.
That spread is what makes bucketing matter.

**The tokenizer** (`get_tokenizer`) is a byte-level BPE trained with ``tokenizers`` on that
corpus (deterministic: same corpus and size, same vocabulary), wrapped as a
``transformers.PreTrainedTokenizerFast`` with ``<|bos|>``, ``<|end|>`` (eos), ``<|pad|>``,
role tokens and a chat template. It is cached on disk under ``$XLA_WORKBENCH_CACHE`` (default
``~/.cache/xla-workbench``) keyed by a hash of the corpus, the size and the recipe. A
user's own tokenizer directory (``data.tokenizer_path``) loads with
``AutoTokenizer.from_pretrained(path)`` instead.

**Records** (`load_records`): "embedded" (column ``text``), "chat-sample" (the shipped
``assets/chat_sample.jsonl``: questions about stdlib functions answered with the first
paragraph of their docstrings; most as ``messages`` lists, some as prompt/response) or a
local jsonl/json/csv/parquet/text file or directory, loaded through ``datasets``.

**Tokenising** (`tokenize_records`): plain text becomes ``bos + text + eos`` with labels equal
to the ids; chat records (``messages`` or ``prompt``/``response``) are rendered with the chat
template and their labels are -100 everywhere except the assistant turns. Records that
teach nothing are left out — texts that are empty, not strings or a single token, chat
records with no assistant token to predict — and counted in one ``RuntimeWarning``. Sequences
are not cut here: lengths above ``data.max_length`` are truncated or dropped by the batch
sampler, which counts them (`workbench.bucketing`).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from workbench.data.corpus import CHAT_SAMPLE, embedded_corpus
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
    return datasets.load_dataset(
        builder,
        data_files=[str(p) for p in files],
        split="train",
        cache_dir=str(cache_root(cache_dir) / "datasets"),
    )


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


def _chat_example(messages: list[dict[str, str]], tokenizer: Any) -> dict[str, list[int]]:
    """Ids of the rendered conversation; labels only on the assistant turns.

    Each assistant turn's label span is found by rendering the conversation up to the turn
    with the generation prompt (the prefix) and up to its end: the tokens in between are the
    answer. Works with any chat template whose renders of a prefix are token prefixes.
    """

    def render(msgs: list[dict[str, str]], prompt: bool) -> list[int]:
        out = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=prompt)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return list(out)

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


# ---- hosts and the one-call builder ------------------------------------------------------------


def host_shard_bounds(
    length: int, num_processes: int, process_index: int, *, equal_shares: bool = False
) -> tuple[int, int]:
    """[start, stop) of host `process_index`'s contiguous share of `length` examples.

    By default the shares cover every example exactly once (the first ``length % num_processes``
    hosts get one more). ``equal_shares=True`` gives every host ``length // num_processes`` and
    leaves the remainder out, for loops that run an epoch to its end: a host with one more batch
    would run one more step and wait for the others at the next collective.
    """
    if num_processes < 1:
        raise ValueError(f"num_processes={num_processes} is not allowed: must be >= 1")
    if not 0 <= process_index < num_processes:
        raise ValueError(f"process_index={process_index} is not allowed: must be in [0, {num_processes})")
    share, extra = divmod(length, num_processes)
    if share == 0 and (equal_shares or process_index >= extra):
        raise ValueError(f"{length} examples cannot give each of {num_processes} hosts at least one")
    if equal_shares:
        return process_index * share, (process_index + 1) * share
    start = process_index * share + min(process_index, extra)
    return start, start + share + (process_index < extra)


def shard_for_host(
    dataset: Any, num_processes: int, process_index: int, *, equal_shares: bool = False
) -> Any:
    """Host `process_index`'s contiguous share of a `datasets.Dataset` or a sequence (see `host_shard_bounds`)."""
    start, stop = host_shard_bounds(len(dataset), num_processes, process_index, equal_shares=equal_shares)
    if start == 0 and stop == len(dataset):
        return dataset
    if hasattr(dataset, "select"):  # datasets.Dataset
        return dataset.select(range(start, stop))
    return dataset[start:stop]


def _host_share() -> tuple[int, int]:
    """(process count, index) when the XLA runtime already runs; (1, 0) otherwise (never starts it)."""
    from workbench.backend import runtime

    if runtime.runtime_started():
        return runtime.process_count(), runtime.process_index()
    return 1, 0


def build_datasets(
    cfg: Any, tokenizer: Any = None, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[Any, Any, Any]:
    """(train, eval or None, tokenizer) for `cfg`: load, tokenise, split, and shard train by host.

    The eval split is a seeded random `data.eval_fraction` of the examples (at least one when
    the fraction is above 0); on a multi-host run each host keeps its share of the train split.
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
