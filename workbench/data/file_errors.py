"""Where a local data file fails to parse: the file, line and column behind a ``datasets`` load error.

``datasets.load_dataset`` reports a bad local file as ``DatasetGenerationError`` or a pyarrow/pandas
error (``JSON parse error: ... in row 3``, ``Couldn't cast array of type ...``, ``Expected 2 fields
in line 3, saw 3``) that names neither the file nor, mostly, the line. Only after such a failure
(loading a good file costs nothing extra) `data_file_error` re-reads the files in plain Python, in
the order they were loaded, and returns a `DataFileError` for the first bad spot::

    data.source: <path> line N, column M: <what is wrong>; <what to do>

Findings are ranked by how surely they broke the load: text that does not parse at all (JSON,
UTF-8, a CSV row with too many fields, an unclosed quote, an unreadable Parquet file, files with
no records at all) first, then a field whose type differs from the records before it (the first
file or first chunk fixes each column's type), then weaker suspects (integers followed by decimals,
short CSV rows), then a field that is not among the columns ``datasets`` took from the first records. When nothing is found the
original error is not swallowed: the `DataFileError` lists the files and the original cause, and
chains it (``raise ... from``). `record_error` places a record that loaded but that its format cannot read.
"""

from __future__ import annotations

import codecs
import csv
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class DataFileError(ValueError):
    """A local data file ``datasets`` could not load, with where it breaks when that was found."""

    def __init__(
        self, message: str, *, path: Path | None = None, line: int | None = None, column: int | None = None
    ) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.column = column


def load_errors() -> tuple[type[BaseException], ...]:
    """What ``datasets.load_dataset`` raises for a file it cannot parse.

    Meant for an ``except`` clause, whose expression runs only once something was raised: the
    imports here cost nothing on the happy path.
    """
    import pyarrow
    from datasets.exceptions import DatasetGenerationError

    # StopIteration: what an empty JSON Lines file raises from inside the builder.
    return (DatasetGenerationError, pyarrow.ArrowException, ValueError, TypeError, StopIteration)


