"""Helpers for plotly `FigureWidget`s that must look right in any frontend, early or late.

A `FigureWidget` sends later edits to the browser as one-off messages (``_py2js_update``,
``_py2js_relayout``, ...) and keeps its *initial* state in the synced ``_widget_data`` /
``_widget_layout`` traits. A frontend that connects after the edits — Voilà (it executes the
notebook before the page attaches), a reloaded page, a notebook saved with widget state, a
figure nested in a ``VBox`` (never passed through ``_repr_mimebundle_``) — only gets that
initial state: the page shows axes and no traces. `sync_state` copies the current figure into
those traits after each batch of edits, which is what plotly itself does when a figure is
displayed; the browser's model ignores later changes to them, so live views are not redrawn twice.
"""

from __future__ import annotations

from copy import deepcopy

import plotly.graph_objects as go


def sync_state(fig: go.FigureWidget) -> None:
    """Make the widget's synced state equal the figure as it is now."""
    fig._widget_layout = deepcopy(fig._layout_obj._props)
    fig._widget_data = deepcopy(fig._data)
