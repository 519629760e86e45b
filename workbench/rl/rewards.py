"""Reward functions for GRPO: TRL's signature, the built-ins, ``module:function`` specs, and scoring.

A **reward function** has TRL's signature, so a TRL user's functions work unchanged::

    fn(prompts: list, completions: list, **columns) -> list[float | None]

``prompts[i]`` is the record's prompt as given (a string, or a list of ``{role, content}`` turns for
a chat prompt); ``completions[i]`` the decoded completion: a string, or for a chat prompt
``[{"role": "assistant", "content": text}]`` as TRL passes it (`trl_completions`). ``columns`` holds
every other column of the records (``answer=[...]``, ``solution=[...]``, ...), one entry per
completion, and ``completion_ids`` (each completion's token ids). ``None`` skips the function for
that completion: it counts in neither the total nor the function's mean.

**Built-ins** (`BUILTIN_REWARDS`, by name in ``grpo.reward_funcs`` and ``eval --rewards``):

- ``math_answer``: 1.0 when the completion's final answer equals the record's ``answer``
  numerically, else 0.0; None for a record without an answer. The completion's answer is the one
  after its last GSM8K ``#### `` or in its last ``\\boxed{...}`` (whichever comes later); both sides
  are normalised (`workbench.data.answers.normalize_answer`: ``$``, thousands commas, a trailing period, trailing zeros
  after the point: ``$1,234.50`` equals ``1234.5``). Answers that are not numbers compare as text
  without spaces. A completion without an answer scores 0.0.
- ``format``: 1.0 when ``grpo.format_pattern`` matches the whole completion (`re.fullmatch`), else 0.0.
- ``length``: ``-min(1, |n - target| / target)`` for a completion of n tokens and
  ``grpo.length_target`` as the target: 0 at the target, -1 at twice it or at none, in between
  linear; add it with a small weight to steer lengths.

**Specs** (`resolve_reward_funcs`): a built-in name, ``module:function`` (imported from Python's
path; a bad one is a one-line `ConfigError` naming it and what is allowed), or a callable.

**Scoring** (`RewardSet.score`), TRL 1.16's ``_calculate_rewards`` and its sum: each function's
values (None or NaN -> nan) form a ``[N, functions]`` table; a completion's total is the nansum of
its weighted values, and nan where every function returned None (TRL's "unscorable" rows, which its
advantages leave out of the group's mean and std and give 0, and every reward mean leaves out).
Values are what TRL's ``torch.tensor(values)`` takes: a list (or tuple, or a 1-D tensor or array)
of numbers, bools, None, or one-element tensors and arrays. A function that raises, returns
something else (a string, None, a dict, one number), the wrong number of values, or a value that is
not a number raises `RewardError`: one line naming the function, what it returned or raised (with
the line of the user's own code that raised, ``file:line``) and the prompt it failed on.
"""

from __future__ import annotations

import difflib
import importlib
import math
import os
import re
import sysconfig
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.config_grpo import BUILTIN_REWARD_NAMES, GSM8K_FORMAT, GRPOConfig
from workbench.config_parse import ConfigError
from workbench.data.answers import extract_answer, final_answer, normalize_answer

RewardFunc = Callable[..., Sequence[Any]]
"""TRL's reward-function signature: ``fn(prompts, completions, **columns) -> list[float | None]``."""


class RewardError(RuntimeError):
    """A reward function raised, or returned what cannot be a reward: names the function and the prompt."""

    def __init__(self, message: str, *, function: str, prompt: Any) -> None:
        super().__init__(message)
        self.function, self.prompt = function, prompt


# ---- the built-ins ----------------------------------------------------------------------------


