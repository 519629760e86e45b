"""Preference data (`workbench.data.preference`): the three record shapes, data.columns/filter/
max_examples, tokenised pairs with and without a chat template, the pair collator, loader and
warm-up shapes, the builder under train.objective=dpo, and the errors for unreadable files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.preference_data import BAD, GOOD, learnable_pairs, write_jsonl
from workbench import data
from workbench.config import DataConfig, WorkbenchConfig
from workbench.data.collate import FillerMasked, PairCollator
from workbench.data.corpus import PREFERENCE_SAMPLE
from workbench.data.file_errors import DataFileError
from workbench.data.formats import FormatError
from workbench.data.preference import is_pair_dataset, load_pairs, record_pair, tokenize_pairs

IGNORE = data.IGNORE_INDEX
USER = {"role": "user", "content": "What does len do?"}
SYSTEM = {"role": "system", "content": "Be kind."}


def says(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def _copy(tokenizer, where: Path, **changes):
    tokenizer.save_pretrained(where)
    copy = tokenizer.__class__.from_pretrained(str(where))
    for key, value in changes.items():
        setattr(copy, key, value)
    return copy


@pytest.fixture(scope="module")
def plain(tokenizer, tmp_path_factory):
    """The same tokenizer without a chat template."""
    return _copy(tokenizer, tmp_path_factory.mktemp("plain"), chat_template=None)


def pairs_of(tmp_path: Path, rows: list[dict], cache_dir: Path, **fields):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return load_pairs(DataConfig(source=str(path), **fields), cache_dir=cache_dir)


def labelled(tokenizer, ids: list[int], labels: list[int]) -> str:
    return tokenizer.decode([i for i, lab in zip(ids, labels) if lab != IGNORE])


# ---- record shapes -----------------------------------------------------------------------------------


def test_prompt_chosen_rejected_records_become_turns(tmp_path, cache_dir):
    rows = [
        {"prompt": "What does len do?", "chosen": "Counts items.", "rejected": "no", "system": "Be kind."},
        {"prompt": [USER], "chosen": [says("assistant", "Counts.")], "rejected": "whatever", "system": None},
        # whole conversations beside their prompt: the answer is what follows it
        {
            "prompt": [USER],
            "chosen": [USER, says("assistant", "A")],
            "rejected": [USER, says("assistant", "B")],
        },
    ]
    pairs = pairs_of(tmp_path, rows, cache_dir)
    assert pairs.column_names == ["prompt", "chosen", "rejected"]
    assert pairs[0] == {
        "prompt": [SYSTEM, USER],
        "chosen": [says("assistant", "Counts items.")],
        "rejected": [says("assistant", "no")],
    }
    assert pairs[1]["prompt"] == [USER] and pairs[1]["rejected"] == [says("assistant", "whatever")]
    assert pairs[2]["chosen"] == [says("assistant", "A")] and pairs[2]["rejected"] == [says("assistant", "B")]


def test_conversations_without_a_prompt_share_theirs():
    a1, a2 = says("assistant", "Counts."), says("assistant", "Fine.")
    chosen = [SYSTEM, USER, a1, says("user", "Thanks"), a2]
    rejected = [SYSTEM, USER, a1, says("user", "Thanks"), says("assistant", "go away")]
    pair = record_pair({"chosen": chosen, "rejected": rejected})
    assert pair == {"prompt": chosen[:4], "chosen": [a2], "rejected": [says("assistant", "go away")]}
    # one that is all of the other's opening keeps its last shared turn as its answer
    short = record_pair({"chosen": [USER, a1], "rejected": [USER, a1, says("user", "More?"), a2]})
    assert short["prompt"] == [USER] and short["chosen"] == [a1] and len(short["rejected"]) == 3
    with pytest.raises(ValueError, match=r"share their first 1 turn.*'chosen' starts with a 'user' turn"):
        record_pair({"chosen": [USER, says("user", "x"), a1], "rejected": [USER, says("user", "y"), a1]})


def test_scored_responses_pair_best_against_worst_per_prompt(tmp_path, cache_dir):
    rows = [
        {"prompt": "p1", "response": "good", "helpfulness": 4, "verbosity": 1},
        {"prompt": "p1", "response": "bad", "helpfulness": 1, "verbosity": 1},
        {"prompt": "p1", "response": "middling", "helpfulness": 3, "verbosity": 1},
        {"prompt": "p2", "response": "tie a", "helpfulness": 2, "verbosity": 1},
        {"prompt": "p2", "response": "tie b", "helpfulness": 2, "verbosity": 1},
        {"prompt": "p3", "response": "alone", "helpfulness": 4, "verbosity": 1},
        {"prompt": "p4", "response": "fine", "helpfulness": 3, "verbosity": 1},
        {"prompt": "p4", "response": "rambling", "helpfulness": 0, "verbosity": 4},
    ]
    with pytest.warns(RuntimeWarning) as caught:
        pairs = pairs_of(tmp_path, rows, cache_dir, pair_by="helpfulness")
    assert [str(w.message) for w in caught] == [
        "data.pair_by='helpfulness': made 2 pairs from 8 records (2 prompts without two different scores)"
    ]
    assert [p[0]["content"] for p in pairs["prompt"]] == ["p1", "p4"]
    assert [c[0]["content"] for c in pairs["chosen"]] == ["good", "fine"]
    assert [r[0]["content"] for r in pairs["rejected"]] == ["bad", "rambling"]
    # the filter runs on records before pairing; max_examples counts pairs after it
    with pytest.warns(RuntimeWarning):
        filtered = pairs_of(tmp_path, rows, cache_dir, pair_by="helpfulness", filter="verbosity <= 2")
    assert [r[0]["content"] for r in filtered["rejected"]] == ["bad"]
    with pytest.warns(RuntimeWarning):
        assert len(pairs_of(tmp_path, rows, cache_dir, pair_by="helpfulness", max_examples=1)) == 1
    with pytest.raises(DataFileError, match=r"line 2: 'helpfulness' is null"):
        pairs_of(tmp_path, [rows[0], {**rows[1], "helpfulness": None}], cache_dir, pair_by="helpfulness")
    with pytest.raises(FormatError, match=r"made no pairs"), pytest.warns(RuntimeWarning):
        pairs_of(tmp_path, rows[3:6], cache_dir, pair_by="helpfulness")


def test_columns_filter_and_max_examples(tmp_path, cache_dir):
    rows = [{"question": f"q{i}", "good": f"yes {i}.", "bad": f"no {i}", "score": i} for i in range(6)]
    columns = {"prompt": "question", "chosen": "good", "rejected": "bad"}
    pairs = pairs_of(tmp_path, rows, cache_dir, columns=columns)
    assert len(pairs) == 6 and pairs[2]["chosen"] == [says("assistant", "yes 2.")]
    with pytest.warns(RuntimeWarning, match=r"kept 3 of 6 records"):
        kept = pairs_of(tmp_path, rows, cache_dir, columns=columns, filter="score >= 3", max_examples=2)
    assert [p[0]["content"] for p in kept["prompt"]] == ["q3", "q4"]


def test_records_that_fit_no_pair_shape_say_what_a_pair_needs(tmp_path, cache_dir):
    with pytest.raises(FormatError) as caught:
        pairs_of(tmp_path, [{"question": "q", "answer": "a"}], cache_dir)
    message = str(caught.value)
    assert "the columns found ['question', 'answer'] fit no pair shape" in message
    for needs in ("prompt + chosen + rejected", "chosen + rejected as whole conversations", "data.pair_by"):
        assert needs in message
    with pytest.raises(
        FormatError, match=r"found \['q', 'chosen', 'rejected'\] fit no pair shape \(no prompt"
    ):
        pairs_of(tmp_path, [{"q": "q", "chosen": "a", "rejected": "b"}], cache_dir)
    with pytest.raises(FormatError, match=r"needs prompt, response and 'score'"):
        pairs_of(tmp_path, [{"prompt": "q", "response": "a"}], cache_dir, pair_by="score")
    with pytest.raises(FormatError, match=r"already carry chosen/rejected"):
        pairs_of(tmp_path, [{"prompt": "q", "chosen": "a", "rejected": "b"}], cache_dir, pair_by="score")
    with pytest.raises(ValueError, match=r"'chat-sample' holds no preference pairs"):
        load_pairs(DataConfig(source="chat-sample"))


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ({"prompt": "q", "chosen": None, "rejected": "b"}, "'chosen' is null or missing"),
        ({"prompt": "q", "chosen": "", "rejected": "b"}, "'chosen' is empty"),
        ({"prompt": "q", "chosen": "a", "rejected": True}, "'rejected' is bool (True), not text"),
        ({"prompt": None, "chosen": "a", "rejected": "b"}, "'prompt' is null or missing"),
    ],
    ids=["missing", "empty", "wrong-type", "no-prompt"],
)
def test_a_bad_record_is_named_by_file_and_line(tmp_path, cache_dir, bad, problem):
    rows = [{"prompt": "q", "chosen": "a", "rejected": "b"}, bad]
    path = tmp_path / "pairs.jsonl"
    with pytest.raises(DataFileError, match=re.escape(f"data.source: {path} line 2: {problem}")):
        pairs_of(tmp_path, rows, cache_dir)


def test_an_answer_must_open_with_an_assistant_turn():
    with pytest.raises(ValueError, match=r"'chosen' starts with a 'user' turn"):
        record_pair({"prompt": "q", "chosen": [says("user", "hm")], "rejected": "b"})


# ---- tokenising -------------------------------------------------------------------------------------


def test_chat_pairs_label_only_the_final_answer(tokenizer):
    import datasets

    prompt = [SYSTEM, USER, says("assistant", "It counts."), says("user", "Say it nicely.")]
    chosen, rejected = says("assistant", "Gladly: it counts items."), says("assistant", "no")
    ds = datasets.Dataset.from_list([{"prompt": prompt, "chosen": [chosen], "rejected": [rejected]}])
    row = tokenize_pairs(ds, tokenizer, DataConfig())[0]
    assert row["input_ids"] == data.chat_token_ids(tokenizer, [*prompt, chosen])
    assert row["rejected_input_ids"] == data.chat_token_ids(tokenizer, [*prompt, rejected])
    start = len(data.chat_token_ids(tokenizer, prompt, add_generation_prompt=True))
    for ids, labels in (
        (row["input_ids"], row["labels"]),
        (row["rejected_input_ids"], row["rejected_labels"]),
    ):
        assert labels[:start] == [IGNORE] * start  # the assistant turn inside the prompt too
        assert labels[start:] == ids[start:]
    assert labelled(tokenizer, row["input_ids"], row["labels"]) == "Gladly: it counts items.<|end|>\n"
    assert labelled(tokenizer, row["rejected_input_ids"], row["rejected_labels"]) == "no<|end|>\n"
    assert row["length"] == max(len(row["input_ids"]), len(row["rejected_input_ids"]))


def test_a_template_refusing_system_turns_gets_them_folded(tokenizer, tmp_path):
    import datasets

    refusing = _copy(
        tokenizer,
        tmp_path / "refusing",
        chat_template="{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
        "supported') }}{% endif %}" + data.CHAT_TEMPLATE,
    )
    records = datasets.Dataset.from_list(
        [{"system": "Be kind.", "prompt": "hi", "chosen": "Hello.", "rejected": "go"}]
    )
    row = tokenize_pairs(records, refusing, DataConfig())[0]
    assert "Be kind.\n\nhi" in refusing.decode(row["input_ids"])
    assert labelled(refusing, row["input_ids"], row["labels"]) == "Hello.<|end|>\n"


def test_plain_pairs_are_prompt_newline_answer_with_labels_on_the_answer(plain):
    import datasets

    ds = datasets.Dataset.from_list(
        [{"prompt": "pick one: mud or rose", "chosen": "rose", "rejected": "mud"}]
    )
    row = tokenize_pairs(ds, plain, DataConfig())[0]
    head = [plain.bos_token_id, *plain("pick one: mud or rose\n", add_special_tokens=False)["input_ids"]]
    rose = [*plain("rose", add_special_tokens=False)["input_ids"], plain.eos_token_id]
    mud = [*plain("mud", add_special_tokens=False)["input_ids"], plain.eos_token_id]
    assert row["input_ids"] == head + rose and row["labels"] == [IGNORE] * len(head) + rose
    assert row["rejected_input_ids"] == head + mud and row["rejected_labels"] == [IGNORE] * len(head) + mud
    assert row["length"] == len(head) + max(len(rose), len(mud))


def test_pairs_that_teach_nothing_are_counted_in_one_warning(tokenizer, plain, tmp_path):
    import datasets

    same = {"prompt": "q", "chosen": "the same.", "rejected": "the same."}
    kept = {"prompt": "q", "chosen": "yes.", "rejected": "no"}
    with pytest.warns(RuntimeWarning) as caught:
        out = tokenize_pairs(datasets.Dataset.from_list([same, kept, same]), tokenizer, DataConfig())
    assert len(out) == 1
    assert [str(w.message) for w in caught] == [
        "2 of 3 pairs were left out when tokenising: 0 with an answer that gave no token to predict, "
        "2 whose chosen and rejected answers are the same"
    ]
    bare = _copy(plain, tmp_path / "bare", bos_token=None, eos_token=None)
    # no prompt, no bos/eos: a one-token answer's only label is at position 0, never predicted
    one = {"chosen": [says("assistant", "a")], "rejected": [says("assistant", "b")]}
    with pytest.warns(
        RuntimeWarning, match=r"1 of 1 pairs were left out.*1 with an answer that gave no token"
    ):
        assert len(tokenize_pairs(datasets.Dataset.from_list([one]), bare, DataConfig())) == 0


# ---- collating, loading, warm-up shapes ---------------------------------------------------------------


def pair(n_chosen: int, n_rejected: int, base: int) -> dict[str, list[int]]:
    chosen = list(range(base, base + n_chosen))
    rejected = list(range(base + 50, base + 50 + n_rejected))
    return {
        "input_ids": chosen,
        "labels": [IGNORE, *chosen[1:]],
        "rejected_input_ids": rejected,
        "rejected_labels": [IGNORE, *rejected[1:]],
        "length": max(n_chosen, n_rejected),
    }


def test_pair_collator_interleaves_sides_and_pads_to_the_bucket():
    pairs = [pair(3, 5, 10), pair(6, 2, 20), pair(4, 4, 30)]
    batch = PairCollator(0, [4, 8, 16])(pairs)
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (6, 8),
        "attention_mask": (6, 8),
        "labels": (6, 8),
    }
    for i, p in enumerate(pairs):
        for row, side in ((2 * i, ""), (2 * i + 1, "rejected_")):
            ids = p[f"{side}input_ids"]
            assert batch["input_ids"][row, : len(ids)].tolist() == ids
            assert batch["input_ids"][row, len(ids) :].eq(0).all()
            assert batch["labels"][row].tolist() == p[f"{side}labels"] + [IGNORE] * (8 - len(ids))
            assert batch["attention_mask"][row].sum() == len(ids)
    cut = PairCollator(0, [4, 8, 16], max_length=4)(pairs)
    assert tuple(cut["input_ids"].shape) == (6, 4)
    with_ref = [
        {**p, "reference_chosen_logp": -1.0 - i, "reference_rejected_logp": -10.0 - i}
        for i, p in enumerate(pairs)
    ]
    ref = PairCollator(0, [4, 8, 16])(with_ref)["reference_logps"]
    assert ref.dtype == torch.float32 and ref.tolist() == [-1.0, -10.0, -2.0, -11.0, -3.0, -12.0]
    with pytest.raises(ValueError, match=r"1 of 2 pairs in a batch lack"):
        PairCollator(0, None)([with_ref[0], pairs[1]])


def test_fillers_of_a_pair_mask_both_rows():
    pairs = [pair(3, 5, 10), pair(6, 2, 20)]
    filled = FillerMasked(pairs)
    filler = filled[-2]
    assert filler["labels"] == [IGNORE] * 6 and filler["rejected_labels"] == [IGNORE] * 2
    assert filler["rejected_input_ids"] == pairs[1]["rejected_input_ids"]
    batch = PairCollator(0, None)([filled[0], filled[-1]])
    assert batch["labels"][2:].eq(IGNORE).all() and batch["labels"][:2].ne(IGNORE).any()
    assert is_pair_dataset(filled) and is_pair_dataset(pairs) and not is_pair_dataset([{"input_ids": [1]}])


def _pair_dataset(n: int):
    import datasets

    return datasets.Dataset.from_list([pair(3 + i % 9, 2 + (i * 5) % 13, i) for i in range(n)])


def test_loader_batches_pairs_and_shapes_count_collated_rows():
    from workbench.backend.hardware import detect
    from workbench.backend.protocol import OneProcess
    from workbench.backend.selection import backend_for
    from workbench.train.stream import TrainingData

    cfg = WorkbenchConfig().with_overrides(
        ["train.objective=dpo", "train.dpo_reference=copy", "train.batch_size=4", "bucketing.max_buckets=2"]
    )
    train, held = _pair_dataset(40), _pair_dataset(7)
    assert is_pair_dataset(train)
    backend = backend_for(detect("cpu"))
    stream = TrainingData(
        cfg, train, held, pad_token_id=0, dp_size=1, backend=backend, replicas=OneProcess(backend)
    )
    shapes = stream.shapes(4, train)
    assert shapes and all(rows == 8 for rows, _ in shapes)
    loader, _ = stream.loader(train, 4)
    seen = {tuple(b["input_ids"].shape) for b in loader}
    assert seen <= set(shapes)  # warm-up compiles exactly what the loop meets
    eval_loader, _ = stream.loader(held, 4)
    eval_batches = list(eval_loader)
    assert {tuple(b["input_ids"].shape) for b in eval_batches} <= set(stream.shapes(4, held))
    real = sum(int(b["labels"][0::2].ne(IGNORE).any(dim=1).sum()) for b in eval_batches)
    assert real == 7  # fill_last: every pair once, the fillers masked on both rows
    plain = data.make_loader(
        train.remove_columns(["rejected_input_ids", "rejected_labels"]), cfg, pad_token_id=0
    )
    assert next(iter(plain[0]))["input_ids"].shape[0] == 4  # SFT data: a row per example, as before


def test_synthetic_batches_copy_a_pair_template_with_reference_logps():
    with_ref = [
        {**p, "reference_chosen_logp": -1.0, "reference_rejected_logp": -2.0}
        for p in (pair(3, 5, 1), pair(4, 2, 9))
    ]
    template = PairCollator(0, [8])(with_ref)
    fake = data.synthetic_batch((8, 16), vocab_size=50, template=template)
    assert {k: (tuple(v.shape), v.dtype) for k, v in fake.items()} == {
        "input_ids": ((8, 16), torch.long),
        "attention_mask": ((8, 16), torch.long),
        "labels": ((8, 16), torch.long),
        "reference_logps": ((8,), torch.float32),
    }


# ---- the builder, the shipped sample, the synthetic generator -----------------------------------------


def test_build_datasets_gives_pairs_under_dpo(tokenizer, cache_dir, tmp_path):
    cfg = WorkbenchConfig().with_overrides(
        [
            "train.objective=dpo",
            "train.dpo_reference=copy",
            "data.source=preference-sample",
            "data.eval_fraction=0.1",
        ]
    )
    train, held, _ = data.build_datasets(cfg, tokenizer, cache_dir=cache_dir)
    assert len(train) + len(held) == 120 and len(held) == 12
    assert set(train.column_names) == {
        "input_ids",
        "labels",
        "rejected_input_ids",
        "rejected_labels",
        "length",
    }
    path = write_jsonl(learnable_pairs(30), tmp_path / "learnable.jsonl")
    file_cfg = cfg.with_overrides([f"data.source={path}", "data.eval_fraction=0"])
    from_file, none, _ = data.build_datasets(file_cfg, tokenizer, cache_dir=cache_dir)
    assert len(from_file) == 30 and none is None
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"prompt": "q", "chosen": "a", "rejected": "b"}\n{"prompt": "q", "chosen": {"x": 1}, "rejected": "b"}\n'
    )
    with pytest.raises(DataFileError, match=re.escape(f"{bad} line 2: 'chosen' is dict")):
        data.build_datasets(cfg.with_overrides([f"data.source={bad}"]), tokenizer, cache_dir=cache_dir)


def test_the_preference_sample_ships_with_a_consistent_style():
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    assert any(
        Path("assets/preference_sample.jsonl").match(p)
        for p in pyproject["tool"]["setuptools"]["package-data"]["workbench.data"]
    )
    rows = [json.loads(line) for line in PREFERENCE_SAMPLE.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 120 and sum("system" in r for r in rows) == 30
    assert all(r["chosen"].endswith(".") and not r["rejected"].endswith(".") for r in rows)
    assert len({r["prompt"] for r in rows}) == 120


def test_learnable_pairs_follow_one_rule_with_held_out_prompts():
    train, held = learnable_pairs(200, seed=1), learnable_pairs(50, held_out=True)
    assert all(r["chosen"] in GOOD and r["rejected"] in BAD for r in train + held)
    assert all(r["chosen"] in r["prompt"] and r["rejected"] in r["prompt"] for r in train + held)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert {r["chosen"] for r in held} == set(GOOD) and learnable_pairs(5, seed=1) == train[:5]
