"""Meshes and sharding: pure-Python validation and plans here, real SPMD on 8 virtual devices below.

The SPMD tests train a tiny Llama and a tiny Qwen2 for three steps on each mesh
(fsdp=8; data=2 x fsdp=4; data=2 x fsdp=2 x model=2; fsdp=4 x model=2) and compare the losses
with the unsharded run in the same process (SPMD mode, no mesh: replicated on every device).
Tolerance: 1e-4 absolute on losses near 6.2 (fp32 on XLA:CPU; sharded matmuls and
all-reduces add in a different order, observed differences are ~2e-6).
"""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from tests.tiny import tiny
from workbench.backend.hardware import GiB, HardwareInfo
from workbench.config import MeshConfig
from workbench.models.build import build_model
from workbench.parallel.apply import batch_spec
from workbench.parallel.mesh import MeshError, MeshSpec, check_batch_size, mesh_from_config, mesh_preset
from workbench.parallel.plan import plan_sharding
from workbench.parallel.rules import DECODER_RULES, GPT2_RULES, rules_for
from workbench.parallel.sharding_report import shard_map
from workbench.parallel.sharding_rule import FSDP_ONLY_RULES, ShardingError, ShardingRule

LOSS_TOLERANCE = 1e-4
MESHES = [
    {"data": 1, "fsdp": 8, "model": 1},
    {"data": 2, "fsdp": 4, "model": 1},
    {"data": 2, "fsdp": 2, "model": 2},
    {"data": 1, "fsdp": 4, "model": 2},
]
FAMILIES = ["llama", "qwen2", "mistral", "gemma", "gpt2"]


def params_of(model) -> list[tuple[str, tuple[int, ...], object]]:
    return [(n, tuple(p.shape), p.dtype) for n, p in model.named_parameters()]


@pytest.fixture(scope="module")
def models():
    return {family: build_model(tiny(family)) for family in FAMILIES}


def hardware(
    num_devices: int, *, chip: str = "v5e", via_xla: bool = True, processes: int = 1
) -> HardwareInfo:
    return HardwareInfo(
        backend="tpu" if via_xla else "cuda",
        via_xla=via_xla,
        device_kind=chip,
        chip=chip,
        num_devices=num_devices,
        local_devices=num_devices // processes,
        num_processes=processes,
        process_index=0,
        memory_per_device_bytes=16 * GiB,
        peak_bf16_flops_per_device=None,
        host_memory_bytes=64 * GiB,
        platform="local",
    )


# ---- MeshSpec ------------------------------------------------------------------------


def test_resolve_fills_the_one_unknown_axis():
    assert MeshSpec().resolve(8) == MeshSpec(data=8, fsdp=1, model=1)
    spec = MeshSpec(data=-1, fsdp=2, model=2).resolve(8)
    assert spec.axis_sizes == {"data": 2, "fsdp": 2, "model": 2}
    assert spec.dp_size == 4 and spec.num_devices == 8
    assert MeshSpec(data=2, fsdp=-1, model=2).resolve(16).fsdp == 4


def test_resolve_spells_out_the_product():
    with pytest.raises(MeshError) as err:
        MeshSpec(data=2, fsdp=2, model=4).resolve(8)
    assert str(err.value) == "data(2) x fsdp(2) x model(4) = 16 != 8 devices"


def test_minus_one_that_cannot_be_filled():
    with pytest.raises(
        MeshError,
        match=re.escape("cannot fill data=-1: 8 devices are not divisible by fsdp(3) x model(1) = 3"),
    ):
        MeshSpec(data=-1, fsdp=3).resolve(8)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"fsdp": 0}, "MeshSpec.fsdp=0 is not allowed"),
        ({"model": -2}, "MeshSpec.model=-2 is not allowed"),
        ({"model": 2.0}, "MeshSpec.model=2.0 is not allowed: expected an int"),
        ({"data": True}, "MeshSpec.data=True is not allowed"),
        ({"data": -1, "model": -1}, "-1 on data and model: at most one axis may be -1"),
        ({"num_slices": 0}, "MeshSpec.num_slices=0 is not allowed"),
        ({"dcn_axis": "model"}, "MeshSpec.dcn_axis='model' is not allowed"),
    ],
)
def test_bad_mesh_values(kwargs, message):
    with pytest.raises(MeshError, match=re.escape(message)):
        MeshSpec(**kwargs)


