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

The readers of each format are their own modules (`workbench.data.json_findings`,
`workbench.data.table_findings`: CSV and Parquet; plain text's in `workbench.data.file_findings`).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from pathlib import Path

from workbench.data.file_findings import BOM, CERTAIN, Finding, error_text, text_findings
from workbench.data.json_findings import array_items, json_findings
from workbench.data.table_findings import csv_findings, parquet_findings


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
        f"data.source: loading {shown} failed with {error_text(error)}; re-reading the file(s) found no bad "
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
    text = path.read_bytes().removeprefix(BOM).decode("utf-8")
    if builder == "csv":  # pandas skips blank rows; a quoted value may span lines
        reader, start, rows = csv.reader(text.splitlines(keepends=True)), 1, []
        for row in reader:
            line, start = start, reader.line_num + 1
            if row and row != [""]:
                rows.append(line)
        yield from ((line, n) for n, line in enumerate(rows[1:], start=1))  # the header is no record
    elif builder == "json" and text.lstrip().startswith("["):
        yield from ((line, n) for n, (line, _, _) in enumerate(array_items(text), start=1))
    else:  # JSON Lines skip blank lines; a text file has a record per line
        numbers = [i for i, raw in enumerate(text.splitlines(), start=1) if builder == "text" or raw.strip()]
        yield from ((line, n) for n, line in enumerate(numbers, start=1))


def _locate(files: Sequence[Path], builder: str, error: BaseException) -> Finding | None:
    scanners = {"json": json_findings, "csv": csv_findings, "parquet": parquet_findings}
    scan = scanners.get(builder, text_findings)
    best: dict[int, Finding] = {}
    try:
        for finding in scan(files, error):
            if finding.rank == CERTAIN:
                return finding
            best.setdefault(finding.rank, finding)
    except (OSError, csv.Error, RecursionError):
        pass  # a file that cannot be re-read this way: report what was found, else the original error
    return best[min(best)] if best else _no_records(files, builder)


def _no_records(files: Sequence[Path], builder: str) -> Finding | None:
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
    return Finding(files[0], None, None, None, f"{which} {what}", fix, CERTAIN)
