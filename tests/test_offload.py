"""Layer checkpoints in host memory (``train.offload_activations``): exact on plain CPU and on XLA:CPU,
in the compiled program as torch_xla's host placements, what XLA:CPU does with those, the memory
estimate's host and device terms, and how a run decides."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import REPO, xla_env
from tests.tiny import nonzero_adapters, tiny
from workbench.analysis.estimate import BREAKDOWN_KEYS, BREAKDOWN_MEANINGS, config_settings, estimate
from workbench.analysis.long_context import HOST_KEYS, IN_FLIGHT_CHECKPOINTS
from workbench.backend.native.offload import HostOffload, offloaded_checkpoint_function
from workbench.config import ConfigError, LoraConfig, WorkbenchConfig
from workbench.models.build import build_model, enable_gradient_checkpointing, hf_config
from workbench.models.checkpoint_offload import checkpoints_offloaded, offload_choice
from workbench.models.presets import MODEL_PRESETS
from workbench.train.long_context import plan_long_context
from workbench.train.lora import apply_lora
from workbench.units import GiB

REL = 1e-5


# ---- plain torch ---------------------------------------------------------------------------------


class CountingOffload(HostOffload):
    """`HostOffload` that counts what it packs and unpacks."""

    def __init__(self) -> None:
        super().__init__()
        self.packed: list[tuple[int, ...]] = []
        self.unpacked = 0

    def pack(self, tensor):
        out = super().pack(tensor)
        if out is not tensor:
            self.packed.append(tuple(tensor.shape))
        return out

    def unpack(self, packed):
        self.unpacked += packed is not None and not isinstance(packed, torch.Tensor)
        return super().unpack(packed)


def _lora_step(way: str, offload: HostOffload | None = None):
    model = build_model(tiny("llama", num_layers=3), seed=0)
    if way != "plain":
        enable_gradient_checkpointing(model, xla=False, offload=way == "offload")
    if offload is not None:
        model._set_gradient_checkpointing(
            enable=True, gradient_checkpointing_func=offloaded_checkpoint_function(offload)
        )
    model = nonzero_adapters(apply_lora(model, LoraConfig(rank=4), seed=0))
    model.train()
    ids = torch.randint(3, 500, (2, 40), generator=torch.Generator().manual_seed(0))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return model, float(loss), [p.grad.clone() for p in model.parameters() if p.requires_grad]


def test_native_offload_is_exact_on_the_cpu_and_moves_each_layers_input():
    _, loss, grads = _lora_step("plain")
    model, checkpointed, checkpointed_grads = _lora_step("checkpointing")
    assert not checkpoints_offloaded(model)
    counting = CountingOffload()
    model, offloaded, offloaded_grads = _lora_step("offload", counting)
    assert checkpoints_offloaded(model)
    assert counting.packed == [(2, 40, 64)] * 3 and counting.unpacked == 3  # each layer's input, and back
    for other, other_grads in ((checkpointed, checkpointed_grads), (offloaded, offloaded_grads)):
        assert abs(other - loss) <= REL * abs(loss)
        for g, h in zip(grads, other_grads):
            assert g.abs().sum() > 0 and (g - h).norm() <= REL * g.norm()


def test_a_tensor_saved_twice_is_copied_once():
    offload = HostOffload(min_bytes=0)
    x = torch.randn(4, 8)
    first, second = offload.pack(x), offload.pack(x)
    assert first is second and torch.equal(offload.unpack(first), x)
    x.add_(1)  # changed in place since: a new copy
    assert offload.pack(x) is not first
    small = torch.randn(2)
    assert HostOffload(min_bytes=1024).pack(small) is small  # too small to move


# ---- XLA -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def offload_scan(xla_scenario):
    """tests/xla/offload_scan.py: the scanned LoRA step with and without offload on one XLA:CPU device."""
    return xla_scenario("offload_scan", devices=1, lengths=[64, 128])


def test_offload_under_the_scan_is_exact_on_xla_cpu(offload_scan):
    plain, scaled, broken = offload_scan["plain"], offload_scan["scaled"], offload_scan["broken"]
    assert abs(scaled["loss"] - plain["loss"]) <= REL * abs(plain["loss"])
    for g, h in zip(plain["grads"], scaled["grads"]):
        g, h = torch.tensor(g), torch.tensor(h)
        assert g.abs().sum() > 0 and (g - h).norm() <= REL * g.norm()
    # the control: placements that do not undo themselves change the gradients, so the stand-ins
    # above were in the program, each saved value coming back into its own input
    assert any(torch.tensor(g).ne(torch.tensor(h)).any() for g, h in zip(plain["grads"], broken["grads"]))


def test_the_program_carries_the_host_placements_the_estimate_counts(offload_scan):
    """torch_xla's placements in the step's HLO: each layer's saved carries (input [2, T, 64], mask,
    rotary cos and sin) leave for pinned host memory in the forward loop's body and come back in the
    backward's; their bytes times the 3 layers are the estimate's host bytes, doubling with the length."""
    host = {}
    for length in (64, 128):
        found = offload_scan[f"length {length}"]
        out = [p for p in found["placements"] if p["placement"] == "pinned_host"]
        back = [p for p in found["placements"] if p["placement"] == "device"]
        assert len(out) == len(back) == 4 and sorted(map(str, out)) == sorted(
            str({**p, "placement": "pinned_host"}) for p in back
        )
        assert {"dtype": "f32", "shape": [2, length, 64], "placement": "pinned_host"} in out
        per_layer = sum(4 * torch.Size(p["shape"]).numel() for p in out)
        assert 3 * per_layer == found["estimate_host_bytes"]
        host[length] = found["estimate_host_bytes"]
    assert host[128] == 2 * host[64]


def test_xla_cpu_keeps_the_placements_through_its_passes_and_cannot_compile_them(tmp_path):
    """What XLA:CPU does with the placement custom calls: its optimised HLO keeps all of them (the
    forward loop's and the backward loop's), no buffer gets a memory space of its own (its memory
    analysis has one: no host/device split), and its code generator refuses the program (torch_xla
    2.9: 'Unknown custom-call API version enum value: 0', or the process dies)."""
    dump = tmp_path / "dump"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.xla.offload_scan", json.dumps({"part": "compile", "lengths": [64]})],
        cwd=REPO,
        env=xla_env(1, {"XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text"}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    compiled = proc.returncode == 0 and '"compiled": true' in proc.stdout
    assert not compiled, "XLA:CPU compiled the host placements: host_offload.placements_for can use them here"
    (optimised,) = [p for p in Path(dump).glob("*after_optimizations.txt") if "pinned_host" in p.read_text()]
    text = optimised.read_text()
    assert text.count('_xla_buffer_placement="pinned_host"') == 4
    assert text.count('_xla_buffer_placement="device"') == 4
    assert text.count(" while(") == 2 and ":S(" not in text  # two loops; no buffer in another memory space


# ---- the estimate and the run's choice -----------------------------------------------------------

LLAMA_8B = {f"model.{k}": v for k, v in MODEL_PRESETS["Llama-3.1-8B shape"].items()}
ISSUE = dict(
    batch_size=1, precision="bf16", gradient_checkpointing=True, attention="flash", lora_rank=16,
    quantize="int4", loss_chunk_tokens="auto", memory_bytes=16 * GiB,
)  # fmt: skip
"""The issue's setting: Llama-3.1-8B, int4 base, LoRA r16, flash, chunked loss, batch 1, one v5e chip."""


