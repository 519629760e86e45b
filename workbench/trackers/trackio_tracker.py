"""trackio: a local-first tracker (SQLite under ``TRACKIO_DIR``, else ``HF_HOME/trackio``) with W&B's calls.

The run goes to the project ``TRACKIO_PROJECT`` (default ``xla-workbench``) under the run's name, with
the resolved config; GRPO's completions as a ``trackio.Table``. Nothing leaves the machine unless the
user syncs the project (``trackio.sync``); ``trackio show`` opens the dashboard.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workbench.trackers.base import project, require_tracker


class TrackioTracker:
    name = "trackio"

    def __init__(self, name: str, config: Mapping[str, Any]) -> None:
        self.trackio = require_tracker("trackio", "trackio")
        self.project = project("TRACKIO_PROJECT")
        self.run_name = name
        self.run = self.trackio.init(project=self.project, name=name, config=dict(config), embed=False)

    def log(self, scalars: Mapping[str, float], texts: Mapping[str, str], step: int) -> None:
        self.trackio.log(dict(scalars), step=step)

    def log_table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        table = self.trackio.Table(columns=list(columns), data=[list(r) for r in rows])
        self.trackio.log({key: table}, step=step)

    def finish(self) -> str | None:
        self.trackio.finish()
        from trackio.utils import TRACKIO_DIR

        return f"{TRACKIO_DIR} (project {self.project}, run {self.run_name}; trackio show to see it)"