def completion_text(completion: Any) -> str:
    """The text of a completion as TRL passes it: the string, or the content of its (last) message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content") or "")
    return "" if completion is None else str(completion)


def math_answer(prompts: list, completions: list, answer: list | None = None, **columns: Any) -> list:
    """1.0 where the completion's final answer (``#### N`` or ``\\boxed{N}``) equals the record's
    ``answer`` numerically, 0.0 where it does not or has none; None where the record has no answer."""
    if answer is None:
        return [None] * len(completions)
    out: list[float | None] = []
    for completion, reference in zip(completions, answer, strict=True):
        expected = final_answer(reference)
        if expected is None:
            out.append(None)
            continue
        given = normalize_answer(extract_answer(completion_text(completion)))
        out.append(1.0 if given is not None and given == expected else 0.0)
    return out


def format_reward(pattern: str = GSM8K_FORMAT) -> RewardFunc:
    """The ``format`` reward for `pattern`: 1.0 where it matches the whole completion, else 0.0."""
    compiled = re.compile(pattern)

    def matches(prompts: list, completions: list, **columns: Any) -> list:
        return [1.0 if compiled.fullmatch(completion_text(c)) else 0.0 for c in completions]

    matches.__name__ = matches.__qualname__ = "format"  # the name its figures go by, as the built-in's
    return matches


def length_reward(target: int = GRPOConfig.length_target) -> RewardFunc:
    """The ``length`` reward for `target` tokens: ``-min(1, |n - target| / target)`` per completion
    of n tokens (``completion_ids``), 0 at the target."""
    if target < 1:
        raise ConfigError(f"grpo.length_target={target!r} is not allowed: must be >= 1")

    def length(prompts: list, completions: list, completion_ids: list | None = None, **columns: Any) -> list:
        if completion_ids is None:
            raise ValueError("the 'length' reward counts tokens: it needs the completion_ids column")
        return [-min(1.0, abs(len(ids) - target) / target) for ids in completion_ids]

    return length


BUILTIN_REWARDS: dict[str, Callable[[GRPOConfig], RewardFunc]] = {
    "math_answer": lambda grpo: math_answer,
    "format": lambda grpo: format_reward(grpo.format_pattern),
    "length": lambda grpo: length_reward(int(grpo.length_target)),
}
"""The built-in rewards by name, each made from the ``grpo`` section (its pattern, its target)."""
assert tuple(BUILTIN_REWARDS) == BUILTIN_REWARD_NAMES  # the names the config checks are these


# ---- specs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NamedReward:
    """A reward function and the name its figures go by (``reward/<name>``)."""

    name: str
    function: RewardFunc


def _allowed(field: str) -> str:
    return (
        f"{field} takes built-in names ({', '.join(BUILTIN_REWARDS)}) or 'module:function' "
        "(a function importable from Python's path, with TRL's signature fn(prompts, completions, **columns))"
    )


def _import(spec: str, field: str) -> RewardFunc:
    """The function `spec` (``module:function``) names; `ConfigError` naming the spec when it cannot be had."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # an import error, or the module's own code failing
        raise ConfigError(
            f"{field}: {spec!r} cannot be imported: {type(err).__name__}: {err}; {_allowed(field)}"
        ) from err
    function = getattr(module, attr, None)
    if function is None:
        names = [n for n in dir(module) if not n.startswith("_")]
        close = difflib.get_close_matches(attr, names, n=1)
        hint = f" (did you mean {module_name}:{close[0]}?)" if close else ""
        raise ConfigError(
            f"{field}: {spec!r}: module {module_name!r} has no {attr!r}{hint}; {_allowed(field)}"
        )
    if not callable(function):
        raise ConfigError(
            f"{field}: {spec!r} is a {type(function).__name__}, not a function; {_allowed(field)}"
        )
    return function


def _callable_name(function: Any) -> str:
    """The name TRL gives a callable reward (``get_callable_name``): its own, a partial's function's, its class's."""
    inner = getattr(function, "func", function)
    return getattr(inner, "__name__", None) or type(inner).__name__


