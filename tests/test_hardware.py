"""Hardware detection on the real CPU and on XLA:CPU, the chip table, platform detection."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, xla_env
from workbench.backend import hardware
from workbench.backend.hardware import (
    CHIPS,
    HardwareError,
    chip_spec,
    detect,
    detect_platform,
    normalise_chip,
)

# Device-kind strings exactly as the runtimes report them: PJRT's device_kind on TPU
# (the same strings JAX shows), torch.cuda.get_device_name() on NVIDIA GPUs.
REAL_KINDS = {
    "TPU v2": "v2",
    "TPU v3": "v3",
    "TPU v4": "v4",
    "TPU v5 lite": "v5e",
    "TPU v5": "v5p",
    "TPU v5p": "v5p",
    "TPU v6 lite": "v6e",
    "TPU v5litepod": "v5e",
    "Tesla T4": "t4",
    "Tesla P100-PCIE-16GB": "p100",
    "NVIDIA L4": "l4",
    "NVIDIA A100-SXM4-40GB": "a100-40gb",
    "NVIDIA A100-PCIE-40GB": "a100-40gb",
    "NVIDIA A100-SXM4-80GB": "a100-80gb",
    "NVIDIA A100 80GB PCIe": "a100-80gb",
    "NVIDIA H100 80GB HBM3": "h100",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA H100 NVL": "h100-nvl",
    "NVIDIA H200": "h200",
    "NVIDIA H200 NVL": "h200-nvl",
    "NVIDIA GH200 480GB": "gh200",  # Grace Hopper: not the H200 card
    "NVIDIA GH200 144G HBM3e": "gh200",
    "cpu": "cpu",
}


@pytest.mark.parametrize(("kind", "chip"), sorted(REAL_KINDS.items()))
def test_real_device_kinds_normalise(kind: str, chip: str) -> None:
    assert normalise_chip(kind) == chip


def test_chip_table_figures() -> None:
    v5e = chip_spec("TPU v5 lite")
    assert v5e is not None and v5e.hbm_bytes == 16 * 1024**3 and v5e.peak_bf16_flops == 197e12
    assert chip_spec("TPU v6 lite").peak_bf16_flops == 918e12
    assert chip_spec("Tesla T4").peak_is_fp16  # no bf16 on Turing: the fp16 figure, marked
    assert chip_spec("NVIDIA A100-SXM4-80GB").hbm_bandwidth_bytes_per_s == 2039e9
    # v2/v3 expose one runtime device per TensorCore: per-device figures are half the chip's
    assert CHIPS["v3"].devices_per_chip == 2
    assert chip_spec("TPU v4 lite") is None  # unknown chips give None, never a guess
    nvl = chip_spec("NVIDIA H100 NVL")  # its own card: less compute, more (and faster) memory than SXM
    assert nvl is not None and nvl.hbm_bytes == 94e9 and nvl.peak_bf16_flops == 835e12
    assert nvl.hbm_bandwidth_bytes_per_s == 3900e9
    assert chip_spec("NVIDIA H100 80GB HBM3").hbm_bytes == 80e9
    assert chip_spec("NVIDIA H200").hbm_bytes == 141e9
    assert chip_spec("NVIDIA GH200 480GB") is None  # 96 or 144 GB by variant: unknown, not the H200's 141
    assert chip_spec("Some Future Chip") is None
    for name in ("v2", "v3", "v4", "v5e", "v5p", "v6e", "t4", "p100", "l4", "a100-40gb", "a100-80gb", "h100"):
        spec = CHIPS[name]
        assert spec.hbm_bytes > 0 and spec.peak_bf16_flops > 1e12 and spec.hbm_bandwidth_bytes_per_s > 1e11


@pytest.mark.parametrize(
    ("environ", "platform"),
    [
        ({"COLAB_RELEASE_TAG": "release-colab_20251101"}, "colab"),
        ({"COLAB_TPU_ADDR": "10.0.0.2:8470"}, "colab"),
        ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "KAGGLE_URL_BASE": "https://www.kaggle.com"}, "kaggle"),
        ({"HOME": "/root"}, "local"),
    ],
)
def test_platform_from_environment(environ: dict[str, str], platform: str) -> None:
    assert detect_platform(environ) == platform


def test_detect_plain_cpu_does_not_start_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    detect.cache_clear()
    hw = detect("auto")
    assert hw.backend == "cpu" and not hw.via_xla and hw.chip == "cpu"
    assert (
        hw.num_devices == 1 and hw.memory_per_device_bytes is None and hw.peak_bf16_flops_per_device is None
    )
    assert hw.host_memory_bytes > 0
    assert detect("auto") is hw  # the second call is cached
    # in a fresh process: libraries imported by other tests (transformers 5) may import torch_xla here
    env = {k: v for k, v in xla_env().items() if k != "PJRT_DEVICE"}
    code = "import sys; from workbench import detect; detect('auto'); print('torch_xla' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_explicit_backends_that_are_missing_say_what_was_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    monkeypatch.setattr(hardware.presence, "tpu_present", lambda: False)
    detect.cache_clear()
    with pytest.raises(HardwareError, match=r"device_type='tpu'.*no TPU.*PJRT_DEVICE=<unset>"):
        detect("tpu")
    with pytest.raises(HardwareError, match=r"device_type='cuda'.*no CUDA device.*device_type='auto'"):
        detect("cuda")
    with pytest.raises(HardwareError, match=r"device_type='xla'.*PJRT_DEVICE is unset.*PJRT_DEVICE=CPU"):
        detect("xla")
    with pytest.raises(HardwareError, match=r"device_type='gpu' is not allowed.*'cuda'"):
        detect("gpu")  # type: ignore[arg-type]
    detect.cache_clear()


@pytest.mark.parametrize(
    ("world_size", "visible", "num_devices"),
    [
        (None, 4, 4),  # one process driving every GPU it sees
        ("8", 4, 8),  # torchrun on 2 nodes x 4 GPUs: each process sees 4, drives 1; not 8 x 4
        ("2", 1, 2),  # CUDA_VISIBLE_DEVICES narrowed per process: the same answer
    ],
)
def test_cuda_counts_one_gpu_per_launched_process(
    monkeypatch: pytest.MonkeyPatch, world_size: str | None, visible: int, num_devices: int
) -> None:
    import types

    import torch

    if world_size is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world_size)
        monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda index=0: types.SimpleNamespace(total_memory=80 * 10**9)
    )
    hw = hardware._detect_cuda()
    assert hw.num_devices == num_devices and hw.local_devices == visible
    assert hw.num_processes == int(world_size or 1) and hw.process_index == (1 if world_size else 0)
    assert hw.chip == "h100" and hw.memory_per_device_bytes == 80 * 10**9


def test_importing_workbench_starts_no_runtime() -> None:
    code = "import sys, workbench, workbench.config, workbench.backend.hardware, workbench.backend.xla.runtime; print('torch_xla' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=xla_env(), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


@pytest.fixture(scope="module")
def detected_on_xla(xla_scenario):
    """tests/xla/detect_devices.py: detect() (twice) and detect("xla") on 8 XLA:CPU devices."""
    return xla_scenario("detect_devices")


@pytest.mark.xla
def test_detect_on_eight_xla_cpu_devices(detected_on_xla) -> None:
    result = detected_on_xla
    assert result["num_devices"] == 8 and result["local_devices"] == 8 and result["explicit"] == 8


@pytest.mark.xla
def test_detect_on_xla_cpu_reports_the_cpu_backend_via_xla(detected_on_xla) -> None:
    assert detected_on_xla["backend"] == "cpu" and detected_on_xla["via_xla"] is True


@pytest.mark.xla
def test_detect_on_xla_cpu_is_one_process(detected_on_xla) -> None:
    assert detected_on_xla["num_processes"] == 1 and detected_on_xla["process_index"] == 0


@pytest.mark.xla
def test_detect_on_xla_cpu_leaves_memory_unknown(detected_on_xla) -> None:
    # XLA:CPU reports no allocator stats: unknown, not guessed
    assert detected_on_xla["memory_per_device_bytes"] is None


@pytest.mark.xla
def test_detect_is_cached(detected_on_xla) -> None:
    assert detected_on_xla["same"] and detected_on_xla["second_s"] < 0.01
