"""A finding: a bad spot in a local data file, what is wrong there and the fix, ranked by how surely it broke the load.

What every format's reader shares (`workbench.data.json_findings`, `workbench.data.table_findings`):
the `Finding` and its ranks, an error's text and chain of causes, a value's short preview, and the
one thing that breaks any text file, bytes that are not UTF-8 (`text_findings`). The error raised and
which reader looks is `workbench.data.file_errors`'.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CERTAIN, TYPE_CONFLICT, SUSPECT, EXTRA_COLUMN = 0, 1, 2, 3
"""Finding ranks, surest first: the first finding of the lowest rank is reported."""

BOM = codecs.BOM_UTF8


@dataclass(frozen=True)
class Finding:
    """A bad spot in a data file: where (file, line, column and its name), what is wrong, the fix, and
    its rank (`CERTAIN` ... `EXTRA_COLUMN`)."""

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


def error_text(error: BaseException) -> str:
    """``Type: message`` of `error` and of its innermost cause, first lines only."""

    def one(e: BaseException) -> str:
        text = str(e).strip().splitlines()
        return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__

    outer, inner = one(error), one(list(error_chain(error))[-1])
    return outer if inner == outer else f"{outer} (caused by {inner})"


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """`error`, then its causes and contexts, each once."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def value_preview(value: Any, limit: int = 40) -> str:
    """`value` as JSON, cut to `limit` characters."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def utf8_finding(path: Path, data: bytes, error: UnicodeDecodeError, first_line: int = 1) -> Finding:
    """Where `error` (from decoding `data`, which starts at `first_line` of `path`) found bytes that are not UTF-8."""
    line_start = data.rfind(b"\n", 0, error.start) + 1
    column = len(data[line_start : error.start].decode("utf-8", "replace")) + 1
    bad = " ".join(f"0x{b:02x}" for b in data[error.start : error.end])
    fix = "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 old > new`)"
    line = first_line + data.count(b"\n", 0, error.start)
    return Finding(path, line, column, None, f"bytes that are not UTF-8 ({bad})", fix, CERTAIN)


def text_findings(files: Sequence[Path], error: BaseException) -> Iterator[Finding]:
    """Plain text files: only bytes that are not UTF-8 can break them."""
    for path in files:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    yield utf8_finding(path, raw, err, number)
                    break
