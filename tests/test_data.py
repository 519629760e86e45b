"""The embedded corpus, the local tokenizer, record loading, chat rendering and the dataset builder."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from workbench import data
from workbench.config import DataConfig, WorkbenchConfig

# ---- the embedded corpus ---------------------------------------------------------------------


def test_embedded_corpus_is_real_deterministic_text():
    corpus = data.embedded_corpus()
    assert corpus == data.embedded_corpus()
    assert len(corpus) > 1000 and sum(map(len, corpus)) > 500_000
    assert len(set(corpus)) == len(corpus)
    assert all(40 <= len(doc) <= 500 for doc in corpus)
    joined = "\n".join(corpus)
    assert "Assert statements are a convenient way" in joined  # pydoc_data.topics
    assert "Serialize ``obj`` to a JSON formatted ``str``" in joined  # json.dumps' docstring
    assert len(data.embedded_corpus(max_chars=2000)) < len(corpus)
    with pytest.raises(ValueError, match="max_chars=10"):
        data.embedded_corpus(max_chars=10)


def test_embedded_corpus_is_the_shipped_file_the_same_on_every_python(tmp_path):
    from workbench.data import corpus as corpus_module

    # what every Python reads (a hash, not this Python's docstrings), small enough to ship
    joined = "\0".join(data.embedded_corpus()).encode("utf-8")
    assert hashlib.sha256(joined).hexdigest() == corpus_module.EMBEDDED_CORPUS_SHA256
    assert corpus_module.EMBEDDED_CORPUS.stat().st_size < 1_000_000
    # the generator writes the same bytes for the same texts (no name or time in the gzip header)
    again = tmp_path / "again.jsonl.gz"
    count = corpus_module.generate_embedded_corpus(again)
    assert count > 2500 and again.read_bytes()[:10] == corpus_module.EMBEDDED_CORPUS.read_bytes()[:10]
    with gzip.open(again, "rt", encoding="utf-8") as handle:
        first = json.loads(handle.readline())
    assert first == corpus_module._shipped_sources()[0]  # pydoc's first topic, the same on 3.11-3.13


# ---- the tokenizer ---------------------------------------------------------------------------


def test_tokenizer_is_trained_cached_and_complete(tokenizer, cache_dir):
    from transformers import PreTrainedTokenizerFast

    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert len(tokenizer) == 512
    for token in (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token):
        assert token is not None
    assert len({tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}) == 3
    text = "def f(x):\n    return sorted(x, key=len)  # ünïcode"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    saved = list((cache_dir / "tokenizers").glob("*/tokenizer.json"))
    assert len(saved) == 1
    again = data.get_tokenizer(DataConfig(), cache_dir=cache_dir)  # loaded from disk
    assert again.get_vocab() == tokenizer.get_vocab()
    assert again.chat_template == data.CHAT_TEMPLATE
    assert len(list((cache_dir / "tokenizers").iterdir())) == 1  # nothing trained twice, no leftovers


def test_the_cached_tokenizer_loads_whichever_transformers_wrote_it(tokenizer, cache_dir, tmp_path):
    """The cache is shared by every transformers the user runs, and a tokenizer_config.json written
    by transformers 5 ("TokenizersBackend", a list of extra special tokens) fails to load under
    4.x: the entry loads from tokenizer.json and the workbench's own settings instead."""
    import shutil

    (entry,) = (cache_dir / "tokenizers").iterdir()
    copy = tmp_path / "tokenizers" / entry.name
    shutil.copytree(entry, copy)
    written_by_5 = {
        "backend": "tokenizers",
        "bos_token": "<|bos|>",
        "eos_token": "<|end|>",
        "pad_token": "<|pad|>",
        "extra_special_tokens": ["<|system|>", "<|user|>", "<|assistant|>"],
        "model_max_length": 1000000,
        "tokenizer_class": "TokenizersBackend",
    }
    (copy / "tokenizer_config.json").write_text(json.dumps(written_by_5))
    loaded = data.get_tokenizer(DataConfig(), cache_dir=tmp_path)
    assert loaded.get_vocab() == tokenizer.get_vocab()
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    assert loaded.all_special_tokens == tokenizer.all_special_tokens
    assert loaded.chat_template == data.CHAT_TEMPLATE


