"""Prompt records to a tokenised prompt dataset, for ``train.objective: grpo`` and ``eval --rewards``.

**Records** (`load_prompts`): ``data.source`` is ``math-sample`` (`workbench.data.math_sample`) or
local files read as `workbench.data.local_files` reads them (any file type, save_to_disk directories).
``data.columns`` names the columns first (e.g. ``{prompt: problem, answer: solution}``), then
``data.filter`` keeps rows and ``data.max_examples`` caps them; ``data.format`` is not read. A
record is read in one of three shapes, the first whose column it has:

1. ``prompt``: text (a plain prompt), or a list of ``{role, content}`` turns (a chat prompt);
2. ``question`` (GSM8K): text, the prompt;
3. ``messages``: a conversation ending in the user's turn (the turn the completion answers).

Chat prompts end in a turn that is not the assistant's; a ``system`` column opens a chat prompt
that has no system turn (and stays a column). ``answer``, when the records have one, is the reference the rewards
compare with: the part after ``####`` (GSM8K) or inside ``\\boxed{}`` when it holds one, numbers
normalised (`workbench.data.answers.final_answer`: ``"#### 1,234"`` -> ``"1234"``); the text as
given is kept as ``solution`` (unless the records have their own). Every other column is kept
as it is: reward functions receive them. A record that cannot be read raises an error naming
its file and line.

**Tokenising** (`tokenize_prompts`): a plain prompt becomes the tokenizer's ids of its text, as
TRL and `workbench.generate` tokenise a text prompt; a chat prompt is rendered with the chat
template and ``add_generation_prompt=True`` (a system turn folded into the first user turn for a
template that refuses one). ``data.chat: true`` renders plain prompts as one user turn (the
``prompt`` column then holds that turn, so reward functions see a chat prompt, as TRL would).
A chat prompt with a tokenizer that has no chat template is a one-line error. A prompt longer than
``data.max_length`` tokens is left out, never cut, and counted in one notice. Columns:
``input_ids``, ``length``, ``prompt`` and the rest. `build_prompts` runs both for
`workbench.data.records.build_datasets` under ``train.objective: grpo``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

from workbench.data import formats
from workbench.data.answers import final_answer
from workbench.data.chat import column_text, column_turns, prompt_token_ids
from workbench.data.formats import FormatError, RecordError
from workbench.data.local_files import convert_local
from workbench.data.math_sample import MATH_SAMPLE, math_sample_records
from workbench.data.tokenizer import missing_chat_template, tokenizer_setting

PROMPT_COLUMNS = ("prompt", "answer")
"""The columns of `load_prompts`' dataset that the rewards read by name (``data.columns`` keys)."""
PROMPT_SOURCES = ("prompt", "question", "messages")
"""The columns a prompt is read from, in the order tried (after ``data.columns``)."""
TOKEN_COLUMNS = ("input_ids", "length")
"""The columns `tokenize_prompts` adds: not record columns, so reward functions do not receive them."""

_NEEDS = (
    "a prompt record needs 'prompt' (text or a list of {role, content} turns), GSM8K's 'question' "
    "(with 'answer': its solution ending in '#### N'), or 'messages' ending in a user turn; an "
    "'answer' column is the reference the rewards compare with; name your own columns with "
    "data.columns, e.g. data.columns={prompt: problem, answer: solution}"
)


# ---- records -----------------------------------------------------------------------------------


def _prompt_value(record: dict[str, Any], source: str) -> str | list[dict[str, str]]:
    """One record's prompt: its text, or its turns checked to end before an answer."""
    value = record.get(source)
    if value is None:
        raise RecordError(
            f"{source!r} is null or missing; every record needs it "
            f"(data.filter='{source} != null' leaves such records out)"
        )
    if not isinstance(value, list):
        text = column_text(value, source)
        if not text.strip():
            raise RecordError(f"{source!r} is empty; a prompt needs some text")
        return text
    turns = column_turns(value, source, "user")
    if not turns:
        raise RecordError(f"{source!r} is an empty list; a chat prompt needs at least one turn")
    if turns[-1]["role"] == "assistant":
        raise RecordError(
            f"{source!r} ends with an assistant turn; a prompt ends with the turn the completion answers "
            "(leave the reference answer out of the prompt: it belongs in the 'answer' column)"
        )
    system = record.get("system")
    if system and turns[0]["role"] != "system":
        turns = [{"role": "system", "content": column_text(system, "system")}, *turns]
    return turns


