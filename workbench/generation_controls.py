"""What a `workbench.generate` call asks for, checked and resolved as ``model.generate`` resolves it,
and the two controls it keeps on the model's device: stop strings and the repetition penalty.

`prompt_ids` reads the prompts; `resolve_options` checks the numbers (a ValueError naming the
bad value) and picks the end-of-sequence and pad ids. The controls follow ``model.generate`` exactly, and both are
fixed-shape tensors advanced inside each decode step, so they add no host read and no program
per token:

- `StopStrings`: transformers' own `StopStringCriteria` (its precomputed token tables and its
  tensor-only matching) applied to a rolling window of each row's last tokens. A row stops at the
  token that completes a stop string, and that token is kept, as ``model.generate(stop_strings=...,
  tokenizer=...)`` keeps it. The window starts with the prompt's last tokens, so a stop string
  may begin inside the prompt, as transformers matches it over the whole sequence.
- `RepetitionPenalty`: transformers' `RepetitionPenaltyLogitsProcessor` over a ``[rows, vocab]``
  mask of the token ids already in each row (prompt and generated, never its left padding),
  updated each step by a scatter rather than rebuilt from a growing sequence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch


def prompt_ids(prompts: Any, tokenizer: Any) -> list[list[int]]:
    """`prompts` (strings with a tokenizer, token ids, one prompt alone) as a list of token-id lists."""
    if isinstance(prompts, str) or (
        isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], (int, torch.Tensor))
    ):
        prompts = [prompts]
    if not prompts:
        raise ValueError("prompts is empty: pass token-id lists, or strings with a tokenizer")
    ids = []
    for p in prompts:
        if isinstance(p, str):
            if tokenizer is None:
                raise ValueError("string prompts need a tokenizer: pass tokenizer=, or token-id lists")
            p = tokenizer(p)["input_ids"]
        row = [int(t) for t in p]
        if not row:
            raise ValueError("a prompt is empty: every prompt needs at least one token")
        ids.append(row)
    return ids


def resolve_options(
    model: Any,
    tokenizer: Any,
    *,
    max_new_tokens: int,
    max_batch_size: int,
    temperature: float,
    top_k: int | None,
    eos_token_id: Any,
    pad_token_id: int | None,
    stop: str | Sequence[str] | None,
    repetition_penalty: float,
    top_p: float = 1.0,
) -> dict[str, Any]:
    """The decoder's options, checked (a ValueError naming the bad value) and resolved as ``model.generate``
    resolves them: end-of-sequence ids, the pad id, the stop strings, the penalty."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is not allowed: must be an int >= 1")
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size={max_batch_size!r} is not allowed: must be >= 1")
    if temperature < 0:
        raise ValueError(f"temperature={temperature!r} is not allowed: 0 (greedy) or more")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k!r} is not allowed: None or >= 1")
    if not isinstance(top_p, (int, float)) or isinstance(top_p, bool) or not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p!r} is not allowed: must be a number in (0, 1] (1.0 is off)")
    eos = eos_ids(model, tokenizer, eos_token_id)
    return {
        "eos": eos,
        "pad": pad_id(model, tokenizer, pad_token_id, eos),
        "temperature": temperature,
        "top_k": top_k,
        "top_p": float(top_p),
        "stop": stop_string_list(stop, tokenizer),
        "repetition_penalty": check_repetition_penalty(repetition_penalty),
    }


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (int, torch.Tensor)):
        return [int(value)]
    return [int(v) for v in value]


def eos_ids(model: Any, tokenizer: Any, eos_token_id: Any) -> list[int]:
    """The ids that end a row: `eos_token_id` itself, or for "auto" the generation config's, else the tokenizer's."""
    if eos_token_id != "auto":
        return _as_list(eos_token_id)
    gen_config = getattr(model, "generation_config", None)
    found = _as_list(getattr(gen_config, "eos_token_id", None))
    return found or _as_list(getattr(tokenizer, "eos_token_id", None))


def pad_id(model: Any, tokenizer: Any, pad_token_id: int | None, eos: list[int]) -> int:
    """What fills left padding and finished rows (never attended to), as model.generate picks it."""
    for value in (
        pad_token_id,
        getattr(getattr(model, "generation_config", None), "pad_token_id", None),
        getattr(tokenizer, "pad_token_id", None),
    ):
        if value is not None:
            return int(value)
    return eos[0] if eos else 0