def data_file_error(files: Sequence[Path], builder: str, error: BaseException) -> DataFileError:
    """The `DataFileError` to raise (``from error``) after ``datasets`` failed to load `files` with `builder`.

    `builder` is the ``datasets`` builder name ("json", "csv", "parquet", "text"). The error names
    the first bad spot found by re-reading the files; else the files and the original cause.
    """
    finding = _locate(files, builder, error)
    if finding is not None:
        return DataFileError(finding.message(), path=finding.path, line=finding.line, column=finding.column)
    shown = ", ".join(str(p) for p in files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    return DataFileError(
        f"data.source: loading {shown} failed with {_describe(error)}; re-reading the file(s) found no bad "
        "line, so the cause is in the error above"
    )


def record_error(files: Sequence[Path], builder: str, index: int, problem: str) -> DataFileError:
    """A `DataFileError` naming the file and line (Parquet: row) of record `index` (0-based, in the
    order ``datasets`` loaded `files` with `builder`), for a record that loaded but is unreadable."""
    number = index + 1
    for path in files:
        try:
            places = list(_record_places(path, builder))
        except (OSError, ValueError, csv.Error):
            break  # cannot re-read it: say which record, not where
        if index < len(places):
            line, row = places[index]
            where = f"line {line}" if line is not None else f"row {row}"
            return DataFileError(f"data.source: {path} {where}: {problem}", path=path, line=line)
        index -= len(places)
    return DataFileError(f"data.source: record {number}: {problem}")


def _record_places(path: Path, builder: str) -> Iterator[tuple[int | None, int]]:
    """(line or None, row in the file) of each record of `path`, as ``datasets`` reads them."""
    if builder == "parquet":
        import pyarrow.parquet as pq

        yield from ((None, row) for row in range(1, pq.read_metadata(path).num_rows + 1))
        return
    text = path.read_bytes().removeprefix(_BOM).decode("utf-8")
    if builder == "csv":  # pandas skips blank rows; a quoted value may span lines
        reader, start, rows = csv.reader(text.splitlines(keepends=True)), 1, []
        for row in reader:
            line, start = start, reader.line_num + 1
            if row and row != [""]:
                rows.append(line)
        yield from ((line, n) for n, line in enumerate(rows[1:], start=1))  # the header is no record
    elif builder == "json" and text.lstrip().startswith("["):
        yield from ((line, n) for n, (line, _, _) in enumerate(_array_items(text), start=1))
    else:  # JSON Lines skip blank lines; a text file has a record per line
        numbers = [i for i, raw in enumerate(text.splitlines(), start=1) if builder == "text" or raw.strip()]
        yield from ((line, n) for n, line in enumerate(numbers, start=1))


# ---- findings ----------------------------------------------------------------------------------

_CERTAIN, _TYPE_CONFLICT, _SUSPECT, _EXTRA_COLUMN = 0, 1, 2, 3
"""Finding ranks, surest first: the first finding of the lowest rank is reported."""

_BOM = codecs.BOM_UTF8


@dataclass(frozen=True)
class _Finding:
    path: Path
    line: int | None
    column: int | None
    column_name: str | None
    problem: str
    fix: str
    rank: int

    def message(self) -> str:
        where = str(self.path)
        if self.line is not None:
            where += f" line {self.line}"
        if self.column is not None:
            where += f", column {self.column}"
            if self.column_name is not None:
                where += f" ({self.column_name!r})"
        return f"data.source: {where}: {self.problem}; {self.fix}"


def _locate(files: Sequence[Path], builder: str, error: BaseException) -> _Finding | None:
    scanners = {"json": _json_findings, "csv": _csv_findings, "parquet": _parquet_findings}
    scan = scanners.get(builder, _text_findings)
    best: dict[int, _Finding] = {}
    try:
        for finding in scan(files, error):
            if finding.rank == _CERTAIN:
                return finding
            best.setdefault(finding.rank, finding)
    except (OSError, csv.Error, RecursionError):
        pass  # a file that cannot be re-read this way: report what was found, else the original error
    return best[min(best)] if best else _no_records(files, builder)


def _no_records(files: Sequence[Path], builder: str) -> _Finding | None:
    """Every file blank (a CSV: a header at most), which datasets reports as "corresponds to no data"."""
    if builder == "parquet":
        return None
    allowed = 1 if builder == "csv" else 0
    for path in files:
        with open(path, "rb") as handle:
            filled = (line for line in handle if line.strip())
            if len(list(zip(filled, range(allowed + 1)))) > allowed:
                return None
    what = "no data rows (a header at most)" if builder == "csv" else "no records (it is empty or blank)"
    which = "the file holds" if len(files) == 1 else f"this and the other {len(files) - 1} files hold"
    fix = "give data.source a file with records"
    return _Finding(files[0], None, None, None, f"{which} {what}", fix, _CERTAIN)


def _describe(error: BaseException) -> str:
    """``Type: message`` of `error` and of its innermost cause, first lines only."""

    def one(e: BaseException) -> str:
        text = str(e).strip().splitlines()
        return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__

    outer, inner = one(error), one(list(_chain(error))[-1])
    return outer if inner == outer else f"{outer} (caused by {inner})"


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _preview(value: Any, limit: int = 40) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _utf8_finding(path: Path, data: bytes, error: UnicodeDecodeError, first_line: int = 1) -> _Finding:
    """Where `error` (from decoding `data`, which starts at `first_line` of `path`) found bytes that are not UTF-8."""
    line_start = data.rfind(b"\n", 0, error.start) + 1
    column = len(data[line_start : error.start].decode("utf-8", "replace")) + 1
    bad = " ".join(f"0x{b:02x}" for b in data[error.start : error.end])
    fix = "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 old > new`)"
    line = first_line + data.count(b"\n", 0, error.start)
    return _Finding(path, line, column, None, f"bytes that are not UTF-8 ({bad})", fix, _CERTAIN)


def _text_findings(files: Sequence[Path], error: BaseException) -> Iterator[_Finding]:
    """Plain text files: only bytes that are not UTF-8 can break them."""
    for path in files:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    yield _utf8_finding(path, raw, err, number)
                    break


# ---- JSON and JSON Lines -----------------------------------------------------------------------

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


def _record_findings(record: dict[str, Any], path: Path, line: int, schema: _Schema) -> Iterator[_Finding]:
    """A field whose type differs from the records before it, or a column ``datasets`` did not expect."""
    for name in schema.extra_columns.intersection(record):
        yield _Finding(
            path,
            line,
            None,
            None,
            f"field {name!r} is not among the columns datasets took from the records before it",
            "give every record the same fields (null where one has no value)",
            _EXTRA_COLUMN,
        )
    for name, value in _fields(record):
        kind = _kind(value)
        if kind is None:
            continue  # null fits any type
        first = schema.fields.setdefault(name, _FirstSeen(kind, path, line))
        if first.kind == kind or (first.kind, kind) == ("a number", "an integer"):
            continue  # integers fit a column of numbers
        at = f"line {first.line}" if first.path == path else f"{first.path} line {first.line}"
        problem = f"field {name!r} is {kind} ({_preview(value)}) here but {first.kind} in the records before it (first at {at})"
        if (first.kind, kind) == ("an integer", "a number"):
            yield _Finding(
                path,
                line,
                None,
                None,
                problem,
                f"write {name!r} alike in every record: all integers, or all with a decimal point (2.0)",
                _SUSPECT,
            )
        else:
            fix = f"give {name!r} one type in every record (null where it has no value)"
            yield _Finding(path, line, None, None, problem, fix, _TYPE_CONFLICT)
        return  # one conflict per record: the first says enough


def _json_findings(files: Sequence[Path], error: BaseException) -> Iterator[_Finding]:
    extra: set[str] = set()
    for e in _chain(error):  # datasets' CastError: "Couldn't cast ... because column names don't match"
        table, requested = getattr(e, "table_column_names", None), getattr(e, "requested_column_names", None)
        if table is not None and requested is not None:
            extra |= set(table) - set(requested)
    schema = _Schema({}, frozenset(extra))
    for path in files:
        with open(path, "rb") as handle:
            head = handle.read(4096).removeprefix(_BOM).lstrip()
        # datasets reads a file that starts with "[" as one array, anything else as JSON Lines.
        yield from (_json_document if head.startswith(b"[") else _json_lines)(path, schema)


def _json_lines(path: Path, schema: _Schema) -> Iterator[_Finding]:
    with open(path, "rb") as handle:
        first_record = True
        for number, raw in enumerate(handle, start=1):
            raw = raw.removeprefix(_BOM) if number == 1 else raw
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield _utf8_finding(path, raw, err, number)
                continue
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as err:
                if first_record:  # maybe one object over several lines: the whole file says where it breaks
                    yield from _json_document(path, schema, first_line=number)
                    return
                yield _Finding(
                    path, number, err.colno, None, f"not valid JSON ({err.msg})", _LINE_FIX, _CERTAIN
                )
                continue
            first_record = False
            if not isinstance(record, dict):
                problem = f"{_kind(record) or 'null'} ({_preview(record)}), not a JSON object"
                yield _Finding(path, number, None, None, problem, _LINE_FIX, _CERTAIN)
                continue
            yield from _record_findings(record, path, number, schema)


def _json_document(path: Path, schema: _Schema, first_line: int | None = None) -> Iterator[_Finding]:
    """Findings in a file read as one JSON value; `first_line` is the first record's line when the
    file was meant as JSON Lines (a break on that very line gets the JSON Lines advice)."""
    raw = path.read_bytes().removeprefix(_BOM)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        yield _utf8_finding(path, raw, err)
        return
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        fix = _LINE_FIX if err.lineno == first_line else _DOCUMENT_FIX
        yield _Finding(path, err.lineno, err.colno, None, f"not valid JSON ({err.msg})", fix, _CERTAIN)
        return
    if isinstance(document, dict):
        return  # one object: read as one record
    if not isinstance(document, list):
        problem = f"the file holds {_kind(document) or 'null'} ({_preview(document)}), not records"
        yield _Finding(path, 1, 1, None, problem, _DOCUMENT_FIX, _CERTAIN)
        return
    # An array of plain values is read as a 'text' column; once it holds objects, every item must be one.
    holds_objects = any(isinstance(item, dict) for item in document)
    for index, (line, column, item) in enumerate(_array_items(text), start=1):
        if isinstance(item, dict):
            yield from _record_findings(item, path, line, schema)
        elif holds_objects:
            problem = (
                f"item {index} of the array is {_kind(item) or 'null'} ({_preview(item)}), not an object"
            )
            fix = 'every item must be an object with named fields, e.g. {"text": "..."}'
            yield _Finding(path, line, column, None, problem, fix, _CERTAIN)


def _array_items(text: str) -> Iterator[tuple[int, int, Any]]:
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


# ---- CSV ---------------------------------------------------------------------------------------

_MISSING = frozenset({"", "NA", "N/A", "n/a", "NaN", "nan", "-nan", "null", "NULL", "None", "#N/A", "<NA>"})
"""Cells pandas reads as missing: they fit any column."""
_REFUSED_VALUE = re.compile(
    r"Failed to parse string: '(?P<value>.*)' as a scalar of type (?P<type>\w+)"
    r"|Could not convert '(?P<value2>.*)' with type str: tried to convert to (?P<type2>\w+)"
)
_CSV_SEPARATOR = re.compile(r"[,\r\n]")


def _csv_kind(cell: str) -> str | None:
    if cell.strip() in _MISSING:
        return None
    for convert, kind in ((int, "integers"), (float, "numbers")):
        try:
            convert(cell)
            return kind
        except ValueError:
            pass
    return "booleans" if cell.strip().lower() in ("true", "false") else "text"


def _fits(cell: str, arrow_type: str) -> bool:
    kind = _csv_kind(cell)
    if kind is None:
        return True
    if arrow_type.startswith(("int", "uint")):
        return kind == "integers"
    if arrow_type in ("double", "float", "halffloat"):
        return kind in ("integers", "numbers")
    return kind == "booleans" if arrow_type == "bool" else True


def _refused_value(error: BaseException) -> tuple[str, str] | None:
    """(value, arrow type) of a cell pyarrow refused to convert, from the error's text."""
    for e in _chain(error):
        if match := _REFUSED_VALUE.search(str(e)):
            return match["value"] or match["value2"] or "", match["type"] or match["type2"]
    return None


def _csv_findings(files: Sequence[Path], error: BaseException) -> Iterator[_Finding]:
    refused = _refused_value(error)
    first_header: tuple[Path, list[str]] | None = None
    for path in files:
        utf8 = next(_text_findings([path], error), None)
        if utf8 is not None:
            yield utf8
            continue
        header, found = _csv_rows(path, refused)
        quote = _unclosed_quote(path)
        if quote is not None:
            line, field = quote
            name = header[field - 1] if field <= len(header) else None
            fix = 'close it with " (a quote inside a quoted value is written "")'
            found.append(
                _Finding(
                    path, line, field, name, "a quoted value opens here and is never closed", fix, _CERTAIN
                )
            )
        if first_header is None:
            first_header = (path, header)
        elif header and header != first_header[1]:
            problem = f"the header is ({', '.join(header)}) but {first_header[0]} has ({', '.join(first_header[1])})"
            fix = "give every CSV file of data.source the same header"
            found.append(_Finding(path, 1, None, None, problem, fix, _TYPE_CONFLICT))
        yield from sorted(found, key=lambda f: (f.rank, f.line or 0))


def _csv_rows(path: Path, refused: tuple[str, str] | None) -> tuple[list[str], list[_Finding]]:
    """The header and the first finding of each rank: rows with the wrong number of fields, cells
    whose type breaks their column."""
    limit = csv.field_size_limit()
    csv.field_size_limit(2**31 - 1)  # long documents are normal training text; the default is 128 KiB
    header: list[str] = []
    found: dict[int, _Finding] = {}
    try:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle)
            columns: _CsvColumns | None = None
            start = 1
            for row in reader:
                line, start = start, reader.line_num + 1
                if not row or row == [""]:
                    continue  # pandas skips blank lines
                if columns is None:
                    header, columns = row, _CsvColumns(path, row, refused)
                    continue
                for finding in columns.check(line, row):
                    found.setdefault(finding.rank, finding)
                if _CERTAIN in found:
                    break
    finally:
        csv.field_size_limit(limit)
    return header, list(found.values())


