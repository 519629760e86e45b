"""The sharding map of a model on a device mesh, drawn from a `workbench.parallel.plan.ShardingReport`.

Three panels:

1. parameter bytes on each device, laid out as the mesh (rows = data x fsdp position,
   columns = model position), so an unbalanced layout shows at a glance;
2. per parameter group (layer numbers folded: ``model.layers.*.mlp.up_proj.weight``), the
   bytes one device holds against the unsharded size, coloured by how it is split;
3. the tile map of one parameter: which device holds which slice of it.

`mesh_figure` returns a static `go.Figure`; `mesh_view` shows it as a `widgets.live_plot.FigureView`
(plotly's `FigureWidget` can miss its state on a page whose models were slow to load).
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from widgets.live_plot import FigureView
from workbench.units import MiB

SPLIT_COLORS = {
    "replicated": "#7f7f7f",
    "fsdp": "#1f77b4",
    "model": "#ff7f0e",
    "data": "#2ca02c",
    "fsdp+model": "#9467bd",
    "data+model": "#8c564b",
    "data+fsdp": "#17becf",
}
OTHER_COLOR = "#e377c2"


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def split_kind(spec: tuple[Any, ...]) -> str:
    """'replicated', or the mesh axes a parameter is split over joined by '+' ('fsdp+model')."""
    used = sorted({a for e in spec for a in _axes(e)})
    return "+".join(used) if used else "replicated"


def _group_name(name: str) -> str:
    return re.sub(r"\.\d+\.", ".*.", name)


def parameter_group_rows(report: Any) -> list[dict[str, Any]]:
    """Entries folded over layer numbers: name, count, full bytes, bytes per device, split kind.

    One row per bar of the figure's group panel (not the optimizer's parameter groups).
    """
    groups: OrderedDict[str, dict[str, Any]] = OrderedDict()
    for e in report.entries:
        key = (_group_name(e.name), split_kind(e.spec))
        g = groups.setdefault(
            key,
            {"name": key[0], "kind": key[1], "count": 0, "bytes": 0, "bytes_per_device": 0, "spec": e.spec,
             "shape": e.shape, "local_shape": e.local_shape},
        )  # fmt: skip
        g["count"] += 1
        g["bytes"] += e.bytes
        g["bytes_per_device"] += e.bytes_per_device
    return list(groups.values())


def _mesh_grid(report: Any) -> tuple[list[list[int]], list[list[int]]]:
    """Device ids and their parameter bytes on a (data*fsdp) x model grid."""
    sizes = report.axis_sizes
    model = sizes.get("model", 1)
    rows = max(1, math.prod(sizes.values()) // model)
    per_device = report.per_device_bytes()
    ids = list(report.device_ids) or list(range(rows * model))
    dev_grid = [ids[r * model : (r + 1) * model] for r in range(rows)]
    byte_grid = [[per_device.get(d, 0) for d in row] for row in dev_grid]
    return dev_grid, byte_grid


def mesh_figure(report: Any, *, parameter: str | None = None) -> go.Figure:
    """The three-panel sharding map (see the module docstring) as a static figure."""
    if not report.entries:
        raise ValueError("the sharding report has no entries: nothing to draw")
    parameter = parameter or max(report.entries, key=lambda e: e.bytes).name
    sizes_text = " × ".join(f"{a}={s}" for a, s in report.axis_sizes.items())
    fig = make_subplots(
        rows=2,
        cols=2,
        specs=[[{}, {"rowspan": 2}], [{}, None]],
        column_widths=[0.42, 0.58],
        subplot_titles=(
            f"Parameter MiB per device (mesh {sizes_text})",
            "Per device vs unsharded, by parameter group (MiB)",
            f"Tiles of {parameter}",
        ),
        horizontal_spacing=0.28,
        vertical_spacing=0.24,
    )

    dev_grid, byte_grid = _mesh_grid(report)
    fig.add_trace(
        go.Heatmap(
            z=[[b / MiB for b in row] for row in byte_grid],
            text=[
                [f"d{d}<br>{b / MiB:.2f}" for d, b in zip(drow, brow)]
                for drow, brow in zip(dev_grid, byte_grid)
            ],
            texttemplate="%{text}",
            colorscale="Blues",
            showscale=False,
            hovertemplate="device %{text} MiB<extra></extra>",
            name="bytes per device",
        ),
        row=1,
        col=1,
    )
    fig.update_xaxes(title_text="model axis", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="data × fsdp", dtick=1, autorange="reversed", row=1, col=1)

    groups = parameter_group_rows(report)
    names = [f"{g['name']} ×{g['count']}" if g["count"] > 1 else g["name"] for g in groups]
    fig.add_trace(
        go.Bar(
            y=names,
            x=[g["bytes"] / MiB for g in groups],
            orientation="h",
            name="unsharded",
            marker={"color": "rgba(0,0,0,0.08)", "line": {"color": "#bbb", "width": 1}},
            hovertemplate="%{y}: %{x:.3f} MiB unsharded<extra></extra>",
        ),
        row=1,
        col=2,
    )
    kinds = list(dict.fromkeys(g["kind"] for g in groups))
    for kind in kinds:
        color = SPLIT_COLORS.get(kind, OTHER_COLOR)
        idx = [i for i, g in enumerate(groups) if g["kind"] == kind]
        fig.add_trace(
            go.Bar(
                y=[names[i] for i in idx],
                x=[groups[i]["bytes_per_device"] / MiB for i in idx],
                orientation="h",
                name=f"per device: {kind}",
                marker={"color": color},
                customdata=[
                    [str(groups[i]["spec"]), "x".join(map(str, groups[i]["local_shape"]))] for i in idx
                ],
                hovertemplate="%{y}<br>%{x:.3f} MiB per device<br>spec %{customdata[0]}"
                "<br>local shard %{customdata[1]}<extra></extra>",
            ),
            row=1,
            col=2,
        )
    fig.update_yaxes(autorange="reversed", tickfont={"size": 10}, row=1, col=2)

    tiles = report.device_map(parameter).tiles()
    labels = [[("d" + ",".join(map(str, devs))) for _idx, devs in line] for line in tiles]
    counts = [[len(devs) for _idx, devs in line] for line in tiles]
    fig.add_trace(
        go.Heatmap(
            z=counts,
            text=labels,
            texttemplate="%{text}",
            colorscale=[[0, "#e8f1fa"], [1, "#9ecae1"]],
            showscale=False,
            xgap=2,
            ygap=2,
            hovertemplate="held by %{text}<extra></extra>",
            name="tiles",
        ),
        row=2,
        col=1,
    )
    fig.update_xaxes(title_text="slices of dim 1", dtick=1, row=2, col=1)
    fig.update_yaxes(title_text="slices of dim 0", dtick=1, autorange="reversed", row=2, col=1)

    fig.update_layout(
        barmode="overlay",
        height=max(520, 22 * len(groups) + 160),
        template="plotly_white",
        title={
            "text": f"Sharding map: {report.total_bytes / MiB:.2f} MiB of parameters, "
            f"at most {report.bytes_per_device / MiB:.2f} MiB on one device",
            "x": 0.01,
        },
        legend={"orientation": "h", "y": -0.18},
        margin={"l": 60, "r": 20, "t": 80, "b": 60},
    )
    return fig


def mesh_view(report: Any, *, parameter: str | None = None) -> FigureView:
    """A `FigureView` of `mesh_figure(report, parameter=...)`; `.figure` is the `go.Figure`."""
    return FigureView(mesh_figure(report, parameter=parameter), name="sharding map")
