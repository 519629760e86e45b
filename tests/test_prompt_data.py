"""GRPO's prompt data (`workbench.data.prompts`, `workbench.data.math_sample`): GSM8K files, prompt +
answer, chat prompts, data.columns, prompts left out by length, a bad line named, the shipped
math-sample under both objectives, and ``eval --rewards`` on a real (tiny) model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from workbench.config import DataConfig, WorkbenchConfig
from workbench.data.file_errors import DataFileError
from workbench.data.formats import FormatError
from workbench.data.math_sample import math_sample_records
from workbench.data.prompts import load_prompts, tokenize_prompts
from workbench.data.records import build_datasets, load_records
from workbench.rl.rewards import math_answer

GSM8K = [
    {
        "question": "Natalia sold clips to 48 friends in April and half as many in May. How many in all?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 48+24 = <<48+24=72>>72.\n#### 72",
    },
    {"question": "Weng earns $12 an hour. How much for 100 hours?", "answer": "12 * 100 = 1,200\n#### 1,200"},
    {"question": "A price falls from 5 to 8.5. By how much?", "answer": "5 - 8.5 = -3.5\n#### -3.50"},
]
CHAT = [{"role": "system", "content": "Answer with #### N."}, {"role": "user", "content": "What is 2 + 2?"}]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def grpo_cfg(source: Path | str, *extra: str) -> WorkbenchConfig:
    return WorkbenchConfig().with_overrides(
        ["train.objective=grpo", "grpo.max_completion_length=32", f"data.source={source}", *extra]
    )


# ---- record shapes -------------------------------------------------------------------------------


def test_gsm8k_records_become_prompts_with_their_parsed_answers(tmp_path, cache_dir, tokenizer):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K)
    records = load_prompts(DataConfig(source=str(path)), cache_dir=cache_dir)
    assert records["answer"] == ["72", "1200", "-3.5"]
    assert records["solution"] == [r["answer"] for r in GSM8K]
    assert records["prompt"] == [r["question"] for r in GSM8K]
    train, held_out, _ = build_datasets(grpo_cfg(path, "data.eval_fraction=0"), tokenizer, cache_dir)
    assert held_out is None and len(train) == 3
    first = next(r for r in train if r["answer"] == "72")
    # a text prompt is tokenised as TRL and `generate` tokenise one: the tokenizer's ids of its text
    assert first["input_ids"] == tokenizer(GSM8K[0]["question"])["input_ids"]
    assert first["length"] == len(first["input_ids"])
    assert train.column_names[:2] == ["input_ids", "length"]


def test_prompt_and_answer_records_keep_their_other_columns(tmp_path, cache_dir, tokenizer):
    rows = [
        {"prompt": "2 + 2 =", "answer": 4, "level": 1},
        {"prompt": "Pay $1,000 and $234:", "answer": "$1,234", "level": 2},
        {"prompt": "No reference here", "answer": None, "level": 3},
    ]
    records = load_prompts(
        DataConfig(source=str(write_jsonl(tmp_path / "p.jsonl", rows))), cache_dir=cache_dir
    )
    assert records["answer"] == ["4", "1234", None] and records["level"] == [1, 2, 3]
    assert math_answer(records["prompt"], ["#### 4", "#### 1234", "#### 1"], answer=records["answer"]) == [
        1.0,
        1.0,
        None,
    ]


def test_chat_prompts_go_through_the_chat_template_with_the_generation_prompt(tmp_path, cache_dir, tokenizer):
    rows = [{"prompt": CHAT, "answer": "4"}, {"messages": CHAT, "answer": "4"}]
    for row in rows:
        path = write_jsonl(tmp_path / "chat.jsonl", [row])
        out = tokenize_prompts(load_prompts(DataConfig(source=str(path)), cache_dir), tokenizer, DataConfig())
        expected = tokenizer.apply_chat_template(
            CHAT, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert out[0]["input_ids"] == list(expected) and out[0]["prompt"] == CHAT
        assert tokenizer.decode(out[0]["input_ids"]).endswith("<|assistant|>\n")
    # a plain prompt under data.chat=true is one user turn (a system column opening it)
    path = write_jsonl(
        tmp_path / "plain.jsonl", [{"prompt": "What is 2 + 2?", "system": "Answer with #### N."}]
    )
    out = tokenize_prompts(
        load_prompts(DataConfig(source=str(path)), cache_dir), tokenizer, DataConfig(chat=True)
    )
    assert out[0]["prompt"] == CHAT and out[0]["input_ids"] == list(expected)


def test_data_columns_map_other_names_onto_prompt_and_answer(tmp_path, cache_dir):
    rows = [{"problem": "Solve x + 1 = 3.", "solution": "x = 2, so \\boxed{2}"}]
    path = write_jsonl(tmp_path / "math.jsonl", rows)
    cfg = DataConfig(source=str(path), columns={"prompt": "problem", "answer": "solution"})
    records = load_prompts(cfg, cache_dir)
    assert records[0] == {"prompt": "Solve x + 1 = 3.", "answer": "2", "solution": "x = 2, so \\boxed{2}"}
    with pytest.raises(
        FormatError, match=r"train\.objective=grpo needs prompts; the columns found \['problem'"
    ):
        load_prompts(DataConfig(source=str(path)), cache_dir)


def test_prompts_longer_than_max_length_are_left_out_with_one_notice(tmp_path, cache_dir, tokenizer):
    rows = [{"prompt": "short", "answer": "1"}, {"prompt": "long " * 40, "answer": "2"}]
    records = load_prompts(DataConfig(source=str(write_jsonl(tmp_path / "p.jsonl", rows))), cache_dir)
    with pytest.warns(RuntimeWarning, match=r"1 of 2 prompts were left out: longer than data.max_length=16"):
        out = tokenize_prompts(records, tokenizer, DataConfig(max_length=16))
    assert out["answer"] == ["1"]


def test_a_bad_record_is_named_by_file_and_line(tmp_path, cache_dir, tokenizer):
    rows = [
        {"prompt": CHAT, "answer": "4"},
        {"prompt": [*CHAT, {"role": "assistant", "content": "4"}], "answer": "4"},
    ]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(
        DataFileError, match=re.escape(f"{path} line 2: 'prompt' ends with an assistant turn")
    ):
        load_prompts(DataConfig(source=str(path)), cache_dir)
    path = write_jsonl(
        tmp_path / "empty.jsonl", [{"question": "fine", "answer": "1"}, {"question": " ", "answer": "2"}]
    )
    with pytest.raises(DataFileError, match=re.escape(f"{path} line 2: 'question' is empty")):
        build_datasets(grpo_cfg(path), tokenizer, cache_dir)
    plain = tokenizer.__class__.from_pretrained(str(_saved(tokenizer, tmp_path / "tok")))
    plain.chat_template = None
    chat = load_prompts(DataConfig(source=str(write_jsonl(tmp_path / "c.jsonl", rows[:1]))), cache_dir)
    with pytest.raises(
        ValueError, match=r"chat prompts \(lists of turns\), which need a tokenizer with a chat"
    ):
        tokenize_prompts(chat, plain, DataConfig())


def _saved(tokenizer, where: Path) -> Path:
    tokenizer.save_pretrained(where)
    return where


# ---- the shipped math sample -------------------------------------------------------------------------


def test_math_sample_is_deterministic_short_and_parseable(cache_dir, tokenizer):
    records = math_sample_records()
    assert records == math_sample_records() and records != math_sample_records(seed=1)
    assert len(records) == 400 and len({r["question"] for r in records}) == 400
    train, held_out, _ = build_datasets(grpo_cfg("math-sample"), tokenizer, cache_dir)
    assert len(train) + len(held_out) == 400 and len(held_out) == 20
    assert max(train["length"]) <= 48  # a chat prompt: the template's tokens included
    for row in [*train.select(range(50)), *held_out]:
        a, op, b, _, result = row["solution"].split("\n")[0].split()
        assert int(row["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b)) == int(result)
        assert 1 <= int(row["answer"]) <= 18 and f"{a} " in row["prompt"][0]["content"]
        assert math_answer([row["prompt"]], [row["solution"]], answer=[row["answer"]]) == [1.0]
    # under SFT the same problems are chat records: the fine-tune that teaches the format
    sft = load_records(DataConfig(source="math-sample"))
    assert sft[0]["messages"] == [
        {"role": "user", "content": records[0]["question"]},
        {"role": "assistant", "content": records[0]["answer"]},
    ]


# ---- eval --rewards ----------------------------------------------------------------------------------

EXPECTED: dict[str, str] = {}
"""Prompt -> the completion transformers' own greedy `model.generate` gives (filled by the test)."""