def test_unresolved_sizes_are_refused():
    with pytest.raises(MeshError, match="unknown until resolve"):
        _ = MeshSpec(data=-1).dp_size
    with pytest.raises(MeshError, match="num_devices=0"):
        MeshSpec().resolve(0)


def test_hybrid_shapes_put_slices_on_the_dcn_axis():
    spec = MeshSpec(data=-1, fsdp=4, num_slices=2).resolve(16)
    assert spec.hybrid_shapes() == ((2, 4, 1), (2, 1, 1))
    spec = MeshSpec(data=1, fsdp=-1, model=2, num_slices=4, dcn_axis="fsdp").resolve(32)
    assert spec.hybrid_shapes() == ((1, 4, 2), (1, 4, 1))
    assert "over 4 slices" in spec.describe()
    with pytest.raises(MeshError, match=re.escape("data(3) must be divisible by num_slices(2)")):
        MeshSpec(data=3, fsdp=2, num_slices=2).resolve(6)


def test_from_config_and_presets():
    cfg = MeshConfig(data=2, fsdp=-1, model=2, enabled=True)
    assert MeshSpec.from_config(cfg) == MeshSpec(data=2, fsdp=-1, model=2)
    assert MeshSpec.from_config(dataclasses.replace(cfg, num_slices=2)).num_slices == 2
    assert mesh_from_config(cfg, hardware(8)) == MeshSpec(data=2, fsdp=2, model=2)
    assert mesh_from_config(dataclasses.replace(cfg, enabled=False), hardware(8)) is None
    # One chip (Colab v5e-1): no mesh. 8 chips (v5e-8, v4-8) or v3-8's 8 cores: FSDP over all.
    assert mesh_preset(hardware(1)) is None
    assert mesh_preset(hardware(8)) == MeshSpec(data=1, fsdp=8, model=1)
    assert mesh_preset(hardware(8, chip="v3")) == MeshSpec(data=1, fsdp=8, model=1)
    assert mesh_preset(hardware(16, chip="v4", processes=4)) == MeshSpec(data=1, fsdp=16, model=1)
    assert mesh_preset(hardware(2, chip="a100-40gb", via_xla=False)) is None
    # The user's mesh wins, checked against the hardware right away.
    assert mesh_preset(hardware(8), MeshSpec(data=-1, model=2)) == MeshSpec(data=4, fsdp=1, model=2)
    with pytest.raises(MeshError, match=re.escape("= 16 != 8 devices")):
        mesh_preset(hardware(8), MeshSpec(data=4, fsdp=4))


# ---- rules and plans (shapes only) -----------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sizes", MESHES, ids=lambda s: "x".join(f"{k}{v}" for k, v in s.items()))
def test_every_family_plans_on_every_mesh(models, family, sizes):
    model = models[family]
    report = plan_sharding(params_of(model), sizes, rules_for(model))
    assert report.fallbacks == []
    assert report.total_bytes == sum(p.numel() * 4 for p in model.parameters())
    shard_factor = sizes["fsdp"] * sizes["model"]
    for e in report.entries:
        # Every parameter is split over all of fsdp x model (weights), over fsdp only (GPT-2's
        # position table) or model only (column biases), or replicated (norms, row biases).
        assert e.fraction in {1.0 / shard_factor, 1.0 / sizes["fsdp"], 1.0 / sizes["model"], 1.0}, e
        if len(e.shape) == 2:
            expected = 1.0 / sizes["fsdp"] if "wpe" in e.name else 1.0 / shard_factor
            assert e.fraction == pytest.approx(expected), e
    assert report.bytes_per_device == sum(e.bytes_per_device for e in report.entries)
    # Only norms, biases (and GPT-2's position table on model axes) exceed the ideal share.
    assert report.bytes_per_device < report.total_bytes / shard_factor * 1.3


def test_tensor_parallel_roles_llama_and_qwen2(models):
    sizes = {"data": 1, "fsdp": 4, "model": 2}
    for family in ("llama", "qwen2", "mistral", "gemma"):
        report = plan_sharding(params_of(models[family]), sizes, rules_for(models[family]))
        layer = "model.layers.0."
        for name in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
        ):
            assert report.entry(layer + name + ".weight").spec == ("model", "fsdp"), (family, name)  # column
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            assert report.entry(layer + name + ".weight").spec == ("fsdp", "model"), (family, name)  # row
        assert report.entry("model.embed_tokens.weight").spec == ("model", "fsdp")  # vocab-parallel
        assert report.entry("model.norm.weight").spec == (None,)
    qwen = plan_sharding(params_of(models["qwen2"]), sizes, DECODER_RULES)
    assert qwen.entry("model.layers.0.self_attn.q_proj.bias").spec == ("model",)
    assert qwen.entry("model.layers.0.self_attn.q_proj.bias").local_shape == (32,)