def resolve_reward_funcs(
    specs: Sequence[str | RewardFunc], grpo: GRPOConfig | None = None, *, field: str = "grpo.reward_funcs"
) -> list[NamedReward]:
    """The reward functions `specs` name: built-in names (made from `grpo`, the ``grpo`` section:
    its ``format_pattern`` and ``length_target``; None takes their defaults), ``module:function``
    strings, or callables. `field` is what an error names (``--rewards`` on the command line).

    Names are kept apart: a second function of the same name becomes ``name_2``.
    """
    if isinstance(specs, str) or not specs:
        raise ConfigError(
            f"{field}={specs!r} is not allowed: give a list of reward functions; {_allowed(field)}"
        )
    out: list[NamedReward] = []
    for spec in specs:
        if callable(spec):
            name, function = _callable_name(spec), spec
        elif isinstance(spec, str) and spec.strip() in BUILTIN_REWARDS:
            name = spec.strip()
            function = BUILTIN_REWARDS[name](grpo if grpo is not None else GRPOConfig())
        elif isinstance(spec, str) and re.fullmatch(r"[\w.]+:\w+", spec.strip()):
            function = _import(spec.strip(), field)
            name = _callable_name(function)
        else:
            close = difflib.get_close_matches(str(spec), list(BUILTIN_REWARDS), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{field}: {spec!r} is not a reward function{hint}; {_allowed(field)}")
        taken = {r.name for r in out}
        unique, n = name, 2
        while unique in taken:
            unique, n = f"{name}_{n}", n + 1
        out.append(NamedReward(unique, function))
    return out


def check_reward_specs(grpo: GRPOConfig, given: Sequence[Any] = ()) -> None:
    """Resolve ``grpo.reward_funcs`` (or `given`, the functions ``Trainer(cfg, rewards=...)`` takes in
    their place) and ``grpo.eval_reward_funcs``, importing ``module:function`` specs, so a spec that names
    no function is a `ConfigError` before data or a model load (``train`` calls it with the config, the
    GRPO objective when a `Trainer` starts; the config's own validation checks the built-in names,
    importing nothing)."""
    resolve_reward_funcs(list(given) or grpo.reward_funcs, grpo)
    if grpo.eval_reward_funcs is not None:
        resolve_reward_funcs(grpo.eval_reward_funcs, grpo, field="grpo.eval_reward_funcs")


# ---- scoring ----------------------------------------------------------------------------------


def is_chat_prompt(prompt: Any) -> bool:
    """Whether `prompt` is a chat prompt: a list of turns (TRL's ``is_conversational``)."""
    return (
        isinstance(prompt, Sequence)
        and not isinstance(prompt, str)
        and bool(prompt)
        and isinstance(prompt[0], Mapping)
        and "role" in prompt[0]
    )


def trl_completions(prompts: Sequence[Any], texts: Sequence[Any]) -> list[Any]:
    """The decoded completions as TRL hands them to reward functions: for a chat prompt
    ``[{"role": "assistant", "content": text}]``, for a text prompt the text. Entries that are not
    strings (already in that form) are kept."""
    chat = bool(prompts) and is_chat_prompt(prompts[0])  # TRL decides on the batch's first prompt
    return [[{"role": "assistant", "content": t}] if chat and isinstance(t, str) else t for t in texts]


def _shown(prompt: Any, limit: int = 160) -> str:
    """A prompt for an error line: its text (a chat prompt's last turn), cut to `limit` characters."""
    text = completion_text(prompt) if is_chat_prompt(prompt) else str(prompt)
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _value(value: Any) -> float | None:
    """A reward as a float (None stays None; NaN scores nothing, as None); a one-element tensor or
    array is its number, as TRL's ``torch.tensor(values)`` reads it. ValueError for what is not a
    number, or is infinite."""
    if value is None:
        return None
    if _is_array(value):
        if _size(value) != 1:
            raise ValueError(f"a {type(value).__name__} of {_size(value)} values")
        value = value.item()
    if isinstance(value, (str, bytes)) or not isinstance(value, (int, float, np.number, np.bool_)):
        raise ValueError(f"{type(value).__name__} {str(value)[:40]!r}")
    number = float(value)
    if math.isinf(number):
        raise ValueError(repr(number))
    return number


def _is_array(value: Any) -> bool:
    """A torch tensor or a numpy array (what a reward function may hand back as TRL accepts it)."""
    return isinstance(value, np.ndarray) or type(value).__module__.startswith("torch")


def _size(value: Any) -> int:
    return int(value.numel()) if hasattr(value, "numel") else int(value.size)


def _returned(value: Any) -> str:
    """What a function returned, for an error line: its type and a glimpse of it."""
    if value is None:
        return "None"
    if _is_array(value):
        shape = tuple(value.shape)
        return f"a {type(value).__name__} of shape {shape}" if shape else f"a 0-d {type(value).__name__}"
    text = repr(value)
    return f"a {type(value).__name__} ({text if len(text) <= 40 else text[:37] + '...'})"


def _as_values(returned: Any) -> list[Any] | None:
    """A function's return as one entry per completion: a list, tuple, generator, or a tensor or array
    of one dimension (its rows). None for what is not a sequence of values (None, a string, a mapping,
    a single number, a 0-d tensor)."""
    if returned is None or isinstance(returned, (str, bytes, Mapping)):
        return None
    if _is_array(returned):
        return list(returned) if len(returned.shape) >= 1 else None
    try:
        return list(returned)
    except TypeError:  # not iterable: one number, an object
        return None


_LIBRARY_ROOTS = tuple(
    {
        os.path.realpath(p)
        for k in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(k))
    }
)