def _llama_8b():
    return (
        WorkbenchConfig()
        .with_overrides({**LLAMA_8B, "model.vocab_size": 128256, "model.max_position_embeddings": 131072})
        .model
    )


def _long_run(extra: dict | None = None) -> WorkbenchConfig:
    """The issue's run as a config: Llama-3.1-8B's shape, int4, LoRA r16, bf16, checkpointing, 1 x 65,536."""
    overrides = {
        **LLAMA_8B,
        "model.vocab_size": 128256,
        "model.max_position_embeddings": 131072,
        "model.quantize": "int4",
        "lora.rank": 16,
        "train.precision": "bf16",
        "train.gradient_checkpointing": True,
        "train.batch_size": 1,
        "data.max_length": 65536,
    }
    return WorkbenchConfig().with_overrides({**overrides, **(extra or {})})


def test_offload_moves_the_checkpoints_to_a_host_line():
    model = _llama_8b()
    plain = estimate(model, seq_len=16384, **ISSUE)
    offloaded = estimate(model, seq_len=16384, offload_activations="on", **ISSUE)
    assert plain.host_bytes == 0 and not plain.offload_activations
    # 32 layers x 16384 tokens x (4096 hidden + the 2 x 128 rotary values) x 2 bytes, + the fp32 segment ids
    checkpoints = 32 * (16384 * 4096 * 2 + 2 * 16384 * 128 * 2 + 16384 * 4)
    assert offloaded.host_bytes == offloaded.breakdown["offloaded_checkpoints"] == checkpoints
    assert offloaded.total_bytes == sum(v for k, v in offloaded.breakdown.items() if k not in HOST_KEYS)
    # on the device: the checkpoints in flight instead of all 32
    saved = (32 - IN_FLIGHT_CHECKPOINTS) * 16384 * 4096 * 2
    assert plain.total_bytes - offloaded.total_bytes >= saved
    assert (
        "offloaded_checkpoints" in BREAKDOWN_KEYS
        and "host memory" in BREAKDOWN_MEANINGS["offloaded_checkpoints"]
    )
    assert "offloaded_checkpoints" in offloaded.table().splitlines()[-1] and "host" in offloaded.table()
    with pytest.raises(ValueError, match="offload_activations='on' needs gradient_checkpointing=True"):
        estimate(model, seq_len=1024, offload_activations="on", **{**ISSUE, "gradient_checkpointing": False})


