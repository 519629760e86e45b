"""What the training dashboard draws: its panels, their traces, how each reads the metrics contract,
and the figure's layout for the panels shown.

Every run draws six panels in a 3 x 2 grid. An objective with figures of its own adds two rows
below them (`EXTRA_PANELS`): preference tuning (``train.objective: dpo``) its reward accuracy,
reward margin and log-prob panels, GRPO (``train.objective: grpo``) its reward (mean, a band of
one standard deviation, eval points), the reward of each function, the completion length, and the
policy update's clip ratio, KL, share of groups without signal and share of completions cut at the
budget. A run's rollout and training time
per step join the step-time panel and its rollout tokens/s the throughput panel, as traces that stay
out of the legend in any other run. `widgets.dashboard.Dashboard` holds the data and the live plot.

A trace reads one key of `workbench.analysis.metrics.RunMetrics` (the getters below). GRPO's
per-function rewards come as one dict (``rewards``), whose names a figure cannot know at creation
(a plot's traces are fixed then): `REWARD_SLOTS` traces are reserved, each named ``reward/<name>``
by the dashboard as the functions appear.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any, Literal

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.analysis.metrics import GRPO_KEYS, PREFERENCE_KEYS, RunMetrics
from workbench.units import GiB

Extra = Literal["preference", "grpo"]
"""The objective whose panels join the six: preference tuning's or GRPO's."""

# (panel title, row, col) in a 3 x 2 grid; an objective's panels add rows 4 and 5 (preference tuning's
# last panel spans both columns).
PANELS: dict[str, tuple[str, int, int]] = {
    "tokens_per_s": ("Throughput (real tokens/s)", 1, 1),
    "mfu": ("MFU (% of peak bf16)", 1, 2),
    "step_time": ("Step time (s)", 2, 1),
    "loss": ("Loss", 2, 2),
    "compiles": ("Compiles per log interval (XLA programs, torch.compile graphs)", 3, 1),
    "memory": ("Memory (GiB)", 3, 2),
    "reward_accuracy": ("Reward accuracy (chosen rewarded above rejected)", 4, 1),
    "reward_margin": ("Reward margin (chosen - rejected)", 4, 2),
    "logps": ("Log-prob of the chosen and rejected answers (policy)", 5, 1),
    "reward": ("Reward (mean ± std over completions)", 4, 1),
    "reward_functions": ("Reward of each function (mean)", 4, 2),
    "completion_length": ("Completion length (mean tokens)", 5, 1),
    "policy": ("Clip ratio, KL, groups without signal, completions cut", 5, 2),
}
EXTRA_PANELS: dict[str, tuple[str, ...]] = {
    "preference": ("reward_accuracy", "reward_margin", "logps"),
    "grpo": ("reward", "reward_functions", "completion_length", "policy"),
}
"""Each objective's own panels, shown below the six."""
REWARD_SLOTS = 6
"""Reward functions drawn one trace each on the per-function panel; more are in the history only."""
_EVAL_MARKER = {"mode": "markers", "marker": {"symbol": "diamond", "size": 9, "color": "#d62728"}}
_HIDDEN_LINE = {"mode": "lines", "line": {"width": 0}, "marker": {"size": 0}, "hoverinfo": "skip"}
_REWARD_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")

# trace name -> (panel, how to read its y value from a metrics dict, trace kwargs)
_Getter = Callable[[RunMetrics], Any]
_MemoryKey = Literal["device_memory_bytes", "device_memory_limit_bytes", "host_rss_bytes"]


def _gib(key: _MemoryKey) -> _Getter:
    def read(m: RunMetrics) -> float | None:
        value = m.get(key)
        return None if value is None else value / GiB

    return read


def _pct(m: RunMetrics) -> float | None:
    value = m.get("mfu")
    return None if value is None else 100.0 * value


def is_recompile(m: RunMetrics) -> bool:
    """Whether the interval of `m` compiled a program after warm-up."""
    # `recompiled` says the run has compiled since warm-up; the marker goes on the intervals
    # that actually compiled something (the flag may stay set for the rest of the run).
    return bool(m.get("recompiled")) and bool(m.get("compiles"))


def _recompile_y(m: RunMetrics) -> int | None:
    return m.get("compiles") if is_recompile(m) else None


def _reward_band(sign: int) -> _Getter:
    """The reward's mean plus (1) or minus (-1) its standard deviation, the band's edge."""

    def read(m: RunMetrics) -> float | None:
        mean, std = m.get("reward_mean"), m.get("reward_std")
        return None if mean is None or std is None else mean + sign * std

    return read


