"""The sharding map of a model on a device mesh, drawn from a `workbench.parallel.sharding_report.ShardingReport`.

Three panels:

1. parameter bytes on each device, laid out as the mesh (rows = data x fsdp position,
   columns = model position), so an unbalanced layout shows at a glance;
2. per parameter group (layer numbers folded: ``model.layers.*.mlp.up_proj.weight``), the
   bytes one device holds against the unsharded size, coloured by how it is split;
3. the tile map of one parameter: which device holds which slice of it.

`mesh_figure` returns a static `go.Figure`; `mesh_view` shows it as a `widgets.live_plot.FigureView`
(plotly's `FigureWidget` can miss its state on a page whose models were slow to load).

Beside it, the communication of a step on that mesh (`communication_panel`, or `mesh_view(...,
communication=, plan=)`): a `workbench.analysis.communication.CommunicationReport` (read from the
compiled step or predicted by `workbench.analysis.comm_model.predict_communication`) drawn as the
bytes each device sends per step and mesh axis, by collective kind (`communication_figure`), its
time on a target chip against the step's compute, and an HTML summary: the table per axis, the
advice (`communication_advice`) and the first rows of a `workbench.analysis.mesh_plan.MeshPlan`
for the target with its reason, the mesh drawn marked.
"""

from __future__ import annotations

import html
import math
import re
from collections import OrderedDict
from typing import Any

import ipywidgets as ipw
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from widgets.live_plot import FigureView
from workbench.analysis.communication import CommunicationCost, CommunicationReport, communication_advice
from workbench.backend.targets import TARGETS
from workbench.units import MiB, format_bytes

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


def mesh_view(
    report: Any,
    *,
    parameter: str | None = None,
    communication: CommunicationReport | CommunicationCost | None = None,
    plan: Any = None,
    target: Any = None,
) -> FigureView | MeshView:
    """A `FigureView` of `mesh_figure(report, parameter=...)`; `.figure` is the `go.Figure`.

    With `communication` (a step's `CommunicationReport`, or a `CommunicationCost` already priced)
    or `plan` (a `MeshPlan`), a `MeshView`: the sharding map above `communication_panel`'s figure
    and summary, priced on `target` (a `TARGETS` name or `Target`; default the plan's target), the
    report's mesh marked in the plan."""
    sharding = FigureView(mesh_figure(report, parameter=parameter), name="sharding map")
    if communication is None and plan is None:
        return sharding
    panel = communication_panel(communication, plan=plan, target=target, mesh=dict(report.axis_sizes))
    return MeshView(sharding, panel.communication, panel.summary)


# ---- the communication of a step on the mesh ----------------------------------------------------

KIND_COLORS = {
    "all-gather": "#1f77b4",
    "reduce-scatter": "#2ca02c",
    "all-reduce": "#d62728",
    "all-to-all": "#9467bd",
    "collective-permute": "#8c564b",
}


class MeshView(ipw.VBox):
    """The sharding map, the communication figure and the summary (HTML) in one box.

    `.sharding` and `.communication` are `FigureView`s (either may be None in a bare panel),
    `.summary` the `ipw.HTML`; `.figure` is the sharding map's `go.Figure`, as `mesh_view`'s is."""

    def __init__(self, sharding: FigureView | None, communication: FigureView | None, summary: ipw.HTML):
        self.sharding, self.communication, self.summary = sharding, communication, summary
        super().__init__([w for w in (sharding, communication, summary) if w is not None])

    @property
    def figure(self) -> go.Figure | None:
        return self.sharding.figure if self.sharding is not None else None


class _Priced:
    """A step's communication as the panel draws it: the report (None when only a cost was given),
    its cost on the target (None without one) and the target itself."""

    def __init__(
        self, communication: CommunicationReport | CommunicationCost | None, target: Any, plan: Any
    ) -> None:
        self.report: CommunicationReport | None = None
        self.cost: CommunicationCost | None = None
        self.target = target
        if isinstance(communication, CommunicationCost):
            self.cost = communication
            return
        if communication is not None and not isinstance(communication, CommunicationReport):
            raise TypeError(
                "communication must be a CommunicationReport or a CommunicationCost, "
                f"got {type(communication).__name__}"
            )
        self.report = communication
        if self.target is None and plan is not None and plan.target in TARGETS:
            self.target = plan.target
        if communication is not None and self.target is not None:
            self.cost = communication.price(self.target)

    @property
    def empty(self) -> bool:
        return self.report is None and self.cost is None

    def headline(self) -> str:
        parts = ["Communication of a step"]
        if self.report is not None:
            sizes = " × ".join(f"{a}={s}" for a, s in self.report.axis_sizes.items() if s > 1)
            parts.append(
                f": {format_bytes(self.report.tpu_wire_bytes)} sent per device on {sizes or 'one device'}"
            )
        if self.cost is not None and self.cost.share is not None:
            parts.append(f", {100 * self.cost.share:.0f}% of the step on {self.cost.target} without overlap")
        return "".join(parts)


