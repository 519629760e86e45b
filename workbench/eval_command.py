"""`python -m workbench eval`: the loss and perplexity of any model directory on a data file.

``python -m workbench eval --model DIR --data FILE [--base DIR] [--config FILE] [KEY=VALUE ...]``
takes what ``train`` writes (a merged or full model, a LoRA adapter, a training checkpoint:
`workbench.model_dirs`), reads every record of FILE in any format ``train`` reads (`data.format`,
`data.columns`, `data.filter`, ...), and prints the mean next-token loss over the predicted tokens
(chat records: the assistant's) and its perplexity. The run goes through the `Trainer`'s own
evaluation (buckets, the device, the mesh), so the figure is the one ``train`` reports as
``eval loss`` for the same data. A training checkpoint's run settings for reading text (max length,
chat, text field, tokenizer) are the defaults, so the file is tokenised as the run's data was.

With ``--rewards NAME[,NAME]`` it scores completions instead (`workbench.rl.rewards`: built-in
names such as ``math_answer`` and ``format``, or ``module:function``): FILE's records are read as
GRPO reads its prompts (`workbench.data.prompts`: ``prompt`` or GSM8K's ``question`` with an
``answer``; ``math-sample`` in place of a FILE evaluates that sample's held-out split, the one a
run with the same ``data.eval_fraction`` and ``train.seed`` holds out), each prompt gets one greedy
completion of up to ``--max-new-tokens`` tokens (`workbench.generate.generate`: bucketed, batched,
on the device ``train.device_type`` picks), and each reward's mean is printed with the accuracy
(the share of completions ``math_answer`` scores 1.0, when it is among the rewards).

Exit codes: 0 evaluated; 1 failed while evaluating (a reward function that raises, or rewards that
scored no completion: one ``error:`` line); 2 could not start (a bad directory, data file, config,
override or reward name, records without the ``answer`` column ``math_answer`` compares with: one
``error:`` line, no traceback). Errors and notices name the command's own flags (``--data``,
``--rewards``), not the training settings they stand for (`eval_words`).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from typing import Any

from workbench.backend.hardware import HardwareError
from workbench.eval_setup import _print_notice, eval_defaults, eval_words
from workbench.run import EXIT_CANNOT_START, EXIT_FAILED, EXIT_OK, notices_as_lines


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``eval`` sub-command's arguments (`workbench.__main__` owns the parser)."""
    parser.add_argument(
        "--model", required=True, help="a model directory: transformers, adapter or checkpoint"
    )
    parser.add_argument(
        "--data", required=True, metavar="FILE", help="records to evaluate on (any data.format)"
    )
    parser.add_argument("--base", metavar="DIR", help="an adapter's base model (default: the one it records)")
    parser.add_argument("--config", metavar="FILE", help="YAML config for data and device settings")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a line")
    parser.add_argument(
        "--rewards",
        metavar="NAME[,NAME]",
        help="score greedy completions with these reward functions (math_answer, format, length or "
        "module:function) instead of the loss; --data may then be math-sample",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        metavar="N",
        help="with --rewards: tokens generated per prompt (default: grpo.max_completion_length)",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides, e.g. data.max_length=512"
    )


def run_eval_command(args: argparse.Namespace) -> int:
    """Run ``python -m workbench eval`` for parsed `args`; returns the exit code."""
    if getattr(args, "rewards", None) is not None:
        from workbench.eval_rewards import run_reward_eval

        return run_reward_eval(args)
    if getattr(args, "max_new_tokens", None) is not None:
        print(
            "error: --max-new-tokens is read only with --rewards (the loss needs no generation)",
            file=sys.stderr,
        )
        return EXIT_CANNOT_START
    try:
        with notices_as_lines(eval_words):
            trainer, described, examples = _set_up(args)
    except (ValueError, OSError, HardwareError) as err:
        print(f"error: {eval_words(' '.join(str(err).split()))}", file=sys.stderr)
        return EXIT_CANNOT_START
    try:
        loss = trainer.evaluate()
    except Exception as err:
        traceback.print_exc()
        print(f"error: evaluating failed: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_FAILED
    report = {
        "loss": float(loss),
        "perplexity": float(loss.perplexity),
        "examples": examples,
        "data": args.data,
        "model": described,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"eval loss {report['loss']:.4f} (perplexity {report['perplexity']:.2f}) on {examples:,} examples "
            f"of {args.data}\n  model {described}"
        )
    return EXIT_OK


def _set_up(args: argparse.Namespace) -> tuple[Any, str, int]:
    """The model, the records as the eval set, and a `Trainer` to evaluate them with."""
    import torch

    from workbench.data.records import load_records, tokenize_records
    from workbench.model_dirs import resolve_model_dir
    from workbench.train import Trainer
    from workbench.train.start import load_for_inference

    model_dir = resolve_model_dir(args.model, base=args.base, field="--model", notice=_print_notice)
    defaults = eval_defaults(args, model_dir)
    model, tokenizer = load_for_inference(model_dir.path, base=args.base)  # a root's verified step
    # a bf16 checkpoint is evaluated in bf16 (a full fine-tune's fp32 master weights would double it)
    as_loaded = ["train.precision=bf16"] if next(model.parameters()).dtype == torch.bfloat16 else []
    cfg = defaults.with_overrides(
        [
            f"data.source={args.data}",
            "data.eval_fraction=0",
            "train.checkpoint_dir=null",
            "train.prewarm=false",
            *as_loaded,
            *args.overrides,
        ]
    )
    records = tokenize_records(load_records(cfg.data), tokenizer, cfg.data)
    if len(records) == 0:
        raise ValueError(f"--data {args.data!r} gave no usable examples after tokenisation")
    # a distinct view of the same rows as the (unused) training split: the eval loader is the one that
    # batches every example (a training loader leaves each bucket's remainder out)
    trainer = Trainer(
        cfg,
        model=model,
        tokenizer=tokenizer,
        train_dataset=records.select(range(len(records))),
        eval_dataset=records,
    )
    return trainer, model_dir.describe(), len(records)
