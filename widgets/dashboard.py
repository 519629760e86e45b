"""Live training dashboard: one live plot with six panels (nine under DPO), fed by trainer callbacks.

A `Dashboard` is a callback: pass it to ``Trainer(..., callbacks=[dashboard])`` and it receives
the metrics dict once per log interval: a `RunMetrics` (the contract in
``workbench/analysis/metrics.py``; every key read here is one of its keys). A hand-written loop
may feed `StepProfiler`'s `IntervalMetrics` instead: keys it lacks read as unknown. It keeps
the full history on the Python side and pushes it to the page in throttled, batched updates
(one comm message per flush, at most one flush per ``min_interval_s``), so a fast loop does
not flood the browser.

The six panels: tokens/s, MFU, step time, loss (train and eval), compiles per interval with a
marker at every recompilation after warm-up (its hover text says why it compiled), and
device/host memory. A panel with nothing to show gives its space to a short note instead of
empty axes (MFU without a known peak, device memory on a CPU); traces without points leave the
legend. The status line above it gives the latest step, loss, throughput and compiles and, for a run
with ``train.time_limit``, the time left, the step the run will stop at and how long the last
checkpoint save held the loop.

Preference tuning (``train.objective: dpo``, where the loss panel shows the DPO loss) adds three
panels below the six: reward accuracy and reward margin (train and eval points) and the policy's
log-probs of the chosen and rejected answers; the status line adds the latest reward accuracy and
margin. By default (``preference=None``) they appear with the first metrics dict that carries a
preference figure, so an SFT run's figure is the six panels alone.

The figure is a `widgets.live_plot.LivePlot`, not plotly's `FigureWidget`: each flush travels as
a numbered append-only delta and any page that rendered late or missed one catches up from the
synced state (the reasons are in that module). Long runs stay cheap in the browser: each trace
draws at most ``max_points`` points (bucket minimum and maximum, so spikes survive; every
recompilation and eval point is kept), while the history and the HTML export keep every point.

It works headless (papermill, plain scripts): without a frontend the widget just holds its
state. `export_html` writes a self-contained report from the same figure description, with
plotly.js embedded (no CDN: TPU VMs and this build machine have no network).
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Mapping
from copy import deepcopy
from pathlib import Path
from typing import Any, Literal, cast

import ipywidgets as ipw
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from widgets.live_plot import DecimatedSeries, LivePlot, TraceData
from workbench.analysis.metrics import PREFERENCE_KEYS, RunMetrics
from workbench.units import GiB, format_duration

# (panel title, row, col) in a 3 x 2 grid; preference tuning adds rows 4 and 5 (the last panel spans both columns).
PANELS: dict[str, tuple[str, int, int]] = {
    "tokens_per_s": ("Throughput (real tokens/s)", 1, 1),
    "mfu": ("MFU (% of peak bf16)", 1, 2),
    "step_time": ("Step time (s)", 2, 1),
    "loss": ("Loss", 2, 2),
    "compiles": ("XLA compiles per log interval", 3, 1),
    "memory": ("Memory (GiB)", 3, 2),
    "reward_accuracy": ("Reward accuracy (chosen rewarded above rejected)", 4, 1),
    "reward_margin": ("Reward margin (chosen - rejected)", 4, 2),
    "logps": ("Log-prob of the chosen and rejected answers (policy)", 5, 1),
}
_PREFERENCE_PANELS = ("reward_accuracy", "reward_margin", "logps")
_EVAL_MARKER = {"mode": "markers", "marker": {"symbol": "diamond", "size": 9, "color": "#d62728"}}

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


def _is_recompile(m: RunMetrics) -> bool:
    # `recompiled` says the run has compiled since warm-up; the marker goes on the intervals
    # that actually compiled something (the flag may stay set for the rest of the run).
    return bool(m.get("recompiled")) and bool(m.get("compiles"))


def _recompile_y(m: RunMetrics) -> int | None:
    return m.get("compiles") if _is_recompile(m) else None


_TRACES: dict[str, tuple[str, _Getter, dict[str, Any]]] = {
    "tokens/s": ("tokens_per_s", lambda m: m.get("tokens_per_s"), {"line": {"color": "#1f77b4"}}),
    "MFU %": ("mfu", _pct, {"line": {"color": "#9467bd"}}),
    "step time": ("step_time", lambda m: m.get("step_time_s"), {"line": {"color": "#ff7f0e"}}),
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
}


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
_HOVER_TEXT: dict[str, Callable[[RunMetrics], str]] = {"recompilation": _recompile_text}
_EVERY_POINT = frozenset({"recompilation", "eval loss", "eval reward accuracy", "eval reward margin"})

_MFU_UNKNOWN = "MFU unknown on this hardware (no published peak FLOP/s)"


def _axis_suffix(panel: str) -> str:
    _, row, col = PANELS[panel]
    index = (row - 1) * 2 + col
    return "" if index == 1 else str(index)


def _panels(preference: bool) -> list[str]:
    """The panels of the figure: the six of every run, and the preference ones when shown."""
    return [p for p in PANELS if preference or p not in _PREFERENCE_PANELS]


def _base_look(title: str, preference: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The figure's layout and one style dict per trace (in `_TRACES` order), without data.

    Without `preference` the preference traces stay in the figure (a plot's traces are fixed at its
    creation) but invisible, parked on the loss panel's axes: the grid is the six panels alone.
    """
    panels = _panels(preference)
    rows = 5 if preference else 3
    specs = [[{}, {}]] * 4 + [[{"colspan": 2}, None]] if preference else None
    base = make_subplots(
        rows=rows,
        cols=2,
        specs=specs,
        subplot_titles=[PANELS[p][0] for p in panels],  # row by row, as the subplots are numbered
        vertical_spacing=0.06 if preference else 0.1,
        horizontal_spacing=0.08,
    )
    for name, (panel, _, style) in _TRACES.items():
        shown = panel in panels
        _, row, col = PANELS[panel if shown else "loss"]
        kwargs = {"mode": "lines+markers", "marker": {"size": 5}, **style}
        if name in _HOVER_TEXT:
            kwargs["hovertemplate"] = f"%{{text}}<extra>{name}</extra>"
        if not shown:
            kwargs["visible"] = False
        base.add_trace(go.Scatter(x=[], y=[], name=name, **kwargs), row=row, col=col)
    base.update_layout(
        title={"text": title, "x": 0.01},
        height=1250 if preference else 780,
        margin={"l": 55, "r": 20, "t": 70, "b": 40},
        legend={"orientation": "h", "y": -0.04 if preference else -0.06},
        template="plotly_white",
    )
    for panel in panels:
        _, row, col = PANELS[panel]
        base.update_xaxes(title_text="step" if row == rows else None, row=row, col=col)
    # Throughput, time, compiles and memory read best against zero (a 5% wobble is not a cliff).
    for panel in ("tokens_per_s", "step_time", "compiles", "memory"):
        _, row, col = PANELS[panel]
        base.update_yaxes(rangemode="tozero", row=row, col=col)
    if preference:
        # A share of pairs, against chance (0.5); a margin against no preference at all (0).
        _, row, col = PANELS["reward_accuracy"]
        base.update_yaxes(range=[-0.02, 1.02], tickformat=".0%", row=row, col=col)
        for panel, y in (("reward_accuracy", 0.5), ("reward_margin", 0.0)):
            _, row, col = PANELS[panel]
            base.add_hline(y=y, line={"color": "#999", "width": 1, "dash": "dot"}, row=row, col=col)
    spec = base.to_plotly_json()
    styles = [{k: v for k, v in trace.items() if k not in ("x", "y")} for trace in spec["data"]]
    return spec["layout"], styles


