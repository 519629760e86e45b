"""Chat turns: read from a record's column, rendered with the tokenizer's chat template, labelled.

Every objective's records that hold conversations go through here: `column_turns` reads a column
as ``{role, content}`` turns (text as one turn of a role; a list of turns as they are, ShareGPT's
``from``/``value`` too); `chat_token_ids` renders turns with the chat template (a one-line error
naming the tokenizer when it has none); `chat_example` gives a conversation's ids with labels
only on the assistant turns (`IGNORE_INDEX` elsewhere); `prompt_token_ids` a prompt's ids with the
generation prompt, where the answer starts. A template that refuses a system turn gets it folded
into the first user turn (`fold_system_turn`).
"""

from __future__ import annotations

from typing import Any

from workbench.data import formats
from workbench.data.formats import RecordError
from workbench.data.tokenizer import missing_chat_template

IGNORE_INDEX = -100
"""Label of a token that is not predicted (prompt, padding, packed borders); `torch`'s default ignore_index."""

Turns = list[dict[str, str]]
"""A conversation or part of one: ``{role, content}`` turns."""


def column_text(value: Any, column: str) -> str:
    """A column's text; numbers count as their text (a CSV cell), anything else is an error."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        shown = "null" if value is None else f"{type(value).__name__} ({str(value)[:40]})"
        raise RecordError(f"{column!r} is {shown}, not text")
    return str(value)


def _turn(entry: Any, column: str, j: int) -> dict[str, str]:
    # Arrow stores a list of mixed entries as structs with every key, the absent ones null.
    if isinstance(entry, dict) and isinstance(entry.get("role"), str) and "content" in entry:
        role, content = entry["role"], entry["content"]
    elif isinstance(entry, dict) and entry.get("from") is not None and entry.get("value") is not None:
        role = formats.SHAREGPT_ROLES.get(str(entry["from"]).lower())
        if role is None:
            raise RecordError(
                f"{column}[{j}] has the role {entry['from']!r}; roles are user, assistant, system"
            )
        content = entry["value"]
    else:
        got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise RecordError(f"{column}[{j}] needs a 'role' string and a 'content'; got {got}")
    return {"role": role, "content": "" if content is None else str(content)}


def column_turns(value: Any, column: str, role: str) -> Turns:
    """Text as one turn of `role`, or a list of turns as they are."""
    if isinstance(value, list):
        return [_turn(entry, column, j) for j, entry in enumerate(value)]
    return [{"role": role, "content": column_text(value, column)}]


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


def chat_example(messages: list[dict[str, str]], tokenizer: Any) -> dict[str, list[int]]:
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
            return chat_example(fold_system_turn(messages), tokenizer)
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


def prompt_token_ids(tokenizer: Any, prompt: Turns) -> list[int]:
    """The prompt's ids with the generation prompt: where the answer starts (a system turn folded for a
    template that refuses one, as `chat_example` folds it)."""
    if not prompt:
        return []
    try:
        return chat_token_ids(tokenizer, prompt, add_generation_prompt=True)
    except Exception as err:  # the template's own raise_exception (a jinja2 TemplateError)
        if prompt[0]["role"] == "system" and "system" in str(err).lower():
            return chat_token_ids(tokenizer, fold_system_turn(prompt), add_generation_prompt=True)
        raise
