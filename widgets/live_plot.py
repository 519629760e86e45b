"""A live plotly figure that no frontend can miss an update of: an anywidget with its own front end.

Why not plotly's `FigureWidget` (or any anywidget that receives updates): anywidget 0.11 gives
each model two seconds from its creation to import and bind its ES module
(``AbortSignal.timeout(2000)`` in its Runtime); past that the model's ``ready`` promise is
rejected for good, and every later comm message to it waits on that promise and is dropped
without an error. The view still renders from the state the model was created with. A Voilà
page creates all its models at once on a busy main thread, and plotly's 5 MB bundle is evaluated
inside that window: on this 2-core machine the dashboard kept its first 12 points while the
kernel had sent 16 (the status label, a core widget, updated fine). JupyterLab pages usually
make the deadline, but nothing guarantees it.

So the parts that change never travel on the anywidget. `LivePlot` (the anywidget) carries only
what is fixed at creation: a small ES module and plotly.js as data (evaluated once per page by
the view, outside that deadline). The live figure lives on `LiveChannel`, a plain core widget
model (``WidgetModel``, no ES module, no deadline), with three synced traits every view
reconciles against:

- ``look``: the layout and the per-trace styles, with a revision number (changes rarely).
- ``delta``: the latest flush as an append-only change, numbered: for each changed trace, how
  many drawn points to keep and the new points after them (``Plotly.extendTraces``). It carries
  the kernel's ``time.time()`` so a page can measure kernel-to-page latency.
- ``state``: the whole drawn figure at the latest number. It is never pushed on a flush (that is
  the traffic deltas avoid); `get_state` computes it whenever a frontend asks for the widget's
  state (a page attaching late, Voilà, a reload, a saved notebook), and a view that sees a gap in
  the numbers asks for it with a message.

`FigureView` is the same plot in whole-figure mode, for figures redrawn from the kernel rather
than appended to (the config panel's bars and histogram, the sharding map): it holds a
`go.Figure` in Python and each `redraw` sends the whole figure (every trace with its data, the
layout with its shapes and annotations) as the next ``look`` revision, with an empty numbered
delta so a page that missed one still sees the gap and asks for the state again.

The front end (``live_plot.js``) draws with the plotly.js that the plotly package ships (no
CDN, no network). `DecimatedSeries` bounds what is drawn per trace
(bucket minimum and maximum, so spikes survive) while the caller keeps the full history.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as ipw
import plotly.graph_objects as go
import traitlets

_MODULE = Path(__file__).with_name("live_plot.js")


def _plotly_module() -> str:
    """plotly.js as an ES module (its UMD wrapper sets ``window.Plotly``); the view imports it once per page."""
    plotly_js = resources.files("plotly").joinpath("package_data", "plotly.min.js").read_text("utf-8")
    return plotly_js + "\nexport default globalThis.Plotly;\n"


@dataclass(frozen=True)
class TraceData:
    """One trace's drawn points (hover `text` empty for traces without hover text)."""

    x: list[float]
    y: list[float]
    text: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, list[Any]]:
        return {"x": self.x, "y": self.y, "text": self.text}


class DecimatedSeries:
    """Append-only (x, y[, text]) points and a bounded view of them for drawing.

    The points are cut into buckets of `stride` (a power of two, the smallest that keeps the
    drawn count within `max_points`); each finished bucket draws its minimum and maximum (so a
    spike survives), the last, unfinished bucket its minimum, maximum and latest point. Finished
    buckets never change until the stride doubles, so successive views share a long prefix and
    the page receives only the tail (a few points) per update. `decimate=False` draws every point
    (rare markers: recompilations, evals).
    """

    def __init__(self, max_points: int, *, decimate: bool = True) -> None:
        if max_points < 10:
            raise ValueError(f"max_points={max_points!r} is not allowed: must be >= 10")
        self.max_points = max_points
        self.decimate = decimate
        self.x: list[float] = []
        self.y: list[float] = []
        self.text: list[str] = []
        self._stride = 1
        self._finished: list[int] = []  # indices drawn for the finished buckets at this stride
        self._finished_buckets = 0

    def __len__(self) -> int:
        return len(self.x)

    def append(self, x: float, y: float, text: str | None = None) -> None:
        self.x.append(x)
        self.y.append(y)
        if text is not None:
            self.text.append(text)

    def full(self) -> TraceData:
        return TraceData(list(self.x), list(self.y), list(self.text))

    def drawn(self) -> TraceData:
        n = len(self.x)
        if not self.decimate or n <= self.max_points:
            return self.full()
        stride = self._stride
        while self._count(n, stride) > self.max_points:
            stride *= 2
        if stride != self._stride:
            self._stride, self._finished, self._finished_buckets = stride, [], 0
        last_bucket = (n - 1) // stride
        for bucket in range(self._finished_buckets, last_bucket):
            self._finished.extend(self._extremes(bucket * stride, (bucket + 1) * stride))
        self._finished_buckets = last_bucket
        tail = sorted({*self._extremes(last_bucket * stride, n), n - 1})
        keep = self._finished + tail
        text = [self.text[i] for i in keep] if self.text else []
        return TraceData([self.x[i] for i in keep], [self.y[i] for i in keep], text)

    @staticmethod
    def _count(n: int, stride: int) -> int:
        finished = (n - 1) // stride
        return finished * min(2, stride) + min(3, n - finished * stride)

    def _extremes(self, start: int, stop: int) -> list[int]:
        window = range(start, stop)
        low = min(window, key=self.y.__getitem__)
        high = max(window, key=self.y.__getitem__)
        return sorted({low, high})


