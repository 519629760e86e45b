"""Preference records to pair examples: prompt/chosen/rejected records, tokenised, for ``train.objective: dpo``.

**Pairs** (`load_pairs`): the records of ``data.source`` (``"preference-sample"``, the shipped
`workbench.data.corpus.PREFERENCE_SAMPLE`, or local files read as `workbench.data.local_files` reads
them) become one pair per row: ``prompt``, ``chosen`` and ``rejected``, each a list of
``{role, content}`` turns (the prompt is the conversation up to the answer, a system turn
included; chosen and rejected are the answer's turns). ``data.columns`` names the columns
first, ``data.filter`` keeps rows, ``data.max_examples`` counts pairs. A record is read in one
of three shapes:

1. ``prompt``, ``chosen``, ``rejected`` (optional ``system``): the prompt as text (one user turn)
   or turns; each answer as text (one assistant turn) or turns. An answer that repeats the
   prompt's turns first (full conversations beside a prompt) has them taken off.
2. ``chosen`` and ``rejected`` as whole conversations and no prompt: the prompt is the turns they
   share before they differ (TRL's "implicit prompt"); what follows must start with an
   assistant turn.
3. ``prompt``, ``response`` and a score column named by ``data.pair_by`` (HelpSteer2's layout,
   several scored responses per prompt): per prompt (and system), the best-scored response is
   chosen and the worst rejected; a prompt with fewer than two different scores makes no pair.
   One notice counts what was made.

**Tokenising** (`tokenize_pairs`): each side becomes its own sequence, ``input_ids``/``labels``
for the chosen one and ``rejected_input_ids``/``rejected_labels`` for the rejected one, labels
`IGNORE_INDEX` everywhere but the answer's tokens; ``length`` is the longer of the two, so the
bucket sampler places a pair by its longer member. With a chat template the conversation is
rendered as SFT renders it (`workbench.data.chat`); without one, ``bos + prompt + "\\n" +
answer + eos``. Pairs that teach nothing are left out and counted in one notice. The collator
(`workbench.data.collate.PairCollator`) puts the two sides of a pair on adjacent rows.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from typing import Any

from workbench.data import formats
from workbench.data.chat import IGNORE_INDEX, Turns, chat_example, column_text, column_turns, prompt_token_ids
from workbench.data.corpus import PREFERENCE_SAMPLE
from workbench.data.formats import FormatError, RecordError
from workbench.data.local_files import convert_local

PAIR_COLUMNS = ("prompt", "chosen", "rejected")
"""The columns of `load_pairs`' dataset, each a list of ``{role, content}`` turns."""

_NEEDS = (
    "a pair needs prompt + chosen + rejected (answers as text or lists of {role, content}; system "
    "optional), chosen + rejected as whole conversations sharing their opening turns (the prompt), "
    "or prompt + response + the score column named by data.pair_by (several scored responses per "
    "prompt); name your own columns with data.columns, e.g. "
    "data.columns={prompt: question, chosen: good, rejected: bad}"
)


# ---- one record -----------------------------------------------------------------------------------


def _answer(turns: Turns, column: str) -> Turns:
    """`turns` checked as an answer: it opens with an assistant turn and has some text."""
    if not turns or not "".join(t["content"] for t in turns).strip():
        raise RecordError(f"{column!r} is empty; a pair needs an answer on both sides")
    if turns[0]["role"] != "assistant":
        raise RecordError(
            f"{column!r} starts with a {turns[0]['role']!r} turn; an answer starts with an assistant turn"
        )
    return turns


def _present(value: Any, column: str) -> Any:
    if value is None:
        raise RecordError(
            f"{column!r} is null or missing; every record needs it "
            f"(data.filter='{column} != null' leaves such records out)"
        )
    return value


def _implicit(chosen: Turns, rejected: Turns) -> tuple[Turns, Turns, Turns]:
    """(prompt, chosen answer, rejected answer) of two whole conversations: the prompt is the
    turns they share before they differ. One that is all of the other's opening keeps its last
    shared turn as its answer (otherwise it would have none)."""
    for column, turns in (("chosen", chosen), ("rejected", rejected)):
        if not turns:
            raise RecordError(f"{column!r} is empty; a pair needs an answer on both sides")
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    while shared and (shared >= len(chosen) or shared >= len(rejected)):
        shared -= 1
    for column, turns in (("chosen", chosen), ("rejected", rejected)):
        if turns[shared]["role"] != "assistant":
            raise RecordError(
                f"'chosen' and 'rejected' share their first {shared} turn(s) (the prompt), and the rest of "
                f"{column!r} starts with a {turns[shared]['role']!r} turn; the turns after the shared "
                "prompt must start with an assistant turn"
            )
    return chosen[:shared], chosen[shared:], rejected[shared:]


