"""GRPO's cases of the bad-input sweep (issue 42, item 12), through the command line, beside
``tests/test_bad_inputs.py``: each exits with the code the CLI promises (2: could not start, 1: failed
after starting) and one ``error:`` line, no traceback, naming what the user typed.

Most cases call the CLI's own entry, ``workbench.__main__.main(argv)``, in this process (the same
parsing, exit codes and stderr; stderr captured by pytest): a GRPO run's first step then costs about
a second instead of a new interpreter's imports. Two go through a real ``python -m workbench``
process: the shortest GRPO command on the defaults, and a reward function that raises (the line a
process prints, with no traceback). The reward functions are this module's, named as a user names
theirs: ``tests.test_grpo_bad_inputs:FUNCTION``.
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import pytest
import torch

from tests.test_bad_inputs import error_lines, one_error, run_cli

HERE = "tests.test_grpo_bad_inputs"
TINY_GRPO = [  # a one-layer llama on 32 math-sample prompts, 2 x 2 completions of 4 tokens
    "train",
    "train.objective=grpo",
    "data.source=math-sample",
    "train.device_type=cpu",
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "data.tokenizer_vocab_size=256",
    "data.max_examples=32",
    "data.eval_fraction=0.25",
    "bucketing.max_buckets=1",
    "train.batch_size=2",
    "train.steps=2",
    "train.log_every=1",
    "train.progress_bar=false",
    "grpo.num_generations=2",
    "grpo.max_completion_length=4",
]


# ---- reward functions, as a user writes them --------------------------------------------------------


def scores_none(prompts, completions, **columns):
    return [None] * len(completions)


def scores_nan(prompts, completions, **columns):
    return [math.nan] * len(completions)


def _table_lookup(text):
    weights = {}
    return weights[text]  # the user's own line that raises


def raises_in_a_helper(prompts, completions, **columns):
    return [_table_lookup(c[-1]["content"]) for c in completions]  # chat completions: a list of turns


def returns_text(prompts, completions, **columns):
    return "1.0"


def returns_nothing(prompts, completions, **columns):
    rewards = [1.0 for _ in completions]  # noqa: F841 (forgot to return them)


def tensor_rewards(prompts, completions, **columns):
    return torch.tensor([float(len(c) % 2) for c in completions])


def tensor_scalars(prompts, completions, **columns):
    return [torch.tensor(1.0) for _ in completions]


def run_main(capsys, *argv: str | Path) -> tuple[int, str, str]:
    """``python -m workbench <argv>`` through the CLI's entry in this process: (exit code, stdout, stderr)."""
    from workbench.__main__ import main

    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def notices(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("notice:")]


# ---- the defaults, the config ----------------------------------------------------------------------


def test_the_shortest_grpo_command_trains_on_the_defaults_and_names_its_traps():
    # `python -m workbench train train.objective=grpo data.source=math-sample`, one step of its 30
    code, out, err = run_cli(
        "train",
        "train.objective=grpo",
        "data.source=math-sample",
        "train.steps=1",
        "train.progress_bar=false",
    )
    assert code == 0 and "trained 1/1 steps" in out, (code, out[-2000:], err[-3000:])
    assert not error_lines(err) and "Traceback" not in err
    # a random model's completions all run to the budget and all score 0: both traps are named
    said = "\n".join(notices(err))
    assert "of the interval's completions were cut at grpo.max_completion_length=256 tokens" in said, said
    assert "of the interval's groups scored every completion alike" in said, said


def test_a_sum_that_does_not_fit_names_every_value_in_it(capsys):
    code, _, err = run_main(capsys, "train", "train.objective=grpo", "grpo.max_completion_length=512")
    line = one_error(code, err)
    assert (
        "grpo.max_completion_length=512 + data.max_length=256 (the longest prompt) = 768 > "
        "model.max_position_embeddings=512" in line
    ), line


