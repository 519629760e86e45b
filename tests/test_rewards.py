"""GRPO's reward functions (`workbench.rl.rewards`): the built-ins on hand-written completions, TRL's
scoring (None, weights, the nansum), the errors that name a failing function and its prompt, and
``module:function`` specs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from workbench.config_grpo import GRPOConfig
from workbench.config_parse import ConfigError
from workbench.data.answers import extract_answer, final_answer, normalize_answer
from workbench.rl.rewards import (
    BUILTIN_REWARDS,
    NamedReward,
    RewardError,
    RewardSet,
    format_reward,
    length_reward,
    math_answer,
    resolve_reward_funcs,
    reward_inputs,
    trl_completions,
)

# ---- reward functions this module offers as `module:function` ------------------------------------


def shouts(prompts, completions, **columns):
    """1.0 for a completion in capitals."""
    return [1.0 if c.isupper() else 0.0 for c in completions]


def fails_on_sevens(prompts, completions, answer, **columns):
    """Raises on a record whose answer is 7 (the test's failing prompt)."""
    return [1.0 / (int(a) - 7) for a in answer]


NOT_A_FUNCTION = 3


# ---- the built-ins ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        ("So the total is \\boxed{1,234}.", "1234", 1.0),
        ("5 - 8.5 = -3.5\n#### -3.50", "-3.5", 1.0),
        ("She pays #### $12", 12, 1.0),  # a number column in JSON
        ("#### 12 apples", "12", 1.0),
        ("#### 7.0", "7", 1.0),
        ("It is \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("#### 13", "12", 0.0),
        ("The answer is 12.", "12", 0.0),  # no #### and no \boxed: no answer given
        ("#### 3\nthen \\boxed{4}", "4", 1.0),  # the later of the two is the final one
        ("\\boxed{4} and later\n#### 3", "4", 0.0),
        ("#### 72", "Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", 1.0),  # a raw GSM8K solution
        ("#### 5", None, None),  # no reference: skipped
        ("#### 5", "", None),
    ],
)
def test_math_answer_compares_the_final_answers_as_numbers(completion, answer, reward):
    assert math_answer(["q"], [completion], answer=[answer]) == [reward]


def test_math_answer_reads_chat_completions_and_skips_records_without_an_answer_column():
    chat = [
        [{"role": "assistant", "content": "4 + 3 = 7\n#### 7"}],
        [{"role": "assistant", "content": "#### 8"}],
    ]
    assert math_answer([[{"role": "user", "content": "?"}]] * 2, chat, answer=["7", "7"]) == [1.0, 0.0]
    assert math_answer(["q", "q"], ["#### 1", "#### 2"]) == [None, None]


def test_answers_are_found_and_normalised():
    assert extract_answer("a \\boxed{x^{2}} b") == "x^{2}"
    assert extract_answer("#### 42\nmore text") == "42"
    assert extract_answer("####\n") is None and extract_answer("nothing") is None
    assert [normalize_answer(v) for v in ("$1,234.50", "-0", "12.", 3.0, "5\\%", "\\$7", None)] == [
        "1234.5",
        "0",
        "12",
        "3",
        "5",
        "7",
        None,
    ]
    assert final_answer("She earned $1,234.\n#### 1,234") == "1234"
    assert final_answer(float("nan")) is None  # an empty number cell of a CSV


def test_format_matches_the_whole_completion_with_the_configs_pattern():
    fn = BUILTIN_REWARDS["format"](GRPOConfig())
    completions = ["3 + 4 = 7\n#### 7", "#### 1,234\n", "#### 7 and more", "7", "#### -2.5"]
    assert fn(["q"] * 5, completions) == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert format_reward(r"<think>.*</think>.*")(["q"] * 2, ["<think>a</think>b", "b"]) == [1.0, 0.0]


