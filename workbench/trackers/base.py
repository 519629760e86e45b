"""What every tracker shares: the metrics contract flattened into scalars, the run's name, a missing package named.

`flatten` turns one logged interval (`workbench.analysis.metrics.RunMetrics`) into tracker keys the way
transformers' trackers name them: ``train/<key>``, ``eval/<key>`` for the ``eval_*`` figures, a dict of
figures (GRPO's per-function rewards) as ``train/rewards/<name>``; booleans as 0/1. A value the interval
could not know (None) is not sent. `texts` keeps the lists (recompile causes) for trackers that show text.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

DEFAULT_PROJECT = "xla-workbench"
"""The project (W&B, trackio) a run goes to unless ``WANDB_PROJECT`` / ``TRACKIO_PROJECT`` say otherwise."""


class TrackerMissingError(ValueError):
    """A tracker named in ``train.report_to`` whose package is not installed: the message is its pip line."""


def require_tracker(module: str, extra: str) -> Any:
    """`module` imported, or `TrackerMissingError` naming the install line."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise TrackerMissingError(
            f"train.report_to names {extra}, which needs the {module} package: pip install "
            f"'xla-workbench[{extra}]' (or pip install {module if module != 'torch.utils.tensorboard' else 'tensorboard'})"
        ) from None


class Tracker(Protocol):
    """One tracker's run: opened with the resolved config, fed every log interval, closed once."""

    name: str

    def log(self, scalars: Mapping[str, float], texts: Mapping[str, str], step: int) -> None: ...

    def log_table(
        self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int
    ) -> None: ...

    def finish(self) -> str | None:
        """Close the run; returns where its files are, when that is worth saying."""
        ...


def _tracker_key(key: str) -> str:
    return f"eval/{key.removeprefix('eval_')}" if key.startswith("eval_") else f"train/{key}"


def flatten(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The interval's numbers under tracker keys (see the module's docstring)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = _tracker_key(key)
        if isinstance(value, (bool, int, float)):  # booleans as 0/1
            out[name] = float(value)
        elif isinstance(value, Mapping):
            for sub, inner in value.items():
                if isinstance(inner, (int, float)) and not isinstance(inner, bool) and not _nan(inner):
                    out[f"{name}/{sub}"] = float(inner)
    return out


def _nan(value: float) -> bool:
    return isinstance(value, float) and math.isnan(value)


def texts(metrics: Mapping[str, Any]) -> dict[str, str]:
    """The interval's non-empty lists as text (the recompile steps and their causes)."""
    return {
        _tracker_key(key): "\n".join(str(v) for v in value)
        for key, value in metrics.items()
        if isinstance(value, (list, tuple)) and value
    }


def run_name(cfg: Any) -> str:
    """``train.run_name``, else the objective and the start time (``sft-20261128-143005``)."""
    return cfg.train.run_name or f"{cfg.train.objective}-{time.strftime('%Y%m%d-%H%M%S')}"


def project(env_var: str) -> str:
    return os.environ.get(env_var) or DEFAULT_PROJECT
