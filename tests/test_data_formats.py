"""Record formats (`workbench.data.formats`): auto detection and its notice, Alpaca and ShareGPT,
data.columns, data.filter, save_to_disk directories, old data.format configs, and short CPU
training runs from each kind of source."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from workbench import data
from workbench.config import ConfigError, DataConfig, WorkbenchConfig
from workbench.data.file_errors import DataFileError
from workbench.data.formats import FORMATS, FormatError, RecordError, parse_filter, record_messages

ALPACA = [
    {"instruction": "Name the builtin that counts items.", "input": "", "output": "len"},
    {"instruction": "Sort these.", "input": "3, 1, 2", "output": "1, 2, 3"},
    {"instruction": "What does abs do?", "input": "", "output": "Absolute value."},
]
SHAREGPT = [
    {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "What does len do?"},
            {"from": "gpt", "value": "Counts items."},
        ]
    },
    {
        "conversations": [
            {"role": "User", "content": "And abs?"},
            {"role": "model", "content": "Absolute value."},
            {"from": "user", "value": "Thanks."},
            {"from": "assistant", "value": "Welcome."},
        ]
    },
]
HELPSTEER = [
    {"prompt": f"Question {i}?", "response": f"Answer {i}.", "helpfulness": i % 5, "verbosity": (i * 3) % 5}
    for i in range(10)
]


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def load(source: Path, cache_dir: Path, **fields):
    return data.load_records(DataConfig(source=str(source), **fields), cache_dir=cache_dir)


def notices(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


# ---- detection -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (
            [{"messages": [{"role": "user", "content": "hi"}], "text": "rendered"}],
            "messages (column messages)",
        ),
        (SHAREGPT, "sharegpt (column conversations)"),
        (ALPACA, "alpaca (columns instruction, input, output)"),
        (HELPSTEER, "prompt_response (columns prompt, response)"),
        ([{"text": "plain words", "score": 1}], "text (column text)"),
    ],
    ids=["messages-before-text", "sharegpt", "alpaca", "helpsteer", "text"],
)
def test_auto_detects_each_format_and_says_which(tmp_path, cache_dir, rows, expected):
    with pytest.warns(RuntimeWarning) as caught:
        records = load(jsonl(tmp_path / "d.jsonl", rows), cache_dir)
    assert notices(caught) == [f"data.format='auto': read {len(rows):,} records as {expected}"]
    assert records.column_names == (["text"] if expected.startswith("text") else ["messages"])


def test_the_notice_counts_with_thousands_separators_and_names_mapped_columns(tmp_path, cache_dir):
    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(1000)]
    with pytest.warns(RuntimeWarning) as caught:
        load(
            jsonl(tmp_path / "qa.jsonl", rows),
            cache_dir,
            columns={"prompt": "question", "response": "answer"},
        )
    assert notices(caught) == [
        "data.format='auto': read 1,000 records as prompt_response "
        "(columns prompt (from 'question'), response (from 'answer'))"
    ]


def test_columns_that_fit_no_format_name_what_each_format_needs(tmp_path, cache_dir):
    path = jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(FormatError) as caught:
        load(path, cache_dir)
    message = str(caught.value)
    assert message.startswith(
        "data.format='auto' found no format: none fits the columns found ['question', 'answer']"
    )
    for needs in (
        "messages needs messages (lists of {role, content})",
        "sharegpt needs conversations (lists of {from, value})",
        "alpaca needs instruction and output (input, system optional)",
        "prompt_response needs prompt and response (system optional)",
        "text needs the data.text_field column 'text'",
        "data.columns={prompt: question, response: answer}",
    ):
        assert needs in message
    with pytest.raises(
        FormatError, match=r"data\.chat=True needs chat records: .*found \['question'"
    ) as chat:
        load(path, cache_dir, chat=True)
    assert "text needs" not in str(chat.value)  # chat=True only looks for chat formats
    with pytest.raises(
        FormatError,
        match=r"data\.format='alpaca': alpaca needs instruction and output .*"
        r"found are \['question', 'answer'\]: .*data\.columns=\{instruction: question",
    ):
        load(path, cache_dir, format="alpaca")


def test_a_file_may_mix_chat_shapes_record_by_record(tmp_path, cache_dir, tokenizer):
    rows = [
        {"prompt": "What does abs do?", "response": "Absolute value."},
        {"messages": [{"role": "user", "content": "And len?"}, {"role": "assistant", "content": "Counts."}]},
    ]
    path = jsonl(tmp_path / "mixed.jsonl", rows)
    with pytest.warns(RuntimeWarning) as caught:
        records = load(path, cache_dir)
    assert notices(caught) == [
        "data.format='auto': read 2 records as messages or prompt_response (columns prompt, response, messages)"
    ]
    assert [m[1]["content"] for m in records["messages"]] == ["Absolute value.", "Counts."]
    with pytest.raises(DataFileError, match=r"line 1: 'messages' is null, not a list of turns"):
        load(path, cache_dir, format="messages")  # an explicit format reads every record its way
    import datasets

    # tokenize_records reads raw mixed records the same way (from_list would keep the first row's keys only)
    raw = datasets.Dataset.from_dict(
        {key: [r.get(key) for r in rows] for key in ("prompt", "response", "messages")}
    )
    assert len(data.tokenize_records(raw, tokenizer, DataConfig())) == 2


def test_an_explicit_format_wins_over_detection_and_chat_forces_chat(tmp_path, cache_dir, tokenizer):
    rows = [{"prompt": "p", "response": "r", "text": "rendered p r"}]
    path = jsonl(tmp_path / "both.jsonl", rows)
    with pytest.warns(RuntimeWarning, match="as prompt_response"):
        assert load(path, cache_dir).column_names == ["messages"]
    assert load(path, cache_dir, format="text").column_names == ["text"]  # no notice: it was asked for
    with pytest.raises(
        ConfigError, match=r"data\.format='text' is not allowed: chat=True needs a chat format"
    ):
        WorkbenchConfig().with_overrides(["data.chat=true", "data.format=text"])
    # records converted by load_records read as messages under any chat format
    converted = load(path, cache_dir, format="prompt_response")
    out = data.tokenize_records(converted, tokenizer, DataConfig(format="prompt_response"))
    assert len(out) == 1


# ---- Alpaca and ShareGPT -------------------------------------------------------------------------


def test_alpaca_joins_instruction_and_input_and_labels_only_the_output(tokenizer):
    import datasets

    assert record_messages(ALPACA[1], "alpaca") == [
        {"role": "user", "content": "Sort these.\n\n3, 1, 2"},
        {"role": "assistant", "content": "1, 2, 3"},
    ]
    assert record_messages({**ALPACA[0], "system": "Be brief."}, "alpaca")[:2] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name the builtin that counts items."},  # an empty input adds nothing
    ]
    assert (
        record_messages({"instruction": "i", "output": "o"}, "alpaca")[0]["content"] == "i"
    )  # no input column
    out = data.tokenize_records(datasets.Dataset.from_list(ALPACA), tokenizer, DataConfig())
    for row, record in zip(out, ALPACA):
        labelled = [t for t, lab in zip(row["input_ids"], row["labels"]) if lab != data.IGNORE_INDEX]
        assert tokenizer.decode(labelled) == record["output"] + "<|end|>\n"
        assert record["instruction"] in tokenizer.decode(row["input_ids"])
    with pytest.raises(
        RecordError,
        match=r"'output' is null or missing; alpaca needs it in every record "
        r"\(data\.filter='output != null' leaves such records out\)",
    ):
        record_messages({"instruction": "i", "output": None}, "alpaca")


def test_sharegpt_roles_map_onto_chat_roles(tmp_path, cache_dir):
    assert [m["role"] for m in record_messages(SHAREGPT[0], "sharegpt")] == ["system", "user", "assistant"]
    assert record_messages(SHAREGPT[1], "sharegpt") == [
        {"role": "user", "content": "And abs?"},
        {"role": "assistant", "content": "Absolute value."},
        {"role": "user", "content": "Thanks."},
        {"role": "assistant", "content": "Welcome."},
    ]
    bad = [
        SHAREGPT[0],
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "narrator", "value": "x"}]},
    ]
    path = jsonl(tmp_path / "bad.jsonl", bad)
    with pytest.warns(RuntimeWarning, match="as sharegpt"), pytest.raises(DataFileError) as caught:
        load(path, cache_dir)
    assert str(caught.value) == (
        f"data.source: {path} line 2: conversations[1] has the role 'narrator'; "
        "sharegpt roles are human/user, gpt/assistant/model and system"
    )
    assert (caught.value.path, caught.value.line) == (path, 2)
    with pytest.raises(RecordError, match=r"conversations\[0\] needs 'from' and 'value'.*got \['speaker'\]"):
        record_messages({"conversations": [{"speaker": "x"}]}, "sharegpt")
    with pytest.raises(RecordError, match=r"'conversations' is str, not a list of turns"):
        record_messages({"conversations": "hi"}, "sharegpt")


def test_a_bad_record_is_placed_in_csv_json_arrays_and_parquet(tmp_path, cache_dir):
    import datasets

    rows = [{"instruction": "a", "output": "b"}, {"instruction": "c", "output": None}]
    csv_path = tmp_path / "bad.csv"
    csv_path.write_text('instruction,output\n"multi\nline",b\n\nc,\n')
    array = tmp_path / "bad.json"
    array.write_text(json.dumps(rows, indent=2))
    parquet = tmp_path / "bad.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    for path, where in ((csv_path, "line 5"), (array, "line 6"), (parquet, "row 2")):
        with (
            pytest.warns(RuntimeWarning),
            pytest.raises(DataFileError, match=re.escape(f"{path} {where}: 'output'")),
        ):
            load(path, cache_dir)


# ---- data.columns --------------------------------------------------------------------------------


def test_columns_map_your_names_and_say_what_is_wrong(tmp_path, cache_dir):
    rows = [{"question": "q", "answer": "a", "prompt": "a rendered prompt", "sys": "Be kind."}]
    path = jsonl(tmp_path / "qa.jsonl", rows)
    columns = {"prompt": "question", "response": "answer", "system": "sys"}
    with pytest.warns(RuntimeWarning, match="as prompt_response"):
        (messages,) = load(path, cache_dir, columns=columns)["messages"]
    # the mapped column replaces the one already named 'prompt'
    assert [m["content"] for m in messages] == ["Be kind.", "q", "a"]
    with pytest.raises(FormatError) as caught:
        load(path, cache_dir, columns={"prompt": "question", "response": "reply"})
    assert str(caught.value) == (
        "data.columns={'prompt': 'question', 'response': 'reply'} is not allowed: response: reply names no "
        "column; the columns found are ['question', 'answer', 'prompt', 'sys']"
    )
    with pytest.raises(
        ConfigError,
        match=r"data\.columns=\{'promt': 'question'\} is not allowed: 'promt' is "
        r"not a column any format reads; did you mean 'prompt'\? \(keys: prompt, response",
    ):
        WorkbenchConfig().with_overrides(["data.columns={promt: question}"])
    with pytest.raises(ConfigError, match="each key maps onto a different, non-empty column name"):
        WorkbenchConfig().with_overrides(["data.columns={prompt: q, response: q}"])
    with pytest.raises(
        ConfigError, match="maps 'text' onto 'body' but text_field='content': set one of them"
    ):
        WorkbenchConfig().with_overrides(["data.columns={text: body}", "data.text_field=content"])
    text = jsonl(tmp_path / "body.jsonl", [{"body": "words here"}])
    with pytest.warns(RuntimeWarning, match=r"as text \(column body\)"):
        assert load(text, cache_dir, columns={"text": "body"})["body"] == ["words here"]


def test_columns_parse_as_a_yaml_flow_mapping_from_overrides(tmp_path):
    cfg = WorkbenchConfig().with_overrides(
        ["data.columns={prompt: question, response: 'answer', system: yes}"]
    )
    assert cfg.data.columns == {
        "prompt": "question",
        "response": "answer",
        "system": "yes",
    }  # no type guessing
    assert WorkbenchConfig.from_yaml(cfg.to_yaml()) == cfg
    assert "columns:\n    prompt: question" in cfg.to_yaml()  # a YAML mapping in a file
    papermill = WorkbenchConfig().with_overrides({"data.columns": {"prompt": "q"}, "data.filter": ["a >= 1"]})
    assert papermill.data.columns == {"prompt": "q"} and papermill.data.filter == ["a >= 1"]
    assert cfg.with_overrides(["data.columns=null"]).data.columns is None
    for bad, why in (
        (
            "data.columns=prompt: q",
            r"expected a mapping of str to str \(e\.g\. \{prompt: question\}\) or null",
        ),
        ("data.columns={prompt: [q}", r"not a YAML flow mapping \(.*\); write it like \{prompt: question"),
        ("data.columns={prompt: [q]}", r"expected a mapping of str to str"),
    ):
        with pytest.raises(ConfigError, match=r"data\.columns=.* is not allowed: " + why):
            WorkbenchConfig().with_overrides([bad])


# ---- data.filter ---------------------------------------------------------------------------------


def test_filter_parses_each_operator_literal_and_and():
    (c,) = parse_filter("helpfulness >= 3")
    assert (c.column, c.op, c.value) == ("helpfulness", ">=", 3)
    parsed = parse_filter(
        "a == 1 and b != 'x \\' y' AND c > -2.5 and d < 1e3 and e <= 0 and f == true and g != null"
    )
    assert [(c.column, c.op, c.value) for c in parsed] == [
        ("a", "==", 1),
        ("b", "!=", "x ' y"),
        ("c", ">", -2.5),
        ("d", "<", 1000.0),
        ("e", "<=", 0),
        ("f", "==", True),
        ("g", "!=", None),
    ]
    assert [c.column for c in parse_filter(["a >= 1", 'b == "two words"'])] == ["a", "b"]
    checks = {">=": (3, 2), "<=": (3, 4), ">": (4, 3), "<": (2, 3), "==": (3, 4), "!=": (4, 3)}
    for op, (kept, dropped) in checks.items():
        (c,) = parse_filter(f"x {op} 3")
        assert c.holds(kept) and not c.holds(dropped), op
    assert not parse_filter("x >= 3")[0].holds(None)  # a missing value passes no ordering


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("helpfulness => 3", r"cannot read '=> 3' \(compare with ==\)"),
        ("helpfulness = 3", r"cannot read '= 3' \(compare with ==\)"),
        ("helpfulness >=", "a condition needs a column, an operator and a value"),
        ("a >= 1 or b <= 2", "'or' is not supported: every condition must hold"),
        ("a >= 1 b <= 2", "expected 'and' or the end after a >= 1, got 'b'"),
        ("a >= good", r"'good' is not a literal \(quote text: 'good'\)"),
        ("a >= null", "null compares only with == and !="),
        ("3 <= a", "expected 'column op value', got '3 <= a'"),
    ],
)
def test_bad_filter_syntax_names_field_value_and_what_is_allowed(value, why):
    with pytest.raises(ConfigError) as caught:
        parse_filter(value)
    message = str(caught.value)
    assert message.startswith(f"data.filter={value!r} is not allowed: ")
    assert re.search(why, message), message
    assert "(ops: == != >= <= > <; literals: numbers, quoted strings, true, false, null)" in message


def test_helpsteer_rows_filtered_by_score(tmp_path, cache_dir):
    path = jsonl(tmp_path / "helpsteer.jsonl", HELPSTEER)
    with pytest.warns(RuntimeWarning) as caught:
        records = load(path, cache_dir, filter="helpfulness >= 3")
    assert notices(caught) == [
        "data.format='auto': read 10 records as prompt_response (columns prompt, response)",
        "data.filter='helpfulness >= 3': kept 4 of 10 records",
    ]
    assert [m[0]["content"] for m in records["messages"]] == [
        "Question 3?",
        "Question 4?",
        "Question 8?",
        "Question 9?",
    ]
    both = ["helpfulness >= 3", "verbosity <= 2"]
    with pytest.warns(RuntimeWarning, match=r"kept 2 of 10"):
        assert len(load(path, cache_dir, filter=both)) == 2
    with pytest.warns(RuntimeWarning, match=r"kept 2 of 10"):
        assert len(load(path, cache_dir, filter="helpfulness >= 3 and verbosity <= 2")) == 2
    with pytest.warns(RuntimeWarning, match=r"kept 4 of 10"):  # the filter runs before the cap
        assert len(load(path, cache_dir, filter="helpfulness >= 3", max_examples=1)) == 1
    with pytest.warns(RuntimeWarning), pytest.raises(FormatError) as caught:
        load(path, cache_dir, filter="helpful >= 3")
    assert str(caught.value) == (
        "data.filter='helpful >= 3' is not allowed: no column 'helpful'; the columns found are "
        "['prompt', 'response', 'helpfulness', 'verbosity']"
    )
    with (
        pytest.warns(RuntimeWarning),
        pytest.raises(FormatError, match=r"compares column 'prompt', which holds "),
    ):
        load(path, cache_dir, filter="prompt > 3")
    with pytest.warns(RuntimeWarning), pytest.raises(FormatError, match=r"kept none of the 10 records"):
        load(path, cache_dir, filter="helpfulness > 9")


def test_a_filter_leaves_bad_records_out_before_they_are_read(tmp_path, cache_dir):
    rows = [*ALPACA, {"instruction": "no answer", "output": None}]
    path = jsonl(tmp_path / "nulls.jsonl", rows)
    with pytest.warns(RuntimeWarning), pytest.raises(DataFileError, match=r"line 4: 'output' is null"):
        load(path, cache_dir)
    with pytest.warns(RuntimeWarning, match="kept 3 of 4"):
        assert len(load(path, cache_dir, filter="output != null")) == 3


# ---- sources and old configs ---------------------------------------------------------------------


def test_save_to_disk_directories_load_like_files(tmp_path, cache_dir):
    import datasets

    alpaca = datasets.Dataset.from_list(ALPACA)
    alpaca.save_to_disk(str(tmp_path / "plain"))
    with pytest.warns(RuntimeWarning, match="read 3 records as alpaca"):
        assert len(load(tmp_path / "plain", cache_dir)) == 3
    assert not list((tmp_path / "plain").glob("cache-*"))  # maps cache in the workbench's cache only
    datasets.DatasetDict({"train": alpaca, "test": alpaca.select([0])}).save_to_disk(str(tmp_path / "dict"))
    with pytest.warns(RuntimeWarning) as caught:
        load(tmp_path / "dict", cache_dir)
    assert notices(caught)[0] == (
        f"data.source={str(tmp_path / 'dict')!r} is a DatasetDict (splits train, test): reading its 'train' split, 3 records"
    )
    datasets.DatasetDict({"validation": alpaca}).save_to_disk(str(tmp_path / "one"))
    with pytest.warns(RuntimeWarning, match=r"reading its only split, 'validation', 3 records"):
        load(tmp_path / "one", cache_dir)
    datasets.DatasetDict({"dev": alpaca, "test": alpaca}).save_to_disk(str(tmp_path / "two"))
    with pytest.raises(
        ValueError, match=r"DatasetDict with the splits \['dev', 'test'\] and none named 'train'"
    ):
        load(tmp_path / "two", cache_dir)
    datasets.Dataset.from_list([*ALPACA, {"instruction": "x", "output": None}]).save_to_disk(
        str(tmp_path / "bad")
    )
    with pytest.warns(RuntimeWarning), pytest.raises(DataFileError, match=r"bad record 4: 'output' is null"):
        load(tmp_path / "bad", cache_dir)


def test_old_configs_that_set_a_file_type_in_format_keep_working(tmp_path, cache_dir):
    cfg = WorkbenchConfig.from_yaml("data:\n  format: csv\n")
    assert (cfg.data.format, cfg.data.file_type) == ("auto", "csv")
    assert WorkbenchConfig().with_overrides(["data.format=parquet"]).data.file_type == "parquet"
    assert DataConfig(format="jsonl").file_type == "jsonl"
    table = tmp_path / "export.dat"  # an extension 'auto' cannot read: the old setting says csv
    table.write_text("prompt,response\nhi,hello\n")
    with pytest.warns(RuntimeWarning, match="as prompt_response"):
        assert len(load(table, cache_dir, format="csv")) == 1
    lines = tmp_path / "notes.log"  # data.format=text read any file as lines of text, and still does
    lines.write_text("first line\nsecond line\n")
    assert load(lines, cache_dir, format="text")["text"] == ["first line", "second line"]
    with pytest.raises(ConfigError, match=r"data\.format='csv' is not allowed with data\.file_type='json'"):
        WorkbenchConfig.from_dict({"data": {"format": "csv", "file_type": "json"}})
    with pytest.raises(
        ConfigError, match=r"data\.format='xml' is not allowed: expected one of 'auto', 'text'"
    ):
        WorkbenchConfig().with_overrides(["data.format=xml"])


def test_every_column_key_is_read_by_some_format():
    from workbench.config import COLUMN_KEYS
    from workbench.data.preference import PAIR_COLUMNS
    from workbench.data.prompts import PROMPT_COLUMNS

    read = {c for f in FORMATS.values() for c in (*f.required, *f.optional)}
    read |= set(PAIR_COLUMNS) | set(PROMPT_COLUMNS)
    assert read == set(COLUMN_KEYS)


# ---- training from each kind of source -----------------------------------------------------------


def _write_source(kind: str, tmp_path: Path) -> tuple[Path, list[str]]:
    import datasets

    many = [dict(r, output=f"{r['output']} ({i})") for i in range(6) for r in ALPACA]
    if kind == "alpaca":
        return jsonl(tmp_path / "alpaca.jsonl", many), []
    if kind == "sharegpt":
        path = tmp_path / "sharegpt.json"
        path.write_text(json.dumps(SHAREGPT * 9, indent=1))
        return path, []
    if kind == "csv":
        path = tmp_path / "qa.csv"
        path.write_text(
            "question,answer,score\n" + "".join(f"What is {i}?,It is {i}.,{i % 3}\n" for i in range(24))
        )
        return path, ["data.columns={prompt: question, response: answer}", "data.filter=score >= 1"]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(many)}).save_to_disk(str(tmp_path / "saved"))
    return tmp_path / "saved", []


@pytest.mark.parametrize("kind", ["alpaca", "sharegpt", "csv", "save_to_disk"])
def test_training_runs_from_each_kind_of_source(kind, tmp_path, tokenizer, monkeypatch):
    from workbench.train import Trainer

    monkeypatch.setenv(data.CACHE_ENV, str(tmp_path / "cache"))
    source, extra = _write_source(kind, tmp_path)
    cfg = (
        WorkbenchConfig()
        .with_overrides(
            {
                "model.hidden_size": 32,
                "model.intermediate_size": 64,
                "model.num_heads": 4,
                "model.num_kv_heads": 2,
                "data.source": str(source),
                "data.max_length": 64,
                "data.eval_fraction": 0,
                "bucketing.max_buckets": 2,
                "train.device_type": "cpu",
                "train.steps": 3,
                "train.batch_size": 4,
                "train.log_every": 1,
                "train.warmup_steps": 1,
                "train.progress_bar": False,
            }
        )
        .with_overrides(extra)
    )
    with pytest.warns(RuntimeWarning) as caught:
        trainer = Trainer(cfg, tokenizer=tokenizer)
    said = notices(caught)
    expected = {
        "alpaca": "read 18 records as alpaca (columns instruction, input, output)",
        "sharegpt": "read 18 records as sharegpt (column conversations)",
        "csv": "read 24 records as prompt_response (columns prompt (from 'question'), response (from 'answer'))",
        "save_to_disk": "read 18 records as alpaca (columns instruction, input, output)",
    }[kind]
    assert f"data.format='auto': {expected}" in said, said
    assert kind != "csv" or "data.filter='score >= 1': kept 16 of 24 records" in said
    labels = trainer.data.train_dataset["labels"]
    assert all(data.IGNORE_INDEX in row and any(x != data.IGNORE_INDEX for x in row) for row in labels)
    result = trainer.fit()
    assert result.steps == 3 and math.isfinite(result.final_loss)
