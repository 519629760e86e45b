"""Bad local data files say where: real files loaded through `load_records`, each error naming the
file, the line (and the column) and what to do; good files still load, and a fixed file is re-read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from workbench.config import DataConfig
from workbench.data import load_records
from workbench.data.file_errors import DataFileError, data_file_error

# These files are plain text records: the notice that says so is not what is tested here.
pytestmark = pytest.mark.filterwarnings("ignore:data.format='auto'")

ROWS = [json.dumps({"text": f"row {i}", "n": i}) for i in range(5)]


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def load(source: Path, cache_dir: Path, **data):
    return load_records(DataConfig(source=str(source), **data), cache_dir=cache_dir)


def load_error(source: Path, cache_dir: Path, **data) -> DataFileError:
    with pytest.raises(DataFileError) as caught:
        load(source, cache_dir, **data)
    message = str(caught.value)
    assert message.startswith("data.source: "), message
    assert caught.value.__cause__ is not None  # the original error stays in the chain
    return caught.value


def lines(*rows: str) -> str:
    return "\n".join(rows) + "\n"


# ---- JSON Lines ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "where", "what"),
    [
        (  # a line that is not JSON: line and column from the JSON parser
            lines(*ROWS[:3], '{"text": "x", oops}', *ROWS[3:]),
            "bad.jsonl line 4, column 15:",
            "not valid JSON (Expecting property name enclosed in double quotes)",
        ),
        (  # the very first line broken: still that line, with the JSON Lines advice
            lines('{"text": "x" "y"}', *ROWS),
            "bad.jsonl line 1, column 14:",
            "each line must hold one complete JSON object",
        ),
        (  # valid JSON that is not an object
            lines(*ROWS[:3], "[1, 2]", *ROWS[3:]),
            "bad.jsonl line 4:",
            "an array ([1, 2]), not a JSON object",
        ),
        (  # bytes that are not UTF-8 (datasets would load them and fail in a later map)
            b'{"text": "a"}\n{"text": "b\xff\xfe"}\n{"text": "c"}\n',
            "bad.jsonl line 2, column 12:",
            "bytes that are not UTF-8 (0xff)",
        ),
        ("\n\n", "bad.jsonl:", "the file holds no records"),
    ],
    ids=["not-json", "first-line", "not-an-object", "not-utf8", "blank"],
)
def test_a_bad_json_lines_file_names_its_line(tmp_path, cache_dir, content, where, what):
    error = load_error(write(tmp_path / "bad.jsonl", content), cache_dir)
    assert f"{tmp_path / where}" in str(error) and what in str(error), str(error)


def test_a_field_whose_type_changes_names_the_field_line_and_both_types(tmp_path, cache_dir):
    # The first file fixes the columns' types; the second breaks 'n' on its line 2.
    write(tmp_path / "data" / "a.jsonl", lines(*ROWS))
    write(tmp_path / "data" / "b.jsonl", lines(ROWS[0], '{"text": "x", "n": "seven"}', ROWS[1]))
    error = load_error(tmp_path / "data", cache_dir)
    message = str(error)
    assert f"{tmp_path / 'data' / 'b.jsonl'} line 2:" in message, message
    assert "field 'n' is a string (\"seven\") here but an integer" in message
    assert f"first at {tmp_path / 'data' / 'a.jsonl'} line 1" in message
    assert error.path == tmp_path / "data" / "b.jsonl" and error.line == 2

    # A nested object where the first file had a number: the same error, the other types named.
    write(tmp_path / "nested" / "a.jsonl", lines(*ROWS))
    write(tmp_path / "nested" / "b.jsonl", lines(ROWS[0], ROWS[1], '{"text": "x", "n": {"x": 1}}'))
    message = str(load_error(tmp_path / "nested", cache_dir))
    assert f"{tmp_path / 'nested' / 'b.jsonl'} line 3:" in message
    assert "field 'n' is an object ({\"x\": 1}) here but an integer" in message


def test_a_field_the_first_file_lacks_is_named_where_it_first_appears(tmp_path, cache_dir):
    write(tmp_path / "data" / "a.jsonl", lines('{"text": "a"}', '{"text": "b"}'))
    write(tmp_path / "data" / "b.jsonl", lines('{"text": "c"}', '{"text": "d", "label": 1}'))
    message = str(load_error(tmp_path / "data", cache_dir))
    assert f"{tmp_path / 'data' / 'b.jsonl'} line 2:" in message, message
    assert "field 'label' is not among the columns" in message


# ---- JSON ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "where", "what"),
    [
        (
            '[{"text": "a"},\n {"text": "b"},\n {"text": "c"\n]',
            "bad.json line 4, column 1:",
            "not valid JSON",
        ),
        (
            '[{"text": "a"},\n 3,\n {"text": "c"}\n]',
            "bad.json line 2, column 2:",
            "item 2 of the array is an integer (3), not an object",
        ),
        ('{\n  "text": "a",\n  "n": \n}', "bad.json line 4, column 1:", "not valid JSON (Expecting value)"),
    ],
    ids=["array-does-not-parse", "item-not-an-object", "object-does-not-parse"],
)
def test_a_bad_json_file_names_its_line_and_column(tmp_path, cache_dir, content, where, what):
    message = str(load_error(write(tmp_path / "bad.json", content), cache_dir))
    assert f"{tmp_path / where}" in message and what in message, message


# ---- CSV -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "where", "what"),
    [
        (
            "prompt,response\na,b\nc,d,e\nf,g\n",
            "bad.csv line 3, column 3:",
            "the header has 2 fields (prompt, response) but this row has 3",
        ),
        (
            'prompt,response\na,b\nc,"d\nf,g\n',
            "bad.csv line 3, column 2 ('response'):",
            "a quoted value opens here and is never closed",
        ),
        (  # pandas reads 10,000 rows at a time: the first chunk made 'n' a column of integers
            "n,text\n" + "".join(f"{i},row\n" for i in range(10_050)) + "x,row\n",
            "bad.csv line 10052, column 1 ('n'):",
            "'x' does not read as int64",
        ),
        (b"text,n\na,1\nb\xff\xfe,2\n", "bad.csv line 3, column 2:", "bytes that are not UTF-8"),
        ("prompt,response\n", "bad.csv:", "the file holds no data rows"),
    ],
    ids=["field-count", "unclosed-quote", "value-type", "not-utf8", "header-only"],
)
def test_a_bad_csv_file_names_its_line_and_column(tmp_path, cache_dir, content, where, what):
    message = str(load_error(write(tmp_path / "bad.csv", content), cache_dir))
    assert f"{tmp_path / where}" in message and what in message, message


def test_a_directory_of_csv_files_names_the_bad_one(tmp_path, cache_dir):
    write(tmp_path / "data" / "a.csv", "n,text\n1,a\n2,b\n")
    write(tmp_path / "data" / "b.csv", "n,text\n3,c\nx,d\n")
    message = str(load_error(tmp_path / "data", cache_dir))
    assert f"{tmp_path / 'data' / 'b.csv'} line 3, column 1 ('n'):" in message, message

    write(tmp_path / "headers" / "a.csv", "n,text\n1,a\n")
    write(tmp_path / "headers" / "b.csv", "n,body\n2,b\n")
    message = str(load_error(tmp_path / "headers", cache_dir))
    assert f"{tmp_path / 'headers' / 'b.csv'} line 1:" in message and "the header is (n, body)" in message


# ---- text and Parquet ----------------------------------------------------------------------------


def test_a_text_file_that_is_not_utf8_names_its_line(tmp_path, cache_dir):
    message = str(load_error(write(tmp_path / "bad.txt", b"a\nb\xff\xfe\nc\n"), cache_dir))
    assert f"{tmp_path / 'bad.txt'} line 2, column 2:" in message, message


def test_a_bad_parquet_file_is_named(tmp_path, cache_dir):
    import datasets

    write(tmp_path / "broken" / "a.parquet", b"not parquet at all")
    message = str(load_error(tmp_path / "broken", cache_dir))
    assert f"{tmp_path / 'broken' / 'a.parquet'}: not a Parquet file" in message, message

    (tmp_path / "mixed").mkdir()
    datasets.Dataset.from_list([{"text": "a", "n": 1}]).to_parquet(str(tmp_path / "mixed" / "a.parquet"))
    datasets.Dataset.from_list([{"text": "b", "n": "x"}]).to_parquet(str(tmp_path / "mixed" / "b.parquet"))
    message = str(load_error(tmp_path / "mixed", cache_dir))
    assert f"{tmp_path / 'mixed' / 'b.parquet'}: column 'n' is string here but int64" in message, message


# ---- nothing found, good files, the cache --------------------------------------------------------


def test_a_failure_with_no_bad_line_found_keeps_the_original_error(tmp_path, cache_dir):
    # Duplicate keys are valid to Python's json module but not to pyarrow or pandas.
    bad = write(tmp_path / "dup.jsonl", lines('{"text": "a", "text": "b"}'))
    error = load_error(bad, cache_dir)
    assert f"loading {bad} failed with DatasetGenerationError" in str(error)
    assert "found no bad line" in str(error)
    # Called directly with any error, it lists the files and the original message.
    files = [write(tmp_path / f"ok{i}.jsonl", lines(*ROWS)) for i in range(7)]
    message = str(data_file_error(files, "json", ValueError("something odd")))
    assert f"{files[0]}, {files[1]}" in message and "and 2 more" in message
    assert "failed with ValueError: something odd" in message


def test_good_files_still_load(tmp_path, cache_dir):
    bom = write(tmp_path / "bom.jsonl", b"\xef\xbb\xbf" + lines(*ROWS).encode())
    assert load(bom, cache_dir)["text"] == [f"row {i}" for i in range(5)]
    # Mixed types within the first file are datasets' own business (it stores them as JSON).
    mixed = write(tmp_path / "mixed.jsonl", lines('{"text": "a"}', '{"text": 5}'))
    assert len(load(mixed, cache_dir)) == 2
    table = write(tmp_path / "t.csv", 'prompt,response\n"a, quoted",b\n"multi\nline",d\n')
    with pytest.warns(RuntimeWarning, match="as prompt_response"):  # chat records become messages
        turns = load(table, cache_dir)["messages"]
    assert [t[0]["content"] for t in turns] == ["a, quoted", "multi\nline"]
    array = write(tmp_path / "a.json", json.dumps([{"text": "x"}, {"text": "y"}], indent=2))
    assert load(array, cache_dir)["text"] == ["x", "y"]


def test_a_fixed_file_is_read_again_not_taken_from_the_cache(tmp_path, cache_dir):
    def rewrite(content: str, edit: int) -> Path:
        # datasets keys its cache of a local file by the file's mtime: each edit here is a second
        # later, as a person's edits are (some file systems keep mtimes to the second only).
        write(path, content)
        os.utime(path, (1_700_000_000 + edit, 1_700_000_000 + edit))
        return path

    path = tmp_path / "data.jsonl"
    rewrite(lines(*ROWS[:2], "{oops", *ROWS[2:]), 0)
    assert f"{path} line 3" in str(load_error(path, cache_dir))
    rewrite(lines(*ROWS), 1)
    assert len(load(path, cache_dir)) == 5
    rewrite(lines(*ROWS[:3]), 2)
    assert len(load(path, cache_dir)) == 3