def test_chat_token_ids_are_a_plain_list_under_every_transformers(tokenizer):
    """transformers 5's apply_chat_template(tokenize=True) returns a BatchEncoding (4.x: a list)."""
    messages = [{"role": "user", "content": "What does len do?"}, {"role": "assistant", "content": "Counts."}]
    ids = data.chat_token_ids(tokenizer, messages)
    assert type(ids) is list and all(type(i) is int for i in ids)
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    prompt = data.chat_token_ids(tokenizer, messages[:1], add_generation_prompt=True)
    assert tokenizer.decode(prompt).endswith("<|assistant|>\n") and ids[: len(prompt)] == prompt


def test_tokenizer_training_is_deterministic(tokenizer):
    retrained = data.train_tokenizer(data.embedded_corpus(), 512)
    assert retrained.get_vocab() == tokenizer.get_vocab()
    assert retrained.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(data.CACHE_ENV, str(tmp_path / "elsewhere"))
    assert data.cache_root() == tmp_path / "elsewhere"
    assert data.cache_root(tmp_path / "given") == tmp_path / "given"
    monkeypatch.delenv(data.CACHE_ENV)
    assert data.cache_root() == Path.home() / ".cache" / "xla-workbench"


def test_a_users_tokenizer_directory_loads_with_autotokenizer(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path / "mine")
    loaded = data.get_tokenizer(DataConfig(tokenizer_path=str(tmp_path / "mine")))
    assert loaded.get_vocab() == tokenizer.get_vocab()
    with pytest.raises(FileNotFoundError, match=r"data\.tokenizer_path="):
        data.get_tokenizer(DataConfig(tokenizer_path=str(tmp_path / "missing")))


# ---- records ---------------------------------------------------------------------------------


def test_chat_sample_ships_real_records():
    lines = data.CHAT_SAMPLE.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert 200 <= len(records) <= 400
    forms = {("messages" in r, "prompt" in r) for r in records}
    assert forms == {(True, False), (False, True)}
    ds = data.load_records(DataConfig(source="chat-sample"))
    assert ds.column_names == ["messages"] and len(ds) == len(records)
    roles = {m["role"] for row in ds["messages"] for m in row}
    assert roles == {"system", "user", "assistant"}


def test_load_local_files_in_every_format(tmp_path, cache_dir):
    rows = [{"text": f"line number {i} of a small local file"} for i in range(6)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "b.csv").write_text("text\n" + "\n".join(r["text"] for r in rows))
    (tmp_path / "c.txt").write_text("\n".join(r["text"] for r in rows))
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    for name in ("a.jsonl", "b.csv", "c.txt", "d.parquet"):
        with pytest.warns(RuntimeWarning, match=r"read 6 records as text \(column text\)"):
            ds = data.load_records(DataConfig(source=str(tmp_path / name)), cache_dir=cache_dir)
        assert ds["text"] == [r["text"] for r in rows], name
    with pytest.warns(RuntimeWarning, match="read 6 records"):  # counted before the cap
        capped = data.load_records(
            DataConfig(source=str(tmp_path / "a.jsonl"), max_examples=2), cache_dir=cache_dir
        )
    assert len(capped) == 2
    with pytest.raises(FileNotFoundError, match=r"data\.source="):
        data.load_records(DataConfig(source=str(tmp_path / "nope.jsonl")))
    with pytest.raises(ValueError, match="cannot tell the file type"):
        data.load_records(DataConfig(source=str(tmp_path)))  # mixed formats in one directory


# ---- tokenising ------------------------------------------------------------------------------


