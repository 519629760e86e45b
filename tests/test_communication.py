"""The communication report: HLO collectives read from text, the analytic model, pricing, plan_mesh,
and (XLA scenario) the model against the compiled training step on every mesh of 8 devices."""

from __future__ import annotations

import pytest

from workbench.analysis.comm_model import predict_communication
from workbench.analysis.communication import communication_advice, from_hlo
from workbench.analysis.hlo_collectives import (
    HloParseError,
    group_axes,
    parse_replica_groups,
    read_collectives,
    ring_wire_bytes,
    shape_bytes,
)
from workbench.analysis.mesh_plan import plan_mesh
from workbench.backend.hardware import CHIPS
from workbench.backend.targets import TARGETS, mesh_factorisations
from workbench.parallel.plan import plan_sharding
from workbench.parallel.rules import rules_for, rules_for_mesh
from workbench.train.step_hlo import tiny_run_model

SIZES = {"data": 2, "fsdp": 4, "model": 1}

# A hand-written module in XLA's optimised-HLO spelling: a gradient all-reduced over fsdp and sliced
# (the reduce-scatter pattern), an all-gather in a while body of 3 trips, an async all-reduce over data.
HLO = """HloModule step

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%slice_fusion (p0: f32[64,64], p1: u32[]) -> f32[16,64] {
  %p0 = f32[64,64]{1,0} parameter(0)
  %p1 = u32[] parameter(1)
  %c = s32[] constant(0)
  ROOT %dynamic-slice.1 = f32[16,64]{1,0} dynamic-slice(%p0, %p1, %c), dynamic_slice_sizes={16,64}
}

%body (state: (s32[], f32[16,64])) -> (s32[], f32[16,64]) {
  %state = (s32[], f32[16,64]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %w = f32[16,64]{1,0} get-tuple-element(%state), index=1
  %all-gather.2 = f32[64,64]{1,0} all-gather(%w), channel_id=2, replica_groups=[2,4]<=[8], dimensions={0}, use_global_device_ids=true
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[16,64]{1,0}) tuple(%next, %w)
}

%cond (state.1: (s32[], f32[16,64])) -> pred[] {
  %state.1 = (s32[], f32[16,64]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%state.1), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

ENTRY %main (param: f32[64,64], param.1: f32[16,64], param.2: f32[128]) -> f32[16,64] {
  %param = f32[64,64]{1,0} parameter(0)
  %param.1 = f32[16,64]{1,0} parameter(1)
  %param.2 = f32[128]{0} parameter(2)
  %partition-id = u32[] partition-id()
  %all-reduce.1 = f32[64,64]{1,0} all-reduce(%param), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %fusion.1 = f32[16,64]{1,0} fusion(%all-reduce.1, %partition-id), kind=kLoop, calls=%slice_fusion
  %all-reduce-start.3 = f32[128]{0} all-reduce-start(%param.2), channel_id=3, replica_groups=[4,2]<=[2,4]T(1,0), use_global_device_ids=true, to_apply=%add
  %all-reduce-done.3 = f32[128]{0} all-reduce-done(%all-reduce-start.3)
  %zero = s32[] constant(0)
  %init = (s32[], f32[16,64]{1,0}) tuple(%zero, %fusion.1)
  %loop = (s32[], f32[16,64]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[16,64]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_replica_groups_in_both_spellings():
    assert parse_replica_groups("{{0,1},{2,3}}") == [[0, 1], [2, 3]]
    assert parse_replica_groups("[2,4]<=[8]") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert parse_replica_groups("[4,2]<=[2,4]T(1,0)") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert parse_replica_groups("[2,4]<=[2,2,2]T(2,1,0)") == [[0, 4, 2, 6], [1, 5, 3, 7]]
    assert parse_replica_groups("{}", num_devices=4) == [[0, 1, 2, 3]]
    with pytest.raises(HloParseError, match="num_devices"):
        parse_replica_groups("{}")
    with pytest.raises(HloParseError, match="iota"):
        parse_replica_groups("[3,4]<=[8]")


def test_groups_name_the_mesh_axes_they_span():
    grid = list(range(8))
    assert group_axes([[0, 1, 2, 3], [4, 5, 6, 7]], SIZES, grid) == ("fsdp",)
    assert group_axes([[0, 4], [1, 5], [2, 6], [3, 7]], SIZES, grid) == ("data",)
    assert group_axes([list(range(8))], SIZES, grid) == ("data", "fsdp")
    # the device grid decides: the same ids on a permuted mesh span the other axis
    assert group_axes([[0, 1], [2, 3]], {"data": 2, "fsdp": 2}, [0, 2, 1, 3]) == ("data",)
    with pytest.raises(HloParseError, match="not on the mesh"):
        group_axes([[9]], SIZES, grid)


def test_bytes_and_ring_formulas():
    assert shape_bytes("f32[64,64]{1,0}") == 16384
    assert shape_bytes("(bf16[8]{0}, s32[], token[])") == 20
    assert shape_bytes("pred[3]") == 3
    assert ring_wire_bytes("all-reduce", 800, 8) == 1400
    assert ring_wire_bytes("all-gather", 800, 8) == 700
    assert ring_wire_bytes("reduce-scatter", 800, 4) == 600
    assert ring_wire_bytes("collective-permute", 800, 2) == 800
    assert ring_wire_bytes("all-reduce", 800, 1) == 0
    with pytest.raises(ValueError, match="kind='broadcast'"):
        ring_wire_bytes("broadcast", 1, 2)


def test_collectives_read_from_hlo_text():
    found = {c.name: c for c in read_collectives(HLO, SIZES)}
    assert set(found) == {"all-reduce.1", "all-gather.2", "all-reduce-start.3"}
    reduce = found["all-reduce.1"]
    assert (reduce.axes, reduce.size_bytes, reduce.scatter_pattern) == (("fsdp",), 16384, True)
    assert reduce.wire_bytes == 2 * 16384 * 3 / 4 and reduce.tpu_wire_bytes == 16384 * 3 / 4
    gather = found["all-gather.2"]
    assert (gather.count, gather.count_known, gather.axes, gather.size_bytes) == (3, True, ("fsdp",), 16384)
    start = found["all-reduce-start.3"]
    assert (start.kind, start.asynchronous, start.axes, start.scatter_pattern) == (
        "all-reduce",
        True,
        ("data",),
        False,
    )


def test_report_sums_per_axis_and_prices_on_a_target():
    report = from_hlo(HLO, SIZES)
    per_axis = report.per_axis()
    assert list(per_axis) == ["data", "fsdp"]
    assert per_axis["fsdp"].count == 4 and per_axis["fsdp"].tpu_wire_bytes == 16384 * 3 / 4 * 4
    assert any("reduce-scatter" in n for n in report.notes)
    cost = report.price("v5e-8")
    bandwidth = CHIPS["v5e"].collective_bandwidth
    assert cost.seconds_per_axis["fsdp"] == pytest.approx(per_axis["fsdp"].tpu_wire_bytes / bandwidth)
    assert cost.compute_s is None and cost.share is None  # no FLOPs given
    advice = communication_advice(report, "v5e-8")
    assert any("all-reduced whole over fsdp" in line and "reduce-scatter" in line for line in advice)
    assert any(line.startswith("on v5e-8") for line in advice)


def test_chip_table_interconnect_is_published_or_unknown():
    assert CHIPS["v5e"].collective_bandwidth == 200e9  # 51.2 TB/s per 256-chip pod
    assert CHIPS["v5p"].collective_bandwidth == 600e9  # half of 1,200 GB/s bidirectional
    assert CHIPS["v4"].ici_bandwidth_bytes_per_s is None and CHIPS["v4"].collective_bandwidth > 0
    assert CHIPS["t4"].collective_bandwidth is None
    assert TARGETS["v4-32"].num_devices == 16 and TARGETS["v4-32"].topology == "2x2x4"


TINY = tiny_run_model()


def test_mixed_data_fsdp_mesh_splits_the_embedding_by_hidden():
    params = [
        ("model.embed_tokens.weight", (512, 64), "float32"),
        ("model.layers.0.mlp.up_proj.weight", (128, 64), "float32"),
    ]
    for sizes, expected in (
        ({"data": 2, "fsdp": 4, "model": 1}, (None, "fsdp")),
        ({"data": 1, "fsdp": 8, "model": 1}, ("fsdp", None)),
    ):
        # the plan from shapes applies the mesh's rule itself, as `shard_model` does; rules already
        # adjusted for the mesh give the same plan
        for rules in (rules_for("llama"), rules_for_mesh(rules_for("llama"), sizes)):
            report = plan_sharding(params, sizes, rules, warn_fallback=False)
            assert report.entry("model.embed_tokens.weight").spec == expected
            assert report.entry("model.layers.0.mlp.up_proj.weight").spec == ("fsdp", None)
            assert report.entry("model.embed_tokens.weight").local_shape == (
                (512, 16) if sizes["data"] > 1 else (64, 64)
            )


def test_model_two_axis_mesh_moves_the_attention_output_not_its_weight():
    """fsdp x model: the attention's output projection runs weight-stationary forward, and the
    embedding's lookup comes as [tokens, hidden / fsdp] rows (`comm_model._attention_output_terms`)."""
    report = predict_communication(TINY, {"data": 1, "fsdp": 4, "model": 2}, batch_size=8, seq_len=32)
    by_name = {c.name: c for c in report.collectives}
    assert by_name["layers.0.o_proj.weight gathered (backward)"].count == 2  # 2 layers, backward only
    assert by_name["attention output: every token"].size_bytes == 256 * 32 * 4  # every token, heads / model
    assert by_name["attention output projection (model)"].size_bytes == 256 * 16 * 4  # hidden / fsdp
    assert by_name["attention output: to the batch's rows"].kind == "all-to-all"
    assert by_name["embedding gradient: to hidden columns"].kind == "all-to-all"
    with_data = predict_communication(TINY, {"data": 2, "fsdp": 2, "model": 2}, batch_size=8, seq_len=32)
    kinds = {c.name: (c.kind, c.axes) for c in with_data.collectives}
    assert kinds["attention output: every hidden column"] == ("all-gather", ("fsdp",))
    assert kinds["embedding lookup: every token"] == ("all-gather", ("data",))
    assert kinds["embedding gradient: every token"] == ("all-gather", ("data", "fsdp"))


