"""configs/lora-8b-v5e-1-64k.yaml, the long-context recipe: Llama-3.1-8B QLoRA (int4, r16, flash,
chunked loss, batch 1) at 65,536 tokens on one v5e chip. The figures its header quotes (device and
host memory, the longest context that fits) are the memory estimate's for the file as written, read
back from the header so the file and the estimate cannot drift apart; the run it describes offloads
its checkpoints and tiles its MLP by the file's own 'auto' settings, and needs both."""

from __future__ import annotations

import re

from tests.conftest import REPO
from workbench.analysis.estimate import config_settings, estimate, estimate_attention
from workbench.backend.targets import TARGETS
from workbench.config import load_config
from workbench.models.presets import MODEL_PRESETS
from workbench.units import GiB

FILE = REPO / "configs" / "lora-8b-v5e-1-64k.yaml"
V5E_1 = TARGETS["v5e-1"].memory_per_device_bytes
V5E_1_HOST = 48e9
"""A v5e-1 VM's host RAM (48 GB)."""


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _estimate(cfg, length: int):
    attention = estimate_attention(cfg.model.attention, TARGETS["v5e-1"], seq_len=length)
    return estimate(
        cfg.model, batch_size=cfg.train.batch_size, seq_len=length, memory_bytes=V5E_1, attention=attention,
        **config_settings(cfg),
    )  # fmt: skip


def test_the_64k_recipe_fits_a_v5e_1_as_its_header_says():
    header = FILE.read_text()
    shape = {f"model.{k}": v for k, v in MODEL_PRESETS["Llama-3.1-8B shape"].items()}
    cfg = load_config(FILE).with_overrides({**shape, "model.vocab_size": 128256})
    assert (cfg.model.quantize, cfg.lora.rank, cfg.train.batch_size) == ("int4", 16, 1)
    assert (cfg.model.mlp_chunk_tokens, cfg.train.offload_activations) == ("auto", "auto")
    length, device, host = re.search(
        r"at 1 x ([\d,]+) tokens on a v5e-1: (\d+\.\d) GiB of device memory.*?(\d+\.\d) GiB of host memory",
        header,
        re.S,
    ).groups()
    assert _number(length) == cfg.data.max_length == 65536
    est = _estimate(cfg, cfg.data.max_length)
    assert est.offload_activations and est.mlp_chunk_positions == 4680 and "4,680 positions" in header
    assert est.attention == "flash" and est.loss_chunk_positions
    assert f"{est.total_bytes / GiB:.1f}" == device and est.total_bytes <= 0.9 * V5E_1  # 14.4 GiB
    assert f"{est.host_bytes / GiB:.1f}" == host and est.host_bytes <= V5E_1_HOST
    # neither setting alone fits
    for alone in ({"train.offload_activations": "off"}, {"model.mlp_chunk_tokens": None}):
        assert not _estimate(cfg.with_overrides(alone), cfg.data.max_length).fits(V5E_1)
    # the longest context, in steps of 1024 tokens, with the figures quoted
    longest, at_device, at_host = re.search(
        r"longest context that fits: ([\d,]+) tokens \(data\.max_length=\d+: (\d+\.\d) GiB on the chip, "
        r"(\d+\.\d) GiB of host memory\)",
        header,
    ).groups()
    top = _estimate(cfg, _number(longest))
    assert top.fits(V5E_1) and not _estimate(cfg, _number(longest) + 1024).fits(V5E_1)
    assert (f"{top.total_bytes / GiB:.1f}", f"{top.host_bytes / GiB:.1f}") == (at_device, at_host)
    assert top.host_bytes <= V5E_1_HOST


def test_plan_prints_the_recipes_host_memory_apart_from_the_devices(capsys):
    """`plan` on the recipe: the checkpoints in host memory are a section of their own, never a share of
    the device's total (17 GiB of host memory is not 134% of a 12.9 GiB step)."""
    from workbench.__main__ import main

    shape = [f"model.{k}={v}" for k, v in MODEL_PRESETS["Llama-3.1-8B shape"].items()]
    assert main(["plan", "--config", str(FILE), *shape, "model.vocab_size=128256", "--chip", "v5e-1"]) == 0
    out = capsys.readouterr().out
    device_rows, host = out.split("  host memory ", 1)
    assert "offloaded_checkpoints" not in device_rows and re.match(r"[\d.]+ GiB, beside the device's:", host)
    assert re.search(r"\n    offloaded_checkpoints  17\.0\d GiB  ", host) and "total 12.9" in host
