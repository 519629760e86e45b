"""Completions you can read: a GRPO run's sampled completions, with their rewards, kept at each log step.

With ``grpo.log_completions`` (TRL's name) each rollout keeps its first
``grpo.num_completions_to_print`` completions (all of them when null; a group's completions stay
together) as rows (`completion_rows`), from what the host already holds after scoring: the prompts
(`workbench.rl.prompt_loader.PromptColumns`), the completion tokens the rollout read (decoded here,
the kept ones only), each reward function's value, the weighted total and the advantage. No device
read is added. At a log step the interval's last rollout's rows become the metrics' ``completions``
(`workbench.analysis.metrics.RunMetrics`), which the dashboard shows as a table and `CompletionsLog`
(a trainer callback) appends to a JSONL file, one row a line::

    {"step": 5, "group": 0, "prompt": "...", "completion": "...", "rewards": {"math_answer": 1.0,
     "format": 0.0}, "reward": 1.0, "advantage": 0.82, "clipped": false}

``reward`` is null where no function scored the completion (each returned None or NaN), a
function's value null where it skipped it. From the command line the file lies beside
``--metrics-out FILE`` (``FILE`` without its ``.json``, plus ``.completions.jsonl``), else in
``train.checkpoint_dir`` (``completions.jsonl``): `completions_path`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

COMPLETIONS_FILE = "completions.jsonl"
"""The file's name in ``train.checkpoint_dir`` when no ``--metrics-out`` is given."""


def _number(value: Any) -> float | None:
    """A float for JSON: None for nan (unscored) or None."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def completion_rows(
    prompts: Sequence[Any],
    texts: Sequence[str],
    names: Sequence[str],
    table: np.ndarray,
    total: np.ndarray,
    advantages: np.ndarray,
    finished: Sequence[bool],
    num_generations: int,
) -> list[dict[str, Any]]:
    """One row per completion (in rollout order, `num_generations` to a group): the prompt as the record
    gives it, the text, each function's value (`names`, the columns of `table`), the total, the
    advantage and whether it was cut at the budget (not `finished`)."""
    return [
        {
            "group": i // num_generations,
            "prompt": prompt,
            "completion": text,
            "rewards": {name: _number(table[i, j]) for j, name in enumerate(names)},
            "reward": _number(total[i]),
            "advantage": float(advantages[i]),
            "clipped": not bool(finished[i]),
        }
        for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True))
    ]


def rollout_sample(
    rollouts: Any,
    indices: Sequence[int],
    token_ids: Sequence[Sequence[int]],
    scores: Any,
    advantages: np.ndarray,
    finished: Sequence[bool],
) -> tuple[dict[str, Any], ...]:
    """The rows a rollout keeps under ``grpo.log_completions`` (none without it): the first
    ``grpo.num_completions_to_print`` of `token_ids` (dataset `indices`, one per row), decoded with
    `rollouts`' tokenizer, their prompts from its `PromptColumns`, their `scores` and `advantages`."""
    grpo = rollouts.grpo
    if not getattr(grpo, "log_completions", False):
        return ()
    keep = min(len(token_ids), int(grpo.num_completions_to_print or len(token_ids)))
    prompts, _ = rollouts.columns.rows(list(indices[:keep]))
    texts = [rollouts.tokenizer.decode(ids, skip_special_tokens=True) for ids in token_ids[:keep]]
    return tuple(
        completion_rows(
            prompts,
            texts,
            rollouts.rewards.names,
            np.asarray(scores.table)[:keep],
            np.asarray(scores.total)[:keep],
            np.asarray(advantages)[:keep],
            list(finished)[:keep],
            int(grpo.num_generations),
        )
    )


def completions_path(metrics_out: str | None, checkpoint_dir: str | None) -> Path | None:
    """Where the command line writes a run's completions: beside ``--metrics-out FILE``
    (``FILE.completions.jsonl``, its ``.json`` dropped), else in ``train.checkpoint_dir``; None without either."""
    if metrics_out:
        out = Path(metrics_out)
        stem = out.name[: -len(".json")] if out.name.endswith(".json") else out.name
        return out.with_name(f"{stem}.completions.jsonl")
    if checkpoint_dir:
        return Path(checkpoint_dir) / COMPLETIONS_FILE
    return None


class CompletionsLog:
    """A trainer callback appending each metrics dict's ``completions`` to a JSONL file, one row a line.

    The first write of a run keeps only the rows of steps up to `start_step` (a resumed run's
    earlier steps) and drops the rest (a run that starts again replaces them), so the file holds one
    run's rows; then each log step's rows are appended and flushed, so the file can be followed
    while the run goes on."""

    def __init__(self, path: str | os.PathLike[str], *, start_step: int = 0) -> None:
        self.path = Path(path)
        self.start_step = int(start_step)
        self.rows_written = 0
        self._started = False

    def __call__(self, metrics: Mapping[str, Any]) -> None:
        rows = metrics.get("completions") or []
        if not rows:
            return
        if not self._started:
            self._start()
        with self.path.open("a", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            out.flush()
        self.rows_written += len(rows)

    def _start(self) -> None:
        """The file with only the rows this run keeps (an earlier run's later steps dropped)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept: list[str] = []
        if self.path.exists() and self.start_step > 0:
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    step = json.loads(line).get("step")
                except (ValueError, AttributeError):
                    continue
                if isinstance(step, int) and step <= self.start_step:
                    kept.append(line)
        partial = self.path.with_name(f".{self.path.name}.partial")
        partial.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        os.replace(partial, self.path)
        self._started = True