def test_gpt2_conv1d_is_transposed(models):
    report = plan_sharding(params_of(models["gpt2"]), {"data": 1, "fsdp": 4, "model": 2}, GPT2_RULES)
    # Conv1D weight is [in, out]: column-parallel splits dim 1, row-parallel dim 0.
    assert report.entry("transformer.h.0.attn.c_attn.weight").spec == ("fsdp", "model")
    assert report.entry("transformer.h.0.attn.c_attn.weight").local_shape == (16, 96)
    assert report.entry("transformer.h.0.mlp.c_fc.weight").spec == ("fsdp", "model")
    assert report.entry("transformer.h.0.attn.c_proj.weight").spec == ("model", "fsdp")
    assert report.entry("transformer.h.0.mlp.c_proj.weight").spec == ("model", "fsdp")
    assert report.entry("transformer.wte.weight").spec == ("model", "fsdp")
    assert report.entry("transformer.h.0.attn.c_attn.bias").spec == ("model",)
    assert report.entry("transformer.h.0.mlp.c_proj.bias").spec == (None,)


def test_untied_lm_head_is_vocab_parallel():
    model = build_model(tiny("llama", tie_word_embeddings=False))
    report = plan_sharding(params_of(model), {"data": 2, "fsdp": 2, "model": 2}, rules_for(model))
    assert report.entry("lm_head.weight").spec == ("model", "fsdp")
    assert report.entry("lm_head.weight").local_shape == (256, 32)


def test_fsdp_only_takes_the_largest_dimension(models):
    report = plan_sharding(params_of(models["llama"]), {"data": 1, "fsdp": 8, "model": 1}, DECODER_RULES)
    assert report.entry("model.layers.0.mlp.gate_proj.weight").spec == ("fsdp", None)  # [128, 64]
    assert report.entry("model.layers.0.mlp.down_proj.weight").spec == (None, "fsdp")  # [64, 128]
    assert report.entry("model.layers.0.self_attn.k_proj.weight").spec == (None, "fsdp")  # [32, 64]
    assert report.entry("model.embed_tokens.weight").spec == ("fsdp", None)  # [512, 64]
    # A largest dimension fsdp cannot divide leaves it for the next one that it can.
    odd = plan_sharding([("x.weight", (50257, 64), "float32")], {"fsdp": 8}, FSDP_ONLY_RULES)
    assert odd.entry("x.weight").spec == (None, "fsdp")


def test_axes_that_do_not_divide_name_parameter_dim_size_and_axis():
    model = build_model(tiny("llama", vocab_size=510))
    with pytest.raises(ShardingError) as err:
        plan_sharding(params_of(model), {"data": 1, "fsdp": 2, "model": 4}, rules_for(model))
    assert str(err.value).startswith(
        "parameter 'model.embed_tokens.weight' (shape [510, 64]): dim 0 has size 510, not divisible by mesh axis 'model' (4)"
    )
    with pytest.raises(
        ShardingError, match=re.escape("no free dimension divides by mesh axis 'fsdp' (4); dim 1 has size 66")
    ):
        plan_sharding(
            [("l.self_attn.q_proj.weight", (30, 66), "float32")], {"fsdp": 4, "model": 1}, DECODER_RULES
        )


def test_replicated_fallback_is_reported_never_silent(models):
    rules = [rule for rule in DECODER_RULES if "norm" not in rule.pattern]
    with pytest.warns(UserWarning, match=r"3 parameter\(s\) matched no sharding rule"):
        report = plan_sharding(
            [(n, s, d) for n, s, d in params_of(models["llama"]) if "layers.1" not in n], {"fsdp": 8}, rules
        )
    assert report.fallbacks == [
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.norm.weight",
    ]
    assert report.entry("model.norm.weight").spec == (None,)
    assert "FALLBACK: replicated, no rule matched" in report.table()
    assert "3 replicated by fallback" in report.table()


