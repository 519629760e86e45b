"""Where a CSV or Parquet data file breaks: the row, the column, and what is wrong there.

`csv_findings` re-reads CSV files as pandas reads them and yields a `Finding` for: a row with too many
or too few fields, a cell pyarrow refused for the type the rows above gave its column, a column whose
cells change kind, a quoted value never closed, a header that differs from the first file's.
`parquet_findings`: a file pyarrow cannot read as Parquet, or columns that differ from the first file's.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from workbench.data.file_findings import (
    CERTAIN,
    SUSPECT,
    TYPE_CONFLICT,
    Finding,
    error_chain,
    error_text,
    text_findings,
)

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
    for e in error_chain(error):
        if match := _REFUSED_VALUE.search(str(e)):
            return match["value"] or match["value2"] or "", match["type"] or match["type2"]
    return None


def csv_findings(files: Sequence[Path], error: BaseException) -> Iterator[Finding]:
    """Findings in CSV files: bytes that are not UTF-8, rows and cells that break their columns, an unclosed
    quote, a header that differs from the first file's."""
    refused = _refused_value(error)
    first_header: tuple[Path, list[str]] | None = None
    for path in files:
        utf8 = next(text_findings([path], error), None)
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
                Finding(
                    path, line, field, name, "a quoted value opens here and is never closed", fix, CERTAIN
                )
            )
        if first_header is None:
            first_header = (path, header)
        elif header and header != first_header[1]:
            problem = f"the header is ({', '.join(header)}) but {first_header[0]} has ({', '.join(first_header[1])})"
            fix = "give every CSV file of data.source the same header"
            found.append(Finding(path, 1, None, None, problem, fix, TYPE_CONFLICT))
        yield from sorted(found, key=lambda f: (f.rank, f.line or 0))


def _csv_rows(path: Path, refused: tuple[str, str] | None) -> tuple[list[str], list[Finding]]:
    """The header and the first finding of each rank: rows with the wrong number of fields, cells
    whose type breaks their column."""
    limit = csv.field_size_limit()
    csv.field_size_limit(2**31 - 1)  # long documents are normal training text; the default is 128 KiB
    header: list[str] = []
    found: dict[int, Finding] = {}
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
                if CERTAIN in found:
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

    def check(self, line: int, row: list[str]) -> Iterator[Finding]:
        header = self.header
        if len(row) != len(header):
            extra = len(row) > len(header)
            problem = f"the header has {len(header)} fields ({', '.join(header)}) but this row has {len(row)}"
            if extra:
                fix = 'quote values that contain commas ("a, b") or remove the extra field'
                yield Finding(self.path, line, len(header) + 1, None, problem, fix, CERTAIN)
            else:
                fix = "fill in the missing fields (an empty one is nothing between two commas)"
                yield Finding(self.path, line, len(row) + 1, header[len(row)], problem, fix, SUSPECT)
        for index, cell in enumerate(row[: len(header)]):
            yield from self._cell(line, index, cell)

    def _cell(self, line: int, index: int, cell: str) -> Iterator[Finding]:
        kind = _csv_kind(cell)
        if kind is None:
            return
        seen, name = self.first_kind[index], self.header[index]
        if self.refused is not None:
            value, arrow_type = self.refused
            if cell == value and seen is not None and self.fits_so_far[index]:
                problem = f"{cell!r} does not read as {arrow_type}, the type the rows above (from line {seen[1]}) gave this column"
                fix = "correct the value, or leave the cell empty"
                yield Finding(self.path, line, index + 1, name, problem, fix, TYPE_CONFLICT)
            self.fits_so_far[index] = self.fits_so_far[index] and _fits(cell, arrow_type)
        if seen is None:
            self.first_kind[index] = (kind, line)
        elif seen[0] != kind and seen[0] != "text" and (seen[0], kind) != ("numbers", "integers"):
            problem = (
                f"{cell!r} is {kind} but the rows above hold {seen[0]} in this column (from line {seen[1]})"
            )
            yield Finding(
                self.path, line, index + 1, name, problem, "give the column one type in every row", SUSPECT
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


def parquet_findings(files: Sequence[Path], error: BaseException) -> Iterator[Finding]:
    """A file pyarrow cannot read as Parquet, or one whose columns differ from the first file's."""
    import pyarrow
    import pyarrow.parquet as pq

    first: tuple[Path, Any] | None = None
    for path in files:
        try:
            schema = pq.read_schema(path)
        except (pyarrow.ArrowException, OSError) as err:
            problem = f"not a Parquet file pyarrow can read ({error_text(err)})"
            yield Finding(
                path, None, None, None, problem, "write it again, or leave it out of data.source", CERTAIN
            )
            continue
        if first is None:
            first = (path, schema)
            continue
        fix = "give every Parquet file of data.source the same columns and types"
        if schema.names != first[1].names:
            problem = f"its columns ({', '.join(schema.names)}) differ from {first[0]}'s ({', '.join(first[1].names)})"
            yield Finding(path, None, None, None, problem, fix, TYPE_CONFLICT)
            continue
        for field in schema:
            expected = first[1].field(field.name).type
            if field.type != expected:
                problem = f"column {field.name!r} is {field.type} here but {expected} in {first[0]}"
                yield Finding(path, None, None, None, problem, fix, TYPE_CONFLICT)
                break