def test_length_is_zero_at_the_target_and_grows_to_minus_one():
    fn = BUILTIN_REWARDS["length"](GRPOConfig(length_target=4))
    ids = [[1] * 4, [1] * 2, [1] * 6, [1] * 8, [1] * 20, []]
    assert fn(["q"] * 6, ["x"] * 6, completion_ids=ids) == [0.0, -0.5, -0.5, -1.0, -1.0, -1.0]
    with pytest.raises(ConfigError, match=r"grpo\.length_target=0 is not allowed"):
        length_reward(0)


# ---- scoring: TRL's table, weights and None ---------------------------------------------------------


def _trl_total(per_function: list[list[float | None]], weights: list[float]) -> torch.Tensor:
    """TRL 1.16's reward of each completion (grpo_trainer.py, `_calculate_rewards` and the lines after
    it): None -> nan, the weighted nansum, nan where every function returned None."""
    table = torch.tensor([[torch.nan if v is None else v for v in row] for row in zip(*per_function)])
    rewards = (table * torch.tensor(weights).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(table).all(dim=1)] = torch.nan
    return rewards


def test_scores_follow_trls_weighted_nansum_and_none_handling():
    values = {"a": [1.0, None, 0.0, None], "b": [0.5, 2.0, None, None], "c": [None, -1.0, 3.0, None]}
    weights = [1.0, 0.5, 2.0]
    functions = [NamedReward(name, lambda prompts, completions, v=v, **kw: v) for name, v in values.items()]
    scores = RewardSet(functions, weights).score(["p"] * 4, ["x"] * 4, {})
    expected = _trl_total(list(values.values()), weights)
    np.testing.assert_allclose(scores.total, expected.numpy(), rtol=0, atol=1e-6, equal_nan=True)
    assert scores.total.dtype == np.float32 and math.isnan(scores.total[3])  # unscorable, as TRL's
    assert scores.per_function == pytest.approx({"a": 0.5, "b": 1.25, "c": 1.0})
    assert scores.mean == pytest.approx(np.nanmean(expected.numpy()))
    none = RewardSet([NamedReward("a", lambda prompts, completions, **kw: [None] * 2)]).score(
        ["p"] * 2, ["x"] * 2
    )
    assert math.isnan(none.per_function["a"]) and math.isnan(none.mean)


def test_functions_get_trls_arguments_and_chat_completions_as_trl_wraps_them():
    seen = {}

    def spy(prompts, completions, **columns):
        seen.update(prompts=prompts, completions=completions, **columns)
        return [0.0] * len(prompts)

    records = [
        {"prompt": [{"role": "user", "content": "2 + 2?"}], "answer": "4", "input_ids": [1, 2], "length": 2},
        {"prompt": [{"role": "user", "content": "3 + 3?"}], "answer": "6", "input_ids": [1, 3], "length": 2},
    ]
    prompts, columns = reward_inputs(records, 2, completion_ids=[[5], [6, 7], [8], [9]])
    RewardSet([NamedReward("spy", spy)]).score(prompts, ["#### 4", "#### 5", "#### 6", "6"], columns)
    assert seen["prompts"] == [records[0]["prompt"]] * 2 + [records[1]["prompt"]] * 2
    assert seen["completions"][1] == [{"role": "assistant", "content": "#### 5"}]
    assert seen["answer"] == ["4", "4", "6", "6"] and seen["completion_ids"] == [[5], [6, 7], [8], [9]]
    assert set(seen) == {"prompts", "completions", "answer", "completion_ids"}  # not the tokenised columns
    assert trl_completions(["text prompt"], ["done"]) == ["done"]


def test_the_config_names_the_functions_and_their_weights():
    grpo = GRPOConfig(reward_funcs=["math_answer", "format"], reward_weights=[1.0, 0.25])
    rewards = RewardSet.from_config(grpo, extra=[shouts, shouts])
    assert rewards.names == ["math_answer", "format", "shouts", "shouts_2"]
    scores = rewards.score(["q", "q"], ["#### 7", "SEVEN"], {"answer": ["7", "7"]})
    np.testing.assert_allclose(scores.total, [1.25, 2.0])  # the extra functions weigh 1.0
    with pytest.raises(ConfigError, match=r"grpo\.reward_weights=\[1\.0\] is not allowed: give one weight"):
        RewardSet(resolve_reward_funcs(["math_answer", "format"]), [1.0])


