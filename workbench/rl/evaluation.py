"""GRPO's held-out eval: greedy completions of the eval prompts, scored by the run's own rewards.

A GRPO run has no held-out loss worth reading (the loss of a batch is relative to its group): its
eval asks what the policy answers when it does not sample. `evaluate_rewards` runs each eval prompt
once, greedy, through the rollout's sampler (`Rollouts.sample`: the same live model, prompt buckets
and row count as the training rollouts, so its programs are few and warmed up with them), reads each
batch's completions in one transfer and scores them with the run's `RewardSet`. The result is an
`EvalLoss` (a float, as every eval here) whose value is the mean total reward, with ``stats``
``reward_mean`` (the contract's ``eval_reward_mean``) and ``reward/<name>`` per function. The
functions are ``grpo.eval_reward_funcs`` when set (the eval rollouts' own `RewardSet`), so a run
trained on format + answer can be judged on the answer alone. A completion no function scored
(each returned None or NaN) is left out of the means, as in training and ``eval --rewards``; a mean
of nothing is nan ("n/a").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from workbench.train.step import EvalLoss


def evaluate_rewards(rollouts: Any, batches: Iterable[dict], *, max_batches: int | None = None) -> EvalLoss:
    """The mean reward of greedy completions of the prompts in `batches` (`PromptCollator`'s, host;
    filler rows are sampled for the shape and not scored), with each function's mean in ``.stats``."""
    totals: list[np.ndarray] = []
    tables: list[np.ndarray] = []
    names: list[str] = list(rollouts.rewards.names)
    for i, host in enumerate(batches):
        if max_batches is not None and i >= max_batches:
            break
        rollout = rollouts.sample(host["input_ids"], host["attention_mask"], 0, greedy=True)
        token_ids, _ = rollouts.completions(rollout)  # the batch's one read
        real = [r for r, filler in enumerate(host["filler"].tolist()) if not filler]
        if not real:
            continue
        indices = host["index"].tolist()
        scores = rollouts.score([indices[r] for r in real], [token_ids[r] for r in real])
        totals.append(np.asarray(scores.total, dtype=np.float64))  # nan: unscored, left out below
        tables.append(np.asarray(scores.table, dtype=np.float64))
    if not totals:
        raise ValueError("the eval split gave no prompt to complete")
    total, table = np.concatenate(totals), np.concatenate(tables)
    scored = total[~np.isnan(total)]
    mean = float(scored.mean()) if scored.size else math.nan
    stats = {"reward_mean": mean}
    for j, name in enumerate(names):
        column = table[:, j]
        values = column[~np.isnan(column)]
        stats[f"reward/{name}"] = float(values.mean()) if values.size else math.nan
    return EvalLoss(mean, stats)