def test_a_bad_reward_name_is_refused_with_the_config_before_data_and_model_load(capsys, tmp_path):
    missing = tmp_path / "no-such-prompts.jsonl"  # loading the data would fail first, naming it
    for key, spec in (
        ("grpo.reward_funcs", "math_anser"),
        ("grpo.eval_reward_funcs", f"{HERE}:tensor_reward"),
    ):
        code, out, err = run_main(
            capsys, "train", "train.objective=grpo", f"data.source={missing}", f"{key}={spec}"
        )
        line = one_error(code, err)
        assert f"{key}: " in line and spec in line and "no-such-prompts" not in line, line
        assert "did you mean" in line and out.startswith("") and "train:" not in out, (line, out)


def test_from_python_a_reward_that_cannot_be_imported_stops_the_trainer_before_data_and_model_load(
    tmp_path, monkeypatch
):
    import workbench.train.trainer as trainer_module
    from workbench.config import ConfigError, load_config
    from workbench.train import Trainer

    def never(*args, **kwargs):
        raise AssertionError("the data loaded before the reward functions were checked")

    monkeypatch.setattr(trainer_module, "build_datasets", never)
    base = ["train.objective=grpo", "train.device_type=cpu", f"data.source={tmp_path / 'prompts.jsonl'}"]
    for overrides, rewards, spec in (
        ([f"grpo.reward_funcs={HERE}:tensor_reward"], (), f"{HERE}:tensor_reward"),
        ([f"grpo.eval_reward_funcs={HERE}:tensor_reward"], [scores_none], f"{HERE}:tensor_reward"),
        ([], ["no_such_module_here:score"], "no_such_module_here"),
    ):
        with pytest.raises(ConfigError, match=r"did you mean|cannot be imported") as raised:
            Trainer(load_config(None, base + overrides), rewards=rewards)
        assert spec in str(raised.value), raised.value


# ---- rewards at run time ---------------------------------------------------------------------------


def test_rewards_that_score_nothing_say_na_each_interval_and_stop_the_run(capsys, tmp_path):
    out_file = tmp_path / "metrics.json"
    code, out, err = run_main(
        capsys,
        *TINY_GRPO,
        f"grpo.reward_funcs={HERE}:scores_none,{HERE}:scores_nan",
        "--metrics-out",
        out_file,
    )
    line = one_error(code, err, expected_code=1)
    assert (
        "step 1: no completion of the interval was scored: every reward function (scores_none, scores_nan)"
        in line
    )
    said = notices(err)
    assert any("'scores_none' scored none of the interval's completions" in n and "n/a" in n for n in said), (
        said
    )
    assert any("'scores_nan' scored none" in n for n in said), said
    report = json.loads(out_file.read_text())  # the interval that stopped it is in the history, as n/a
    assert report["status"] == "failed" and report["history"][-1]["reward_mean"] is None
    assert report["history"][-1]["rewards"] == {"scores_none": None, "scores_nan": None}
    assert "rewards     mean 0.000" not in out


def test_a_raising_reward_function_is_one_line_with_the_users_own_file_and_line():
    line_no = inspect.getsourcelines(_table_lookup)[1] + 2
    code, _, err = run_cli(*TINY_GRPO, f"grpo.reward_funcs={HERE}:raises_in_a_helper")
    line = one_error(code, err, expected_code=1)  # one line, no traceback (not two)
    assert "reward function 'raises_in_a_helper' raised KeyError" in line, line
    assert f"at tests/test_grpo_bad_inputs.py:{line_no} in _table_lookup" in line, line
    assert "its prompt: " in line and "How many" in line, line


def test_wrong_return_types_say_what_was_returned(capsys):
    for function, said in (
        ("returns_text", "returned a str ('1.0'), not a list of 4 rewards"),
        ("returns_nothing", "returned None, not a list of 4 rewards"),
    ):
        code, _, err = run_main(capsys, *TINY_GRPO, f"grpo.reward_funcs={HERE}:{function}")
        line = one_error(code, err, expected_code=1)
        assert f"reward function {function!r} {said}" in line and "raised" not in line, line


