"""Trackers a run reports to besides the dashboard: ``train.report_to`` (``none``, ``tensorboard``,
``trackio``, ``wandb``, or a list of them; transformers' names), default ``none``.

`with_trackers` adds a `RunTrackers` to the `Trainer`'s callbacks (on the main process only). At the
first log interval it opens each tracker's run with the resolved config (``train.run_name``, files under
``train.logging_dir``); every interval then goes out whole: each key of the metrics contract
(`workbench.analysis.metrics.METRIC_KEYS`) that has a value, at the interval's step
(`workbench.trackers.base.flatten`). The runs finish at the last step (or when the process ends), each
saying where its files are. Each tracker is an optional extra; one that is not installed stops the run
before training with its ``pip install`` line.

GRPO's completions (``grpo.log_completions``: the metrics key ``completions``, rows of prompt, completion,
rewards, advantage): each interval's rows go out as a table where the tracker has tables (W&B, trackio) and
as a markdown table in TensorBoard's text tab (`RunTrackers.log_completions`, which a caller of its own
may also call).
"""

from __future__ import annotations

import atexit
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.trackers.base import Tracker, TrackerMissingError, flatten, require_tracker, run_name, texts

TRACKERS = ("tensorboard", "trackio", "wandb")
"""The trackers ``train.report_to`` may name (besides ``none``)."""
_MODULES = {"tensorboard": "torch.utils.tensorboard", "trackio": "trackio", "wandb": "wandb"}


def report_to_names(value: str | Sequence[str] | None) -> list[str]:
    """``train.report_to`` as a list of tracker names ('none' and None: [])."""
    names = [value] if isinstance(value, str) else list(value or [])
    return [n for n in dict.fromkeys(str(n).strip() for n in names) if n and n != "none"]


def check_installed(cfg: Any) -> list[str]:
    """The trackers ``train.report_to`` names; `TrackerMissingError` (its pip line) for one not installed."""
    names = report_to_names(cfg.train.report_to)
    for name in names:
        require_tracker(_MODULES[name], name)
    return names


class RunTrackers:
    """A `Trainer` callback that reports every log interval to the trackers ``train.report_to`` names."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.names = check_installed(cfg)  # a missing package stops the run here, before training
        self.trackers: list[Tracker] | None = None
        self.run_name = run_name(cfg)

    def _open(self) -> list[Tracker]:
        from workbench.trackers.tensorboard_writer import TensorBoardTracker
        from workbench.trackers.trackio_tracker import TrackioTracker
        from workbench.trackers.wandb_tracker import WandbTracker

        config, root = self.cfg.to_dict(), Path(self.cfg.train.logging_dir).expanduser()
        makers = {
            "tensorboard": lambda: TensorBoardTracker(root / self.run_name, config),
            "trackio": lambda: TrackioTracker(self.run_name, config),
            "wandb": lambda: WandbTracker(self.run_name, config, root),
        }
        self.trackers = [makers[name]() for name in self.names]
        atexit.register(self.finish)  # a run that stops early (time limit, error) still closes its files
        return self.trackers

    def __call__(self, metrics: Mapping[str, Any]) -> None:
        trackers = self.trackers if self.trackers is not None else self._open()
        step = int(metrics["step"])
        rows = metrics.get("completions") or []  # a table of its own, not a text list
        scalars, lists = flatten(metrics), texts({k: v for k, v in metrics.items() if k != "completions"})
        for tracker in trackers:
            tracker.log(scalars, lists, step)
        self.log_completions(step, rows)
        if step >= self.cfg.train.steps:
            self.finish()

    def log_completions(self, step: int, rows: Sequence[Mapping[str, Any]], key: str = "completions") -> None:
        """GRPO's sampled completions at `step` as a table (columns: the first row's keys)."""
        if not rows:
            return
        trackers = self.trackers if self.trackers is not None else self._open()
        columns = list(rows[0])
        values = [[row.get(c) for c in columns] for row in rows]
        for tracker in trackers:
            tracker.log_table(f"train/{key}", columns, values, step)

    def finish(self) -> None:
        """Close every tracker's run (once), each saying where its files are."""
        trackers, self.trackers = self.trackers, None
        for tracker in trackers or []:
            where = tracker.finish()
            if where:
                warnings.warn(f"train.report_to: {tracker.name} run in {where}", RuntimeWarning, stacklevel=2)


def with_trackers(cfg: Any, callbacks: Sequence[Any]) -> list[Any]:
    """`callbacks` and, when ``train.report_to`` names trackers, the `RunTrackers` reporting to them (on the
    main process of a pod: one run per training run, not one per host)."""
    from workbench.backend import multihost

    if not report_to_names(cfg.train.report_to) or not multihost.is_main():
        return list(callbacks)
    return [*callbacks, RunTrackers(cfg)]


__all__ = [
    "TRACKERS",
    "RunTrackers",
    "TrackerMissingError",
    "report_to_names",
    "with_trackers",
]
