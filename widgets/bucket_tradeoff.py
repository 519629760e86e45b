"""The config panel's compile-time trade-off: controls for ``bucketing.max_buckets: auto`` and the figure
of predicted run time against the number of shapes.

`AutoBucketControls` holds the switch to 'auto' and the two costs the choice weighs (compile
seconds per shape, microseconds per padded token), or "measure both at run start" (the config
then leaves them unset and the trainer measures them on the run's first shape). The panel asks
it for its config overrides and for the costs to preview with.

`new_tradeoff_figure` (a `widgets.live_plot.FigureView`) / `draw_tradeoff` (on it or on a plain
`go.Figure`) draw a `workbench.data.buckets.BucketChoice`: per
number of shapes K, the predicted seconds spent compiling and spent on (padded) training steps,
stacked, with the K that minimises their sum marked, and the slider's K when 'auto' is off.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as ipw
import plotly.graph_objects as go

from widgets.figures import Drawable, figure_of, publish
from widgets.live_plot import FigureView

PREVIEW_COMPILE_SECONDS = 10.0
"""Compile seconds per shape previewed when the config leaves it to be measured."""
PREVIEW_TOKEN_MICROSECONDS = 1.0
"""Microseconds per padded token previewed when the config leaves it to be measured."""

_COMPILE_COLOR, _STEPS_COLOR, _CHOICE_COLOR = "#ff7f0e", "#1f77b4", "#2ca02c"


class AutoBucketControls:
    """The 'auto' switch and the two costs `choose_buckets` weighs, as widgets."""

    def __init__(self, bucketing: Any, *, style: dict[str, str], layout: ipw.Layout) -> None:
        given = bucketing.compile_seconds is not None and bucketing.seconds_per_padded_token is not None
        self.auto = ipw.Checkbox(
            value=bucketing.max_buckets == "auto", description="Choose the bucket count (auto)", indent=False
        ).add_class("wb-buckets-auto")
        self.measure = ipw.Checkbox(
            value=not given, description="Measure the costs at run start", indent=False
        ).add_class("wb-buckets-measure")
        compile_s = bucketing.compile_seconds or PREVIEW_COMPILE_SECONDS
        token_us = (bucketing.seconds_per_padded_token or PREVIEW_TOKEN_MICROSECONDS * 1e-6) * 1e6
        self.compile_seconds = ipw.BoundedFloatText(
            value=compile_s, min=1e-3, max=1e5, description="Compile s / shape", style=style, layout=layout
        ).add_class("wb-compile-seconds")
        self.token_us = ipw.BoundedFloatText(
            value=token_us, min=1e-6, max=1e6, description="µs / padded token", style=style, layout=layout
        ).add_class("wb-token-us")

    @property
    def widgets(self) -> list[ipw.Widget]:
        return [self.auto, self.measure, self.compile_seconds, self.token_us]

    def costs(self) -> tuple[float, float]:
        """(compile seconds per shape, seconds per padded token) to preview with."""
        return float(self.compile_seconds.value), float(self.token_us.value) * 1e-6

    def overrides(self, fixed_buckets: int) -> dict[str, Any]:
        """The ``bucketing.*`` settings these controls describe (the slider's count when not 'auto')."""
        compile_s, token_s = self.costs()
        measured = self.measure.value
        return {
            "bucketing.max_buckets": "auto" if self.auto.value else fixed_buckets,
            "bucketing.compile_seconds": None if measured else compile_s,
            "bucketing.seconds_per_padded_token": None if measured else token_s,
        }


def new_tradeoff_figure() -> FigureView:
    """An empty stacked bar of predicted seconds per number of shapes (filled by `draw_tradeoff`)."""
    fig = go.Figure()
    fig.add_trace(go.Bar(x=[], y=[], name="compiling", marker={"color": _COMPILE_COLOR}))
    fig.add_trace(go.Bar(x=[], y=[], name="training steps (padded tokens)", marker={"color": _STEPS_COLOR}))
    for name, symbol, color in (
        ("least predicted time", "star", _CHOICE_COLOR),
        ("the slider's count", "triangle-down", "#444444"),
    ):
        marker = {"symbol": symbol, "size": 13, "color": color}
        fig.add_trace(
            go.Scatter(x=[], y=[], mode="markers+text", name=name, textposition="top center", marker=marker)
        )
    fig.update_layout(
        barmode="stack",
        height=280,
        margin={"l": 60, "r": 20, "t": 40, "b": 40},
        title={"text": "Predicted run time by number of shapes", "x": 0.01},
        xaxis_title="shapes (bucket boundaries)",
        yaxis_title="seconds",
        template="plotly_white",
        legend={"orientation": "h", "y": -0.25},
    )
    return FigureView(fig, name="predicted run time")


def draw_tradeoff(target: Drawable, choice: Any, fixed_shapes: int | None = None) -> None:
    """Draw `choice`'s curve; mark its K, and `fixed_shapes` (the slider's K) when 'auto' is off."""
    fig = figure_of(target)
    rows = choice.curve()
    shapes = [r["shapes"] for r in rows]
    total = {r["shapes"]: r["total_s"] for r in rows}
    marked = fixed_shapes if fixed_shapes is not None and fixed_shapes in total else None
    with fig.batch_update():
        fig.data[0].x, fig.data[0].y = shapes, [r["compile_s"] for r in rows]
        fig.data[1].x, fig.data[1].y = shapes, [r["steps_s"] for r in rows]
        fig.data[2].x, fig.data[2].y = [choice.chosen], [choice.predicted_total_s]
        fig.data[2].text = [f"auto: {choice.chosen}"]
        fig.data[3].x = [marked] if marked is not None else []
        fig.data[3].y = [total[marked]] if marked is not None else []
        fig.data[3].text = [f"{marked}: {total[marked] / choice.predicted_total_s:.2f}×"] if marked else []
        fig.layout.title.text = (
            f"Predicted run time by number of shapes ({choice.epochs:.3g} epochs, "
            f"{choice.compile_seconds:.3g} s/shape, {choice.seconds_per_padded_token * 1e6:.3g} µs/padded token)"
        )
    publish(target)


def tradeoff_readout(choice: Any, *, auto: bool, measured: bool) -> str:
    """One line: the count 'auto' picks and its predicted time (with where the costs come from)."""
    where = "previewed costs: the run measures them at its start" if measured else "the config's costs"
    verb = "picks" if auto else "would pick"
    return (
        f"<b>auto</b> {verb} <b>{choice.chosen}</b> shapes: predicted {choice.predicted_total_s:,.1f} s "
        f"({choice.compile_part(choice.chosen):,.1f} s compiling) — {html.escape(where)}"
    )