def reward_slot(index: int) -> str:
    """The trace name of the `index`-th reward function's slot (named ``reward/<name>`` when drawn)."""
    return f"reward function {index + 1}"


def _no_value(m: RunMetrics) -> None:
    """A reward slot's getter: the dashboard reads the slot's function by name (`Dashboard._ingest`)."""
    return None


TRACES: dict[str, tuple[str, _Getter, dict[str, Any]]] = {
    "tokens/s": ("tokens_per_s", lambda m: m.get("tokens_per_s"), {"line": {"color": "#1f77b4"}}),
    "rollout tokens/s": (
        "tokens_per_s",
        lambda m: m.get("rollout_tokens_per_s"),
        {"line": {"color": "#2ca02c", "dash": "dot"}},
    ),
    "MFU %": ("mfu", _pct, {"line": {"color": "#9467bd"}}),
    "step time": ("step_time", lambda m: m.get("step_time_s"), {"line": {"color": "#ff7f0e"}}),
    "rollout": ("step_time", lambda m: m.get("rollout_s"), {"line": {"color": "#2ca02c", "dash": "dot"}}),
    "training": ("step_time", lambda m: m.get("train_s"), {"line": {"color": "#1f77b4", "dash": "dot"}}),
    "train loss": ("loss", lambda m: m.get("loss"), {"line": {"color": "#2ca02c"}}),
    "eval loss": ("loss", lambda m: m.get("eval_loss"), _EVAL_MARKER),
    "compiles": ("compiles", lambda m: m.get("compiles"), {"line": {"color": "#7f7f7f"}}),
    "recompilation": (
        "compiles",
        _recompile_y,
        {"mode": "markers", "marker": {"symbol": "x", "size": 12, "color": "#d62728"}},
    ),
    "device memory": ("memory", _gib("device_memory_bytes"), {"line": {"color": "#17becf"}}),
    "device limit": (
        "memory",
        _gib("device_memory_limit_bytes"),
        {"mode": "lines", "line": {"color": "#d62728", "dash": "dash"}},
    ),
    "host RSS": ("memory", _gib("host_rss_bytes"), {"line": {"color": "#bcbd22"}}),
    "reward accuracy": (
        "reward_accuracy",
        lambda m: m.get("reward_accuracy"),
        {"line": {"color": "#8c564b"}},
    ),
    "eval reward accuracy": ("reward_accuracy", lambda m: m.get("eval_reward_accuracy"), _EVAL_MARKER),
    "reward margin": ("reward_margin", lambda m: m.get("reward_margin"), {"line": {"color": "#e377c2"}}),
    "eval reward margin": ("reward_margin", lambda m: m.get("eval_reward_margin"), _EVAL_MARKER),
    "chosen log-prob": ("logps", lambda m: m.get("chosen_logp"), {"line": {"color": "#1f77b4"}}),
    "rejected log-prob": ("logps", lambda m: m.get("rejected_logp"), {"line": {"color": "#ff7f0e"}}),
    # the band first (its lower edge, then the upper one filled down to it), the mean over it
    "reward - std": ("reward", _reward_band(-1), {**_HIDDEN_LINE, "showlegend": False}),
    "reward ± std": (
        "reward",
        _reward_band(1),
        {**_HIDDEN_LINE, "fill": "tonexty", "fillcolor": "rgba(140,86,75,0.2)"},
    ),
    "reward mean": ("reward", lambda m: m.get("reward_mean"), {"line": {"color": "#8c564b"}}),
    "eval reward mean": ("reward", lambda m: m.get("eval_reward_mean"), _EVAL_MARKER),
    **{
        reward_slot(i): ("reward_functions", _no_value, {"line": {"color": _REWARD_COLORS[i]}})
        for i in range(REWARD_SLOTS)
    },
    "completion length": (
        "completion_length",
        lambda m: m.get("completion_length"),
        {"line": {"color": "#17becf"}},
    ),
    "clip ratio": ("policy", lambda m: m.get("clip_ratio"), {"line": {"color": "#d62728"}}),
    "KL": ("policy", lambda m: m.get("kl"), {"line": {"color": "#9467bd"}}),
    "zero-std groups": ("policy", lambda m: m.get("zero_std_groups"), {"line": {"color": "#7f7f7f"}}),
    "clipped completions": (
        "policy",
        lambda m: m.get("clipped_ratio"),
        {"line": {"color": "#ff7f0e", "dash": "dot"}},
    ),
}
"""Every trace of the figure, in drawing order, by name."""

REWARD_SLOT_NAMES = tuple(reward_slot(i) for i in range(REWARD_SLOTS))