class Dashboard:
    """Training dashboard; call it with each metrics dict (it is a trainer callback).

    Args:
        min_interval_s: at most one figure update per this many seconds; points that arrive in
            between are batched into the next update (`flush()` forces one).
        total_steps: when a metrics dict reaches this step (or the earlier ``planned_stop_step`` a
            time limit sets) the dashboard flushes at once, so the last interval of a run is always
            drawn; the status line says whether a time limit stops the run before it.
        max_points: most points drawn per trace (the history and the export keep everything).
        title: figure title.
        preference: the preference-tuning panels (reward accuracy, reward margin, chosen and
            rejected log-probs). None: shown from the first metrics dict with a preference figure
            (a DPO run), never for an SFT run. True: shown from the start (waiting for data), so a
            DPO run's figure does not grow; False: never shown.
    """

    def __init__(
        self,
        *,
        min_interval_s: float = 0.5,
        total_steps: int | None = None,
        max_points: int = 2000,
        title: str = "XLA Workbench — training",
        preference: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s={min_interval_s!r} is not allowed: must be >= 0")
        if max_points < 10:
            raise ValueError(f"max_points={max_points!r} is not allowed: must be >= 10")
        self.min_interval_s = float(min_interval_s)
        self.total_steps = total_steps
        self.max_points = int(max_points)
        self.title = title
        self.preference = preference
        self._clock = clock
        self.history: list[RunMetrics] = []
        self.flush_count = 0
        self._last_flush: float | None = None
        self._pending = False
        self._series = {
            name: DecimatedSeries(self.max_points, decimate=name not in _EVERY_POINT) for name in _TRACES
        }
        self._ingested = 0
        self._shows_preference = preference is True
        self._base_layout, self._base_styles = _base_look(title, self._shows_preference)
        layout, styles = self._look()
        self.figure = LivePlot(layout, styles, name=title)
        self.status = ipw.HTML(value=self._status_html(), layout=ipw.Layout(margin="0 0 4px 0"))

    @property
    def shows_preference(self) -> bool:
        """Whether the figure has the preference panels now."""
        return self._shows_preference

    def trace(self, name: str) -> TraceData:
        """What the page draws of the trace called `name` (e.g. 'tokens/s', 'recompilation')."""
        if name not in _TRACES:
            raise KeyError(f"no trace named {name!r}; traces: {', '.join(_TRACES)}")
        return self.figure.data[list(_TRACES).index(name)]

    # ---- callback ------------------------------------------------------------------
    def __call__(self, metrics: RunMetrics) -> None:
        if not isinstance(metrics, Mapping):
            raise TypeError(f"Dashboard expects a metrics dict, got {type(metrics).__name__}")
        row = cast(RunMetrics, dict(metrics))  # a copy: the caller may reuse its dict
        if row.get("step") is None:
            row["step"] = self.history[-1]["step"] + 1 if self.history else 0
        self.history.append(row)
        self._pending = True
        now = self._clock()
        due = self._last_flush is None or now - self._last_flush >= self.min_interval_s
        # The run's last step, or the earlier one a time limit stops it at, is drawn at once.
        last = [n for n in (self.total_steps, row.get("planned_stop_step")) if n is not None]
        final = bool(last) and row["step"] >= min(last)
        if due or final:
            self.flush()

    def flush(self) -> None:
        """Send every point received so far to the page in one message (only what changed)."""
        if not self._pending and self.flush_count:
            return
        self._ingest()
        layout, styles = self._look()
        self.figure.update([series.drawn() for series in self._series.values()], layout=layout, styles=styles)
        self.status.value = self._status_html()
        self._pending = False
        self._last_flush = self._clock()
        self.flush_count += 1

    def _ingest(self) -> None:
        """Append the rows received since the last flush to each trace's full series."""
        rows = self.history
        if self._ingested == 0 and rows and (warm := self._warmup_compiles(rows)):
            # Programs compiled before the first interval (prewarm) are drawn at step 0.
            self._series["compiles"].append(0, warm)
        for m in rows[self._ingested :]:
            if self.preference is None and not self._shows_preference and _has_preference(m):
                # A DPO run: the grid grows by the preference panels (a new look, the traces kept).
                self._shows_preference = True
                self._base_layout, self._base_styles = _base_look(self.title, True)
            for name, (_, read, _) in _TRACES.items():
                y = read(m)
                if y is None or (isinstance(y, float) and not math.isfinite(y)):
                    continue
                hover = _HOVER_TEXT.get(name)
                self._series[name].append(int(m["step"]), float(y), hover(m) if hover else None)
        self._ingested = len(rows)

    def _look(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Layout and styles for the data so far: empty panels give their space to a note."""
        layout = deepcopy(self._base_layout)
        notes = list(layout.get("annotations", []))
        styles = []
        filled: set[str] = set()
        panels = _panels(self._shows_preference)
        for style, (name, (panel, _, _)) in zip(self._base_styles, _TRACES.items(), strict=True):
            has_points = len(self._series[name]) > 0 and panel in panels
            styles.append({**style, "showlegend": has_points})
            if has_points:
                filled.add(panel)
        for panel in panels:
            if panel in filled:
                continue
            suffix = _axis_suffix(panel)
            for axis in (f"xaxis{suffix}", f"yaxis{suffix}"):
                layout[axis] = {**layout.get(axis, {}), "visible": False}
            if not self.history:
                text = "waiting for the first log interval"
            elif panel == "mfu":
                text = _MFU_UNKNOWN
            else:
                text = "not reported by this run"
            notes.append(
                {
                    "text": text,
                    "xref": f"x{suffix} domain",
                    "yref": f"y{suffix} domain",
                    "x": 0.5,
                    "y": 0.5,
                    "showarrow": False,
                    "font": {"color": "#777", "size": 13},
                }
            )
        layout["annotations"] = notes
        return layout, styles

    @staticmethod
    def _warmup_compiles(rows: list[RunMetrics]) -> int:
        if not rows:
            return 0
        # The trainer says how many programs its own prewarm compiled. "total_compiles" counts the
        # whole process, so a second run in the same kernel would claim the first run's compiles.
        warm = rows[0].get("warmup_compiles")
        if warm is not None:
            return int(warm)
        # A hand-written loop feeding StepProfiler metrics has no prewarm count: derive it.
        total, first = rows[0].get("total_compiles"), rows[0].get("compiles")
        return max(0, int(total) - int(first or 0)) if total is not None else 0

    # ---- summaries -----------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Headline numbers of the run so far."""
        rows = self.history
        if not rows:
            return {"intervals": 0}
        last = rows[-1]
        tps = [m["tokens_per_s"] for m in rows if m.get("tokens_per_s") is not None]
        rss = [m["host_rss_bytes"] for m in rows if m.get("host_rss_bytes") is not None]
        dev = [m["device_memory_bytes"] for m in rows if m.get("device_memory_bytes") is not None]
        losses = [m["loss"] for m in rows if m.get("loss") is not None]
        preference = {}
        if self._shows_preference:
            for key in ("reward_accuracy", "reward_margin", "eval_reward_accuracy", "eval_reward_margin"):
                values = [m[key] for m in rows if m.get(key) is not None]
                preference[f"final_{key}"] = values[-1] if values else None
        return {
            "intervals": len(rows),
            "last_step": last["step"],
            "final_loss": losses[-1] if losses else None,
            "last_tokens_per_s": tps[-1] if tps else None,
            "best_tokens_per_s": max(tps) if tps else None,
            "mfu": last.get("mfu"),
            "warmup_compiles": self._warmup_compiles(rows),
            "total_compiles": last.get("total_compiles"),
            "recompilations": sum(1 for m in rows if _is_recompile(m)),
            "tokens_seen": last.get("tokens_seen"),
            "elapsed_s": last.get("elapsed_s"),
            "peak_host_rss_gib": max(rss) / GiB if rss else None,
            "peak_device_memory_gib": max(dev) / GiB if dev else None,
            **preference,  # a DPO run's headline: the last reward accuracy and margin, train and eval
        }

    def _status_html(self) -> str:
        s = self.summary()
        if not s["intervals"]:
            return "<b>waiting for the first log interval…</b>"
        parts = [f"step <b>{s['last_step']}</b>"]
        if s["final_loss"] is not None:
            parts.append(f"loss <b>{s['final_loss']:.4f}</b>")
        if s.get("final_reward_accuracy") is not None:
            parts.append(f"reward accuracy <b>{100 * s['final_reward_accuracy']:.0f}%</b>")
        if s.get("final_reward_margin") is not None:
            parts.append(f"margin <b>{s['final_reward_margin']:.3f}</b>")
        if s["last_tokens_per_s"] is not None:
            parts.append(f"<b>{s['last_tokens_per_s']:,.0f}</b> tokens/s")
        if s["mfu"] is not None:
            parts.append(f"MFU <b>{100 * s['mfu']:.1f}%</b>")
        if s["total_compiles"] is not None:
            parts.append(f"compiles <b>{s['total_compiles']}</b>")
        recompile_color = "#d62728" if s["recompilations"] else "inherit"
        parts.append(
            f"<span style='color:{recompile_color}'>recompilations <b>{s['recompilations']}</b></span>"
        )
        return " · ".join(parts + _time_limit_parts(self.history[-1], self.total_steps))

    # ---- display & export ----------------------------------------------------------
    def _ipython_display_(self) -> None:
        self.display()

    def display(self) -> None:
        """Show the status line and the figure (each on its own, never nested in a box)."""
        from IPython.display import display

        self.flush()
        display(self.status)
        display(self.figure)

    def to_figure(self) -> go.Figure:
        """The live figure's description with every received point (no decimation): the export's figure."""
        self.flush()
        layout, styles = self._look()
        data = []
        for style, series in zip(styles, self._series.values(), strict=True):
            full = series.full()
            trace = {**style, "x": full.x, "y": full.y}
            if full.text:
                trace["text"] = full.text
            data.append(trace)
        return go.Figure({"data": data, "layout": layout})

    def recompilations(self) -> list[tuple[int, str]]:
        """(step, why) for every compile after warm-up, from the intervals that had one."""
        found = []
        for m in self.history:
            if not _is_recompile(m):
                continue
            steps = m.get("recompile_steps") or [m["step"]]
            causes = m.get("recompile_causes") or []
            for i, step in enumerate(steps):
                found.append((int(step), causes[i] if i < len(causes) else "cause not recorded"))
        return found

    def export_html(self, path: str | Path, *, title: str | None = None, appendix: str | None = None) -> Path:
        """Write a self-contained HTML report (plotly.js embedded, no network needed to view it).

        `appendix` is preformatted text shown under the figure (e.g. the run's config YAML).
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure_html = pio.to_html(
            self.to_figure(),
            include_plotlyjs=True,  # embedded bundle: never "cdn"
            full_html=False,
            config={"displaylogo": False, "responsive": True},
            div_id="workbench-dashboard",
        )
        heading = html.escape(title or self.title)
        cards = "".join(
            f"<div class='card'><div class='k'>{html.escape(k.replace('_', ' '))}</div>"
            f"<div class='v'>{html.escape(_fmt(v))}</div></div>"
            for k, v in self.summary().items()
        )
        extra = ""
        if recompiled := self.recompilations():
            items = "".join(
                f"<li>step {step}: <code>{html.escape(why)}</code></li>" for step, why in recompiled
            )
            extra += f"<h2>Recompilations</h2><ul class='recompilations'>{items}</ul>"
        if appendix:
            extra += f"<h2>Config</h2><pre>{html.escape(appendix)}</pre>"
        page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{heading}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 16px 24px; color: #222; }}
.cards {{ display: flex; flex-wrap: wrap; gap: 8px; margin-bottom: 8px; }}
.card {{ border: 1px solid #ddd; border-radius: 6px; padding: 4px 10px; min-width: 110px; }}
.k {{ color: #666; font-size: 12px; }} .v {{ font-size: 16px; font-weight: 600; }}
pre {{ background: #f6f6f6; padding: 8px; font-size: 12px; }}
</style></head>
<body><h1 style="font-size:20px">{heading}</h1>
<div class='cards'>{cards}</div>
{figure_html}
{extra}
</body></html>
"""
        path.write_text(page, encoding="utf-8")
        return path


def _has_preference(m: RunMetrics) -> bool:
    """Whether a metrics dict carries a preference-tuning figure (an SFT run's are all None)."""
    return any(m.get(key) is not None for key in PREFERENCE_KEYS)


def _time_limit_parts(m: RunMetrics, total_steps: int | None) -> list[str]:
    """The status line's time-limit parts: time left, where the run will stop, the last save's stall.

    Each is shown only when the trainer reported it (None or absent: a run without
    ``train.time_limit``, before its first save, or a caller older than these keys).
    """
    parts = []
    left = m.get("time_left_s")
    if left is not None:
        parts.append(f"time left <b>{format_duration(left)}</b>" if left > 0 else "<b>time limit reached</b>")
    stop = m.get("planned_stop_step")
    if stop is not None:
        if total_steps is None:
            parts.append(f"stops at step <b>{stop}</b>")
        elif stop < total_steps:
            parts.append(
                f"<span style='color:#ff7f0e'>stops at step <b>{stop}</b> of {total_steps} (time limit)</span>"
            )
        else:
            parts.append(f"finishes all {total_steps} steps in time")
    stall = m.get("checkpoint_stall_s")
    if stall is not None:
        held = f"{stall:.2f}s" if stall < 60 else format_duration(stall)
        parts.append(f"last save held the loop <b>{held}</b>")
    return parts


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