def test_model_pure_data_parallel_is_gradient_all_reduces():
    report = predict_communication(TINY, {"data": 8}, batch_size=8, seq_len=32)
    (axis,) = report.per_axis()
    params = 512 * 64 + 2 * (4 * 64 * 64 + 3 * 128 * 64 + 2 * 64) + 64
    tied_twice = 512 * 64  # the tied embedding is reduced once per use
    assert axis == "data"
    assert report.tpu_wire_bytes == pytest.approx(2 * 7 / 8 * 4 * (params + tied_twice))


def test_model_errors_name_the_field():
    with pytest.raises(ValueError, match="batch_size=6"):
        predict_communication(TINY, {"data": 4}, batch_size=6, seq_len=8)
    with pytest.raises(ValueError, match="precision='fp8'"):
        predict_communication(TINY, {"data": 2}, batch_size=2, seq_len=8, precision="fp8")
    with pytest.raises(ValueError, match="target='v9'"):
        plan_mesh(TINY, "v9", 32, 8)


def test_plan_mesh_ranks_every_shape_of_a_v4_32():
    from bench.real_shapes import real_config

    qwen = real_config("qwen2.5-0.5b")
    plan = plan_mesh(qwen, "v4-32", 2048, 32, lora_rank=16)
    assert len(plan.options) == len(mesh_factorisations(16))
    best = plan.best
    assert best is not None and best.fits and best.label in plan.reason
    runnable = [o for o in plan.options if o.problem is None and o.fits]
    assert [o.step_s for o in runnable] == sorted(o.step_s for o in runnable)
    assert "GiB/device" in plan.table() and plan.table().count("\n") == len(plan.options) + 1


