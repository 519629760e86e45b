"""Records of any known shape -> what the tokeniser takes: chat ``messages`` or a text column.

**Formats** (`FORMATS`, ``data.format``), tried by ``'auto'`` in this order, the first that fits
winning (chat shapes before plain text, since many chat sets also carry a rendered ``text``
column; the column that holds a whole conversation before the ones that hold a single turn):

1. ``messages``: a ``messages`` column of ``{role, content}`` lists, passed on as they are;
2. ``sharegpt``: a ``conversations`` column of ``{from, value}`` lists (``{role, content}``
   entries too); roles human/user -> user, gpt/assistant/model -> assistant, system -> system;
3. ``alpaca``: ``instruction`` and ``output``, optional ``input`` and ``system``; the user turn
   is the instruction, then a blank line and the input when the input is not empty;
4. ``prompt_response``: ``prompt`` and ``response``, optional ``system`` (other columns, such as
   HelpSteer2's scores, stay for ``data.filter``);
5. ``text``: the ``data.text_field`` column, plain language-model text.

``data.chat=True`` leaves ``text`` out of the search. Under ``'auto'`` one ``RuntimeWarning``
says what was chosen: ``data.format='auto': read 1,000 records as alpaca (columns instruction,
input, output)``. Records whose columns fit no format raise `FormatError` listing the columns
found, what each format needs and the ``data.columns`` hint.

**Column names** (`map_columns`, ``data.columns``): ``{prompt: question}`` renames your column
``question`` to ``prompt`` before the format is looked for.

**Filter** (`parse_filter`, ``data.filter``): ``column op literal`` conditions joined by
``and`` (or a list of them), parsed by a small tokenizer, never ``eval``; applied before the
records are converted, and counted in one notice.

Under ``'auto'`` a file may mix chat shapes record by record (``messages`` in some records,
``prompt``/``response`` in others, as the shipped chat sample does): each record is read by the
first format, in the order above, whose columns it fills.

`prepare_records` runs all of it for `workbench.data.records.load_records`; `detect_format` and
`Detected.messages` serve `tokenize_records` for records that come from anywhere.
"""

from __future__ import annotations

import operator
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.config import COLUMN_KEYS, ConfigError

# ---- the formats -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordFormat:
    """One record shape: the columns it must have, those it may have, and what they hold."""

    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    holds: str = ""
    """The shape of the required column, in words, for errors (e.g. 'lists of {role, content}')."""
    example: str = ""
    """A ``data.columns`` value mapping a user's columns onto this format, for errors."""

    @property
    def chat(self) -> bool:
        return self.name != "text"

    def needs(self, text_column: str) -> str:
        """``alpaca needs instruction and output (input, system optional)``."""
        if not self.chat:
            return f"text needs the data.text_field column {text_column!r}"
        what = " and ".join(self.required) + (f" ({self.holds})" if self.holds else "")
        optional = f" ({', '.join(self.optional)} optional)" if self.optional else ""
        return f"{self.name} needs {what}{optional}"


FORMATS: dict[str, RecordFormat] = {
    f.name: f
    for f in (
        RecordFormat("messages", ("messages",), (), "lists of {role, content}", "{messages: dialog}"),
        RecordFormat("sharegpt", ("conversations",), (), "lists of {from, value}", "{conversations: turns}"),
        RecordFormat(
            "alpaca",
            ("instruction", "output"),
            ("input", "system"),
            "",
            "{instruction: question, output: answer}",
        ),
        RecordFormat(
            "prompt_response", ("prompt", "response"), ("system",), "", "{prompt: question, response: answer}"
        ),
        RecordFormat("text", ("text",), (), "", "{text: body}"),
    )
}
"""The record formats by name, in the order ``data.format='auto'`` tries them."""

SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}
"""ShareGPT's ``from`` values (any case) and the chat roles they become."""

_COLUMNS_HINT = "name your own columns with data.columns, e.g. data.columns={example}"


class FormatError(ValueError):
    """Records that fit no format, or a ``data.columns`` / ``data.filter`` the records cannot meet."""


class RecordError(ValueError):
    """One record a format cannot read: `index` (0-based, None until known) and the `problem`."""

    def __init__(self, problem: str, index: int | None = None) -> None:
        super().__init__(problem if index is None else f"record {index + 1}: {problem}")
        self.problem, self.index = problem, index