def stop_string_list(stop: str | Sequence[str] | None, tokenizer: Any) -> list[str]:
    """`stop` as a list of stop strings ([] for none); ValueError when it cannot be used."""
    if stop is None:
        return []
    strings = [stop] if isinstance(stop, str) else list(stop)
    bad = [s for s in strings if not isinstance(s, str) or not s]
    if bad:
        raise ValueError(f"stop={stop!r} is not allowed: every stop string must be a non-empty str")
    if strings and tokenizer is None:
        raise ValueError(
            f"stop={strings!r} needs a tokenizer to match the strings against tokens: pass tokenizer="
        )
    return strings


def check_repetition_penalty(penalty: float) -> float:
    """`penalty` as a float; ValueError naming the value unless it is a finite number above 0."""
    ok = isinstance(penalty, (int, float)) and not isinstance(penalty, bool)
    if not ok or not math.isfinite(penalty) or penalty <= 0:
        raise ValueError(
            f"repetition_penalty={penalty!r} is not allowed: must be a number > 0 "
            "(1.0 is off, above 1 discourages repeating a token, as in model.generate)"
        )
    return float(penalty)


class StopStrings:
    """Whether each row's newest token completes one of `strings` (tokenized by `tokenizer`), on the device."""

    def __init__(self, tokenizer: Any, strings: Sequence[str], device: torch.device) -> None:
        from transformers.generation.stopping_criteria import StopStringCriteria

        criteria = StopStringCriteria(tokenizer, list(strings))
        # moved once here rather than by the criteria's first call, which would move them inside a step
        criteria.embedding_vec = criteria.embedding_vec.to(device)
        criteria.target_lens = criteria.target_lens.to(device)
        self.criteria = criteria
        self.width = int(criteria.maximum_token_len)
        """Tokens the window holds: a stop string of N characters spans at most N tokens."""
        self.blank = int(criteria.embedding_vec.shape[0]) - 1
        """The id of the criteria's all-(-1) table row: matches nothing, so it stands for "before the prompt"."""

    def start(self, input_ids: torch.Tensor, prompt_mask: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The window of each row's last `width` prompt tokens (host tensors in, a device tensor out);
        left padding and anything before the prompt read as `blank`, i.e. a shorter sequence."""
        window = input_ids.masked_fill(prompt_mask == 0, self.blank)[:, -self.width :]
        if window.shape[1] < self.width:
            blanks = torch.full(
                (window.shape[0], self.width - window.shape[1]), self.blank, dtype=window.dtype
            )
            window = torch.cat([blanks, window], dim=1)
        return window.to(device)

    def advance(self, window: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the window with `token` appended and its oldest token dropped, whether each row now ends
        with a stop string)."""
        window = torch.cat([window[:, 1:], token[:, None]], dim=1)
        return window, self.criteria(window, None)


class RepetitionPenalty:
    """transformers' repetition penalty: the logit of every token id already in a row is multiplied by
    `penalty` when negative, divided by it otherwise."""

    def __init__(self, penalty: float) -> None:
        self.penalty = check_repetition_penalty(penalty)

    @staticmethod
    def start(input_ids: torch.Tensor, prompt_mask: torch.Tensor, vocab: int) -> torch.Tensor:
        """The ``[rows, vocab]`` mask of each row's prompt tokens, built on the ids' device. Left padding
        and ids outside the logits (a tokenizer larger than the head) go to an extra column, dropped."""
        ids = input_ids.clamp(max=vocab).masked_fill(prompt_mask == 0, vocab)
        seen = torch.zeros((ids.shape[0], vocab + 1), dtype=torch.bool, device=ids.device)
        return seen.scatter(1, ids, True)[:, :vocab]

    def apply(self, logits: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """`logits` with the penalty applied to the ids `seen` in each row."""
        penalized = torch.where(logits < 0, logits * self.penalty, logits / self.penalty)
        return torch.where(seen, penalized, logits)

    @staticmethod
    def observe(seen: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """`seen` with each row's new `token` added."""
        return seen.scatter(1, token[:, None], True)