def _common_prefix(old: TraceData, new: TraceData) -> int:
    limit = min(len(old.x), len(new.x))
    texts = bool(old.text or new.text)
    for i in range(limit):
        if old.x[i] != new.x[i] or old.y[i] != new.y[i]:
            return i
        if texts and (old.text[i : i + 1] != new.text[i : i + 1]):
            return i
    return limit


class LiveChannel(ipw.Widget):
    """The live figure's data on a core widget model (no view): look, numbered deltas, state."""

    look = traitlets.Dict().tag(sync=True)
    delta = traitlets.Dict().tag(sync=True)
    state = traitlets.Dict().tag(sync=True)

    def __init__(self, layout: dict[str, Any], styles: list[dict[str, Any]], *, whole: bool = False) -> None:
        self.seq = 0
        self.snapshot_requests = 0
        # Whole-figure mode: the look's "styles" are complete traces (data included), no live points.
        self._data = [] if whole else [TraceData([], []) for _ in styles]
        look: dict[str, Any] = {"layout": layout, "styles": styles, "rev": 0}
        if whole:
            look["whole"] = True
        super().__init__(look=look)
        self.on_msg(self._on_frontend_message)

    @property
    def data(self) -> list[TraceData]:
        """What every page draws once it has caught up (the latest update)."""
        return list(self._data)

    def update(
        self,
        data: list[TraceData],
        *,
        layout: dict[str, Any] | None = None,
        styles: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any] | None:
        """Send what changed in one comm message; returns the delta sent (None if nothing changed)."""
        if self.look.get("whole"):
            raise ValueError("this channel draws whole figures (whole=True): use redraw_whole")
        if len(data) != len(self._data):
            raise ValueError(f"data has {len(data)} traces, the plot has {len(self._data)}")
        layout = self.look["layout"] if layout is None else layout
        styles = self.look["styles"] if styles is None else styles
        changes = []
        for index, (old, new) in enumerate(zip(self._data, data, strict=True)):
            keep = _common_prefix(old, new)
            if keep == len(old.x) == len(new.x):
                continue
            changes.append([index, keep, new.x[keep:], new.y[keep:], new.text[keep:]])
        look_changed = layout != self.look["layout"] or styles != self.look["styles"]
        if not changes and not look_changed:
            return None
        with self.hold_sync():  # one message: the look and the delta travel together
            if look_changed:
                self.look = {"layout": layout, "styles": styles, "rev": self.look["rev"] + 1}
            delta = None
            if changes:
                self.seq += 1
                delta = {"seq": self.seq, "base": self.seq - 1, "t": 1000 * time.time(), "traces": changes}
                self._data = list(data)
                self.delta = delta
        return delta

    def redraw_whole(self, layout: dict[str, Any], traces: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Whole-figure mode: send `layout` and complete `traces` as the next look revision, with an
        empty numbered delta in the same message; returns the delta (None if nothing changed)."""
        if not self.look.get("whole"):
            raise ValueError("redraw_whole needs a channel created with whole=True (live points use update)")
        if layout == self.look["layout"] and traces == self.look["styles"]:
            return None
        with self.hold_sync():
            self.look = {"layout": layout, "styles": traces, "rev": self.look["rev"] + 1, "whole": True}
            self.seq += 1
            self.delta = {"seq": self.seq, "base": self.seq - 1, "t": 1000 * time.time(), "traces": []}
        return self.delta

    def snapshot(self) -> dict[str, Any]:
        """The whole drawn figure at the latest update number."""
        return {"seq": self.seq, "t": 1000 * time.time(), "traces": [t.to_json() for t in self._data]}

    def get_state(self, key: Any = None, drop_defaults: bool = False) -> dict[str, Any]:
        state = super().get_state(key=key, drop_defaults=drop_defaults)
        if "state" in state or key is None:
            state["state"] = self.snapshot()  # computed when asked, never pushed per flush
        return state

    def _on_frontend_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        # A view that saw a gap in the numbers (it rendered mid-stream or lost a message).
        if isinstance(content, dict) and content.get("type") == "snapshot":
            self.snapshot_requests += 1
            # The look too: the message the view missed may have carried a new look revision.
            self.send_state(["look", "state"])


class LivePlot(anywidget.AnyWidget):
    """A plotly figure (layout + traces) that every page draws completely, however late it renders.

    Args:
        layout: plotly layout dict.
        styles: one dict per trace (name, mode, marker, axes...), without data.
        name: a label for the page (tests and benches find the plot by it).
    """

    _esm = _MODULE.read_text("utf-8")
    _plotly = traitlets.Unicode(_plotly_module()).tag(sync=True)
    name = traitlets.Unicode("").tag(sync=True)
    channel_id = traitlets.Unicode("").tag(sync=True)

    def __init__(self, layout: dict[str, Any], styles: list[dict[str, Any]], *, name: str = "") -> None:
        # The channel is created (and its comm opened) first, so any page knows it before the plot.
        self.channel = LiveChannel(layout, styles)
        super().__init__(name=name, channel_id=self.channel.model_id)

    def close(self) -> None:
        """Close the plot and its channel (the channel's comm would otherwise stay open)."""
        self.channel.close()
        super().close()

    @property
    def look(self) -> dict[str, Any]:
        return self.channel.look

    @property
    def delta(self) -> dict[str, Any]:
        return self.channel.delta

    @property
    def seq(self) -> int:
        return self.channel.seq

    @property
    def data(self) -> list[TraceData]:
        return self.channel.data

    def update(
        self,
        data: list[TraceData],
        *,
        layout: dict[str, Any] | None = None,
        styles: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any] | None:
        """See `LiveChannel.update`."""
        return self.channel.update(data, layout=layout, styles=styles)

    def snapshot(self) -> dict[str, Any]:
        return self.channel.snapshot()


def _plain(value: Any) -> Any:
    """numpy arrays and scalars as lists and numbers (what the comm's JSON can carry)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def figure_json(figure: go.Figure) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A figure's layout and complete traces as plain JSON values (numpy arrays as lists).

    Read from the figure's own dicts rather than `to_plotly_json`, which (plotly >= 6) encodes
    numpy arrays as base64 typed-array specs: the page draws either, but the look then stays
    readable and comparable in Python.
    """
    layout = json.loads(json.dumps(figure._layout, default=_plain))
    traces = json.loads(json.dumps(figure._data, default=_plain))
    return layout, traces


class FigureView(LivePlot):
    """A `go.Figure` redrawn from the kernel that every page draws as it is now, however late it
    renders: edit `.figure` in Python, then call `redraw()` (see the module docstring).

    Args:
        figure: the figure to show (held, not copied: later edits to it are drawn on `redraw`).
        name: a label for the page (tests find the plot by it).
    """

    def __init__(self, figure: go.Figure, *, name: str = "") -> None:
        if not isinstance(figure, go.Figure):
            raise TypeError(f"figure must be a plotly go.Figure, got {type(figure).__name__}")
        self._figure = figure
        layout, traces = figure_json(figure)
        self.channel = LiveChannel(layout, traces, whole=True)
        anywidget.AnyWidget.__init__(self, name=name, channel_id=self.channel.model_id)

    @property
    def figure(self) -> go.Figure:
        """The figure in Python (what the page draws after the latest `redraw`)."""
        return self._figure

    def redraw(self) -> dict[str, Any] | None:
        """Send the figure as it is now to every page; returns the delta sent (None if unchanged)."""
        layout, traces = figure_json(self._figure)
        return self.channel.redraw_whole(layout, traces)

    def update(self, *_args: Any, **_kwargs: Any) -> dict[str, Any] | None:
        raise TypeError("a FigureView draws a whole figure: edit .figure and call redraw()")


def message_bytes(payload: Any) -> int:
    """Size of a payload as the comm sends it (JSON)."""
    return len(json.dumps(payload, separators=(",", ":")))