def communication_figure(
    communication: CommunicationReport | CommunicationCost, *, target: Any = None
) -> go.Figure:
    """Bytes each device sends per step, per mesh axis group and collective kind (TPU's collectives;
    a marker where the compiled program sends more: XLA:CPU's all-reduce + slice), and, priced on
    `target` (a `TARGETS` name or `Target`) or given a `CommunicationCost`, the time per axis group
    against the step's compute at the chip's peak."""
    return _figure(_Priced(communication, target, None))


def _figure(priced: _Priced) -> go.Figure:
    report, cost = priced.report, priced.cost
    if priced.empty:
        raise ValueError("nothing to draw: give a CommunicationReport or a CommunicationCost")
    titles = ["MiB each device sends per step, by mesh axes"] if report is not None else []
    if cost is not None:
        titles.append(f"ms per step on {cost.target} ({cost.chip}), no overlap")
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.22)
    traffic = list(report.per_axis().values()) if report is not None else []
    if report is not None:
        axes = [t.axes for t in traffic]
        kinds = [k for k in KIND_COLORS if any(k in t.by_kind for t in traffic)]
        kinds += sorted({k for t in traffic for k in t.by_kind} - set(kinds))
        for kind in kinds:
            fig.add_trace(
                go.Bar(
                    y=axes,
                    x=[t.by_kind.get(kind, 0.0) / MiB for t in traffic],
                    orientation="h",
                    name=kind,
                    marker={"color": KIND_COLORS.get(kind, OTHER_COLOR)},
                    hovertemplate=f"%{{y}}: %{{x:.3f}} MiB in {kind}<extra></extra>",
                ),
                row=1,
                col=1,
            )
        more = [t for t in traffic if t.wire_bytes > t.tpu_wire_bytes * 1.001]
        if more:  # an all-reduce + slice as XLA:CPU compiled it: what the program here sends
            fig.add_trace(
                go.Scatter(
                    y=[t.axes for t in more],
                    x=[t.wire_bytes / MiB for t in more],
                    mode="markers",
                    name="as compiled here (all-reduce + slice)",
                    marker={"symbol": "line-ns-open", "size": 18, "color": "#000"},
                    hovertemplate="%{y}: %{x:.3f} MiB as compiled<extra></extra>",
                ),
                row=1,
                col=1,
            )
        fig.update_yaxes(autorange="reversed", row=1, col=1)
    if cost is not None:
        labels = [*cost.seconds_per_axis, "compute at peak"]
        values = [*cost.seconds_per_axis.values(), cost.compute_s]
        fig.add_trace(
            go.Bar(
                y=labels,
                x=[0.0 if v is None else v * 1e3 for v in values],
                text=[_duration(v) for v in values],
                textposition="auto",
                orientation="h",
                name="time",
                showlegend=False,
                marker={"color": ["#ff7f0e"] * len(cost.seconds_per_axis) + ["#7f7f7f"]},
                customdata=[*cost.network_per_axis.values(), "chip"],
                hovertemplate="%{y} (%{customdata}): %{text}<extra></extra>",
            ),
            row=1,
            col=len(titles),
        )
        fig.update_yaxes(autorange="reversed", row=1, col=len(titles))
    fig.update_layout(
        barmode="stack",
        height=max(260, 40 * max(len(traffic), len(cost.seconds_per_axis) + 1 if cost else 0) + 180),
        template="plotly_white",
        title={"text": priced.headline(), "x": 0.01},
        legend={"orientation": "h", "y": -0.25},
        margin={"l": 90, "r": 20, "t": 80, "b": 60},
    )
    return fig


