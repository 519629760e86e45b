"""Records to training examples: load the data source, tokenise plain text or chat, split, share by host.

**Records** (`load_records`): "embedded" (the embedded corpus, column ``text``), "chat-sample"
(the shipped chat SFT records, from `workbench.data.corpus`), "math-sample" (the arithmetic word
problems of `workbench.data.math_sample` as question/solution chat turns), a local jsonl/json/csv/parquet/text
file or directory (``data.file_type``), loaded through ``datasets``, a directory written by
``save_to_disk``, or a Hub dataset id (the files of its ``data.subset`` and ``data.split``, read the same way). Whatever their shape, `workbench.data.formats` reads them (``data.format``,
``data.columns``, ``data.filter``) into one ``messages`` column (chat) or the text column.

**Tokenising** (`tokenize_records`): plain text becomes ``bos + text + eos`` with labels equal
to the ids; chat records (any chat format) are rendered with the chat template and their labels
are `IGNORE_INDEX` (-100) everywhere except the assistant turns (`workbench.data.chat`).
Records that teach nothing are left out — texts that are empty, not strings or a single
token, chat records with no assistant token to predict — and counted in one
``RuntimeWarning``. Sequences are not cut here: lengths above ``data.max_length`` are
truncated or dropped by the batch sampler, which counts them (`workbench.data.sampler`).

**The builder** (`build_datasets`): records, tokenised (SFT's here, DPO's pairs from
`workbench.data.preference`, GRPO's prompts from `workbench.data.prompts`), split into a seeded train and eval
part; each host keeps its equal share of the train part (`workbench.backend.multihost`).
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

from workbench.backend.multihost import shard_for_host
from workbench.backend.xla import runtime
from workbench.data import formats
from workbench.data.chat import IGNORE_INDEX, chat_example
from workbench.data.corpus import CHAT_SAMPLE, embedded_corpus
from workbench.data.local_files import PlaceRecord, load_source
from workbench.data.tokenizer import get_tokenizer, missing_chat_template, tokenizer_setting
from workbench.objective_registry import objective_for

# ---- records ---------------------------------------------------------------------------------


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
    place: PlaceRecord | None = None
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
        ds, place = load_source(data_cfg, cache_dir)
    try:
        # the shipped sources are known shapes: the format notice is for the user's own data
        return formats.prepare_records(ds, data_cfg, announce=place is not None)
    except formats.RecordError as err:
        if place is None or err.index is None:
            raise
        raise place(err) from None


# ---- tokenising ------------------------------------------------------------------------------


def _warn_left_out(dropped: int, total: int, why: str) -> None:
    """One warning for the records tokenising left out, so a shrunken dataset is never a surprise."""
    if dropped:
        warnings.warn(
            f"{dropped} of {total} records were left out when tokenising: {why}",
            RuntimeWarning,
            stacklevel=3,
        )


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
                return chat_example(detected.messages(record), tokenizer)
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

    The examples are the run's objective's (`workbench.objective_registry.Objective.examples`, for
    ``train.objective``): SFT records (`load_records`, `tokenize_records`), preference pairs
    (`workbench.data.preference`) or prompts with their answers (`workbench.data.prompts`).

    The eval split is a seeded random `data.eval_fraction` of the examples (at least one when
    the fraction is above 0); on a multi-host run each host keeps its equal share of the train
    split (`workbench.backend.multihost.shard_for_host`; the remainder is left out).
    """
    tokenizer = (
        tokenizer if tokenizer is not None else get_tokenizer(cfg.data, cache_dir, cfg.model.pretrained_path)
    )
    tokenized = objective_for(cfg).examples(cfg, tokenizer, cache_dir)
    if len(tokenized) == 0:
        raise ValueError(f"data.source={cfg.data.source!r} gave no usable examples after tokenisation")
    train_ds, eval_ds = split_eval(tokenized, cfg.data.eval_fraction, cfg.train.seed)
    count, index = _host_share()
    return shard_for_host(train_ds, count, index), eval_ds, tokenizer