def _convert(dataset: Any, source: str, rows: list[int] | None) -> Any:
    """The records with ``prompt`` (from `source`), ``answer`` parsed and ``solution`` kept."""
    names = list(dataset.column_names)
    has_answer = "answer" in names
    keep_solution = has_answer and "solution" not in names
    replaced = [c for c in dict.fromkeys((source, "prompt", "answer")) if c in names]

    def convert(record: dict[str, Any], index: int) -> dict[str, Any]:
        try:
            out: dict[str, Any] = {"_prompt": _prompt_value(record, source)}
            if has_answer:
                raw = record.get("answer")
                if isinstance(raw, bool) or not isinstance(raw, (str, int, float, type(None))):
                    raise RecordError(
                        f"'answer' is {type(raw).__name__} ({str(raw)[:40]}), not text or a number"
                    )
                # new columns under new names: a column of mixed types (numbers and text, text and
                # turns) loads as datasets' Json feature, which a same-named output keeps, reading
                # the text "1234" back as a number
                out["_answer"] = final_answer(raw)
                if keep_solution:
                    out["_solution"] = None if raw is None else str(raw)
        except RecordError as err:
            raise RecordError(err.problem, rows[index] if rows is not None else index) from None
        return out

    out = dataset.map(convert, with_indices=True, remove_columns=replaced, desc=None)
    return out.rename_columns(
        {c: c[1:] for c in ("_prompt", "_answer", "_solution") if c in out.column_names}
    )


def prompt_records(dataset: Any, data_cfg: Any) -> Any:
    """Raw records -> the prompt dataset (``prompt``, ``answer``, ``solution``, the rest), with
    ``data.columns``, ``data.filter`` and ``data.max_examples`` applied. A record that cannot be
    read raises `RecordError` with its index in `dataset`."""
    dataset = formats.map_columns(dataset, data_cfg)
    names = list(dataset.column_names)
    source = next((c for c in PROMPT_SOURCES if c in names), None)
    if source is None:
        raise FormatError(
            f"train.objective=grpo needs prompts; the columns found {names} hold none: {_NEEDS}"
        )
    dataset, rows = formats.filter_rows(dataset, data_cfg)
    limit = data_cfg.max_examples
    if limit is not None and len(dataset) > limit:
        dataset = dataset.select(range(int(limit)))
        rows = rows[: int(limit)] if rows is not None else None
    return _convert(dataset, source, rows)


def load_prompts(data_cfg: Any, cache_dir: str | os.PathLike[str] | None = None) -> Any:
    """The prompt records of ``data.source`` as a `datasets.Dataset` (`prompt_records`):
    ``math-sample`` or a local file, directory or save_to_disk directory. A record that cannot be
    read raises an error naming its file and line."""
    import datasets

    source = data_cfg.source
    if source == MATH_SAMPLE:
        return prompt_records(datasets.Dataset.from_list(math_sample_records()), data_cfg)
    if source in ("embedded", "chat-sample", "preference-sample"):
        raise ValueError(
            f"data.source={source!r} holds no prompts with answers; train.objective=grpo reads "
            f"'{MATH_SAMPLE}' or a local file of prompt records ({_NEEDS})"
        )
    return convert_local(
        data_cfg, cache_dir, prompt_records, objective="grpo", shipped=MATH_SAMPLE, kind="prompt records"
    )


# ---- tokenising --------------------------------------------------------------------------------