def communication_html(
    communication: CommunicationReport | CommunicationCost | None = None,
    *,
    plan: Any = None,
    target: Any = None,
    mesh: dict[str, int] | None = None,
    rows: int = 5,
) -> str:
    """The summary as HTML: per axis group the collectives, bytes per device and time; the advice
    (`communication_advice`) and notes; the plan's reason and its first `rows` options, the `mesh`
    drawn (default the report's) marked and added with its rank when it ranks lower."""
    return _html(_Priced(communication, target, plan), plan, mesh, rows)


def _html(priced: _Priced, plan: Any, mesh: dict[str, int] | None, rows: int) -> str:
    report, cost = priced.report, priced.cost
    out = []
    if not priced.empty:
        traffic = report.per_axis() if report is not None else {}
        head = ["mesh axes", "collectives", "sent per device", "by kind"]
        head += ["network", f"time on {cost.target}"] if cost is not None else []
        body = []
        for label in traffic or (cost.seconds_per_axis if cost is not None else {}):
            t = traffic.get(label)
            kinds = ", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(t.by_kind.items())) if t else ""
            cells = [label, str(t.count) if t else "", format_bytes(t.tpu_wire_bytes) if t else "", kinds]
            if cost is not None:
                seconds = cost.seconds_per_axis.get(label)
                cells.append(cost.network_per_axis.get(label, ""))
                cells.append(_duration(seconds))
            body.append(cells)
        out.append(f"<b>{html.escape(priced.headline())}</b>" + _table(head, body))
        if cost is not None:
            out.append(html.escape(cost.lines()[-1]))
        notes = communication_advice(report, priced.target) + report.notes if report is not None else []
        if notes:
            out.append(
                "<ul style='margin:4px 0'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"
            )
    if plan is not None:
        out.append(_plan_html(plan, mesh or (report.axis_sizes if report is not None else None), rows))
    return "<div class='wb-communication'>" + "".join(f"<div>{p}</div>" for p in out) + "</div>"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def _table(head: list[str], body: list[list[Any]], marked: set[int] = frozenset()) -> str:
    """A plain HTML table; the rows in `marked` bold on a tint."""
    cell = "style='padding:1px 8px'"
    rows = ["<tr>" + "".join(f"<th {cell}>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for i, line in enumerate(body):
        style = " style='font-weight:bold;background:#eef5fb'" if i in marked else ""
        rows.append(
            f"<tr{style}>" + "".join(f"<td {cell}>{html.escape(str(c))}</td>" for c in line) + "</tr>"
        )
    return f"<table style='border-collapse:collapse;font-size:12px;text-align:left'>{''.join(rows)}</table>"


def _plan_html(plan: Any, mesh: dict[str, int] | None, rows: int) -> str:
    current = None
    if mesh is not None:
        key = tuple(int(mesh.get(a, 1)) for a in ("data", "fsdp", "model"))
        current = next((i for i, o in enumerate(plan.options) if (o.data, o.fsdp, o.model) == key), None)
    shown = list(range(min(rows, len(plan.options))))
    if current is not None and current not in shown:
        shown.append(current)
    head = ["rank", *(plan.options[0].row() if plan.options else {})]
    body = []
    for i in shown:
        cells = [str(i + 1), *("" if v is None else v for v in plan.options[i].row().values())]
        if i == current:
            cells[1] = f"{cells[1]} (drawn)"
        body.append(cells)
    more = len(plan.options) - len(shown)
    return (
        f"<b>Mesh plan for {html.escape(plan.target)}</b>: {html.escape(plan.reason)}"
        + _table(head, body, {shown.index(current)} if current is not None else set())
        + (f"<i>{more} more mesh shape(s): MeshPlan.table()</i>" if more > 0 else "")
    )


def communication_panel(
    communication: CommunicationReport | CommunicationCost | None = None,
    *,
    plan: Any = None,
    target: Any = None,
    mesh: dict[str, int] | None = None,
    rows: int = 5,
) -> MeshView:
    """A `MeshView` without the sharding map: `communication_figure` as a `FigureView` (when there is
    a report or cost) above `communication_html` as an `ipw.HTML` (class ``wb-communication``)."""
    if communication is None and plan is None:
        raise ValueError(
            "communication_panel needs a CommunicationReport or CommunicationCost, or a MeshPlan"
        )
    priced = _Priced(communication, target, plan)
    figure = None if priced.empty else FigureView(_figure(priced), name="communication")
    summary = ipw.HTML(_html(priced, plan, mesh, rows)).add_class("wb-communication")
    return MeshView(None, figure, summary)
