"""Live training dashboard: one live plot with six panels (nine under DPO, ten under GRPO), fed by trainer callbacks.

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

GRPO (``train.objective: grpo``, where the loss panel shows the GRPO loss) adds four: the reward
(its mean with a band of one standard deviation, and the held-out eval's mean as points), each reward
function's mean (``reward/<name>``), the completion length, and the clip ratio, KL, share of groups
without signal and share of completions cut at the budget (``clipped_ratio``); the step-time panel
splits into rollout and training time and the throughput panel adds the rollout's tokens/s. They
appear with the first metrics dict that carries a GRPO figure (``grpo=None``); the status line adds
the latest reward, eval reward and completion length. The panels and traces are
`widgets.dashboard_panels`'. With ``grpo.log_completions`` a table under the figure
(`completions`, `widgets.completions_table`) shows the latest log step's completions with their
prompts, each function's reward, the total and the advantage; the HTML export has it too.

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
from typing import Any, cast

import ipywidgets as ipw
import plotly.graph_objects as go
import plotly.io as pio

from widgets.completions_table import completions_html
from widgets.dashboard_panels import (
    EVERY_POINT,
    HOVER_TEXT,
    MFU_UNKNOWN,
    REWARD_SLOT_NAMES,
    TRACES,
    Extra,
    axis_suffix,
    base_look,
    extra_of,
    is_recompile,
    panels_of,
)
from widgets.live_plot import DecimatedSeries, LivePlot, TraceData
from workbench.analysis.metrics import RunMetrics
from workbench.units import GiB, format_duration

_TRACES = TRACES  # the traces by name, in the figure's order (tests and callers index the plot by it)


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
        grpo: the GRPO panels (reward, reward per function, completion length, clip ratio / KL /
            groups without signal), as `preference` is for a DPO run: None shows them from the first
            metrics dict with a GRPO figure. One objective's panels at most: not both True.
    """

    def __init__(
        self,
        *,
        min_interval_s: float = 0.5,
        total_steps: int | None = None,
        max_points: int = 2000,
        title: str = "XLA Workbench — training",
        preference: bool | None = None,
        grpo: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s={min_interval_s!r} is not allowed: must be >= 0")
        if max_points < 10:
            raise ValueError(f"max_points={max_points!r} is not allowed: must be >= 10")
        if preference and grpo:
            raise ValueError("preference=True with grpo=True is not allowed: one objective's panels at most")
        self.min_interval_s = float(min_interval_s)
        self.total_steps = total_steps
        self.max_points = int(max_points)
        self.title = title
        self.preference, self.grpo = preference, grpo
        self._clock = clock
        self.history: list[RunMetrics] = []
        self.flush_count = 0
        self._last_flush: float | None = None
        self._pending = False
        self._series = {
            name: DecimatedSeries(self.max_points, decimate=name not in EVERY_POINT) for name in _TRACES
        }
        self._ingested = 0
        self._extra: Extra | None = "preference" if preference else "grpo" if grpo else None
        self.reward_names: list[str] = []
        """The reward functions drawn, in order of appearance: one ``reward/<name>`` trace each."""
        self._base_layout, self._base_styles = base_look(title, self._extra)
        layout, styles = self._look()
        self.figure = LivePlot(layout, styles, name=title)
        self.status = ipw.HTML(value=self._status_html(), layout=ipw.Layout(margin="0 0 4px 0"))
        self.completions = ipw.HTML(value="", layout=ipw.Layout(margin="4px 0 0 0"))
        """The latest logged completions of a GRPO run as a table (empty until a metrics dict has some)."""

    @property
    def shows_preference(self) -> bool:
        """Whether the figure has the preference panels now."""
        return self._extra == "preference"

    @property
    def shows_grpo(self) -> bool:
        """Whether the figure has the GRPO panels now."""
        return self._extra == "grpo"

    def trace(self, name: str) -> TraceData:
        """What the page draws of the trace called `name` (e.g. 'tokens/s', 'recompilation', 'reward/format')."""
        if name.startswith("reward/") and name[len("reward/") :] in self.reward_names:
            name = REWARD_SLOT_NAMES[self.reward_names.index(name[len("reward/") :])]
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
        table = completions_html(self.latest_completions())
        if table != self.completions.value:
            self.completions.value = table
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
            extra = extra_of(m) if self._extra is None else None
            if extra is not None and {"preference": self.preference, "grpo": self.grpo}[extra] is None:
                # A DPO or GRPO run: the grid grows by its panels (a new look, the traces kept).
                self._extra = extra
                self._base_layout, self._base_styles = base_look(self.title, extra)
            rewards = m.get("rewards") or {}
            for reward in rewards:
                if reward not in self.reward_names and len(self.reward_names) < len(REWARD_SLOT_NAMES):
                    self.reward_names.append(reward)
            by_slot = {slot: rewards.get(n) for slot, n in zip(REWARD_SLOT_NAMES, self.reward_names)}
            for name, (_, read, _) in _TRACES.items():
                y = by_slot.get(name) if name in REWARD_SLOT_NAMES else read(m)
                if y is None or (isinstance(y, float) and not math.isfinite(y)):
                    continue
                hover = HOVER_TEXT.get(name)
                self._series[name].append(int(m["step"]), float(y), hover(m) if hover else None)
        self._ingested = len(rows)

    def _look(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Layout and styles for the data so far: empty panels give their space to a note."""
        layout = deepcopy(self._base_layout)
        notes = list(layout.get("annotations", []))
        styles = []
        filled: set[str] = set()
        panels = panels_of(self._extra)
        named = dict(zip(REWARD_SLOT_NAMES, (f"reward/{n}" for n in self.reward_names)))
        for style, (name, (panel, _, _)) in zip(self._base_styles, _TRACES.items(), strict=True):
            has_points = len(self._series[name]) > 0 and panel in panels
            # a band's lower edge stays out of the legend: its upper edge (the filled one) stands for both
            legend = has_points and style.get("showlegend", True)
            styles.append({**style, "showlegend": legend, **({"name": named[name]} if name in named else {})})
            if has_points:
                filled.add(panel)
        for panel in panels:
            if panel in filled:
                continue
            suffix = axis_suffix(panel)
            for axis in (f"xaxis{suffix}", f"yaxis{suffix}"):
                layout[axis] = {**layout.get(axis, {}), "visible": False}
            if not self.history:
                text = "waiting for the first log interval"
            elif panel == "mfu":
                text = MFU_UNKNOWN
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
        headline = {
            "preference": ("reward_accuracy", "reward_margin", "eval_reward_accuracy", "eval_reward_margin"),
            "grpo": ("reward_mean", "eval_reward_mean", "completion_length"),
        }.get(self._extra or "", ())
        objective = {}
        for key in headline:
            values = [m[key] for m in rows if m.get(key) is not None]
            objective[f"final_{key}"] = values[-1] if values else None
        return {
            "intervals": len(rows),
            "last_step": last["step"],
            "final_loss": losses[-1] if losses else None,
            "last_tokens_per_s": tps[-1] if tps else None,
            "best_tokens_per_s": max(tps) if tps else None,
            "mfu": last.get("mfu"),
            "warmup_compiles": self._warmup_compiles(rows),
            "total_compiles": last.get("total_compiles"),
            "recompilations": sum(1 for m in rows if is_recompile(m)),
            "tokens_seen": last.get("tokens_seen"),
            "elapsed_s": last.get("elapsed_s"),
            "peak_host_rss_gib": max(rss) / GiB if rss else None,
            "peak_device_memory_gib": max(dev) / GiB if dev else None,
            # a DPO run's headline: the last reward accuracy and margin, train and eval; a GRPO run's:
            # the last mean reward, train and eval, and completion length
            **objective,
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
        for key, label in (("reward_mean", "reward"), ("eval_reward_mean", "eval reward")):
            if s.get(f"final_{key}") is not None:
                parts.append(f"{label} <b>{s[f'final_{key}']:.3f}</b>")
        if s.get("final_completion_length") is not None:
            parts.append(f"completions <b>{s['final_completion_length']:.0f}</b> tokens")
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
        display(self.completions)  # empty (no space taken) until a GRPO run logs completions

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

    def latest_completions(self) -> list[dict[str, Any]]:
        """The completions of the latest metrics dict that carried some (``grpo.log_completions``)."""
        for m in reversed(self.history):
            if m.get("completions"):
                return list(m["completions"])
        return []

    def recompilations(self) -> list[tuple[int, str]]:
        """(step, why) for every compile after warm-up, from the intervals that had one."""
        found = []
        for m in self.history:
            if not is_recompile(m):
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
        if completions := self.latest_completions():
            extra += f"<h2>Latest completions</h2>{completions_html(completions)}"
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
