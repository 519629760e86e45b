"""The sharding map drawn from a real sharding plan of a real (tiny) transformers model."""

from __future__ import annotations

import warnings

import plotly.graph_objects as go
import pytest

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


def test_mesh_view_is_a_widget_with_its_state_synced(model):
    report = plan(model, {"data": 2, "fsdp": 4, "model": 1})
    widget = mesh_view(report)
    assert isinstance(widget, go.FigureWidget)
    # The synced state carries the data (a page that attaches late draws the same thing).
    assert len(widget._widget_data) == len(widget.data) and widget._widget_data[0]["z"]


def test_empty_report_is_refused():
    empty = ShardingReport([], {"data": 1, "fsdp": 1, "model": 1}, [0])
    with pytest.raises(ValueError, match="no entries"):
        mesh_figure(empty)