# ---- errors that name the function and the prompt ----------------------------------------------------


def test_a_raising_function_is_named_with_the_prompt_it_failed_on():
    rewards = RewardSet(resolve_reward_funcs(["math_answer", "tests.test_rewards:fails_on_sevens"]))
    prompts = ["Tom has 3 files. He gets 4 more.", "Sue has 9 pens. She loses 2.", "Ann has 1 cat."]
    with pytest.raises(RewardError) as raised:
        rewards.score(prompts, ["#### 7"] * 3, {"answer": ["8", "7", "1"]})
    message = str(raised.value)
    assert "reward function 'fails_on_sevens' raised ZeroDivisionError" in message, message
    assert "on completion 2 of 3; its prompt: 'Sue has 9 pens. She loses 2.'" in message, message
    assert raised.value.function == "fails_on_sevens" and raised.value.prompt == prompts[1]
    assert isinstance(raised.value.__cause__, ZeroDivisionError)


def test_a_wrong_number_of_values_or_a_value_that_is_no_number_is_named():
    short = NamedReward("short", lambda prompts, completions, **kw: [1.0])
    with pytest.raises(
        RewardError, match=r"'short' returned 1 values for 2 completions .* first prompt: 'p0'"
    ):
        RewardSet([short]).score(["p0", "p1"], ["a", "b"])
    text = NamedReward("texty", lambda prompts, completions, **kw: [1.0, "good"])
    with pytest.raises(
        RewardError, match=r"'texty' returned str 'good' for completion 2 of 2, .*its prompt: 'p1'"
    ):
        RewardSet([text]).score(["p0", "p1"], ["a", "b"])
    long_chat = [{"role": "user", "content": "word " * 100}]
    with pytest.raises(RewardError, match=r"its prompt: 'word word .*\.\.\.'$"):
        RewardSet([NamedReward("inf", lambda prompts, completions, **kw: [math.inf])]).score(
            [long_chat], ["a"]
        )


# ---- specs -----------------------------------------------------------------------------------------


def test_module_function_specs_are_imported_and_bad_ones_named_in_one_line():
    (loaded,) = resolve_reward_funcs(["tests.test_rewards:shouts"])
    assert loaded.name == "shouts" and loaded.function is shouts
    bad = {
        "math_anser": r"--rewards: 'math_anser' is not a reward function \(did you mean 'math_answer'\?\); "
        r"--rewards takes built-in names \(math_answer, format, length\) or 'module:function'",
        "no_such_module_here:fn": r"--rewards: 'no_such_module_here:fn' cannot be imported: ModuleNotFoundError",
        "tests.test_rewards:shout": r"module 'tests.test_rewards' has no 'shout' \(did you mean tests.test_rewards:shouts\?\)",
        "tests.test_rewards:NOT_A_FUNCTION": r"'tests.test_rewards:NOT_A_FUNCTION' is a int, not a function",
    }
    for spec, message in bad.items():
        with pytest.raises(ConfigError, match=message) as raised:
            resolve_reward_funcs([spec], field="--rewards")
        assert "\n" not in str(raised.value)


# ---- what a function returns: TRL's values accepted, anything else named (issue 42) -----------------


def _one(name, returned):
    """A RewardSet of one function returning `returned` whatever it is given."""
    return RewardSet([NamedReward(name, lambda prompts, completions, **kw: returned)])


