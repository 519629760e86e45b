"""Hardware detection: which backend runs the work, on how many chips, of what kind.

`detect()` walks an ordered fallback, TPU (through torch_xla; through TorchTPU where torch_xla is not
installed: `workbench.backend.routing`) -> CUDA -> XLA on the CPU (when ``PJRT_DEVICE=CPU`` asks for
it) -> plain CPU, and returns a frozen `HardwareInfo`.

What `detect()` initialises: for a TPU or XLA:CPU answer it imports torch_xla and
starts the PJRT client (the XLA runtime); for CUDA it initialises torch's CUDA context;
for plain CPU nothing. Importing this module starts nothing. Results are cached per
``device_type``, so a second call is a dictionary look-up.

The chip table (`CHIPS`) holds per-chip HBM, peak dense bf16 FLOP/s, memory bandwidth and, for
TPUs, the interconnect: ICI within a slice, DCN between slices (`collective_bandwidth` is what a
collective is priced at), with sources. Unknown values are None, never a guess.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import warnings
from dataclasses import dataclass
from typing import Literal

from workbench.backend import routing
from workbench.backend.torchtpu import plan as torchtpu_plan
from workbench.backend.torchtpu.detect import find_torch_tpu
from workbench.backend.xla import presence, runtime
from workbench.units import GB, GiB

TFLOPS = 1e12

DeviceType = Literal["auto", "tpu", "cuda", "xla", "cpu"]


class HardwareError(RuntimeError):
    """The requested backend is not available; the message says what was found instead."""


@dataclass(frozen=True)
class ChipSpec:
    """Published per-chip figures (a chip may hold several runtime devices: see `devices_per_chip`)."""

    name: str
    hbm_bytes: int
    peak_bf16_flops: float
    """Peak dense matrix FLOP/s in bf16; fp16 where the chip has no bf16 (`peak_is_fp16`)."""
    hbm_bandwidth_bytes_per_s: float
    devices_per_chip: int = 1
    """Runtime devices per chip: 2 on TPU v2/v3 (one per TensorCore), 1 where cores are fused (megacore)."""
    peak_is_fp16: bool = False
    ici_bandwidth_bytes_per_s: float | None = None
    """Bidirectional inter-chip interconnect (ICI) bandwidth of one chip, all its links together,
    as Google publishes it; None where no per-chip figure is published."""
    allreduce_bandwidth_bytes_per_s: float | None = None
    """The published "all-reduce bandwidth per Pod" over the pod's chips: what one chip moves in a
    collective that uses all its links (half of `ici_bandwidth_bytes_per_s` where both are known)."""
    dcn_bandwidth_bytes_per_s: float | None = None
    """Data-centre network bandwidth of one chip (between slices); None where unpublished."""
    ici_ports: int | None = None
    """ICI links per chip (4 on the 2D-torus v5e/v6e); None where unpublished."""

    @property
    def collective_bandwidth(self) -> float | None:
        """Bytes/s one chip sends in a ring collective over ICI: the per-chip all-reduce bandwidth,
        else one direction of the bidirectional ICI figure; None when neither is published."""
        if self.allreduce_bandwidth_bytes_per_s is not None:
            return self.allreduce_bandwidth_bytes_per_s
        if self.ici_bandwidth_bytes_per_s is not None:
            return self.ici_bandwidth_bytes_per_s / 2
        return None


# Sources: cloud.google.com/tpu/docs/system-architecture-tpu-vm and the per-version pages
# (v2, v3, v4, v5e, v5p, v6e "Trillium"); NVIDIA datasheets for T4, P100, L4, A100, H100, H200.
# NVIDIA quotes tensor FLOP/s "with sparsity": the dense figures here are half of those.
CHIPS: dict[str, ChipSpec] = {
    # TPU v2: 16 GiB HBM per chip (8 per core), 45 TFLOP/s bf16 per chip, 600 GB/s. Two cores = two devices.
    "v2": ChipSpec("v2", 16 * GiB, 45 * TFLOPS, 600 * GB, devices_per_chip=2),
    # TPU v3: 32 GiB per chip (16 per core), 123 TFLOP/s bf16, 900 GB/s. Two devices per chip.
    "v3": ChipSpec("v3", 32 * GiB, 123 * TFLOPS, 900 * GB, devices_per_chip=2),
    # TPU v4: 32 GiB HBM2, 275 TFLOP/s bf16, 1,200 GB/s; megacore: one device per chip.
    # Interconnect (cloud.google.com/tpu/docs/v4): no per-chip ICI figure is published; "All-reduce
    # bandwidth per Pod 1.1 PB/s" over the 4,096-chip pod is 268.6 GB/s per chip. DCN: unpublished.
    "v4": ChipSpec("v4", 32 * GiB, 275 * TFLOPS, 1200 * GB, allreduce_bandwidth_bytes_per_s=1.1e15 / 4096),
    # TPU v5e ("TPU v5 lite"): 16 GiB, 197 TFLOP/s bf16, 819 GB/s.
    # Interconnect (cloud.google.com/tpu/docs/v5e): bidirectional ICI 400 GB/s per chip, 4 ICI ports,
    # 2D torus; all-reduce bandwidth per Pod 51.2 TB/s over 256 chips = 200 GB/s per chip; DCN 6.4 Tbps
    # per Pod over 256 chips = 25 Gbps per chip (the same as its 2 x 100 Gbps NICs per 8-chip host).
    "v5e": ChipSpec(
        "v5e",
        16 * GiB,
        197 * TFLOPS,
        819 * GB,
        ici_bandwidth_bytes_per_s=400 * GB,
        allreduce_bandwidth_bytes_per_s=51.2e12 / 256,
        dcn_bandwidth_bytes_per_s=6.4e12 / 8 / 256,
        ici_ports=4,
    ),
    # TPU v5p: 95 GiB, 459 TFLOP/s bf16, 2,765 GB/s.
    # Interconnect (cloud.google.com/tpu/docs/v5p): bidirectional ICI 1,200 GB/s per chip, 3D torus;
    # DCN 50 Gbps per chip.
    "v5p": ChipSpec(
        "v5p",
        95 * GiB,
        459 * TFLOPS,
        2765 * GB,
        ici_bandwidth_bytes_per_s=1200 * GB,
        dcn_bandwidth_bytes_per_s=50e9 / 8,
    ),
    # TPU v6e (Trillium, "TPU v6 lite"): 32 GiB, 918 TFLOP/s bf16, 1,640 GB/s.
    # Interconnect (cloud.google.com/tpu/docs/v6e): bidirectional ICI 800 GB/s per chip, 4 ICI ports,
    # 2D torus; all-reduce bandwidth per Pod 102.4 TB/s over 256 chips = 400 GB/s per chip. DCN per chip:
    # unpublished there.
    "v6e": ChipSpec(
        "v6e",
        32 * GiB,
        918 * TFLOPS,
        1640 * GB,
        ici_bandwidth_bytes_per_s=800 * GB,
        allreduce_bandwidth_bytes_per_s=102.4e12 / 256,
        ici_ports=4,
    ),
    # Tesla T4: 16 GB GDDR6, 65 TFLOP/s fp16 tensor (no bf16), 320 GB/s.
    "t4": ChipSpec("t4", 16 * GB, 65 * TFLOPS, 320 * GB, peak_is_fp16=True),
    # Tesla P100 (PCIe 16 GB): 18.7 TFLOP/s fp16 (no bf16, no tensor cores), 732 GB/s.
    "p100": ChipSpec("p100", 16 * GB, 18.7 * TFLOPS, 732 * GB, peak_is_fp16=True),
    # L4: 24 GB GDDR6, 121 TFLOP/s bf16 dense (242 with sparsity), 300 GB/s.
    "l4": ChipSpec("l4", 24 * GB, 121 * TFLOPS, 300 * GB),
    # A100 40 GB (SXM4): 312 TFLOP/s bf16 dense, 1,555 GB/s.
    "a100-40gb": ChipSpec("a100-40gb", 40 * GB, 312 * TFLOPS, 1555 * GB),
    # A100 80 GB (SXM4): 312 TFLOP/s bf16 dense, 2,039 GB/s.
    "a100-80gb": ChipSpec("a100-80gb", 80 * GB, 312 * TFLOPS, 2039 * GB),
    # H100 SXM5: 80 GB HBM3, 989 TFLOP/s bf16 dense, 3,350 GB/s.
    "h100": ChipSpec("h100", 80 * GB, 989 * TFLOPS, 3350 * GB),
    # H100 PCIe: 80 GB HBM2e, 756 TFLOP/s bf16 dense, 2,000 GB/s.
    "h100-pcie": ChipSpec("h100-pcie", 80 * GB, 756 * TFLOPS, 2000 * GB),
    # H100 NVL (H100 datasheet, NVL column): 94 GB HBM3, 1,671 TFLOP/s bf16 with sparsity = 835 dense,
    # 3,900 GB/s. A different card from the SXM part, not a naming variant of it.
    "h100-nvl": ChipSpec("h100-nvl", 94 * GB, 835 * TFLOPS, 3900 * GB),
    # H200 SXM: 141 GB HBM3e, 989 TFLOP/s bf16 dense, 4,800 GB/s.
    "h200": ChipSpec("h200", 141 * GB, 989 * TFLOPS, 4800 * GB),
    # H200 NVL (H200 datasheet, NVL column): 141 GB HBM3e, 1,671 TFLOP/s bf16 with sparsity = 835 dense,
    # 4,800 GB/s.
    "h200-nvl": ChipSpec("h200-nvl", 141 * GB, 835 * TFLOPS, 4800 * GB),
    # GH200 (Grace Hopper) is deliberately absent: its GPU ships with 96 GB HBM3 (4,000 GB/s) or
    # 144 GB HBM3e (4,900 GB/s), and the device names ('NVIDIA GH200 480GB', '... 120GB', '... 144G
    # HBM3e') do not reliably say which, so its figures stay unknown (on CUDA, `detect` reads the
    # memory from torch anyway).
}

# Device-kind strings as runtimes report them -> normalised chip names. Ordered: first match wins.
_KIND_PATTERNS: list[tuple[str, str]] = [
    (r"tpu\s*v6\s*(lite|e)", "v6e"),
    (r"tpu\s*v5\s*(lite|e)", "v5e"),  # "TPU v5 lite", or "v5litepod" from the accelerator type
    (r"tpu\s*v5\s*p?\b", "v5p"),
    (r"tpu\s*v4\s*(lite|i)", "v4i"),  # inference chip, not in the table: figures stay unknown
    (r"tpu\s*v4", "v4"),
    (r"tpu\s*v3", "v3"),
    (r"tpu\s*v2", "v2"),
    (r"\bt4\b", "t4"),
    (r"p100", "p100"),
    (r"\bl4\b", "l4"),
    (r"a100.*80\s*gb", "a100-80gb"),
    (r"a100", "a100-40gb"),
    # \b keeps "GH200" (Grace Hopper) from matching the H200 entry; NVL/PCIe cards before the SXM default
    (r"\bh100.*pcie", "h100-pcie"),
    (r"\bh100.*nvl", "h100-nvl"),
    (r"\bh100", "h100"),
    (r"\bh200.*nvl", "h200-nvl"),
    (r"\bh200", "h200"),
    (r"\bgh200", "gh200"),  # named, but not in the table: see CHIPS
    (r"^cpu", "cpu"),
]


def normalise_chip(device_kind: str) -> str:
    """Map a runtime's device-kind string ('TPU v5 lite', 'NVIDIA A100-SXM4-80GB') to a chip name."""
    text = device_kind.strip().lower()
    for pattern, chip in _KIND_PATTERNS:
        if re.search(pattern, text):
            return chip
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "unknown"


