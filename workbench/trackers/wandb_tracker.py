"""Weights & Biases, without ever prompting: online with a key, otherwise offline with its files named.

A key comes from ``WANDB_API_KEY`` or a ``wandb login`` earlier (its netrc entry); without one the run
is offline (``WANDB_MODE`` set by the user is kept as it is) and the finish line names its directory and
the ``wandb sync`` line that uploads it later. A notebook under papermill has nobody to answer a prompt,
so the login prompt is never reached. Files go under ``train.logging_dir``; the project is
``WANDB_PROJECT`` (default ``xla-workbench``); GRPO's completions are a ``wandb.Table``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.trackers.base import project, require_tracker


def has_key() -> bool:
    """Whether W&B has a key here without asking: ``WANDB_API_KEY`` or a netrc entry from ``wandb login``."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import netrc

        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbTracker:
    name = "wandb"

    def __init__(self, name: str, config: Mapping[str, Any], directory: Path) -> None:
        self.wandb = require_tracker("wandb", "wandb")
        directory.mkdir(parents=True, exist_ok=True)
        mode = os.environ.get("WANDB_MODE") or ("online" if has_key() else "offline")
        self.offline = mode in ("offline", "dryrun")
        self.run = self.wandb.init(
            project=project("WANDB_PROJECT"),
            name=name,
            config=dict(config),
            dir=str(directory),
            mode=mode,
            settings=self.wandb.Settings(silent=True, console="off"),
        )

    def log(self, scalars: Mapping[str, float], texts: Mapping[str, str], step: int) -> None:
        self.run.log(dict(scalars), step=step)

    def log_table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        self.run.log({key: self.wandb.Table(columns=list(columns), data=[list(r) for r in rows])}, step=step)

    def finish(self) -> str | None:
        where = str(Path(self.run.dir).parent)
        self.run.finish()
        if self.offline:
            return f"{where} (offline, no W&B key here: upload it with wandb sync {where})"
        return str(getattr(self.run, "url", None) or where)