def test_text_records_get_bos_eos_and_full_labels(tokenizer):
    import datasets

    ds = datasets.Dataset.from_dict({"body": ["Return the sum of a and b.", ""]})
    cfg = DataConfig(text_field="body")
    with pytest.warns(RuntimeWarning, match="1 of 2 records were left out"):
        out = data.tokenize_records(ds, tokenizer, cfg)
    assert len(out) == 1  # the empty text gives no usable example
    row = out[0]
    assert row["input_ids"][0] == tokenizer.bos_token_id and row["input_ids"][-1] == tokenizer.eos_token_id
    assert row["labels"] == row["input_ids"] and row["length"] == len(row["input_ids"])
    with pytest.raises(ValueError, match=r"found no format: .*text needs the data\.text_field column 'text'"):
        data.tokenize_records(ds, tokenizer, DataConfig())
    with pytest.raises(ValueError, match=r"data\.text_field='text', which is not a column"):
        data.tokenize_records(ds, tokenizer, DataConfig(format="text"))


def test_chat_labels_cover_only_assistant_turns(tokenizer):
    import datasets

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What does len do?"},
        {"role": "assistant", "content": "Return the number of items in a container."},
        {"role": "user", "content": "And its signature?"},
        {"role": "assistant", "content": "len(obj, /)"},
    ]
    ds = datasets.Dataset.from_list(
        [{"messages": messages}, {"messages": [{"role": "user", "content": "hi"}]}]
    )
    with pytest.warns(RuntimeWarning, match="1 of 2 records were left out.*no assistant token"):
        out = data.tokenize_records(ds, tokenizer, DataConfig(chat=True))
    assert len(out) == 1  # a conversation without an answer teaches nothing
    row = out[0]
    assert row["input_ids"] == data.chat_token_ids(tokenizer, messages)
    labelled = [t for t, lab in zip(row["input_ids"], row["labels"]) if lab != data.IGNORE_INDEX]
    text = tokenizer.decode(labelled)
    assert "Return the number of items in a container.<|end|>" in text and "len(obj, /)<|end|>" in text
    assert "What does len do" not in text and "Be brief" not in text and "<|assistant|>" not in text
    pr = datasets.Dataset.from_list([{"prompt": "What does abs do?", "response": "Absolute value."}])
    pr_row = data.tokenize_records(pr, tokenizer, DataConfig())[0]
    answer = [t for t, lab in zip(pr_row["input_ids"], pr_row["labels"]) if lab != data.IGNORE_INDEX]
    assert tokenizer.decode(answer).startswith("Absolute value.")


def _copy_of(tokenizer, where: Path):
    tokenizer.save_pretrained(where)
    return tokenizer.__class__.from_pretrained(str(where))


def test_left_out_records_are_counted_in_one_warning(tokenizer, tmp_path):
    import warnings

    import datasets

    texts = ["A real sentence to learn from.", "", None, "Another one.", ""]
    with pytest.warns(RuntimeWarning) as caught:
        out = data.tokenize_records(datasets.Dataset.from_dict({"text": texts}), tokenizer, DataConfig())
    assert len(out) == 2
    assert [str(w.message) for w in caught if "left out" in str(w.message)] == [
        "3 of 5 records were left out when tokenising: their data.text_field='text' was empty or "
        "not a string, or gave fewer than 2 tokens (nothing to predict)"
    ]
    bare = _copy_of(tokenizer, tmp_path / "bare")
    bare.bos_token = bare.eos_token = None  # without bos/eos a one-token text predicts nothing
    one_token = datasets.Dataset.from_dict({"text": ["a", "a b c d"]})
    with pytest.warns(RuntimeWarning, match="1 of 2 records were left out"):
        assert len(data.tokenize_records(one_token, bare, DataConfig())) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left out, nothing said
        data.tokenize_records(datasets.Dataset.from_dict({"text": ["Kept."]}), tokenizer, DataConfig())