def chip_spec(chip_or_kind: str) -> ChipSpec | None:
    """The table entry for a chip name or a raw device-kind string, or None when unknown."""
    key = chip_or_kind if chip_or_kind in CHIPS else normalise_chip(chip_or_kind)
    return CHIPS.get(key)


@dataclass(frozen=True)
class HardwareInfo:
    """What the run will execute on."""

    backend: Literal["tpu", "cuda", "cpu"]
    via_xla: bool
    """True when the torch_xla runtime drives the devices (XLA on the CPU included); a ``tpu`` backend
    without it is TorchTPU."""
    device_kind: str
    """As the runtime reports it, e.g. 'TPU v5 lite', 'NVIDIA L4', 'CPU'."""
    chip: str
    """Normalised chip name: v2, v3, v4, v5e, v5p, v6e, t4, p100, l4, a100-40gb, a100-80gb, h100, cpu, ..."""
    num_devices: int
    """Devices across all processes."""
    local_devices: int
    """Devices this process addresses."""
    num_processes: int
    process_index: int
    memory_per_device_bytes: int | None
    """Accelerator memory per runtime device; None when unknown (CPU)."""
    peak_bf16_flops_per_device: float | None
    """Peak dense bf16 FLOP/s per runtime device (fp16 on chips without bf16); None when unknown."""
    host_memory_bytes: int
    platform: Literal["colab", "kaggle", "local"]
    notices: tuple[str, ...] = ()
    """What "auto" detection decided on its own: a backend that is present but could not start."""

    @property
    def device_string(self) -> str:
        """How the training loop names the device: 'xla', 'cuda', 'cpu', or 'tpu' on TorchTPU."""
        return "xla" if self.via_xla else self.backend

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def table(self) -> str:
        rows = self.to_dict()
        width = max(len(k) for k in rows)
        return "\n".join(f"{k:<{width}}  {_fmt(k, v)}" for k, v in rows.items())