def test_rules_are_data_and_checked():
    rules = [(r"w$", ("model", None)), ShardingRule(r"b$", None, "bias")]
    report = plan_sharding(
        [("w", (8, 4), "bfloat16"), ("b", (4,), "float32")], {"fsdp": 2, "model": 2}, rules
    )
    assert report.entry("w").spec == ("model", "fsdp") and report.entry("w").bytes_per_device == 8 * 2
    with pytest.raises(ShardingError, match=r"gives 1 spec entries but parameter 'w' has 2 dimension"):
        plan_sharding([("w", (8, 4), "float32")], {"fsdp": 2}, [(r"w", ("model",))])
    with pytest.raises(ShardingError, match=r"names mesh axis 'tensor'; the mesh has data, fsdp, model"):
        plan_sharding(
            [("w", (8, 4), "float32")], {"data": 1, "fsdp": 2, "model": 1}, [(r"w", ("tensor", None))]
        )
    # A family with neither a tensor-parallel plan nor hand rules gets FSDP only, and a note.
    bert = rules_for("bert")
    assert list(bert) == list(FSDP_ONLY_RULES) and "'bert' has no tensor-parallel plan" in bert.notes[0]


def test_device_map_says_which_device_holds_which_shard(models):
    sizes = {"data": 2, "fsdp": 2, "model": 2}
    report = plan_sharding(params_of(models["llama"]), sizes, DECODER_RULES)
    smap = report.device_map("model.layers.0.mlp.gate_proj.weight")  # [128, 64], spec (model, fsdp)
    by_device = {s.device: s.index for s in smap.shards}
    # Device id = data*4 + fsdp*2 + model: model picks the row half, fsdp the column half.
    assert by_device[0] == ((0, 64), (0, 32))
    assert by_device[1] == ((64, 128), (0, 32))
    assert by_device[2] == ((0, 64), (32, 64))
    assert by_device[4] == by_device[0]  # data replicas hold the same tile
    tiles = smap.tiles()
    assert [[devs for _idx, devs in row] for row in tiles] == [[[0, 4], [2, 6]], [[1, 5], [3, 7]]]
    text = smap.text()
    assert "d0,4" in text and "[64:128]" in text and "[:, 32:64]" in text
    per_device = report.per_device_bytes()
    assert set(per_device) == set(range(8)) and max(per_device.values()) == report.bytes_per_device
    lines = report.device_table().splitlines()
    assert lines[0].split() == ["device", "data", "fsdp", "model", "parameter", "bytes"]
    assert lines[6].split()[:4] == ["d5", "1", "0", "1"] and len(lines) == 9
    norm = report.device_map("model.norm.weight")
    assert norm.tiles() == [[(((0, 64),), list(range(8)))]]


def test_batch_rules():
    assert batch_spec(2, {"data": 2, "fsdp": 4, "model": 1}) == (("data", "fsdp"), None)
    assert batch_spec(2, {"data": 1, "fsdp": 8, "model": 1}) == ("fsdp", None)
    assert batch_spec(3, {"data": 1, "fsdp": 1, "model": 8}) == (None, None, None)
    check_batch_size(8, {"data": 2, "fsdp": 4})
    with pytest.raises(
        ShardingError,
        match=re.escape(
            "batch has batch size 6, not divisible by the data-parallel size data(2) x fsdp(2) = 4"
        ),
    ):
        check_batch_size(6, {"data": 2, "fsdp": 2, "model": 2})
    with pytest.raises(ShardingError) as err:  # below the divisor: the lower multiple would be 0
        check_batch_size(2, {"data": 4, "fsdp": 1})
    assert str(err.value).endswith("use a multiple of 4 (e.g. 4)")
    with pytest.raises(ShardingError, match=re.escape("use a multiple of 4 (e.g. 4 or 8)")):
        check_batch_size(6, {"data": 2, "fsdp": 2})
    rows = shard_map("ids", (8, 16), ("fsdp", None), {"data": 1, "fsdp": 8, "model": 1}).shards
    assert [s.index[0] for s in rows] == [(i, i + 1) for i in range(8)]


