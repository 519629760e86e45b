"""What both ``eval`` commands start from: the config a model directory is evaluated under, and their notice line.

``python -m workbench eval`` (`workbench.eval_command`: the loss) and ``eval --rewards``
(`workbench.eval_rewards`: rewards and accuracy) read a model directory the same way: `eval_defaults`
is ``--config``'s config, else the defaults with, for a training checkpoint, how its run read text; a
notice of either (a damaged checkpoint skipped) is one ``notice:`` line on stderr.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

_READ_AS_TRAINED = ("max_length", "text_field", "chat", "tokenizer_path", "tokenizer_vocab_size")
"""The ``data.*`` settings of a checkpoint's run that `eval` keeps: how text became tokens."""


def eval_defaults(args: argparse.Namespace, model_dir: Any) -> Any:
    """The config ``eval`` starts from: ``--config``'s, else the defaults with, for a training
    checkpoint, how its run read text (`_READ_AS_TRAINED`)."""
    from workbench.config import WorkbenchConfig, load_config

    defaults = load_config(args.config) if args.config else WorkbenchConfig()
    if model_dir.kind == "checkpoint" and not args.config and model_dir.run_config:
        # how the run read its text, not which file it read: its columns and filter fit its own data
        saved = model_dir.run_config.get("data", {})
        defaults.data = WorkbenchConfig.from_dict(
            {"data": {k: saved[k] for k in _READ_AS_TRAINED if k in saved}}
        ).data
    return defaults


_EVAL_WORDS = (
    (re.compile(r"\btrain\.objective=grpo\b"), "eval --rewards"),
    (re.compile(r"\btrain\.objective=\w+ (reads|needs)\b"), r"eval \1"),
    (re.compile(r"\bdata\.source="), "--data "),
    (re.compile(r"\bdata\.source\b"), "--data"),
    (re.compile(r"\bgrpo\.reward_funcs\b"), "--rewards"),
)
"""The training settings `eval` stands for by its flags: what the data and reward layers name, reworded."""


def eval_words(message: str) -> str:
    """`message` (an error or notice of the data or reward layer, written for ``train``) in ``eval``'s own
    terms: ``--data`` for ``data.source``, ``--rewards`` for ``grpo.reward_funcs`` and
    ``train.objective=grpo``; the user typed the flags, not the settings."""
    for pattern, words in _EVAL_WORDS:
        message = pattern.sub(words, message)
    return message


def _print_notice(message: str) -> None:
    """A notice of this read-only command (a damaged checkpoint skipped): one ``notice:`` line on stderr."""
    print(f"notice: {eval_words(message)}", file=sys.stderr)