class _CsvColumns:
    """What the rows so far say about each column: the first cell's kind, and whether every cell
    fits the type pyarrow refused a value for."""

    def __init__(self, path: Path, header: list[str], refused: tuple[str, str] | None) -> None:
        self.path, self.header, self.refused = path, header, refused
        self.first_kind: list[tuple[str, int] | None] = [None] * len(header)
        self.fits_so_far = [True] * len(header)

    def check(self, line: int, row: list[str]) -> Iterator[_Finding]:
        header = self.header
        if len(row) != len(header):
            extra = len(row) > len(header)
            problem = f"the header has {len(header)} fields ({', '.join(header)}) but this row has {len(row)}"
            if extra:
                fix = 'quote values that contain commas ("a, b") or remove the extra field'
                yield _Finding(self.path, line, len(header) + 1, None, problem, fix, _CERTAIN)
            else:
                fix = "fill in the missing fields (an empty one is nothing between two commas)"
                yield _Finding(self.path, line, len(row) + 1, header[len(row)], problem, fix, _SUSPECT)
        for index, cell in enumerate(row[: len(header)]):
            yield from self._cell(line, index, cell)

    def _cell(self, line: int, index: int, cell: str) -> Iterator[_Finding]:
        kind = _csv_kind(cell)
        if kind is None:
            return
        seen, name = self.first_kind[index], self.header[index]
        if self.refused is not None:
            value, arrow_type = self.refused
            if cell == value and seen is not None and self.fits_so_far[index]:
                problem = f"{cell!r} does not read as {arrow_type}, the type the rows above (from line {seen[1]}) gave this column"
                fix = "correct the value, or leave the cell empty"
                yield _Finding(self.path, line, index + 1, name, problem, fix, _TYPE_CONFLICT)
            self.fits_so_far[index] = self.fits_so_far[index] and _fits(cell, arrow_type)
        if seen is None:
            self.first_kind[index] = (kind, line)
        elif seen[0] != kind and seen[0] != "text" and (seen[0], kind) != ("numbers", "integers"):
            problem = (
                f"{cell!r} is {kind} but the rows above hold {seen[0]} in this column (from line {seen[1]})"
            )
            yield _Finding(
                self.path, line, index + 1, name, problem, "give the column one type in every row", _SUSPECT
            )