ALL_MESHES = [list(m) for m in mesh_factorisations(8)]
AXIS_TOLERANCE = 0.10
"""The analytic model against the compiled step, per axis group (bytes each device sends, TPU
pipeline), on every mesh; groups under 2% of a mesh's bytes (index and mask reshuffles of a few
hundred bytes) are left out."""


@pytest.fixture(scope="module")
def measured(xla_scenario):
    return xla_scenario("communication_step", meshes=ALL_MESHES)


@pytest.mark.slow
@pytest.mark.xla
def test_model_matches_the_compiled_step_on_every_mesh(measured):
    assert set(measured) == {f"{d}x{f}x{m}" for d, f, m in ALL_MESHES}
    for mesh, figures in measured.items():
        hlo, model = figures["hlo"], figures["model"]
        significant = {k: v for k, v in hlo.items() if v > 0.02 * sum(hlo.values())}
        for axes, measured_bytes in significant.items():
            assert model.get(axes, 0) == pytest.approx(measured_bytes, rel=AXIS_TOLERANCE), (
                mesh,
                axes,
                hlo,
                model,
            )
        assert set(model) <= set(hlo), (mesh, hlo, model)  # no traffic on an axis group the step has none on


@pytest.mark.slow
@pytest.mark.xla
def test_fsdp_gradients_are_all_reduce_plus_slice_on_cpu(measured):
    figures = measured["1x8x1"]
    assert figures["scatter_patterns"] > 0
    assert figures["hlo_cpu"]["fsdp"] > figures["hlo"]["fsdp"]  # as compiled on XLA:CPU, before TPU's rewrite
    assert "reduce-scatter" not in figures["kinds"]


def test_an_async_collective_is_counted_once_and_a_shared_callee_per_call_site():
    """XLA's async form names the wrapped computation on both halves (``async-start`` and
    ``async-done``); only the start runs it. A computation called from two sites runs twice."""
    from workbench.analysis.hlo_collectives import read_collectives

    text = """HloModule m

%wrapped (p: f32[64]) -> f32[8] {
  %p = f32[64]{0} parameter(0)
  ROOT %reduce-scatter.1 = f32[8]{0} reduce-scatter(%p), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, to_apply=%add
}

%twice (q: f32[16]) -> f32[16] {
  %q = f32[16]{0} parameter(0)
  ROOT %all-reduce.2 = f32[16]{0} all-reduce(%q), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
}

ENTRY %main (a: f32[64], b: f32[16]) -> f32[8] {
  %a = f32[64]{0} parameter(0)
  %b = f32[16]{0} parameter(1)
  %c1 = f32[16]{0} call(%b), to_apply=%twice
  %c2 = f32[16]{0} call(%c1), to_apply=%twice
  %start = ((f32[64]{0}), f32[8]{0}) async-start(%a), calls=%wrapped
  ROOT %done = f32[8]{0} async-done(%start), calls=%wrapped
}
"""
    found = {c.kind: c for c in read_collectives(text, {"data": 8})}
    assert found["reduce-scatter"].count == 1
    assert found["all-reduce"].count == 2