def record_pair(record: dict[str, Any]) -> dict[str, Turns]:
    """The ``prompt``/``chosen``/``rejected`` turns of one record (shape 1 or 2 of the module
    docstring, columns already named); `RecordError` when it cannot be read."""
    chosen_value = _present(record.get("chosen"), "chosen")
    rejected_value = _present(record.get("rejected"), "rejected")
    system = record.get("system")
    system_turns = [{"role": "system", "content": column_text(system, "system")}] if system else []
    if record.get("prompt") is None:
        if not (isinstance(chosen_value, list) and isinstance(rejected_value, list)):
            raise RecordError(
                "'prompt' is null or missing, and 'chosen'/'rejected' are text, not whole conversations "
                "to take their shared prompt from (data.filter='prompt != null' leaves such records out)"
            )
        prompt, chosen, rejected = _implicit(
            column_turns(chosen_value, "chosen", "assistant"),
            column_turns(rejected_value, "rejected", "assistant"),
        )
    else:
        prompt = column_turns(record["prompt"], "prompt", "user")
        chosen = column_turns(chosen_value, "chosen", "assistant")
        rejected = column_turns(rejected_value, "rejected", "assistant")
        # whole conversations beside their prompt: the answer is what follows it
        if prompt and chosen[: len(prompt)] == prompt and rejected[: len(prompt)] == prompt:
            chosen, rejected = chosen[len(prompt) :], rejected[len(prompt) :]
    if system_turns and not (prompt and prompt[0]["role"] == "system"):
        prompt = system_turns + prompt  # a conversation's own system turn wins over the column
    return {"prompt": prompt, "chosen": _answer(chosen, "chosen"), "rejected": _answer(rejected, "rejected")}


# ---- records to pairs -------------------------------------------------------------------------------


def _shape_error(names: list[str], data_cfg: Any, why: str = "") -> FormatError:
    head = "train.objective=dpo needs preference pairs"
    if data_cfg.pair_by is not None:
        head += f" (data.pair_by={data_cfg.pair_by!r} needs prompt, response and {data_cfg.pair_by!r})"
    return FormatError(f"{head}; the columns found {names} fit no pair shape{why}: {_NEEDS}")


def _explicit_pairs(dataset: Any, rows: list[int] | None) -> Any:
    """Shapes 1 and 2: one pair per record."""

    def convert(record: dict[str, Any], index: int) -> dict[str, Turns]:
        try:
            return record_pair(record)
        except RecordError as err:
            raise RecordError(err.problem, rows[index] if rows is not None else index) from None

    return dataset.map(convert, with_indices=True, remove_columns=dataset.column_names, desc=None)