def _unclosed_quote(path: Path) -> tuple[int, int] | None:
    """(line, field number) where a quoted value opens and the file ends before it closes."""
    opened: tuple[int, int] | None = None
    in_quote, field_start, field = False, True, 1
    with open(path, encoding="utf-8-sig", newline="") as handle:
        for number, text in enumerate(handle, start=1):
            position = 0
            while position < len(text):
                if in_quote:
                    close = text.find('"', position)
                    if close < 0:
                        break  # the quoted value goes on past this line
                    if text.startswith('"', close + 1):
                        position = close + 2  # "" is a quote inside the value
                        continue
                    in_quote, field_start, position = False, False, close + 1
                elif field_start and text[position] == '"':
                    in_quote, opened, position = True, (number, field), position + 1
                else:
                    separator = _CSV_SEPARATOR.search(text, position)
                    if separator is None:
                        break
                    field = field + 1 if separator.group() == "," else 1
                    field_start, position = True, separator.end()
    return opened if in_quote else None


# ---- Parquet -----------------------------------------------------------------------------------


def _parquet_findings(files: Sequence[Path], error: BaseException) -> Iterator[_Finding]:
    """A file pyarrow cannot read as Parquet, or one whose columns differ from the first file's."""
    import pyarrow
    import pyarrow.parquet as pq

    first: tuple[Path, Any] | None = None
    for path in files:
        try:
            schema = pq.read_schema(path)
        except (pyarrow.ArrowException, OSError) as err:
            problem = f"not a Parquet file pyarrow can read ({_describe(err)})"
            yield _Finding(
                path, None, None, None, problem, "write it again, or leave it out of data.source", _CERTAIN
            )
            continue
        if first is None:
            first = (path, schema)
            continue
        fix = "give every Parquet file of data.source the same columns and types"
        if schema.names != first[1].names:
            problem = f"its columns ({', '.join(schema.names)}) differ from {first[0]}'s ({', '.join(first[1].names)})"
            yield _Finding(path, None, None, None, problem, fix, _TYPE_CONFLICT)
            continue
        for field in schema:
            expected = first[1].field(field.name).type
            if field.type != expected:
                problem = f"column {field.name!r} is {field.type} here but {expected} in {first[0]}"
                yield _Finding(path, None, None, None, problem, fix, _TYPE_CONFLICT)
                break
