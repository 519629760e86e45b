"""TensorBoard: event files under ``train.logging_dir/<run name>`` (torch's ``SummaryWriter``).

Every scalar of an interval at its step, the resolved config as text at step 0, lists (recompile
causes) and tables (GRPO's completions, as a markdown table) as text. Each log step is flushed, so
TensorBoard (``tensorboard --logdir runs``, or ``%tensorboard`` in a notebook) shows a run while it trains.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.trackers.base import require_tracker


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, directory: Path, config: Mapping[str, Any]) -> None:
        module = require_tracker("torch.utils.tensorboard", "tensorboard")
        self.directory = directory
        self.writer = module.SummaryWriter(log_dir=str(directory))
        text = json.dumps(config, indent=1, default=str)
        self.writer.add_text("config", "```\n" + text + "\n```", 0)
        self.writer.flush()

    def log(self, scalars: Mapping[str, float], texts: Mapping[str, str], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        for key, value in texts.items():
            self.writer.add_text(key, value, step)
        self.writer.flush()

    def log_table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns)
        body = "\n".join("| " + " | ".join(_cell(v) for v in row) + " |" for row in rows)
        self.writer.add_text(key, f"{head}\n{body}", step)
        self.writer.flush()

    def finish(self) -> str | None:
        self.writer.close()
        return str(self.directory)


def _cell(value: Any) -> str:
    return " ".join(str(value).split()).replace("|", "\\|")