def _as_chat(dataset: Any) -> Any:
    """Plain prompts as one user turn each (a ``system`` column opening them)."""
    has_system = "system" in dataset.column_names

    def wrap(record: dict[str, Any]) -> dict[str, Any]:
        prompt = record["prompt"]
        if isinstance(prompt, list):
            return {"_prompt": prompt}
        system = record.get("system") if has_system else None
        head = [{"role": "system", "content": str(system)}] if system else []
        return {"_prompt": [*head, {"role": "user", "content": prompt}]}

    return dataset.map(wrap, remove_columns=["prompt"], desc=None).rename_column("_prompt", "prompt")


def _chat_prompts(dataset: Any) -> bool:
    """Whether any prompt is a list of turns (a file may mix them with text prompts)."""
    return any(isinstance(p, list) for p in dataset["prompt"])


def tokenize_prompts(dataset: Any, tokenizer: Any, data_cfg: Any, *, chat: bool | None = None) -> Any:
    """`prompt_records`' dataset with ``input_ids`` and ``length`` added; prompts longer than
    ``data.max_length`` left out (one notice). `chat` (default ``data.chat``): render plain prompts
    as one user turn through the chat template."""
    chat = bool(data_cfg.chat) if chat is None else chat
    if chat:
        dataset = _as_chat(dataset)
    if _chat_prompts(dataset):
        missing = missing_chat_template(tokenizer, tokenizer_setting(data_cfg))
        if missing is not None:
            why = "data.chat=True renders them as user turns" if chat else "lists of turns"
            raise ValueError(
                f"the prompts are chat prompts ({why}), which need a tokenizer with a chat template; {missing}, "
                "give data.tokenizer_path=DIR of a tokenizer that has one, or give the prompts as text"
                + (" and set data.chat=false" if chat else "")
            )

    def tokenize(record: dict[str, Any]) -> dict[str, Any]:
        prompt = record["prompt"]
        if isinstance(prompt, str):
            ids = [int(i) for i in tokenizer(prompt)["input_ids"]]
        else:
            ids = prompt_token_ids(tokenizer, prompt)
        return {"input_ids": ids, "length": len(ids)}

    out = dataset.map(tokenize, desc=None)
    limit = int(data_cfg.max_length)
    kept = out.filter(lambda length: 0 < length <= limit, input_columns="length")
    if len(kept) < len(out):
        warnings.warn(  # the project's notice
            f"{len(out) - len(kept)} of {len(out)} prompts were left out: longer than data.max_length={limit} "
            "tokens (a prompt is never cut: raise data.max_length to keep them)",
            RuntimeWarning,
            stacklevel=2,
        )
    return kept.select_columns([*TOKEN_COLUMNS, *(c for c in kept.column_names if c not in TOKEN_COLUMNS)])


def build_prompts(
    cfg: Any,
    tokenizer: Any,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    reward_names: Sequence[Any] | None = None,
    records: Any = None,
) -> Any:
    """The tokenised prompt dataset of `cfg` (`load_prompts`, `tokenize_prompts`), for
    `workbench.data.records.build_datasets` and ``eval --rewards``. ``math-sample``'s questions are
    chat prompts when the tokenizer has a chat template, as its fine-tune renders them
    (`workbench.data.math_sample`). `reward_names` (default ``grpo.reward_funcs``): with
    ``math_answer`` among them, records without an ``answer`` column get a notice. `records`:
    `load_prompts`' dataset when the caller read it already (before loading a model)."""
    records = load_prompts(cfg.data, cache_dir) if records is None else records
    if reward_names is None:
        reward_names = getattr(getattr(cfg, "grpo", None), "reward_funcs", ())
    if "answer" not in records.column_names and "math_answer" in reward_names:
        warnings.warn(
            f"data.source={cfg.data.source!r} has no 'answer' column: the math_answer reward scores none "
            "of its prompts (None); name the column with data.columns={answer: YOUR_COLUMN}",
            RuntimeWarning,
            stacklevel=3,
        )
    chat = bool(cfg.data.chat) or (
        cfg.data.source == MATH_SAMPLE and missing_chat_template(tokenizer, "") is None
    )
    return tokenize_prompts(records, tokenizer, cfg.data, chat=chat)