def _user_frame(err: BaseException) -> str:
    """Where `err` was raised in the user's own code: ``file:line in function`` of the innermost frame
    below the reward call that is not Python's or an installed library's (else the reward function's
    own frame); the file relative to the working directory when under it."""
    frames = traceback.extract_tb(err.__traceback__)[1:]  # [0] is RewardSet._call's
    if not frames:
        return ""
    own = [f for f in frames if not os.path.realpath(f.filename).startswith(_LIBRARY_ROOTS)]
    frame = (own or frames[:1])[-1]
    path = frame.filename
    try:
        relative = os.path.relpath(path)
        path = relative if not relative.startswith("..") else path
    except ValueError:  # another drive (Windows)
        pass
    return f" at {path}:{frame.lineno} in {frame.name}"


@dataclass(frozen=True)
class RewardScores:
    """The rewards of N completions."""

    total: np.ndarray
    """[N] float32: each completion's weighted sum over the functions (nansum), nan where every
    function returned None (TRL's unscorable rows)."""
    per_function: dict[str, float]
    """Function name -> mean over the completions it scored (nan when it scored none)."""
    table: np.ndarray
    """[N, functions] float32: each function's value per completion, nan for None."""

    @property
    def mean(self) -> float:
        """The mean total over the scorable completions (TRL's logged ``reward``); nan if none is."""
        scored = self.total[~np.isnan(self.total)]
        return float(scored.mean()) if scored.size else math.nan