def _fmt(key: str, value: object) -> str:
    if value is None:
        return "unknown"
    if key.endswith("_bytes") and isinstance(value, int):
        return f"{value / GiB:.1f} GiB"
    if key.startswith("peak") and isinstance(value, float):
        return f"{value / TFLOPS:.1f} TFLOP/s"
    return str(value)


def detect_platform(environ: dict[str, str] | None = None) -> Literal["colab", "kaggle", "local"]:
    """'colab' or 'kaggle' from the variables those notebook services set, else 'local'."""
    env = os.environ if environ is None else environ
    if any(k.startswith("KAGGLE_") for k in env):  # KAGGLE_KERNEL_RUN_TYPE, KAGGLE_URL_BASE, ...
        return "kaggle"
    if (
        "COLAB_RELEASE_TAG" in env
        or "COLAB_GPU" in env
        or "COLAB_TPU_ADDR" in env
        or "COLAB_BACKEND_VERSION" in env
    ):
        return "colab"
    return "local"


def host_memory_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _per_device(spec: ChipSpec | None) -> tuple[int | None, float | None]:
    if spec is None:
        return None, None
    return spec.hbm_bytes // spec.devices_per_chip, spec.peak_bf16_flops / spec.devices_per_chip


def _detect_xla() -> HardwareInfo:
    summary = runtime.runtime_summary()
    backend = {"TPU": "tpu", "CUDA": "cuda", "GPU": "cuda"}.get(summary.device_type, "cpu")
    chip = normalise_chip(summary.device_kind) if backend != "cpu" else "cpu"
    memory, peak = _per_device(CHIPS.get(chip))
    if summary.memory_bytes_limit:  # what the runtime reports beats the table
        memory = summary.memory_bytes_limit
    return HardwareInfo(
        backend=backend,  # type: ignore[arg-type]
        via_xla=True,
        device_kind=summary.device_kind,
        chip=chip,
        num_devices=summary.global_devices,
        local_devices=summary.local_devices,
        num_processes=summary.process_count,
        process_index=summary.process_index,
        memory_per_device_bytes=memory,
        peak_bf16_flops_per_device=peak,
        host_memory_bytes=host_memory_bytes(),
        platform=detect_platform(),
    )