def test_auto_offloads_only_what_does_not_fit():
    model = _llama_8b()
    assert not estimate(model, seq_len=4096, offload_activations="auto", **ISSUE).offload_activations
    long = estimate(model, seq_len=65536, offload_activations="auto", **ISSUE)
    assert long.offload_activations and long.host_bytes > 0
    unknown = {**ISSUE, "memory_bytes": None}  # the CPU: nothing to fit
    assert not estimate(model, seq_len=65536, offload_activations="auto", **unknown).offload_activations


def test_the_issues_target_64k_tokens_of_an_8b_lora_on_one_v5e_chip():
    """Llama-3.1-8B (int4, LoRA r16, flash, chunked loss, batch 1) at 65,536 tokens on v5e-1: at most
    14.4 GiB of device memory (16 GiB less the 10% headroom) and host memory within the v5e-1 VM's
    48 GB, with the checkpoints offloaded and the MLP in tiles; neither alone is enough."""
    model = _llama_8b()
    est = estimate(model, seq_len=65536, offload_activations="auto", mlp_chunk_tokens="auto", **ISSUE)
    assert est.offload_activations and est.mlp_chunk_positions
    assert est.total_bytes <= 14.4 * GiB and est.fits(16 * GiB)
    assert est.host_bytes <= 48e9
    for alone in (dict(offload_activations="on"), dict(mlp_chunk_tokens="auto")):
        assert not estimate(model, seq_len=65536, **alone, **ISSUE).fits(16 * GiB)