def test_tensor_rewards_train_with_their_completions_logged_and_judged_on_the_eval_rewards(capsys, tmp_path):
    out_file = tmp_path / "run" / "metrics.json"
    code, out, err = run_main(
        capsys,
        *TINY_GRPO,
        f"grpo.reward_funcs={HERE}:tensor_rewards,{HERE}:tensor_scalars",
        f"grpo.eval_reward_funcs={HERE}:tensor_scalars",
        "train.eval_every=2",
        "grpo.log_completions=true",
        "grpo.num_completions_to_print=3",
        "--metrics-out",
        out_file,
    )
    assert code == 0 and "trained 2/2 steps" in out and not error_lines(err), (out[-2000:], err[-3000:])
    jsonl = tmp_path / "run" / "metrics.completions.jsonl"
    assert f"notice: grpo.log_completions: completions go to {jsonl}" in err
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 1, 1, 2, 2, 2]  # three a log step
    assert set(rows[0]) == {
        "step",
        "group",
        "prompt",
        "completion",
        "rewards",
        "reward",
        "advantage",
        "clipped",
    }
    assert (
        set(rows[0]["rewards"]) == {"tensor_rewards", "tensor_scalars"}
        and rows[0]["rewards"]["tensor_scalars"] == 1.0
    )
    assert rows[0]["prompt"][-1]["role"] == "user" and rows[0]["clipped"] is True
    report = json.loads(out_file.read_text())
    last = report["history"][-1]
    assert "completions" not in last and last["clipped_ratio"] == 1.0  # the rows live in the JSONL
    # the eval scores with grpo.eval_reward_funcs alone
    assert set(report["result"]["eval_stats"]) == {"reward_mean", "reward/tensor_scalars"}
    assert report["result"]["eval_stats"]["reward_mean"] == 1.0


# ---- eval --rewards ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny base model with its tokenizer beside it."""
    from workbench.config import WorkbenchConfig
    from workbench.data.tokenizer import get_tokenizer
    from workbench.models.build import build_model

    root = tmp_path_factory.mktemp("grpo-eval-model")
    sizes = WorkbenchConfig().with_overrides([o for o in TINY_GRPO if o.startswith(("model.", "data.tok"))])
    tokenizer = get_tokenizer(sizes.data)
    build_model(sizes.model, vocab_size=len(tokenizer), seed=1).save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


def test_eval_rewards_errors_name_the_flags_and_a_missing_answer_column(capsys, tiny_model, tmp_path):
    files = {
        "no-answer.jsonl": '{"prompt": "2 + 2?", "solution": "4"}\n',
        "no-prompt.jsonl": '{"text": "2 + 2 = 4"}\n',
        "ok.jsonl": '{"prompt": "2 + 2?", "answer": "4"}\n',
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    base = ["eval", "--model", tiny_model, "--max-new-tokens", "2", "train.device_type=cpu", "--rewards"]
    cases = [
        (
            "math_answer",
            "missing.jsonl",
            2,
            "--data '{path}' does not exist; eval --rewards reads 'math-sample'",
        ),
        (
            "math_answer",
            "no-prompt.jsonl",
            2,
            "eval --rewards needs prompts; the columns found ['text'] hold none",
        ),
        (
            "math_answer",
            "no-answer.jsonl",
            2,
            "--data '{path}' has no 'answer' column, which --rewards math_answer",
        ),
        (
            f"{HERE}:scores_none",
            "ok.jsonl",
            1,
            "--rewards scores_none scored none of the 1 completions of --data",
        ),
    ]
    for rewards, name, expected, said in cases:
        path = tmp_path / name
        code, _, err = run_main(capsys, *base, rewards, "--data", path)
        line = one_error(code, err, expected_code=expected)
        assert said.format(path=path) in line, line
        assert "data.source" not in err and "train.objective" not in err, err