def test_chat_errors_say_what_made_the_records_chat(tokenizer, tmp_path):
    import datasets

    plain = _copy_of(tokenizer, tmp_path / "plain")
    plain.chat_template = None
    pairs = datasets.Dataset.from_list([{"prompt": "What does abs do?", "response": "Absolute value."}])
    with pytest.raises(ValueError, match=r"chat records \(from the 'prompt' and 'response' columns"):
        data.tokenize_records(pairs, plain, DataConfig())
    messages = datasets.Dataset.from_list([{"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(ValueError, match=r"from the 'messages' column of the records"):
        data.tokenize_records(messages, plain, DataConfig())
    with pytest.raises(ValueError, match=r"from data\.chat=True"):
        data.tokenize_records(messages, plain, DataConfig(chat=True))
    body = datasets.Dataset.from_dict({"body": ["x"]})
    with pytest.raises(ValueError, match=r"data\.chat=True needs chat records: .*found \['body'\]"):
        data.tokenize_records(body, tokenizer, DataConfig(chat=True))


def test_chat_sample_tokenises_with_masked_prompts(tokenizer):
    cfg = DataConfig(source="chat-sample")
    out = data.tokenize_records(data.load_records(cfg), tokenizer, cfg)
    assert len(out) >= 200
    for row in out.select(range(20)):
        masked = sum(lab == data.IGNORE_INDEX for lab in row["labels"])
        assert 0 < masked < row["length"]


# ---- hosts and the builder --------------------------------------------------------------------


def test_build_datasets_gives_every_host_an_equal_share(tokenizer, cache_dir, monkeypatch):
    from workbench.backend.xla import runtime
    from workbench.data import records

    # The process facts come from the runtime only once it runs: building data never starts it.
    monkeypatch.setattr(runtime, "runtime_started", lambda: False)
    assert records._host_share() == (1, 0)
    monkeypatch.setattr(runtime, "runtime_started", lambda: True)
    monkeypatch.setattr(runtime, "xla_process_count", lambda: 4)
    monkeypatch.setattr(runtime, "xla_process_index", lambda: 2)
    assert records._host_share() == (4, 2)

    cfg = WorkbenchConfig().with_overrides(["data.max_examples=103", "data.eval_fraction=0"])
    monkeypatch.setattr(records, "_host_share", lambda: (1, 0))
    whole = data.build_datasets(cfg, tokenizer, cache_dir=cache_dir)[0]
    shares = []
    for index in range(4):
        monkeypatch.setattr(records, "_host_share", lambda index=index: (4, index))
        shares.append(data.build_datasets(cfg, tokenizer, cache_dir=cache_dir)[0])
    share = len(whole) // 4
    assert [len(s) for s in shares] == [share] * 4  # equal: no host runs an extra step
    # contiguous and disjoint, in the seeded order; the remainder (< 4 examples) is left out
    assert [ids for s in shares for ids in s["input_ids"]] == whole["input_ids"][: 4 * share]


def test_build_datasets_end_to_end(tokenizer, cache_dir):
    cfg = WorkbenchConfig().with_overrides(["data.max_examples=300", "data.eval_fraction=0.1"])
    train, evaluation, tok = data.build_datasets(cfg, tokenizer, cache_dir=cache_dir)
    assert tok is tokenizer
    assert len(train) + len(evaluation) == 300 and len(evaluation) == 30
    assert set(train.column_names) == {"input_ids", "labels", "length"}
    again, _, _ = data.build_datasets(cfg, tokenizer, cache_dir=cache_dir)
    assert again["length"] == train["length"]  # the split is seeded
    none_cfg = cfg.with_overrides(["data.eval_fraction=0"])
    assert data.build_datasets(none_cfg, tokenizer)[1] is None


def test_assets_ship_with_the_package():
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["workbench.data"]
    assert any(Path("assets/chat_sample.jsonl").match(p) for p in patterns)
    assert data.CHAT_SAMPLE.is_file() and data.CHAT_SAMPLE.parent.name == "assets"