def _notice(message: str, depth: int) -> None:
    # A RuntimeWarning is the project's notice; `depth` calls up is load_records' caller.
    warnings.warn(message, RuntimeWarning, stacklevel=depth + 1)


def text_column(data_cfg: Any) -> str:
    """The column the text format reads: ``data.columns['text']`` when given, else ``data.text_field``."""
    return (data_cfg.columns or {}).get("text", data_cfg.text_field)


# ---- detection -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Detected:
    """The format records are read as, and why (for errors that depend on it)."""

    format: RecordFormat
    columns: tuple[str, ...]
    """The columns it reads, as named in the records."""
    reason: str
    """What made it this format: ``data.format='alpaca'``, ``data.chat=True`` or the columns seen."""
    fallbacks: tuple[RecordFormat, ...] = ()
    """Under 'auto', the later chat formats whose columns the records have too: a file may mix
    shapes (the shipped chat sample does), so a record that leaves `format`'s columns null is read
    by the first of these it fills."""

    @property
    def chat(self) -> bool:
        return self.format.chat

    @property
    def name(self) -> str:
        """``alpaca``, or ``messages or prompt_response`` for records that mix shapes."""
        return " or ".join(f.name for f in (self.format, *self.fallbacks))

    def messages(self, record: dict[str, Any]) -> list[dict[str, str]]:
        """The chat turns of one record (`record_messages` under the format it fills)."""
        for fmt in (self.format, *self.fallbacks):
            if all(record.get(c) is not None for c in fmt.required):
                return record_messages(record, fmt.name)
        return record_messages(record, self.format.name)  # raises, naming what is missing


def _used(fmt: RecordFormat, names: Sequence[str], data_cfg: Any) -> tuple[str, ...] | None:
    """The columns of `names` that `fmt` reads, or None when one it needs is missing."""
    if not fmt.chat:
        column = text_column(data_cfg)
        return (column,) if column in names else None
    if not set(fmt.required) <= set(names):
        return None
    wanted = {*fmt.required, *fmt.optional}
    return tuple(c for c in names if c in wanted)  # in the records' own order


def detect_format(column_names: Sequence[str], data_cfg: Any) -> Detected:
    """The format of records with `column_names` under ``data.format`` and ``data.chat``.

    Records already converted by `prepare_records` (one ``messages`` column) read as messages
    whatever chat format produced them.
    """
    names = list(column_names)
    if data_cfg.format != "auto":
        fmt = FORMATS[data_cfg.format]
        used = _used(fmt, names, data_cfg)
        if used is not None:
            return Detected(fmt, used, f"data.format={fmt.name!r}")
        if fmt.chat and names == ["messages"]:
            return Detected(FORMATS["messages"], ("messages",), f"data.format={fmt.name!r}")
        if not fmt.chat:
            raise FormatError(
                f"data.format='text' reads data.text_field={text_column(data_cfg)!r}, which is not a column; "
                f"the columns found are {names}: set data.text_field to the column holding the text"
            )
        raise FormatError(
            f"data.format={fmt.name!r}: {fmt.needs('')}; the columns found are {names}: "
            + _COLUMNS_HINT.format(example=fmt.example)
        )
    candidates = [f for f in FORMATS.values() if f.chat or not data_cfg.chat]
    fitting = [f for f in candidates if _used(f, names, data_cfg) is not None]
    if fitting:
        fmt = fitting[0]
        if data_cfg.chat:
            reason = "data.chat=True"
        else:
            quoted = " and ".join(repr(c) for c in fmt.required)
            reason = f"the {quoted} column{'s' if len(fmt.required) > 1 else ''} of the records"
        fallbacks = tuple(f for f in fitting[1:] if f.chat) if fmt.chat else ()
        used = {c for f in (fmt, *fallbacks) for c in _used(f, names, data_cfg) or ()}
        return Detected(fmt, tuple(c for c in names if c in used), reason, fallbacks)
    head = "data.chat=True needs chat records" if data_cfg.chat else "data.format='auto' found no format"
    needs = "; ".join(f.needs(text_column(data_cfg)) for f in candidates)
    raise FormatError(
        f"{head}: none fits the columns found {names}. {needs}. "
        + _COLUMNS_HINT.format(example=FORMATS["prompt_response"].example)
    )