def _detect_cuda() -> HardwareInfo:
    """CUDA through torch (no XLA).

    How many GPUs the run has: a launcher that sets ``WORLD_SIZE`` (torchrun, torch.distributed)
    starts one process per GPU, so the run has WORLD_SIZE devices, however many each process can
    see (under torchrun every process sees all of its node's GPUs: multiplying by the visible
    count would over-count by that factor). Without ``WORLD_SIZE`` this is the only process and
    the run has every GPU it can see. `local_devices` is always the visible count.
    """
    import torch

    kind = torch.cuda.get_device_name(0)
    memory = int(torch.cuda.get_device_properties(0).total_memory)
    return _process_per_device("cuda", kind, torch.cuda.device_count(), memory)


def _process_per_device(backend: str, kind: str, count: int, memory: int | None) -> HardwareInfo:
    """A backend that runs one process per device (CUDA, TorchTPU): WORLD_SIZE devices when a launcher
    set it, else the `count` this process sees; `memory` per device (None: the chip table's)."""
    chip = normalise_chip(kind)
    table_memory, peak = _per_device(CHIPS.get(chip))
    world = launched_world_size()
    return HardwareInfo(
        backend=backend,
        via_xla=False,
        device_kind=kind,
        chip=chip,
        num_devices=world or count,
        local_devices=count,
        num_processes=world or 1,
        process_index=int(os.environ.get("RANK", "0")),
        memory_per_device_bytes=table_memory if memory is None else memory,
        peak_bf16_flops_per_device=peak,
        host_memory_bytes=host_memory_bytes(),
        platform=detect_platform(),
    )


