"""Host memory for the layers' checkpoints (``train.offload_activations``) against what the machine has.

With offload the run keeps every layer's checkpointed input in host memory
(`workbench.analysis.long_context`): per device, the memory estimate's ``host_bytes``, and a host
holds those of all its devices (a v5e-8 VM: 8 chips, 384 GB). The check sizes it for the run's batch
and ``data.max_length`` with the attention kernel the run would use here ('auto': flash on a TPU,
sdpa on a GPU, chunked otherwise) and compares it with the available RAM: a run that must offload
('on') and cannot is a failure, one that might ('auto') a warning. Nothing is checked when offload
is off or checkpointing is.
"""

from __future__ import annotations

from typing import Any

from workbench.doctor.accelerator import Devices
from workbench.doctor.checks import Check
from workbench.doctor.roots import DoctorRoots
from workbench.doctor.session import read_meminfo
from workbench.doctor.sizing import _config_view
from workbench.units import format_bytes

NAME = "offloaded checkpoints"


def offload_check(cfg: Any, roots: DoctorRoots, devices: Devices) -> Check | None:
    """The host RAM the offloaded checkpoints take against what is available; None when the run
    never offloads (``train.offload_activations: off`` or no gradient checkpointing)."""
    train = cfg.train
    if train.offload_activations == "off" or not train.gradient_checkpointing:
        return None
    try:
        from workbench.analysis.estimate import config_settings, estimate

        view, _ = _config_view(cfg, roots)
        kernel = cfg.model.attention
        if kernel == "auto":
            kernel = "flash" if devices.tpu else "sdpa" if devices.gpu_files else "chunked"
        settings = {**config_settings(cfg), "offload_activations": "on"}
        est = estimate(
            view, batch_size=train.batch_size, seq_len=cfg.data.max_length, attention=kernel, **settings
        )
    except Exception as err:  # a model the estimate cannot size: the model check says why
        return Check(NAME, "warn", f"cannot size them: {err}", "check the host RAM by hand (free -h)")
    count = max(1, devices.tpu_pci_chips or len(devices.gpu_files))
    need = est.host_bytes * count
    what = (
        f"train.offload_activations={train.offload_activations}: {format_bytes(est.host_bytes)} per device"
        + (f" x {count} devices = {format_bytes(need)}" if count > 1 else "")
        + f" at {train.batch_size} x {cfg.data.max_length} tokens"
    )
    info = read_meminfo(roots.proc)
    available = info.get("MemAvailable")
    if available is None:
        return Check(
            NAME, "warn", f"{what}; cannot read MemAvailable", "check the host RAM by hand (free -h)"
        )
    total = f" of {format_bytes(info['MemTotal'])}" if "MemTotal" in info else ""
    saw = f"{what}; {format_bytes(available)} available{total}"
    if need <= available:
        return Check(NAME, "ok", saw)
    fix = (
        "shorten data.max_length or train.batch_size, or use a VM with more RAM "
        "(v5e-1: 48 GB, v5e-4: 192 GB, v5e-8: 384 GB)"
    )
    if train.offload_activations == "on":
        return Check(NAME, "fail", f"{saw}: they do not fit", fix)
    return Check(
        NAME,
        "warn",
        f"{saw}: they would not fit if the run offloads (it does where the device is short)",
        fix,
    )


__all__ = ["offload_check"]