def _recompile_text(m: RunMetrics) -> str:
    """Hover text of a recompilation marker: each compile after warm-up and why it happened."""
    steps = m.get("recompile_steps") or []
    causes = m.get("recompile_causes") or []
    lines = [
        f"step {step}: {causes[i] if i < len(causes) else 'cause not recorded'}"
        for i, step in enumerate(steps)
    ]
    if not lines:
        lines = [f"{m.get('compiles')} program(s) compiled after warm-up; cause not recorded"]
    return "<br>".join(html.escape(line).replace("\n", "<br>") for line in lines)


# Traces whose hover text explains each point, and traces too rare to decimate (every point drawn).
HOVER_TEXT: dict[str, Callable[[RunMetrics], str]] = {"recompilation": _recompile_text}
EVERY_POINT = frozenset(
    {"recompilation", "eval loss", "eval reward accuracy", "eval reward margin", "eval reward mean"}
)

MFU_UNKNOWN = "MFU unknown on this hardware (no published peak FLOP/s)"


def axis_suffix(panel: str) -> str:
    """The suffix of `panel`'s axes in the layout ('' for the first panel, '2', ...)."""
    _, row, col = PANELS[panel]
    index = (row - 1) * 2 + col
    return "" if index == 1 else str(index)


def panels_of(extra: Extra | None) -> list[str]:
    """The panels of the figure: the six of every run, and the objective's own when shown."""
    shown = EXTRA_PANELS.get(extra or "", ())
    return [p for p in PANELS if PANELS[p][1] <= 3 or p in shown]


def base_look(title: str, extra: Extra | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The figure's layout and one style dict per trace (in `TRACES` order), without data.

    The traces of panels not shown stay in the figure (a plot's traces are fixed at its creation)
    but invisible, parked on the loss panel's axes: the grid is the six panels alone, or with `extra`'s.
    """
    panels = panels_of(extra)
    rows = 5 if extra else 3
    specs = [[{}, {}]] * 4 + [[{"colspan": 2}, None]] if extra == "preference" else None
    base = make_subplots(
        rows=rows,
        cols=2,
        specs=specs,
        subplot_titles=[PANELS[p][0] for p in panels],  # row by row, as the subplots are numbered
        vertical_spacing=0.06 if extra else 0.1,
        horizontal_spacing=0.08,
    )
    for name, (panel, _, style) in TRACES.items():
        shown = panel in panels
        _, row, col = PANELS[panel if shown else "loss"]
        kwargs = {"mode": "lines+markers", "marker": {"size": 5}, **style}
        if name in HOVER_TEXT:
            kwargs["hovertemplate"] = f"%{{text}}<extra>{name}</extra>"
        if not shown:
            kwargs["visible"] = False
        base.add_trace(go.Scatter(x=[], y=[], name=name, **kwargs), row=row, col=col)
    base.update_layout(
        title={"text": title, "x": 0.01},
        height=1250 if extra else 780,
        margin={"l": 55, "r": 20, "t": 70, "b": 40},
        legend={"orientation": "h", "y": -0.04 if extra else -0.06},
        template="plotly_white",
    )
    for panel in panels:
        _, row, col = PANELS[panel]
        base.update_xaxes(title_text="step" if row == rows else None, row=row, col=col)
    # Throughput, time, compiles, memory and lengths read best against zero (a 5% wobble is not a cliff).
    for panel in ("tokens_per_s", "step_time", "compiles", "memory", "completion_length"):
        if panel in panels:
            _, row, col = PANELS[panel]
            base.update_yaxes(rangemode="tozero", row=row, col=col)
    if extra == "preference":
        # A share of pairs, against chance (0.5); a margin against no preference at all (0).
        _, row, col = PANELS["reward_accuracy"]
        base.update_yaxes(range=[-0.02, 1.02], tickformat=".0%", row=row, col=col)
        for panel, y in (("reward_accuracy", 0.5), ("reward_margin", 0.0)):
            _, row, col = PANELS[panel]
            base.add_hline(y=y, line={"color": "#999", "width": 1, "dash": "dot"}, row=row, col=col)
    spec = base.to_plotly_json()
    styles = [{k: v for k, v in trace.items() if k not in ("x", "y")} for trace in spec["data"]]
    return spec["layout"], styles


def extra_of(m: RunMetrics) -> Extra | None:
    """The objective whose figures a metrics dict carries: 'preference', 'grpo' or None (SFT: all None)."""
    if any(m.get(key) is not None for key in PREFERENCE_KEYS):
        return "preference"
    if any(m.get(key) is not None for key in GRPO_KEYS):
        return "grpo"
    return None