class RewardSet:
    """Reward functions with their weights, scored together as TRL's GRPO trainer scores them."""

    def __init__(self, functions: Sequence[NamedReward], weights: Sequence[float] | None = None) -> None:
        if not functions:
            raise ValueError("a RewardSet needs at least one reward function")
        if weights is not None and len(weights) != len(functions):
            raise ConfigError(
                f"grpo.reward_weights={list(weights)!r} is not allowed: give one weight per reward function "
                f"({len(functions)}: {', '.join(f.name for f in functions)}) or null"
            )
        self.functions = list(functions)
        self.names = [f.name for f in functions]
        self.weights = np.asarray([1.0] * len(functions) if weights is None else weights, dtype=np.float32)

    @classmethod
    def from_config(cls, grpo: GRPOConfig, extra: Sequence[str | RewardFunc] = ()) -> RewardSet:
        """The ``grpo`` section's ``reward_funcs`` weighted by ``reward_weights``, then the `extra`
        functions (e.g. ``Trainer(cfg, rewards=[fn])``) with weight 1.0 each."""
        specs, weights = list(grpo.reward_funcs), grpo.reward_weights
        if weights is not None and extra:
            weights = [*weights, *[1.0] * len(extra)]
        return cls(resolve_reward_funcs([*specs, *extra], grpo), weights)

    def score(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        columns: Mapping[str, Sequence[Any]] | None = None,
    ) -> RewardScores:
        """Score N completions of `prompts` (one prompt per completion, repeated for a group);
        `columns`: the records' other columns and ``completion_ids``, N entries each. Completions
        may be the decoded strings: those of chat prompts are wrapped as TRL wraps them."""
        prompts, completions = list(prompts), trl_completions(prompts, completions)
        count = len(prompts)
        if len(completions) != count:
            raise ValueError(
                f"{len(completions)} completions for {count} prompts: give one prompt per completion"
            )
        kwargs = dict(columns or {})
        table = np.full((count, len(self.functions)), np.nan, dtype=np.float32)
        for j, reward in enumerate(self.functions):
            returned = self._call(reward, prompts, completions, kwargs)
            values = _as_values(returned)
            if values is None:
                raise RewardError(
                    f"reward function {reward.name!r} returned {_returned(returned)}, not a list of "
                    f"{count} rewards (one number per completion, None to skip one); the first prompt: "
                    f"{_shown(prompts[0]) if prompts else 'none'}",
                    function=reward.name,
                    prompt=prompts[0] if prompts else None,
                )
            if len(values) != count:
                raise RewardError(
                    f"reward function {reward.name!r} returned {len(values)} values for {count} completions "
                    f"(one per completion, None to skip one); the first prompt: {_shown(prompts[0])}",
                    function=reward.name,
                    prompt=prompts[0] if prompts else None,
                )
            for i, value in enumerate(values):
                try:
                    number = _value(value)
                except ValueError as err:
                    raise RewardError(
                        f"reward function {reward.name!r} returned {err} for completion {i + 1} of {count}, "
                        f"not a number (or None to skip it); its prompt: {_shown(prompts[i])}",
                        function=reward.name,
                        prompt=prompts[i],
                    ) from None
                if number is not None:
                    table[i, j] = number
        unscorable = np.isnan(table).all(axis=1)
        total = np.nansum(table * self.weights[None, :], axis=1).astype(np.float32)
        total[unscorable] = np.nan
        per_function = {
            name: float(np.nanmean(column)) if not np.isnan(column).all() else math.nan
            for name, column in zip(self.names, table.T)
        }
        return RewardScores(total=total, per_function=per_function, table=table)

    @staticmethod
    def _call(reward: NamedReward, prompts: list, completions: list, kwargs: dict[str, Any]) -> Any:
        """What the function returned; `RewardError` naming it, the line of the user's code that raised
        and the prompt it failed on when it raises (the user's error is its ``__cause__``)."""
        try:
            return reward.function(prompts=prompts, completions=completions, **kwargs)
        except Exception as err:
            failing = _first_failing_row(reward.function, prompts, completions, kwargs)
            where = "its prompt" if failing is not None else "the batch's first prompt"
            row = failing if failing is not None else 0
            said = " ".join(str(err).split())
            raise RewardError(
                f"reward function {reward.name!r} raised {type(err).__name__}"
                f"{': ' + said if said else ''}{_user_frame(err)}, on completion {row + 1} "
                f"of {len(prompts)}; {where}: {_shown(prompts[row]) if prompts else 'none'}",
                function=reward.name,
                prompt=prompts[row] if prompts else None,
            ) from err


def _first_failing_row(function: RewardFunc, prompts: list, completions: list, kwargs: dict) -> int | None:
    """The first completion the function raises on when called on it alone (the failure path only:
    a function that fails for the batch as a whole fails on no single row, and None says so)."""
    for i in range(len(prompts)):
        one = {
            k: v[i : i + 1] if isinstance(v, Sequence) and len(v) == len(prompts) else v
            for k, v in kwargs.items()
        }
        try:
            function(prompts=prompts[i : i + 1], completions=completions[i : i + 1], **one)
        except Exception:
            return i
    return None


def reward_inputs(
    records: Sequence[Mapping[str, Any]],
    num_generations: int = 1,
    *,
    completion_ids: Sequence[Sequence[int]] | None = None,
    skip: Sequence[str] = ("input_ids", "length"),
) -> tuple[list[Any], dict[str, list[Any]]]:
    """(prompts, columns) for `RewardSet.score` from prompt-dataset rows (`workbench.data.prompts`),
    each repeated `num_generations` times in a row as a group's completions are, as TRL repeats its
    inputs: every column but the prompt and the tokenised ones (`skip`), plus `completion_ids`."""
    prompts = [r["prompt"] for r in records for _ in range(num_generations)]
    names = [k for k in (records[0] if records else {}) if k != "prompt" and k not in skip]
    columns = {k: [r.get(k) for r in records for _ in range(num_generations)] for k in names}
    if completion_ids is not None:
        columns["completion_ids"] = [list(map(int, ids)) for ids in completion_ids]
    return prompts, columns
