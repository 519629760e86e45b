"""Where a JSON or JSON Lines data file breaks: the line and column, and what is wrong there.

`json_findings` re-reads the files ``datasets`` failed on as it reads them (a file that starts with
``[`` as one array, anything else as JSON Lines) and yields a `Finding` for: text that does not parse,
a line or item that is not an object, a field whose type differs from the records before it (the first
file or first chunk fixes each column's type), integers followed by decimals, a field that is not among
the columns ``datasets`` took from the first records. `array_items` places each item of an array.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.data.file_findings import (
    BOM,
    CERTAIN,
    EXTRA_COLUMN,
    SUSPECT,
    TYPE_CONFLICT,
    Finding,
    error_chain,
    utf8_finding,
    value_preview,
)

_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"),  # before int: a bool is an int in Python, not in JSON
    (int, "an integer"),
    (float, "a number"),
    (str, "a string"),
    (list, "an array"),
    (dict, "an object"),
)
_LINE_FIX = 'each line must hold one complete JSON object, e.g. {"text": "..."}'
_DOCUMENT_FIX = 'a .json file holds one JSON array of objects, [{"text": "..."}, ...], or one object per line'


def _kind(value: Any) -> str | None:
    return next((name for cls, name in _KINDS if isinstance(value, cls)), None)


@dataclass
class _FirstSeen:
    kind: str
    path: Path
    line: int


@dataclass
class _Schema:
    """The type of each field as first seen, and the columns ``datasets`` said it expected."""

    fields: dict[str, _FirstSeen]
    extra_columns: frozenset[str]


def _fields(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(field path, value) for every field of a record, nested ones as ``messages[].content``."""
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            yield name, item
            yield from _fields(item, name)
    elif isinstance(value, list):
        for item in value:
            yield f"{prefix}[]", item
            yield from _fields(item, f"{prefix}[]")


def _record_findings(record: dict[str, Any], path: Path, line: int, schema: _Schema) -> Iterator[Finding]:
    """A field whose type differs from the records before it, or a column ``datasets`` did not expect."""
    for name in schema.extra_columns.intersection(record):
        yield Finding(
            path,
            line,
            None,
            None,
            f"field {name!r} is not among the columns datasets took from the records before it",
            "give every record the same fields (null where one has no value)",
            EXTRA_COLUMN,
        )
    for name, value in _fields(record):
        kind = _kind(value)
        if kind is None:
            continue  # null fits any type
        first = schema.fields.setdefault(name, _FirstSeen(kind, path, line))
        if first.kind == kind or (first.kind, kind) == ("a number", "an integer"):
            continue  # integers fit a column of numbers
        at = f"line {first.line}" if first.path == path else f"{first.path} line {first.line}"
        problem = f"field {name!r} is {kind} ({value_preview(value)}) here but {first.kind} in the records before it (first at {at})"
        if (first.kind, kind) == ("an integer", "a number"):
            yield Finding(
                path,
                line,
                None,
                None,
                problem,
                f"write {name!r} alike in every record: all integers, or all with a decimal point (2.0)",
                SUSPECT,
            )
        else:
            fix = f"give {name!r} one type in every record (null where it has no value)"
            yield Finding(path, line, None, None, problem, fix, TYPE_CONFLICT)
        return  # one conflict per record: the first says enough


def json_findings(files: Sequence[Path], error: BaseException) -> Iterator[Finding]:
    """Findings in JSON Lines files and JSON documents, in the order ``datasets`` loaded `files`."""
    extra: set[str] = set()
    for e in error_chain(error):  # datasets' CastError: "Couldn't cast ... because column names don't match"
        table, requested = getattr(e, "table_column_names", None), getattr(e, "requested_column_names", None)
        if table is not None and requested is not None:
            extra |= set(table) - set(requested)
    schema = _Schema({}, frozenset(extra))
    for path in files:
        with open(path, "rb") as handle:
            head = handle.read(4096).removeprefix(BOM).lstrip()
        # datasets reads a file that starts with "[" as one array, anything else as JSON Lines.
        yield from (_json_document if head.startswith(b"[") else _json_lines)(path, schema)


def _json_lines(path: Path, schema: _Schema) -> Iterator[Finding]:
    with open(path, "rb") as handle:
        first_record = True
        for number, raw in enumerate(handle, start=1):
            raw = raw.removeprefix(BOM) if number == 1 else raw
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield utf8_finding(path, raw, err, number)
                continue
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as err:
                if first_record:  # maybe one object over several lines: the whole file says where it breaks
                    yield from _json_document(path, schema, first_line=number)
                    return
                yield Finding(
                    path, number, err.colno, None, f"not valid JSON ({err.msg})", _LINE_FIX, CERTAIN
                )
                continue
            first_record = False
            if not isinstance(record, dict):
                problem = f"{_kind(record) or 'null'} ({value_preview(record)}), not a JSON object"
                yield Finding(path, number, None, None, problem, _LINE_FIX, CERTAIN)
                continue
            yield from _record_findings(record, path, number, schema)


def _json_document(path: Path, schema: _Schema, first_line: int | None = None) -> Iterator[Finding]:
    """Findings in a file read as one JSON value; `first_line` is the first record's line when the
    file was meant as JSON Lines (a break on that very line gets the JSON Lines advice)."""
    raw = path.read_bytes().removeprefix(BOM)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        yield utf8_finding(path, raw, err)
        return
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        fix = _LINE_FIX if err.lineno == first_line else _DOCUMENT_FIX
        yield Finding(path, err.lineno, err.colno, None, f"not valid JSON ({err.msg})", fix, CERTAIN)
        return
    if isinstance(document, dict):
        return  # one object: read as one record
    if not isinstance(document, list):
        problem = f"the file holds {_kind(document) or 'null'} ({value_preview(document)}), not records"
        yield Finding(path, 1, 1, None, problem, _DOCUMENT_FIX, CERTAIN)
        return
    # An array of plain values is read as a 'text' column; once it holds objects, every item must be one.
    holds_objects = any(isinstance(item, dict) for item in document)
    for index, (line, column, item) in enumerate(array_items(text), start=1):
        if isinstance(item, dict):
            yield from _record_findings(item, path, line, schema)
        elif holds_objects:
            problem = (
                f"item {index} of the array is {_kind(item) or 'null'} ({value_preview(item)}), not an object"
            )
            fix = 'every item must be an object with named fields, e.g. {"text": "..."}'
            yield Finding(path, line, column, None, problem, fix, CERTAIN)


def array_items(text: str) -> Iterator[tuple[int, int, Any]]:
    """(line, column, item) of each item of the JSON array `text` (already known to parse)."""
    decoder = json.JSONDecoder()
    whitespace = re.compile(r"[\s,]*")
    position = whitespace.match(text, text.index("[") + 1).end()  # type: ignore[union-attr]
    line, line_start, counted = 1, 0, 0
    while position < len(text) and text[position] != "]":
        newline = text.rfind("\n", counted, position)
        if newline >= 0:
            line, line_start = line + text.count("\n", counted, position), newline + 1
        counted = position
        item, end = decoder.raw_decode(text, position)
        yield line, position - line_start + 1, item
        position = whitespace.match(text, end).end()  # type: ignore[union-attr]