def detection_notice(detected: Detected, count: int, data_cfg: Any) -> str:
    """``data.format='auto': read 1,000 records as alpaca (columns instruction, input, output)``."""
    mapped = {k: v for k, v in (data_cfg.columns or {}).items() if k != v}
    shown = [f"{c} (from {mapped[c]!r})" if c in mapped else c for c in detected.columns]
    label = "column" if len(shown) == 1 else "columns"
    return f"data.format='auto': read {count:,} records as {detected.name} ({label} {', '.join(shown)})"


# ---- column names --------------------------------------------------------------------------------


def map_columns(dataset: Any, data_cfg: Any) -> Any:
    """`dataset` with the columns ``data.columns`` names renamed to the format's names.

    A column that already bears a format name and is replaced by a mapped one is dropped (the
    mapping says which of the two to read). ``text`` is read in place (`text_column`).
    """
    columns = data_cfg.columns or {}
    names = list(dataset.column_names)
    missing = [f"{key}: {name}" for key, name in columns.items() if name not in names]
    if missing:
        raise FormatError(
            f"data.columns={columns!r} is not allowed: {', '.join(missing)} names no column; "
            f"the columns found are {names}"
        )
    unknown = [key for key in columns if key not in COLUMN_KEYS]  # a config built without validation
    if unknown:
        raise ConfigError(f"data.columns={columns!r} is not allowed: keys are {', '.join(COLUMN_KEYS)}")
    renames = {name: key for key, name in columns.items() if key != name and key != "text"}
    replaced = [key for key in renames.values() if key in names and key not in renames]
    if replaced:
        dataset = dataset.remove_columns(replaced)
    return dataset.rename_columns(renames) if renames else dataset


# ---- records to messages -------------------------------------------------------------------------


def _text(record: dict[str, Any], name: str, fmt: str, *, required: bool) -> str:
    value = record.get(name)
    if value is None:
        if required:
            raise RecordError(
                f"{name!r} is null or missing; {fmt} needs it in every record "
                f"(data.filter='{name} != null' leaves such records out)"
            )
        return ""
    if isinstance(value, (str, int, float)):  # a number in a CSV cell is still the text of it
        return str(value)
    raise RecordError(f"{name!r} is {type(value).__name__} ({str(value)[:40]}), not text")


def _turns(record: dict[str, Any], column: str) -> list[Any]:
    turns = record.get(column)
    if not isinstance(turns, list):
        shown = "null" if turns is None else type(turns).__name__
        raise RecordError(f"{column!r} is {shown}, not a list of turns")
    return turns


def _sharegpt_turn(entry: Any, j: int) -> dict[str, str]:
    where = f"conversations[{j}]"
    # Arrow stores a list of mixed entries as structs with every key, the absent ones null.
    if isinstance(entry, dict) and entry.get("from") is not None and entry.get("value") is not None:
        role, content = entry["from"], entry["value"]
    elif isinstance(entry, dict) and entry.get("role") is not None and entry.get("content") is not None:
        role, content = entry["role"], entry["content"]
    else:
        got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise RecordError(f"{where} needs 'from' and 'value' (or 'role' and 'content'); got {got}")
    mapped = SHAREGPT_ROLES.get(str(role).lower())
    if mapped is None:
        raise RecordError(
            f"{where} has the role {role!r}; sharegpt roles are human/user, gpt/assistant/model and system"
        )
    return {"role": mapped, "content": str(content)}


def _message_turn(entry: Any, j: int) -> dict[str, str]:
    if not (isinstance(entry, dict) and isinstance(entry.get("role"), str) and "content" in entry):
        got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise RecordError(f"messages[{j}] needs a 'role' string and a 'content'; got {got}")
    content = entry["content"]  # an assistant turn that only calls a tool has null content
    return {"role": entry["role"], "content": "" if content is None else str(content)}