def test_config_keys_and_their_errors():
    cfg = WorkbenchConfig().with_overrides(["model.mlp_chunk_tokens=null", "train.offload_activations=off"])
    assert cfg.model.mlp_chunk_tokens is None and cfg.train.offload_activations == "off"
    defaults = WorkbenchConfig()
    assert (defaults.model.mlp_chunk_tokens, defaults.train.offload_activations) == (None, "auto")
    settings = config_settings(cfg.with_overrides(["model.mlp_chunk_tokens=auto"]))
    assert (settings["offload_activations"], settings["mlp_chunk_tokens"]) == ("off", "auto")
    yaml_on = WorkbenchConfig.from_yaml("train:\n  gradient_checkpointing: true\n  offload_activations: on\n")
    assert yaml_on.train.offload_activations == "on"  # YAML's bare on is a bool: read as 'on'
    with pytest.raises(
        ConfigError,
        match=r"train\.offload_activations='on' is not allowed: 'on' needs gradient_checkpointing",
    ):
        WorkbenchConfig().with_overrides(["train.offload_activations=on"])
    with pytest.raises(ConfigError, match=r"model\.mlp_chunk_tokens=0 is not allowed"):
        WorkbenchConfig().with_overrides(["model.mlp_chunk_tokens=0"])


def test_where_a_model_can_offload():
    train = SimpleNamespace(offload_activations="on", gradient_checkpointing=True)
    assert offload_choice(train, None, xla=False, scan=False, notice=None)
    with pytest.raises(
        ConfigError, match=r"train\.offload_activations='on' is not allowed here: on XLA .* scanned"
    ):
        offload_choice(train, None, xla=True, scan=False, notice=None)
    heard: list[str] = []
    auto = SimpleNamespace(offload_activations="auto", gradient_checkpointing=True)
    assert not offload_choice(auto, True, xla=True, scan=False, notice=heard.append)
    assert heard and "this one is unrolled" in heard[0]
    assert not offload_choice(SimpleNamespace(offload_activations="on", gradient_checkpointing=False), None,
                              xla=False, scan=False, notice=None)  # fmt: skip


def test_a_run_plans_offload_and_tiles_for_its_device():
    cfg = _long_run({"model.mlp_chunk_tokens": "auto"})
    model = SimpleNamespace(config=hf_config(cfg.model))
    v5e = SimpleNamespace(
        memory_per_device_bytes=16 * GiB,
        host_memory_bytes=48 * 10**9,
        local_devices=1,
        device_string="xla",
    )
    heard: list[str] = []
    plan = plan_long_context(cfg, model, v5e, attention="flash", notice=heard.append)
    assert plan.offload and plan.tiling is not None and plan.tiling.memory_bytes == 16 * GiB
    assert any("the MLP runs in tiles of 4680 positions" in h for h in heard)
    assert any(
        h.startswith("train.offload_activations=auto: on, the layers' checkpoints (17.01 GiB)") for h in heard
    )
    short = cfg.with_overrides(["data.max_length=2048"])
    assert plan_long_context(short, model, v5e, attention="flash") == type(plan)(False, None)
    small_host = SimpleNamespace(**{**vars(v5e), "host_memory_bytes": 16 * GiB})
    heard.clear()
    plan_long_context(cfg, model, small_host, attention="flash", notice=heard.append)
    assert any("more than 80% of this machine's 16.00 GiB" in h for h in heard)


