"""``python -m workbench eval --rewards NAME[,NAME]``: a model's rewards and accuracy on prompts with answers.

``eval --model DIR --data FILE --rewards math_answer[,format]`` reads FILE's records as GRPO reads
prompts (`workbench.data.prompts`; ``math-sample`` evaluates that sample's held-out split: the one
`workbench.data.records.split_eval` holds out for a run with the same ``data.eval_fraction`` and
``train.seed``), generates one greedy completion per prompt (`workbench.generate.generate`:
prompts bucketed, ``train.batch_size`` rows a batch, on the device ``train.device_type`` picks) and
scores them with the reward functions (`workbench.rl.rewards.RewardSet`, as a GRPO run's eval does).
It prints each reward's mean, the mean total, and the accuracy: the share of the completions
``math_answer`` scored that it scored 1.0. ``--json`` prints one object instead. A completion no
function scored (each returned None or NaN) is left out of every mean, as in a GRPO run.

What it refuses, in one ``error:`` line naming ``--data`` and ``--rewards`` (`eval_words`): a bad
reward name (before anything loads), records without the ``answer`` column when ``math_answer`` is
among the rewards (before the model loads: it would score nothing; exit 2), a reward function that
raises or returns what is not a reward (its name, the user's ``file:line`` and the prompt; exit 1),
and rewards that scored no completion at all (exit 1: nothing was measured).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import traceback
from typing import Any

from workbench.backend.hardware import HardwareError
from workbench.eval_setup import _print_notice, eval_defaults, eval_words
from workbench.run import EXIT_CANNOT_START, EXIT_FAILED, EXIT_OK, notices_as_lines


def run_reward_eval(args: argparse.Namespace) -> int:
    """Run ``eval --rewards`` for parsed `args`; returns the exit code (0, 1 failed, 2 could not start)."""
    from workbench.rl.rewards import RewardError

    try:
        with notices_as_lines(eval_words):
            setup = _set_up(args)
    except (ValueError, OSError, HardwareError) as err:
        print(f"error: {eval_words(' '.join(str(err).split()))}", file=sys.stderr)
        return EXIT_CANNOT_START
    try:
        with notices_as_lines(eval_words):
            report = _evaluate(**setup)
    except RewardError as err:  # the line names the function, the user's file:line and the prompt
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as err:
        traceback.print_exc()
        print(f"error: evaluating failed: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_FAILED
    if report["reward_mean"] is None:
        print(
            f"error: --rewards {','.join(report['rewards'])} scored none of the {report['prompts']:,} "
            f"completions of --data {args.data!r} (each function returned None or NaN for each): nothing "
            "was measured",
            file=sys.stderr,
        )
        return EXIT_FAILED
    report.update(data=args.data, model=setup["described"])
    print(json.dumps(report) if args.json else _lines(report))
    return EXIT_OK


def _set_up(args: argparse.Namespace) -> dict[str, Any]:
    """The model on its device, the prompts, the reward functions: everything that can refuse to start."""
    import torch

    from workbench.backend.hardware import detect
    from workbench.backend.xla import runtime
    from workbench.data.math_sample import MATH_SAMPLE
    from workbench.data.prompts import build_prompts, load_prompts
    from workbench.data.records import split_eval
    from workbench.model_dirs import resolve_model_dir
    from workbench.models.attention_choice import choose_attention, use_attention
    from workbench.rl.rewards import RewardSet, resolve_reward_funcs
    from workbench.train.start import load_for_inference

    specs = [s.strip() for s in str(args.rewards).split(",") if s.strip()]
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens={args.max_new_tokens} is not allowed: must be >= 1")
    model_dir = resolve_model_dir(args.model, base=args.base, field="--model", notice=_print_notice)
    defaults = eval_defaults(args, model_dir)
    keep_split = args.data == MATH_SAMPLE  # its held-out split; a file is evaluated whole
    cfg = defaults.with_overrides(
        [f"data.source={args.data}", *([] if keep_split else ["data.eval_fraction=0"]), *args.overrides]
    )
    rewards = RewardSet(resolve_reward_funcs(specs, cfg.grpo, field="--rewards"))
    records = load_prompts(cfg.data)  # the data's errors before a model loads
    if "math_answer" in rewards.names and "answer" not in records.column_names:
        raise ValueError(
            f"--data {args.data!r} has no 'answer' column, which --rewards math_answer compares each "
            f"completion with (its columns: {', '.join(records.column_names)}): nothing would be scored; "
            "name yours with data.columns={answer: YOUR_COLUMN}"
        )
    model, tokenizer = load_for_inference(model_dir.path, base=args.base)
    prompts = build_prompts(cfg, tokenizer, reward_names=specs, records=records)
    if keep_split:
        _, held_out = split_eval(prompts, cfg.data.eval_fraction, cfg.train.seed)
        prompts = held_out if held_out is not None else prompts
    if len(prompts) == 0:
        raise ValueError(f"--data {args.data!r} gave no prompts after tokenisation")
    max_new_tokens = args.max_new_tokens or cfg.grpo.max_completion_length
    hw = detect(cfg.train.device_type)
    longest = max(prompts["length"]) + max_new_tokens
    to_stderr = functools.partial(print, file=sys.stderr)
    use_attention(
        model, choose_attention(cfg.model.attention, hw, seq_len=longest, notice=to_stderr, model=model)
    )
    model.to(runtime.device() if hw.via_xla else torch.device(hw.backend))
    return {
        "model": model,
        "tokenizer": tokenizer,
        "prompts": prompts,
        "rewards": rewards,
        "max_new_tokens": max_new_tokens,
        "batch_size": cfg.train.batch_size,
        "described": model_dir.describe(),
    }


def _evaluate(
    model: Any,
    tokenizer: Any,
    prompts: Any,
    rewards: Any,
    max_new_tokens: int,
    batch_size: int,
    described: str,
) -> dict[str, Any]:
    """Greedy completions of every prompt, scored: the report's figures."""
    import numpy as np

    from workbench.generate import generate
    from workbench.rl.rewards import reward_inputs

    rows = list(prompts)
    result = generate(
        model,
        [r["input_ids"] for r in rows],
        tokenizer=tokenizer,
        max_new_tokens=max_new_tokens,
        max_batch_size=batch_size,
    )
    prompt_values, columns = reward_inputs(rows, completion_ids=result.token_ids)
    scores = rewards.score(prompt_values, result.texts or [], columns)
    report: dict[str, Any] = {
        "prompts": len(rows),
        "rewards": {name: _finite(value) for name, value in scores.per_function.items()},
        "reward_mean": _finite(scores.mean),
        "accuracy": None,
        "correct": None,
        "answered": None,
        "completion_length": sum(len(t) for t in result.token_ids) / len(rows),
        "max_new_tokens": max_new_tokens,
        "tokens_per_s": result.tokens_per_s,
    }
    if "math_answer" in rewards.names:
        column = scores.table[:, rewards.names.index("math_answer")]
        scored = column[~np.isnan(column)]  # completions of prompts with an answer
        report["correct"], report["answered"] = int((scored == 1.0).sum()), len(scored)
        report["accuracy"] = report["correct"] / len(scored) if len(scored) else None
    return report


def _finite(value: float) -> float | None:
    """A mean for the report: None when nothing was scored (JSON has no nan)."""
    return None if math.isnan(value) else float(value)


def _lines(report: dict[str, Any]) -> str:
    """The report as lines: one per reward, then the total and the accuracy."""

    def shown(value: float | None) -> str:
        return "n/a (nothing scored)" if value is None else f"{value:.4f}"

    width = max(len(name) for name in report["rewards"])
    lines = [f"eval rewards on {report['prompts']:,} prompts of {report['data']}"]
    lines += [f"  {name:<{width}}  {shown(value)}" for name, value in report["rewards"].items()]
    lines.append(f"  reward mean (weighted sum)  {shown(report['reward_mean'])}")
    if report["accuracy"] is not None:
        lines.append(
            f"  accuracy {report['accuracy']:.4f} ({report['correct']} of {report['answered']} right)"
        )
    lines.append(
        f"  completions: {report['completion_length']:.1f} tokens on average "
        f"(at most {report['max_new_tokens']}), greedy\n  model {report['model']}"
    )
    return "\n".join(lines)