def _score(value: Any, column: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        shown = "null" if value is None else repr(value)[:40]
        raise RecordError(
            f"{column!r} is {shown}; data.pair_by={column!r} ranks responses by a number in every record "
            f"(data.filter='{column} != null' leaves records without one out)"
        )
    return float(value)


def _scored_pairs(dataset: Any, rows: list[int] | None, data_cfg: Any) -> Any:
    """Shape 3: per prompt (and system), the best- and worst-scored responses; one notice counts them."""
    import datasets

    column = data_cfg.pair_by
    names = list(dataset.column_names)
    values = {c: dataset[c] for c in ("prompt", "response", "system", column) if c in names}
    groups: dict[str, list[tuple[float, Turns, Turns]]] = {}  # in the order prompts first appear
    for i in range(len(dataset)):
        try:
            system = values["system"][i] if "system" in values else None
            prompt = column_turns(_present(values["prompt"][i], "prompt"), "prompt", "user")
            if system:
                prompt = [{"role": "system", "content": column_text(system, "system")}, *prompt]
            response = column_turns(_present(values["response"][i], "response"), "response", "assistant")
            scored = (_score(values[column][i], column), prompt, _answer(response, "response"))
        except RecordError as err:
            raise RecordError(err.problem, rows[i] if rows is not None else i) from None
        groups.setdefault(json.dumps(prompt, sort_keys=True), []).append(scored)
    pairs: dict[str, list[Turns]] = {name: [] for name in PAIR_COLUMNS}
    for members in groups.values():
        best = max(members, key=lambda m: m[0])  # the first of equal scores: the records' own order
        worst = min(members, key=lambda m: m[0])
        if best[0] == worst[0]:
            continue  # one response, or only ties: no preference to learn
        pairs["prompt"].append(best[1])
        pairs["chosen"].append(best[2])
        pairs["rejected"].append(worst[2])
    made = len(pairs["prompt"])
    warnings.warn(  # the project's notice
        f"data.pair_by={column!r}: made {made:,} pairs from {len(dataset):,} records "
        f"({len(groups) - made:,} prompts without two different scores)",
        RuntimeWarning,
        stacklevel=4,  # load_pairs' caller
    )
    if not made:
        raise FormatError(
            f"data.pair_by={column!r} made no pairs: none of the {len(groups):,} prompts has two responses "
            "with different scores"
        )
    return datasets.Dataset.from_dict(pairs)


def _holds_text(dataset: Any, column: str) -> bool:
    import datasets

    return isinstance(dataset.features[column], datasets.Value)


def pair_records(dataset: Any, data_cfg: Any) -> Any:
    """Raw records (any of the three shapes) -> the ``prompt``/``chosen``/``rejected`` dataset, with
    ``data.columns``, ``data.filter``, ``data.pair_by`` and ``data.max_examples`` (pairs) applied.

    A record that cannot be read raises `RecordError` with its index in `dataset`.
    """
    dataset = formats.map_columns(dataset, data_cfg)
    names = list(dataset.column_names)
    if data_cfg.pair_by is not None:
        if "chosen" in names or "rejected" in names:
            raise FormatError(
                f"data.pair_by={data_cfg.pair_by!r} pairs scored responses, but the records already carry "
                f"chosen/rejected (columns {names}): set data.pair_by=null"
            )
        if not {"prompt", "response", data_cfg.pair_by} <= set(names):
            raise _shape_error(names, data_cfg)
    elif not {"chosen", "rejected"} <= set(names):
        raise _shape_error(names, data_cfg)
    elif "prompt" not in names and any(_holds_text(dataset, c) for c in ("chosen", "rejected")):
        why = " (no prompt, and chosen/rejected hold text, not conversations to take a shared prompt from)"
        raise _shape_error(names, data_cfg, why)
    dataset, rows = formats.filter_rows(dataset, data_cfg)
    limit = data_cfg.max_examples
    if data_cfg.pair_by is not None:
        pairs = _scored_pairs(dataset, rows, data_cfg)
        return pairs.select(range(int(limit))) if limit is not None and len(pairs) > limit else pairs
    if limit is not None and len(dataset) > limit:  # one pair per record: cap before converting
        dataset = dataset.select(range(int(limit)))
    return _explicit_pairs(dataset, rows)


def _read_sample() -> Any:
    import datasets

    with open(PREFERENCE_SAMPLE, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    # from_dict, not from_list: from_list keeps the first row's keys only (the system is optional)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return datasets.Dataset.from_dict({k: [r.get(k) for r in rows] for k in keys})


def load_pairs(data_cfg: Any, cache_dir: str | os.PathLike[str] | None = None) -> Any:
    """The preference pairs of ``data.source`` as a `datasets.Dataset` with the columns ``prompt``,
    ``chosen`` and ``rejected``, each a list of ``{role, content}`` turns (`pair_records`).

    ``"preference-sample"`` is the shipped sample; anything else a local file, directory or
    save_to_disk directory. A record that cannot be read raises an error naming its file and line.
    """
    source = data_cfg.source
    if source == "preference-sample":
        return pair_records(_read_sample(), data_cfg)
    if source in ("embedded", "chat-sample", "math-sample"):
        raise ValueError(
            f"data.source={source!r} holds no preference pairs; train.objective=dpo needs "
            "'preference-sample' or a local file of prompt/chosen/rejected records"
        )
    return convert_local(
        data_cfg,
        cache_dir,
        pair_records,
        objective="dpo",
        shipped="preference-sample",
        kind="preference records",
    )


# ---- tokenising -------------------------------------------------------------------------------------


def _chat_side(tokenizer: Any, prompt: Turns, answer: Turns) -> tuple[list[int], list[int]]:
    """Ids of prompt + answer rendered with the chat template; labels only on the answer's assistant
    turns (those inside the prompt are context, not what the pair compares)."""
    example = chat_example([*prompt, *answer], tokenizer)
    ids, labels = example["input_ids"], example["labels"]
    head = prompt_token_ids(tokenizer, prompt)
    start = len(head)
    if ids[:start] != head:
        raise ValueError(
            "the tokenizer's chat template does not render the prompt as a token prefix of the conversation; "
            "cannot tell the answer's tokens from the prompt's"
        )
    return ids, [IGNORE_INDEX] * start + labels[start:]


def _plain_side(tokenizer: Any, prompt: Turns, answer: Turns) -> tuple[list[int], list[int]]:
    """``bos + prompt + "\\n" + answer + eos`` (the turns' texts one per line), labels on the answer
    and eos. The two parts are tokenised apart so the answer's tokens are the same on both sides."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    head = [bos] if bos is not None else []
    if prompt:
        text = "\n".join(t["content"] for t in prompt) + "\n"
        head += tokenizer(text, add_special_tokens=False)["input_ids"]
    body = tokenizer("\n".join(t["content"] for t in answer), add_special_tokens=False)["input_ids"]
    body += [eos] if eos is not None else []
    return head + body, [IGNORE_INDEX] * len(head) + body


def tokenize_pairs(dataset: Any, tokenizer: Any, data_cfg: Any) -> Any:
    """Columns ``input_ids``/``labels`` (prompt + chosen answer), ``rejected_input_ids``/
    ``rejected_labels`` (prompt + rejected answer) and ``length`` (the longer); no truncation here.

    Takes `load_pairs`' dataset, or records of shape 1 or 2 under their own column names. Labels
    are `IGNORE_INDEX` except on the answer's tokens. Pairs where a side has nothing to predict or
    both sides are the same are left out and counted in one ``RuntimeWarning``.
    """
    names = list(dataset.column_names)
    if not {"chosen", "rejected"} <= set(names):
        raise _shape_error(names, data_cfg)
    chat = bool(getattr(tokenizer, "chat_template", None))
    side = _chat_side if chat else _plain_side

    def tokenize(record: dict[str, Any], index: int) -> dict[str, Any]:
        try:
            pair = record_pair(record)
        except RecordError as err:
            raise RecordError(err.problem, index) from None
        ids, labels = side(tokenizer, pair["prompt"], pair["chosen"])
        r_ids, r_labels = side(tokenizer, pair["prompt"], pair["rejected"])
        # Label 0 is never predicted (nothing precedes it): a side needs a label after it.
        empty = not any(x != IGNORE_INDEX for x in labels[1:]) or not any(
            x != IGNORE_INDEX for x in r_labels[1:]
        )
        return {
            "input_ids": ids,
            "labels": labels,
            "rejected_input_ids": r_ids,
            "rejected_labels": r_labels,
            "length": max(len(ids), len(r_ids)),
            "_left_out": 1 if empty else 2 if ids == r_ids else 0,
        }

    out = dataset.map(tokenize, with_indices=True, remove_columns=dataset.column_names, desc=None)
    why = out["_left_out"]
    kept = out.filter(lambda r: r["_left_out"] == 0).remove_columns("_left_out")
    if len(kept) < len(out):
        warnings.warn(
            f"{len(out) - len(kept)} of {len(out)} pairs were left out when tokenising: "
            f"{why.count(1)} with an answer that gave no token to predict, "
            f"{why.count(2)} whose chosen and rejected answers are the same",
            RuntimeWarning,
            stacklevel=2,
        )
    return kept


def is_pair_dataset(dataset: Any) -> bool:
    """Whether `dataset` holds pairs (`tokenize_pairs`' ``rejected_input_ids``): a `datasets.Dataset`
    by its columns, a wrapper (`workbench.data.collate.FillerMasked`) by what it wraps, any other
    sequence by its first example."""
    inner = getattr(dataset, "dataset", None)
    if inner is not None and not hasattr(dataset, "column_names"):
        return is_pair_dataset(inner)
    names = getattr(dataset, "column_names", None)
    if names is not None:
        return "rejected_input_ids" in names
    if len(dataset) == 0:
        return False
    first = dataset[0]
    return isinstance(first, dict) and "rejected_input_ids" in first