def same_as_transformers(prompts, completions, **columns):
    """1.0 where the eval's completion is transformers' greedy one for the same prompt."""
    return [1.0 if EXPECTED[p] == c else 0.0 for p, c in zip(prompts, completions)]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tokenizer) -> Path:
    from workbench.models.build import build_model

    path = tmp_path_factory.mktemp("models") / "tiny"
    cfg = WorkbenchConfig().with_overrides(
        ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.num_kv_heads=1"]
    )
    build_model(cfg.model, vocab_size=len(tokenizer), seed=3).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_eval_rewards_scores_greedy_completions_of_every_prompt(tiny_model, tokenizer, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from workbench.__main__ import main

    rows = [*GSM8K, {"question": "No answer to this one.", "answer": None}]
    path = write_jsonl(tmp_path / "held_out.jsonl", rows)
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    for row in rows:
        ids = torch.tensor([tokenizer(row["question"])["input_ids"]])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
        EXPECTED[row["question"]] = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    rewards = "math_answer,format,tests.test_prompt_data:same_as_transformers"
    argv = ["eval", "--model", str(tiny_model), "--data", str(path), "--rewards", rewards]
    assert main([*argv, "--max-new-tokens", "6", "--json", "train.device_type=cpu"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["prompts"] == 4 and report["max_new_tokens"] == 6
    assert report["rewards"]["same_as_transformers"] == 1.0  # every completion is transformers' greedy one
    # a random model writes no '#### N': nothing right, and the record without an answer is not counted
    assert report["rewards"]["math_answer"] == 0.0 and report["accuracy"] == 0.0 and report["answered"] == 3
    assert report["reward_mean"] == pytest.approx(1.0) and 0 < report["completion_length"] <= 6
    assert main([*argv[:-1], "math_anser", "train.device_type=cpu"]) == 2
    assert "error: --rewards: 'math_anser' is not a reward function (did you mean 'math_answer'?)" in (
        capsys.readouterr().err
    )
