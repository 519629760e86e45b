"""The sharding map drawn from a real sharding plan of a real (tiny) transformers model, and beside it
the communication of a step on that mesh (predicted from shapes, priced on a target) and the mesh plan."""

from __future__ import annotations

import html
import warnings

import ipywidgets as ipw
import plotly.graph_objects as go
import pytest

from widgets.live_plot import FigureView
from widgets.mesh_view import (
    MeshView,
    communication_figure,
    communication_panel,
    mesh_figure,
    mesh_view,
    parameter_group_rows,
    split_kind,
)
from workbench.analysis.comm_model import predict_communication
from workbench.analysis.communication import CommunicationReport
from workbench.analysis.hlo_collectives import Collective
from workbench.analysis.mesh_plan import plan_mesh
from workbench.backend.hardware import CHIPS
from workbench.config import ModelConfig
from workbench.models.build import build_model
from workbench.parallel.plan import plan_sharding
from workbench.parallel.rules import rules_for
from workbench.parallel.sharding_report import ShardingReport

MiB = 1024**2


TINY = ModelConfig(family="llama", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="module")
def model():
    return build_model(TINY)


def plan(model, sizes):
    params = [(n, tuple(p.shape), p.dtype) for n, p in model.named_parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_sharding(params, sizes, rules_for(model))


def test_device_panel_matches_the_report(model):
    report = plan(model, {"data": 2, "fsdp": 2, "model": 2})
    fig = mesh_figure(report)
    heat = fig.data[0]
    assert isinstance(heat, go.Heatmap)
    # Laid out as the mesh: (data x fsdp) rows by model columns, in device-id order.
    assert len(heat.z) == 4 and all(len(row) == 2 for row in heat.z)
    per_device = report.per_device_bytes()
    flat = [v for row in heat.z for v in row]
    assert flat == pytest.approx([per_device[d] / MiB for d in range(8)])
    assert heat.text[3][1].startswith("d7")


def test_groups_fold_layers_and_keep_totals(model):
    report = plan(model, {"data": 1, "fsdp": 4, "model": 2})
    groups = parameter_group_rows(report)
    names = [g["name"] for g in groups]
    assert "model.layers.*.mlp.up_proj.weight" in names
    assert not any(".0." in n or ".1." in n for n in names)
    assert sum(g["bytes"] for g in groups) == report.total_bytes
    assert sum(g["bytes_per_device"] for g in groups) == sum(e.bytes_per_device for e in report.entries)
    up = next(g for g in groups if g["name"] == "model.layers.*.mlp.up_proj.weight")
    assert up["count"] == 2 and up["kind"] == "fsdp+model"
    assert up["bytes_per_device"] * 8 == up["bytes"]


def test_tile_panel_shows_which_device_holds_which_slice(model):
    report = plan(model, {"data": 2, "fsdp": 2, "model": 2})
    name = "model.layers.0.mlp.down_proj.weight"
    fig = mesh_figure(report, parameter=name)
    tiles = fig.data[-1]
    expected = [
        ["d" + ",".join(map(str, devs)) for _idx, devs in line] for line in report.device_map(name).tiles()
    ]
    assert [list(row) for row in tiles.text] == expected
    # Data parallel replicates each tile on 2 devices: 4 tiles x 2 devices = all 8.
    assert sorted(int(d) for row in expected for cell in row for d in cell[1:].split(",")) == list(range(8))
    assert name in fig.layout.annotations[2].text


def test_pure_data_parallel_is_replicated_everywhere(model):
    report = plan(model, {"data": 8, "fsdp": 1, "model": 1})
    groups = parameter_group_rows(report)
    assert {g["kind"] for g in groups} == {"replicated"}
    fig = mesh_figure(report)
    assert all(v == pytest.approx(report.total_bytes / MiB) for row in fig.data[0].z for v in row)
    assert split_kind((None, ("fsdp", "model"))) == "fsdp+model"


def test_mesh_view_is_a_figure_view_whose_synced_look_is_the_whole_figure(model):
    report = plan(model, {"data": 2, "fsdp": 4, "model": 1})
    widget = mesh_view(report)
    assert isinstance(widget, FigureView) and isinstance(widget.figure, go.Figure)
    # The channel's synced look carries every trace with its data (a page that attaches late draws it).
    look = widget.channel.get_state()["look"]
    assert look["whole"] and len(look["styles"]) == len(widget.figure.data)
    assert look["styles"][0]["z"] == [list(row) for row in widget.figure.data[0].z]
    assert look["layout"]["title"]["text"] == widget.figure.layout.title.text


class WholeFigurePage:
    """What live_plot.js does with a FigureView's synced traits, in Python: draw the look of each
    numbered message in order; on a gap (a missed message) ask for the state and the look again."""

    def __init__(self, view: FigureView):
        state = view.channel.get_state()  # what a page gets when it attaches
        self.look, self.seq, self.snapshots = state["look"], state["state"]["seq"], 0

    def receive(self, look: dict, delta: dict, view: FigureView) -> None:
        if delta["base"] != self.seq:
            view.channel._on_frontend_message(view.channel, {"type": "snapshot", "have": self.seq}, [])
            resent = view.channel.get_state(["look", "state"])  # what that request sends back
            self.look, self.seq = resent["look"], resent["state"]["seq"]
            self.snapshots += 1
            return
        self.look, self.seq = look, delta["seq"]


def test_a_redrawn_figure_after_a_missed_message_is_recovered_from_the_state(model):
    report = plan(model, {"data": 2, "fsdp": 2, "model": 2})
    view = mesh_view(report)
    page = WholeFigurePage(view)
    assert view.redraw() is None  # nothing changed: nothing sent

    view.figure.update_layout(title_text="redrawn once")
    delta = view.redraw()  # the look and the delta travel in one message
    page.receive(view.look, delta, view)
    assert page.look["layout"]["title"]["text"] == "redrawn once" and page.snapshots == 0

    view.figure.data[0].z = [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
    view.redraw()  # this message never reaches the page
    view.figure.layout.shapes = [dict(type="line", x0=0, x1=1, y0=0, y1=1)]
    view.figure.update_layout(title_text="redrawn three times")
    delta = view.redraw()
    page.receive(view.look, delta, view)  # base 2 != page's 1: a gap, so it asks again

    assert page.snapshots == 1 and page.seq == view.seq == 3 and view.channel.snapshot_requests == 1
    assert page.look == view.look and page.look["rev"] == 3
    drawn = page.look["styles"][0]["z"]
    assert drawn == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
    assert page.look["layout"]["shapes"][0]["x1"] == 1
    assert page.look["layout"]["title"]["text"] == "redrawn three times"


def test_a_figure_view_refuses_what_is_not_a_figure(model):
    with pytest.raises(TypeError, match=r"go\.Figure"):
        FigureView({"data": []})
    view = mesh_view(plan(model, {"data": 8, "fsdp": 1, "model": 1}))
    with pytest.raises(TypeError, match="redraw"):
        view.update([])


def test_empty_report_is_refused():
    empty = ShardingReport([], {"data": 1, "fsdp": 1, "model": 1}, [0])
    with pytest.raises(ValueError, match="no entries"):
        mesh_figure(empty)


def test_mesh_view_shows_the_communication_of_a_step_and_the_mesh_plan(model):
    sizes = {"data": 2, "fsdp": 4, "model": 1}
    report = plan(model, sizes)
    comm = predict_communication(TINY, sizes, batch_size=8, seq_len=64)
    mesh_plan = plan_mesh(TINY, "v5e-8", 64, 8)
    view = mesh_view(report, communication=comm, plan=mesh_plan)  # priced on the plan's target
    assert isinstance(view, MeshView) and isinstance(view, ipw.VBox)
    assert view.children == (view.sharding, view.communication, view.summary)
    assert view.figure.layout.title.text == mesh_figure(report).layout.title.text

    fig = view.communication.figure
    traffic = comm.per_axis()
    assert {"data", "fsdp"} <= set(traffic)  # gradients over data, weights gathered over fsdp
    assert list(fig.data[0].y) == list(traffic)
    bars = {t.name: t for t in fig.data if t.name != "time"}
    assert bars["reduce-scatter"].x[list(traffic).index("fsdp")] == pytest.approx(
        traffic["fsdp"].by_kind["reduce-scatter"] / MiB
    )
    for i, axis in enumerate(traffic):  # the kinds stack up to what each device sends over that axis
        assert sum(b.x[i] for b in bars.values()) == pytest.approx(traffic[axis].tpu_wire_bytes / MiB)
    cost = comm.price("v5e-8")
    (time_bar,) = [t for t in fig.data if t.name == "time"]
    assert list(time_bar.y) == [*traffic, "compute at peak"]
    assert list(time_bar.x) == pytest.approx(
        [s * 1e3 for s in cost.seconds_per_axis.values()] + [cost.compute_s * 1e3]
    )
    assert cost.seconds_per_axis["fsdp"] == pytest.approx(
        traffic["fsdp"].tpu_wire_bytes / CHIPS["v5e"].collective_bandwidth
    )
    assert f"{100 * cost.share:.0f}% of the step on v5e-8" in fig.layout.title.text
    look = view.communication.channel.get_state()["look"]  # a page attaching late draws it whole
    assert look["whole"] and len(look["styles"]) == len(fig.data)

    page = view.summary.value
    assert "time on v5e-8" in page and "reduce-scatter" in page and "ICI" in page
    assert "Mesh plan for v5e-8" in page and html.escape(mesh_plan.reason) in page
    drawn = next(i for i, o in enumerate(mesh_plan.options) if (o.data, o.fsdp, o.model) == (2, 4, 1))
    assert (
        f"<td style='padding:1px 8px'>{drawn + 1}</td><td style='padding:1px 8px'>2x4x1 (drawn)</td>" in page
    )
    assert page.count("<tr") == 1 + len(traffic) + 1 + 5 + (drawn >= 5)  # a row per axis group, 5 plan rows


def test_communication_panel_takes_a_cost_a_plan_or_a_report_read_from_xla_cpu():
    # an fsdp gradient all-reduced whole and sliced, as XLA:CPU compiles it: TPU's XLA sends half
    grad = Collective(
        "g", "all-reduce", "main", "f32", (64, 64), 64 * 64 * 4, 8, 1, ("fsdp",), 3, scatter_pattern=True
    )
    report = CommunicationReport([grad], {"data": 1, "fsdp": 8, "model": 1})
    fig = communication_figure(report)
    bar, marker = fig.data
    assert (bar.name, list(bar.x)) == ("reduce-scatter", [pytest.approx(3 * 7 / 8 * 64 * 64 * 4 / MiB)])
    assert marker.name.startswith("as compiled here") and list(marker.x) == [pytest.approx(2 * bar.x[0])]
    panel = communication_panel(report, target="v4-32")
    assert "all-reduced whole over fsdp" in panel.summary.value and "on v4-32" in panel.summary.value

    only_cost = communication_figure(report.price("v5e-8"))  # no report: the time panel alone
    assert [t.name for t in only_cost.data] == ["time"] and "v5e-8" in only_cost.layout.annotations[0].text

    mesh_plan = plan_mesh(TINY, "v5e-8", 64, 8)
    last = len(mesh_plan.options) - 1
    worst = mesh_plan.options[last]
    only_plan = communication_panel(
        plan=mesh_plan, mesh={"data": worst.data, "fsdp": worst.fsdp, "model": worst.model}, rows=2
    )
    assert only_plan.communication is None and only_plan.children == (only_plan.summary,)
    assert only_plan.summary.value.count("<tr") == 1 + 3 and f"{last + 1}</td>" in only_plan.summary.value
    with pytest.raises(ValueError, match="needs a CommunicationReport"):
        communication_panel()
    with pytest.raises(TypeError, match="CommunicationReport"):
        communication_figure({"fsdp": 1.0})