def launched_world_size() -> int | None:
    """``WORLD_SIZE`` from a launcher that starts one process per device (torchrun, torch.distributed);
    None without one."""
    world = os.environ.get("WORLD_SIZE", "").strip()
    return int(world) if world else None


def _detect_cpu() -> HardwareInfo:
    """Plain CPU: one device per process; under torchrun (``WORLD_SIZE``) one per rank."""
    world = launched_world_size()
    return HardwareInfo(
        backend="cpu",
        via_xla=False,
        device_kind="CPU",
        chip="cpu",
        num_devices=world or 1,
        local_devices=1,
        num_processes=world or 1,
        process_index=int(os.environ.get("RANK", "0")) if world else 0,
        memory_per_device_bytes=None,
        peak_bf16_flops_per_device=None,
        host_memory_bytes=host_memory_bytes(),
        platform=detect_platform(),
    )


def _detect_torchtpu() -> HardwareInfo:  # pragma: no cover - TorchTPU on a TPU host only
    """TorchTPU: plain torch's ``tpu`` device, one process per chip under torchrun (as `_detect_cuda`
    counts GPUs: WORLD_SIZE devices when a launcher set it, else every chip this process sees)."""
    kind, count = torchtpu_plan.local_devices()
    return _process_per_device("tpu", kind, count, None)


def machine_facts() -> routing.MachineFacts:
    """What `routing.choose` decides from, read here (starts nothing, imports neither torch_xla nor TorchTPU)."""
    return routing.MachineFacts(
        xla_installed=presence.xla_installed(),
        torch_tpu=find_torch_tpu(),
        tpu_present=presence.tpu_present(),
        cuda_available=_cuda_available(),
        pjrt_device=presence.env_requests_xla(),
    )


def _tpu_runtime() -> str | None:
    """`routing.tpu_runtime` here, its conflict as a `HardwareError` (what to uninstall)."""
    facts = routing.MachineFacts(presence.xla_installed(), find_torch_tpu(), False, False, None)
    try:
        return routing.tpu_runtime(facts)
    except routing.BackendConflictError as err:
        raise HardwareError(str(err)) from None


def _found() -> str:
    """One line on what this machine offers, for error messages."""
    parts = [f"torch_xla {'installed' if presence.xla_installed() else 'not installed'}"]
    torch_tpu = find_torch_tpu()
    parts.append(
        f"TorchTPU {'installed' if torch_tpu is not None and torch_tpu.is_torchtpu else 'not installed'}"
    )
    parts.append(f"PJRT_DEVICE={os.environ.get('PJRT_DEVICE', '<unset>')}")
    parts.append(f"CUDA {'available' if _cuda_available() else 'not available'}")
    parts.append(f"TPU {'signs present' if presence.tpu_present() else 'not found'}")
    return ", ".join(parts)