def test_values_are_read_as_trls_torch_tensor_reads_them():
    prompts, completions = ["p0", "p1", "p2"], ["a", "b", "c"]
    expected = [1.0, 0.0, 0.5]
    for returned in (
        torch.tensor(expected),  # a 1-D tensor
        [torch.tensor(1.0), torch.tensor(0), torch.tensor(0.5, dtype=torch.float64)],  # 0-d tensors
        np.asarray(expected),
        torch.tensor(expected).reshape(3, 1),  # rows of one value each
        (1, False, np.float32(0.5)),
    ):
        scores = _one("t", returned).score(prompts, completions)
        np.testing.assert_allclose(scores.total, expected, err_msg=repr(returned))
    # NaN scores nothing, as None: left out of the mean, and a completion nothing scored is nan
    scores = _one("n", [1.0, math.nan, None]).score(prompts, completions)
    assert math.isnan(scores.total[1]) and math.isnan(scores.total[2]) and scores.mean == 1.0


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        ("1.0", r"returned a str \('1\.0'\), not a list of 2 rewards"),
        (None, r"returned None, not a list of 2 rewards"),
        ({"p0": 1.0, "p1": 0.0}, r"returned a dict \(\{'p0': 1\.0, 'p1': 0\.0\}\), not a list"),
        (0.5, r"returned a float \(0\.5\), not a list of 2 rewards"),
        (torch.tensor(0.5), r"returned a 0-d Tensor, not a list of 2 rewards"),
        (
            [torch.tensor([1.0, 2.0]), 1.0],
            r"returned a Tensor of 2 values for completion 1 of 2, not a number",
        ),
    ],
)
def test_what_is_not_a_list_of_rewards_is_named_as_what_it_is(returned, said):
    with pytest.raises(RewardError, match=said) as raised:
        _one("odd", returned).score(["p0", "p1"], ["a", "b"])
    assert "'odd'" in str(raised.value) and "p0" in str(raised.value) and "\n" not in str(raised.value)


def _lookup(completion):
    table = {"a": 1.0}
    return table[completion]  # the line a failing reward points at


def fails_in_a_helper(prompts, completions, **columns):
    """Raises KeyError in `_lookup` (this file) for a completion other than 'a'."""
    return [_lookup(c) for c in completions]


def test_a_raising_function_is_one_line_with_the_users_own_file_and_line():
    import inspect

    (reward,) = resolve_reward_funcs(["tests.test_rewards:fails_in_a_helper"])
    with pytest.raises(RewardError) as raised:
        RewardSet([reward]).score(["p0", "p1"], ["a", "b"])
    line = inspect.getsourcelines(_lookup)[1] + 2
    message = str(raised.value)
    assert f"raised KeyError: 'b' at tests/test_rewards.py:{line} in _lookup, on completion 2 of 2" in message
    assert "\n" not in message and isinstance(raised.value.__cause__, KeyError)
    # an error raised inside a library (json) still points at the user's own line that called it
    import json

    def parses(prompts, completions, **columns):
        return [json.loads(c) for c in completions]

    with pytest.raises(
        RewardError, match=r"raised JSONDecodeError: .* at tests/test_rewards\.py:\d+ in (<listcomp>|parses)"
    ):
        RewardSet([NamedReward("parses", parses)]).score(["p"], ["not json"])


def test_bad_reward_names_are_found_with_the_config():
    from workbench.config import WorkbenchConfig
    from workbench.rl.rewards import check_reward_specs

    grpo = {"train.objective": "grpo"}
    with pytest.raises(
        ConfigError, match=r"grpo\.reward_funcs: 'math_anser' is not a reward function \(did you mean"
    ):
        WorkbenchConfig().with_overrides({**grpo, "grpo.reward_funcs": ["math_anser"]})
    with pytest.raises(ConfigError, match=r"grpo\.eval_reward_funcs: 'fromat' .*did you mean 'format'"):
        WorkbenchConfig().with_overrides({**grpo, "grpo.eval_reward_funcs": ["fromat"]})
    # 'module:function' specs are imported when a run starts (the config may travel without the module)
    cfg = WorkbenchConfig().with_overrides({**grpo, "grpo.eval_reward_funcs": ["tests.test_rewards:shout"]})
    with pytest.raises(
        ConfigError, match=r"grpo\.eval_reward_funcs: 'tests\.test_rewards:shout': module .* has no"
    ):
        check_reward_specs(cfg.grpo)
    # an SFT run's config never reads the grpo section's rewards
    WorkbenchConfig().with_overrides({"grpo.reward_funcs": ["math_anser"]})