def record_messages(record: dict[str, Any], fmt: str) -> list[dict[str, str]]:
    """The chat turns (``{role, content}``) of one record of the chat format `fmt`; `RecordError` if unreadable."""
    if fmt == "messages":
        return [_message_turn(m, j) for j, m in enumerate(_turns(record, "messages"))]
    if fmt == "sharegpt":
        return [_sharegpt_turn(m, j) for j, m in enumerate(_turns(record, "conversations"))]
    if fmt == "alpaca":
        system, extra = (_text(record, n, fmt, required=False) for n in ("system", "input"))
        user = _text(record, "instruction", fmt, required=True) + (f"\n\n{extra}" if extra else "")
        answer = _text(record, "output", fmt, required=True)
    elif fmt == "prompt_response":
        system = _text(record, "system", fmt, required=False)
        user = _text(record, "prompt", fmt, required=True)
        answer = _text(record, "response", fmt, required=True)
    else:
        raise ValueError(f"{fmt!r} is not a chat format; chat formats: {[f for f in FORMATS if f != 'text']}")
    turns = [{"role": "system", "content": system}] if system else []
    return [*turns, {"role": "user", "content": user}, {"role": "assistant", "content": answer}]


# ---- the filter ----------------------------------------------------------------------------------

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<op>==|!=|>=|<=|>|<)
      | (?P<number>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w.]))
      | (?P<word>[A-Za-z_][\w.\-]*)
    )""",
    re.VERBOSE,
)
_WORDS = {"true": True, "false": False, "null": None, "none": None}
_FILTER_HELP = (
    "write 'column op literal' conditions joined by 'and', e.g. 'helpfulness >= 3 and verbosity <= 2' "
    "(ops: == != >= <= > <; literals: numbers, quoted strings, true, false, null)"
)


@dataclass(frozen=True)
class Condition:
    """``column op value``: one condition of ``data.filter``."""

    column: str
    op: str
    value: Any

    def holds(self, cell: Any) -> bool:
        if cell is None and self.op not in ("==", "!="):
            return False  # a missing value is neither above nor below anything
        return bool(_OPS[self.op](cell, self.value))

    def __str__(self) -> str:
        return f"{self.column} {self.op} {self.value!r}"


def _tokens(text: str, fail: Callable[[str], ConfigError]) -> list[tuple[str, str]]:
    out, position = [], 0
    while text[position:].strip():
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            rest = text[position:].strip()
            extra = " (compare with ==)" if rest.startswith("=") else ""
            raise fail(f"cannot read {rest[:20]!r}{extra}")
        kind = match.lastgroup or ""
        out.append((kind, match.group(kind)))
        position = match.end()
    return out


def _literal(kind: str, token: str, fail: Callable[[str], ConfigError]) -> Any:
    if kind == "string":
        return re.sub(r"\\(.)", r"\1", token[1:-1])
    if kind == "number":
        return float(token) if any(c in token for c in ".eE") else int(token)
    if kind == "word" and token.lower() in _WORDS:
        return _WORDS[token.lower()]
    raise fail(f"{token!r} is not a literal (quote text: '{token}')")


def parse_filter(value: str | list[str] | None) -> list[Condition]:
    """The conditions of ``data.filter`` (a string, or a list of strings that must all hold)."""
    out: list[Condition] = []
    for text in [value] if isinstance(value, str) else list(value or []):

        def fail(problem: str, text: str = text) -> ConfigError:
            return ConfigError(f"data.filter={text!r} is not allowed: {problem}; {_FILTER_HELP}")

        tokens = _tokens(text, fail)
        while True:
            if len(tokens) < 3:
                raise fail("a condition needs a column, an operator and a value")
            (kc, column), (ko, op), (kv, raw) = tokens[:3]
            if kc != "word" or ko != "op":
                raise fail(f"expected 'column op value', got {' '.join(t for _, t in tokens[:3])!r}")
            literal = _literal(kv, raw, fail)
            if (literal is None or isinstance(literal, bool)) and op not in ("==", "!="):
                raise fail(f"{raw} compares only with == and !=")
            out.append(Condition(column, op, literal))
            tokens = tokens[3:]
            if not tokens:
                break
            if tokens[0][1].lower() == "or":
                raise fail("'or' is not supported: every condition must hold")
            if tokens[0][0] != "word" or tokens[0][1].lower() != "and":
                raise fail(f"expected 'and' or the end after {column} {op} {raw}, got {tokens[0][1]!r}")
            tokens = tokens[1:]
    return out


_NUMBER_TYPES = ("int", "uint", "float", "double", "decimal")


def _check_condition(condition: Condition, dataset: Any, text: Any) -> None:
    """A condition whose column holds values its literal cannot be compared with is an error now,
    not a silently empty (or full) result."""
    feature = dataset.features[condition.column]
    dtype = getattr(feature, "dtype", None)  # Value('int64'), ClassLabel: 'int64'; lists: 'list'
    dtype = dtype if isinstance(dtype, str) else type(feature).__name__
    value = condition.value
    if value is None:
        return
    if isinstance(value, bool):
        wanted, fits = "booleans", dtype == "bool"
    elif isinstance(value, (int, float)):
        wanted, fits = "numbers", dtype.startswith(_NUMBER_TYPES)
    else:
        wanted, fits = "strings", "string" in dtype
    if not fits:
        raise FormatError(
            f"data.filter={text!r} is not allowed: {condition} compares column {condition.column!r}, which "
            f"holds {dtype}, with {wanted}"
        )


def filter_rows(dataset: Any, data_cfg: Any) -> tuple[Any, list[int] | None]:
    """`dataset` with the rows ``data.filter`` keeps, and the kept rows' indices (None: no filter).

    A column may be named by the records' own name or, under ``data.columns``, the user's.
    One notice says how many rows were kept of how many.
    """
    conditions = parse_filter(data_cfg.filter)
    if not conditions:
        return dataset, None
    names = list(dataset.column_names)
    mapped = {name: key for key, name in (data_cfg.columns or {}).items() if key != "text"}
    resolved = []
    for c in conditions:
        column = c.column if c.column in names else mapped.get(c.column, c.column)
        if column not in names:
            raise FormatError(
                f"data.filter={data_cfg.filter!r} is not allowed: no column {c.column!r}; "
                f"the columns found are {names}"
            )
        resolved.append(Condition(column, c.op, c.value))
        _check_condition(resolved[-1], dataset, data_cfg.filter)
    kept: list[int] = []
    columns = sorted({c.column for c in resolved})
    for start, batch in zip(range(0, len(dataset), 1000), dataset.select_columns(columns).iter(1000)):
        for offset in range(len(batch[columns[0]])):
            if all(c.holds(batch[c.column][offset]) for c in resolved):
                kept.append(start + offset)
    _notice(f"data.filter={data_cfg.filter!r}: kept {len(kept):,} of {len(dataset):,} records", depth=4)
    if not kept:
        raise FormatError(f"data.filter={data_cfg.filter!r} kept none of the {len(dataset):,} records")
    return dataset.select(kept), kept


# ---- all of it -----------------------------------------------------------------------------------


def to_messages(dataset: Any, detected: Detected, rows: list[int] | None = None) -> Any:
    """`dataset` with a ``messages`` column read from its chat format (other columns kept).

    A record that cannot be read raises `RecordError` carrying its index in the original records
    (`rows` maps positions back to them after a filter).
    """

    def convert(record: dict[str, Any], index: int) -> dict[str, Any]:
        try:
            return {"messages": detected.messages(record)}
        except RecordError as err:
            raise RecordError(err.problem, rows[index] if rows is not None else index) from None

    return dataset.map(convert, with_indices=True, desc=None)


def prepare_records(dataset: Any, data_cfg: Any, *, announce: bool = True) -> Any:
    """Records of any known format -> the column the tokeniser reads (``messages`` or the text one).

    In order: ``data.columns`` renames; the format is found (and, under ``'auto'`` with
    `announce`, said); ``data.filter`` keeps rows; ``data.max_examples`` caps them; chat records
    become ``messages``. A record a format cannot read raises `RecordError` with its index in
    `dataset`, for the caller to place in a file.
    """
    dataset = map_columns(dataset, data_cfg)
    detected = detect_format(dataset.column_names, data_cfg)
    if announce and data_cfg.format == "auto":
        _notice(detection_notice(detected, len(dataset), data_cfg), depth=3)
    dataset, rows = filter_rows(dataset, data_cfg)
    if data_cfg.max_examples is not None and len(dataset) > data_cfg.max_examples:
        dataset = dataset.select(range(int(data_cfg.max_examples)))
    if not detected.chat:
        return dataset.select_columns([detected.columns[0]])
    return to_messages(dataset, detected, rows).select_columns(["messages"])