def test_the_config_panel_follows_offload_and_tiles():
    """The config panel's estimate takes both settings from the config: at 65,536 tokens an 8B QLoRA
    does not fit a v5e chip with the checkpoints on it, fits with them in host memory and the MLP in
    tiles; the host line is a readout, not part of the device's bar."""
    from widgets.config_panel import ConfigPanel

    cfg = WorkbenchConfig().with_overrides({"model.vocab_size": 128256, "train.offload_activations": "off"})
    panel = ConfigPanel(cfg, target="v5e-1")
    panel.set(
        model_size="Llama-3.1-8B shape", precision="bf16", gradient_checkpointing=True, seq_len=65536,
        batch_size=1, lora_rank=16, quantize="int4",
    )  # fmt: skip
    assert panel.error is None and "does not fit" in panel.fits_html.value
    assert panel.long_context_html.value == ""
    panel.set(offload_activations="auto", mlp_chunk_tokens="auto")
    assert panel.error is None and "✔ fits" in panel.fits_html.value and panel.largest_batch == 1
    assert panel.config.train.offload_activations == "auto" and panel.config.model.mlp_chunk_tokens == "auto"
    assert (
        "Checkpoints in host memory: <b class='wb-host-value'>17.01 GiB</b>" in panel.long_context_html.value
    )
    assert "MLP in tiles of <b>4680</b> positions" in panel.long_context_html.value
    bars = [trace.name for trace in panel.memory_figure.figure.data]
    assert "offloaded_checkpoints" not in bars and "activations" in bars
    panel.set(gradient_checkpointing=False)  # offload 'auto' needs checkpointing: nothing to offload
    assert "Checkpoints in host memory" not in panel.long_context_html.value


def test_the_doctor_weighs_the_offloaded_checkpoints_against_the_host_ram(tmp_path):
    from tests.test_doctor import _roots
    from workbench.doctor import doctor
    from workbench.doctor.accelerator import Devices
    from workbench.doctor.offload import offload_check

    for name in ("proc", "dev", "sys", "tmp", "fs", "work"):  # a made-up machine (tests/test_doctor.py)
        (tmp_path / name).mkdir()
    cfg = _long_run()
    one_tpu = Devices((tmp_path / "dev" / "accel0",), 1, ())
    roomy = offload_check(cfg, _roots(tmp_path, available=40 * GiB), one_tpu)
    assert roomy.status == "ok" and roomy.saw.startswith(
        "train.offload_activations=auto: 17.01 GiB per device"
    )
    eight = Devices(tuple(tmp_path / "dev" / f"accel{i}" for i in range(8)), 8, ())
    short = offload_check(cfg, _roots(tmp_path, available=40 * GiB), eight)
    assert short.status == "warn" and "x 8 devices = 136.06 GiB" in short.saw and "v5e-8: 384 GB" in short.fix
    forced = cfg.with_overrides(["train.offload_activations=on"])
    assert offload_check(forced, _roots(tmp_path, available=40 * GiB), eight).status == "fail"
    assert (
        offload_check(cfg.with_overrides(["train.offload_activations=off"]), _roots(tmp_path), one_tpu)
        is None
    )
    report = doctor(cfg, roots=_roots(tmp_path, available=40 * GiB))  # no accelerator here: one device
    assert report.check("offloaded checkpoints").status == "ok"


def test_a_cpu_run_with_both_settings_trains_as_one_without_them():
    """The trainer's wiring: the run prepares its model with the checkpoints offloaded and the MLP in
    tiles (said in its notices), and its losses are those of the run without either."""
    from tests.test_train import tiny_cfg, token_dataset
    from workbench.models.mlp_tiles import installed_tiling
    from workbench.train import Trainer

    common = {"train.gradient_checkpointing": True, "lora.rank": 4, "train.steps": 3}
    data = token_dataset(16)
    plain = Trainer(tiny_cfg(**common), train_dataset=data)
    both = Trainer(
        tiny_cfg(**common, **{"train.offload_activations": "on", "model.mlp_chunk_tokens": 32}),
        train_dataset=data,
    )
    assert not checkpoints_offloaded(plain.model) and installed_tiling(plain.model) is None
    assert checkpoints_offloaded(both.model) and installed_tiling(both.model).setting == 32
    assert any("the MLP runs in tiles of 8 positions" in n for n in both.notices)
    losses = [[m["loss"] for m in t.fit().history] for t in (plain, both)]
    assert len(losses[0]) == 3 and all(abs(a - b) <= REL * abs(a) for a, b in zip(*losses))