def test_importing_sharding_starts_nothing():
    import subprocess
    import sys

    # a fresh process: in this one, other tests' model code (accelerate, via peft) imports torch_xla
    code = (
        "import sys, warnings; warnings.simplefilter('error'); import workbench.parallel; "
        "from workbench.parallel.mesh import MeshSpec; MeshSpec(fsdp=8).resolve(8); "
        "print('torch_xla' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PJRT_DEVICE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- real SPMD on 8 virtual XLA:CPU devices (scenarios in tests/xla/) -------------------


def _mesh_id(spec: dict[str, int]) -> str:
    return "x".join(f"{k}{v}" for k, v in spec.items())  # the scenario's key for each mesh


# Tensor-parallel roles to check per family: (column-parallel weight, row-parallel weight).
TP_ROLES = {
    "llama": ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"),
    "qwen2": ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"),
    # GPT-2's Conv1D stores [in, out]: column-parallel is ("fsdp", "model"), the mirror of nn.Linear.
    "gpt2": ("transformer.h.0.attn.c_attn.weight", "transformer.h.0.mlp.c_proj.weight"),
}
SHARDED_WEIGHTS = ("proj.weight", "embed_tokens.weight", "c_attn.weight", "c_fc.weight", "wte.weight")


@pytest.fixture(
    scope="module",
    params=[("llama", MESHES), ("qwen2", MESHES), ("gpt2", [{"data": 1, "fsdp": 4, "model": 2}])],
    ids=["llama", "qwen2", "gpt2-conv1d"],
)
def sharded(xla_scenario, request):
    """tests/xla/sharded_training.py for one family: (family, meshes, result), one run per family.

    The family trains unsharded and on each mesh in one SPMD process; the same process checks the
    device loader and the errors at the edges."""
    family, meshes = request.param
    return family, meshes, xla_scenario("sharded_training", family=family, meshes=meshes)


def _mesh_runs(sharded):
    family, meshes, result = sharded
    return [(spec, result[_mesh_id(spec)], f"{family} {_mesh_id(spec)}") for spec in meshes]


@pytest.mark.slow
@pytest.mark.xla
def test_mesh_preset_on_eight_devices_is_pure_fsdp(sharded):
    assert sharded[2]["preset"] == {"data": 1, "fsdp": 8, "model": 1}


@pytest.mark.slow
@pytest.mark.xla
def test_unsharded_reference_run_learns(sharded):
    reference = sharded[2]["unsharded"]["losses"]
    assert reference[-1] < reference[0], "the reference run must learn"


@pytest.mark.slow
@pytest.mark.xla
def test_sharded_training_matches_unsharded(sharded):
    reference = sharded[2]["unsharded"]["losses"]
    for _spec, run, name in _mesh_runs(sharded):
        assert run["losses"] == pytest.approx(reference, abs=LOSS_TOLERANCE), name


@pytest.mark.slow
@pytest.mark.xla
def test_sharded_training_makes_no_host_transfers(sharded):
    for _spec, run, name in _mesh_runs(sharded):
        assert run["transfers"] == 0, f"{name}: hidden host transfers inside the loop"


@pytest.mark.slow
@pytest.mark.xla
def test_sharded_training_compiles_at_most_two_programs(sharded):
    for _spec, run, name in _mesh_runs(sharded):
        assert run["compiles"] <= 2, f"{name}: step 1 (creates optimizer state) and step 2+ only"


@pytest.mark.slow
@pytest.mark.xla
def test_sharded_model_keeps_lm_head_tied(sharded):
    for _spec, run, name in _mesh_runs(sharded):
        assert run["tied"], f"{name}: lm_head must stay tied to the embedding"


@pytest.mark.slow
@pytest.mark.xla
def test_sharding_plan_needs_no_fallbacks(sharded):
    for _spec, run, _name in _mesh_runs(sharded):
        assert run["fallbacks"] == []


@pytest.mark.slow
@pytest.mark.xla
def test_parameter_shards_have_the_planned_shapes(sharded):
    for _spec, run, name in _mesh_runs(sharded):
        assert run["wrong_shape"] == [], name


@pytest.mark.slow
@pytest.mark.xla
def test_parameter_shards_sit_on_the_planned_devices(sharded):
    for _spec, run, name in _mesh_runs(sharded):
        assert run["wrong_place"] == [], name


@pytest.mark.slow
@pytest.mark.xla
def test_gradients_are_sharded_like_their_parameters(sharded):
    for _spec, run, name in _mesh_runs(sharded):
        assert run["wrong_grad"] == [], f"{name}: gradients must be sharded like their parameters"


@pytest.mark.slow
@pytest.mark.xla
def test_optimizer_state_never_exceeds_the_parameter_share(sharded):
    for _spec, run, name in _mesh_runs(sharded):
        assert run["state_bigger"] == [], f"{name}: optimizer state must never exceed the parameter's share"


@pytest.mark.slow
@pytest.mark.xla
def test_adamw_state_lands_exactly_like_the_parameters(sharded):
    if sharded[0] == "gpt2":
        pytest.skip("GPT-2: GSPMD also splits the state of a few replicated biases/norms further")
    for _spec, run, name in _mesh_runs(sharded):
        assert run["state_layout"] == [], name


@pytest.mark.slow
@pytest.mark.xla
def test_each_weight_holds_its_planned_share_on_each_device(sharded):
    # Every weight holds 1/(fsdp*model) of itself on each device: checked against the
    # shards torch_xla really holds, not only against the plan.
    for spec, run, _name in _mesh_runs(sharded):
        shard_factor = spec["fsdp"] * spec["model"]
        for pname, (planned, actual, _shapes) in run["fractions"].items():
            assert actual == pytest.approx(planned), pname
            if pname.endswith(SHARDED_WEIGHTS):
                assert actual == pytest.approx(1 / shard_factor), pname


@pytest.mark.slow
@pytest.mark.xla
def test_batch_rows_split_over_data_and_fsdp(sharded):
    # The batch: 8 rows over data x fsdp; each device holds 8 / dp rows.
    for spec, run, name in _mesh_runs(sharded):
        dp = spec["data"] * spec["fsdp"]
        assert run["batch_as_expected"], name
        assert {tuple(r) for r in run["batch_rows"].values()} == {
            (i * 8 // dp, (i + 1) * 8 // dp) for i in range(dp)
        }


@pytest.mark.slow
@pytest.mark.xla
def test_shard_batch_passes_non_tensors_through(sharded):
    for _spec, run, _name in _mesh_runs(sharded):
        assert run["note"] == "passes through"


@pytest.mark.slow
@pytest.mark.xla
def test_tensor_parallel_weights_split_by_role(sharded):
    family = sharded[0]
    column, row = TP_ROLES[family]
    for spec, run, name in _mesh_runs(sharded):
        if spec["model"] > 1:
            col_spec, row_spec = (
                (["fsdp", "model"], ["model", "fsdp"])
                if family == "gpt2"
                else (["model", "fsdp"], ["fsdp", "model"])
            )
            assert run["specs"][column] == col_spec, name
            assert run["specs"][row] == row_spec, name


@pytest.mark.slow
@pytest.mark.xla
def test_device_loader_shards_batches_like_shard_batch(sharded):
    loader, direct = sharded[2]["loader_spec"]
    assert loader == direct and loader.startswith("{devices=[4,1,2]"), sharded[2]["loader_spec"]


@pytest.mark.slow
@pytest.mark.xla
def test_shard_batch_refuses_a_batch_the_data_parallel_size_does_not_divide(sharded):
    errors = sharded[2]["errors"]
    assert "batch size 6, not divisible by the data-parallel size data(2) x fsdp(2) = 4" in errors["batch"]


@pytest.mark.slow
@pytest.mark.xla
def test_multislice_mesh_is_refused_on_cpu(sharded):
    errors = sharded[2]["errors"]
    assert "multi-slice" in errors["multislice_on_cpu"].lower() or "slice" in errors["multislice_on_cpu"]


@pytest.mark.slow
@pytest.mark.xla
def test_mesh_larger_than_the_devices_is_refused(sharded):
    errors = sharded[2]["errors"]
    assert errors["too_big"] == "data(2) x fsdp(2) x model(4) = 16 != 8 devices"


@pytest.fixture(scope="module")
def refused_build(xla_scenario):
    """tests/xla/spmd_after_device_use.py: MeshSpec.build() twice after the device was used
    without SPMD.

    torch_xla 2.9: use_spmd() after torch_xla.device() "works" and then segfaults at the next
    execution (pytorch/xla#9735). build() must refuse instead, and say how to fix it."""
    return xla_scenario("spmd_after_device_use")


@pytest.mark.xla
def test_build_refuses_once_the_device_was_used_without_spmd(refused_build):
    first, _second = refused_build["errors"]
    assert first is not None and "already used without SPMD" in first and "pytorch/xla#9735" in first


@pytest.mark.xla
def test_build_refusal_says_how_to_fix_it(refused_build):
    first, _second = refused_build["errors"]
    assert first is not None and "Restart the Python process" in first and "MeshSpec(...).build()" in first


@pytest.mark.xla
def test_build_refusal_counts_the_xla_tensors_created(refused_build):
    first, second = refused_build["errors"]
    assert first is not None and "(0 XLA tensor(s) created" in first
    assert second is not None and re.search(r"\([1-9]\d* XLA tensor\(s\) created", second)


@pytest.mark.xla
def test_process_stays_usable_after_build_refuses(refused_build):
    assert refused_build["spmd"] is False and refused_build["sum"] == 16.0