@functools.cache
def detect(device_type: DeviceType = "auto") -> HardwareInfo:
    """Detect the hardware, trying TPU -> CUDA -> XLA:CPU (if PJRT_DEVICE=CPU) -> CPU for "auto".

    "auto" tries each backend whose signs are present; one that is present but fails to start
    is warned about, recorded in `HardwareInfo.notices`, and the next one is tried. An explicit
    "tpu", "cuda", "xla" or "cpu" that is not available raises `HardwareError` saying what was
    found and how to get what was asked for. Cached per `device_type`.
    """
    if device_type not in ("auto", "tpu", "cuda", "xla", "cpu"):
        raise HardwareError(
            f"device_type={device_type!r} is not allowed: expected one of 'auto', 'tpu', 'cuda', 'xla', 'cpu'"
        )
    if device_type != "auto":
        return _detect_explicit(device_type)
    notices: list[str] = []
    for kind in _present_backends():
        try:
            info = _detect_explicit(kind)
        except Exception as err:  # a backend that is there but cannot start: say so, try the next
            message = f"device_type='auto': {kind} is present but could not start ({err}); falling back"
            notices.append(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            continue
        return dataclasses.replace(info, notices=tuple(notices))
    return dataclasses.replace(_detect_cpu(), notices=tuple(notices))


def _present_backends() -> list[str]:
    """The backends "auto" tries, in order: those whose signs are on this machine (starts nothing)."""
    pjrt = presence.env_requests_xla()
    present = []
    if pjrt in (None, "TPU") and presence.tpu_present() and _tpu_runtime() is not None:
        present.append("tpu")  # torch_xla's, or TorchTPU's where torch_xla is not installed
    if _cuda_available():
        present.append("cuda")
    if presence.xla_installed() and pjrt == "CPU":
        present.append("xla")
    return present


def _detect_explicit(device_type: str) -> HardwareInfo:
    """The named backend, or `HardwareError` saying what was found and how to get it."""
    pjrt = presence.env_requests_xla()
    if device_type == "cpu":
        return _detect_cpu()
    if device_type == "tpu":
        tpu_runtime = _tpu_runtime()
        if tpu_runtime == "torchtpu" and presence.tpu_present():
            return _detect_torchtpu()
        if tpu_runtime is None or pjrt not in (None, "TPU") or not presence.tpu_present():
            raise HardwareError(
                f"device_type='tpu' requested but no TPU is usable here ({_found()}). "
                "On a TPU VM or a Colab/Kaggle TPU runtime, install torch_xla with its libtpu and set PJRT_DEVICE=TPU."
            )
        info = _detect_xla()
        if info.backend != "tpu":
            raise HardwareError(
                f"device_type='tpu' requested but the XLA runtime reports {info.device_kind!r} ({_found()})"
            )
        return info
    if device_type == "cuda":
        if not _cuda_available():
            raise HardwareError(
                f"device_type='cuda' requested but torch sees no CUDA device ({_found()}). "
                "Use a GPU runtime and a CUDA build of torch, or pass device_type='auto'."
            )
        return _detect_cuda()
    if device_type == "xla":
        _tpu_runtime()  # torch_xla beside TorchTPU: refused, naming what to uninstall
        if not presence.xla_installed():
            raise HardwareError(
                f"device_type='xla' requested but torch_xla is not installed ({_found()}). "
                "Install it with `pip install -e .[xla-cpu]` and set PJRT_DEVICE=CPU (or TPU)."
            )
        if pjrt is None and not presence.tpu_present():
            raise HardwareError(
                f"device_type='xla' requested but PJRT_DEVICE is unset and no TPU was found ({_found()}). "
                "Set PJRT_DEVICE=CPU (and CPU_NUM_DEVICES=8 for eight virtual devices) before starting Python."
            )
        return _detect_xla()
