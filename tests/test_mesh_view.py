"""The sharding map drawn from a real sharding plan of a real (tiny) transformers model."""

from __future__ import annotations

import warnings

import plotly.graph_objects as go
import pytest

from widgets.live_plot import FigureView
from widgets.mesh_view import mesh_figure, mesh_view, parameter_group_rows, split_kind
from workbench.config import ModelConfig
from workbench.models.build import build_model
from workbench.parallel.plan import ShardingReport, plan_sharding
from workbench.parallel.rules import rules_for

MiB = 1024**2


@pytest.fixture(scope="module")
def model():
    return build_model(ModelConfig(family="llama", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2))


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
