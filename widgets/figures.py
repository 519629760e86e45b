"""Draw functions that take either a `go.Figure` or a `FigureView` showing one.

The config panel's and the sharding map's figures are redrawn from the kernel, so on a page
they are `widgets.live_plot.FigureView`s (plotly's `FigureWidget` misses later updates on a page
whose models took over 2 s to load: see widgets/live_plot.py). Their draw functions edit the
`go.Figure` in Python and then send it; `figure_of` gives the figure to edit and `publish` sends
it, so the same functions draw a plain `go.Figure` too (tests, exports, static HTML).
"""

from __future__ import annotations

from typing import TypeAlias

import plotly.graph_objects as go

from widgets.live_plot import FigureView

Drawable: TypeAlias = go.Figure | FigureView
"""What a draw function accepts: a figure, or a view of one on the page."""


def figure_of(target: Drawable) -> go.Figure:
    """The `go.Figure` to edit: `target` itself, or the figure a `FigureView` shows."""
    if isinstance(target, FigureView):
        return target.figure
    if isinstance(target, go.Figure):
        return target
    raise TypeError(f"expected a plotly go.Figure or a FigureView, got {type(target).__name__}")


def publish(target: Drawable) -> None:
    """Send the edited figure to every page showing it (nothing to send for a plain figure)."""
    if isinstance(target, FigureView):
        target.redraw()
