"""The accelerator, seen without starting it: device files, who holds the TPU, libtpu's lock, PJRT_DEVICE.

What is visible: TPU device files (``/dev/accel*`` on v2-v5e hosts, ``/dev/vfio/<n>`` and
``/dev/vfio/devices/*`` on newer ones), TPU chips on the PCI bus (present even where a
container hides the device files), GPU device files (``/dev/nvidia<n>``). Then:

- the TPU held by another process: a forgotten notebook kernel or a stuck run keeps the device
  open and every new run fails with "TPU in use" or ``Operation not permitted``; the holder is
  named (PID and command line, read from ``/proc``) with the command that frees it;
- libtpu's lock file (``/tmp/libtpu_lockfile``): held by another process (the same problem), or
  left behind by a process that died (stale: safe to remove);
- ``PJRT_DEVICE`` and friends against the hardware: asking for a TPU that is not there fails,
  running XLA on the CPU beside an idle TPU warns, deprecated settings warn.

`runtime_check` (``doctor(start_runtime=True)`` only) starts the runtime through
`workbench.backend.hardware.detect` and reports the devices it found.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from workbench.backend.xla.presence import tpu_pci_chips
from workbench.doctor.checks import Check, Status
from workbench.doctor.processes import HolderScan, find_holders
from workbench.doctor.roots import DoctorRoots

LOCK_FILE = "libtpu_lockfile"
PJRT_ALLOWED = "TPU, CPU, CUDA (deprecated) or unset"
UNSET_PJRT = "unset PJRT_DEVICE (in a notebook: restart, then `os.environ.pop('PJRT_DEVICE')` before torch_xla is imported)"


@dataclass(frozen=True)
class Devices:
    """The accelerator device files and PCI chips of this host."""

    tpu_files: tuple[Path, ...]
    tpu_pci_chips: int
    gpu_files: tuple[Path, ...]

    @property
    def tpu(self) -> bool:
        """A TPU is attached: device files or chips on the PCI bus."""
        return bool(self.tpu_files) or self.tpu_pci_chips > 0

    def describe(self) -> str:
        parts = []
        if self.tpu_files:
            parts.append(f"TPU device files {', '.join(map(str, self.tpu_files))}")
        if self.tpu_pci_chips:
            parts.append(f"{self.tpu_pci_chips} TPU chip(s) on the PCI bus")
        if self.gpu_files:
            parts.append(f"GPU device files {', '.join(map(str, self.gpu_files))}")
        return "; ".join(parts) or "no TPU or GPU device files: the CPU only"


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def scan_devices(roots: DoctorRoots) -> Devices:
    """The TPU and GPU device files under ``roots.dev`` and the TPU chips under ``roots.sys``."""
    tpu = [roots.dev / n for n in _listdir(roots.dev) if re.fullmatch(r"accel\d+", n)]
    # /dev/vfio/vfio is the generic VFIO container, present on hosts without a TPU: not a TPU
    tpu += [roots.dev / "vfio" / n for n in _listdir(roots.dev / "vfio") if n.isdigit()]
    tpu += [roots.dev / "vfio" / "devices" / n for n in _listdir(roots.dev / "vfio" / "devices")]
    gpu = [roots.dev / n for n in _listdir(roots.dev) if re.fullmatch(r"nvidia\d+", n)]
    return Devices(tuple(tpu), tpu_pci_chips(roots.sys / "bus" / "pci" / "devices"), tuple(gpu))


def devices_check(devices: Devices) -> Check:
    """What is attached, and whether this process may open the TPU's device files."""
    if devices.tpu_pci_chips and not devices.tpu_files:
        return Check(
            "accelerator",
            "warn",
            f"{devices.describe()}, but no TPU device files (/dev/accel*, /dev/vfio/*): the driver is not "
            "loaded or a container hides them",
            "in Docker, start the container with --privileged (or --device for each /dev/accel* "
            "or /dev/vfio/* of the host)",
        )
    closed = [str(p) for p in devices.tpu_files if not os.access(p, os.R_OK | os.W_OK)]
    if closed:
        return Check(
            "accelerator",
            "fail",
            f"{devices.describe()}; this user cannot open {', '.join(closed)} ('Operation not permitted')",
            "run as a user that may open the TPU's device files (e.g. with sudo), or in Docker with --privileged",
        )
    return Check("accelerator", "ok", devices.describe())


def _free_fix(scan: HolderScan) -> str:
    pids = sorted({h.pid for h in scan.others})
    fix = f"kill {' '.join(map(str, pids))}, then run again"
    if any(h.is_notebook_kernel for h in scan.others):
        fix += (
            "; it is a notebook kernel: Kernel > Shut Down in its notebook (in Colab: Runtime > "
            "Restart session) frees the TPU too"
        )
    return fix


def _holders_text(scan: HolderScan) -> str:
    return "; ".join(f"PID {h.pid} holds {h.path}: {h.cmdline}" for h in scan.others)


def tpu_in_use_check(roots: DoctorRoots, devices: Devices) -> Check | None:
    """Another process holding a TPU device file (None without TPU device files to look at)."""
    if not devices.tpu_files:
        return None
    scan = find_holders(roots.proc, devices.tpu_files, self_pid=roots.self_pid)
    if scan.others:
        return Check(
            "TPU in use",
            "fail",
            f"{_holders_text(scan)}: a TPU is opened by one process at a time, so this run would fail "
            "with 'TPU in use' or 'Operation not permitted'",
            _free_fix(scan),
        )
    mine = (
        f"; this process holds {', '.join(scan.self_holds)} (its XLA runtime is started)"
        if scan.self_holds
        else ""
    )
    return Check("TPU in use", "ok", f"no other process holds the TPU{mine}{scan.note()}")


def lock_check(roots: DoctorRoots) -> Check | None:
    """libtpu's lock file: held by another process (fail), or left by a dead one (stale: warn)."""
    lock = roots.tmp / LOCK_FILE
    if not lock.exists():
        return None
    scan = find_holders(roots.proc, [lock], self_pid=roots.self_pid)
    if scan.others:
        return Check(
            "libtpu lock",
            "fail",
            f"{_holders_text(scan)}: libtpu refuses a second process ('TPU in use')",
            _free_fix(scan),
        )
    if scan.self_holds:
        return Check("libtpu lock", "ok", f"{lock} is held by this process (its XLA runtime is started)")
    if scan.unreadable:
        return Check(
            "libtpu lock",
            "warn",
            f"{lock} exists and no process we could inspect holds it{scan.note()}",
            f"sudo lsof {lock}; if nothing holds it: rm {lock}",
        )
    return Check(
        "libtpu lock",
        "warn",
        f"{lock} exists but no process holds it open: left behind by a run that died (stale)",
        f"rm {lock}",
    )


def _count(value: str) -> int | None:
    """A positive device count from an environment value, or None when it is not one."""
    return int(value) if value.strip().isdigit() and int(value) > 0 else None


def _device_count_check(
    name: str, value: str, *, bad_fix: str, idle_why: str | None, idle_fix: str, in_use: str
) -> Check:
    """A device-count variable: not a positive whole number (fail), set where it does nothing (warn,
    `idle_why`), or in use (ok)."""
    if _count(value) is None:
        return Check(name, "fail", f"{name}={value!r} is not a positive whole number", bad_fix)
    if idle_why is not None:
        return Check(name, "warn", f"{name}={value} {idle_why}", idle_fix)
    return Check(name, "ok", f"{name}={value}{in_use}")


def environment_checks(roots: DoctorRoots, devices: Devices) -> list[Check]:
    """``PJRT_DEVICE`` (always) and ``TPU_NUM_DEVICES``, ``CPU_NUM_DEVICES``, ``XLA_USE_BF16`` (when set)."""
    env = roots.env
    pjrt = env.get("PJRT_DEVICE", "").strip().upper() or None
    checks = [_pjrt_check(pjrt, devices)]
    if "TPU_NUM_DEVICES" in env:
        checks.append(
            _device_count_check(
                "TPU_NUM_DEVICES",
                env["TPU_NUM_DEVICES"],
                bad_fix="unset TPU_NUM_DEVICES (every TPU device), or set it to a count such as 1",
                idle_why=None if devices.tpu else "but no TPU here: it does nothing",
                idle_fix="unset TPU_NUM_DEVICES",
                in_use=": the run uses that many TPU devices",
            )
        )
    if "CPU_NUM_DEVICES" in env:
        checks.append(
            _device_count_check(
                "CPU_NUM_DEVICES",
                env["CPU_NUM_DEVICES"],
                bad_fix="unset CPU_NUM_DEVICES, or set it to a count such as 8 (with PJRT_DEVICE=CPU)",
                idle_why=None if pjrt == "CPU" else f"does nothing while PJRT_DEVICE is {pjrt or 'unset'}",
                idle_fix="export PJRT_DEVICE=CPU for virtual XLA:CPU devices, or unset CPU_NUM_DEVICES",
                in_use=" virtual XLA:CPU devices",
            )
        )
    for name in ("XLA_USE_BF16", "XLA_DOWNCAST_BF16"):
        if env.get(name, "0").strip() not in ("", "0"):
            checks.append(
                Check(
                    name,
                    "warn",
                    f"{name}={env[name]} is deprecated in torch_xla 2.x and casts every float tensor behind the "
                    "workbench's back",
                    f"unset {name} and set train.precision=bf16 (or bf16-mixed)",
                )
            )
    return checks


def _pjrt_check(pjrt: str | None, devices: Devices) -> Check:
    if pjrt is None:
        picked = "the TPU" if devices.tpu else "a GPU through torch" if devices.gpu_files else "the CPU"
        return Check("PJRT_DEVICE", "ok", f"unset: the run picks {picked}")
    if pjrt == "TPU":
        if devices.tpu:
            return Check("PJRT_DEVICE", "ok", "TPU, and a TPU is attached")
        return Check(
            "PJRT_DEVICE",
            "fail",
            "PJRT_DEVICE=TPU, but no TPU is attached (no /dev/accel*, /dev/vfio/* or TPU on the PCI bus): "
            "torch_xla will fail to start",
            f"{UNSET_PJRT}, or export PJRT_DEVICE=CPU for XLA on the CPU; or switch to a TPU runtime",
        )
    if pjrt == "CPU":
        if devices.tpu:
            return Check(
                "PJRT_DEVICE",
                "warn",
                "PJRT_DEVICE=CPU on a machine with a TPU: XLA runs on the CPU and the TPU stays idle",
                f"{UNSET_PJRT} (or export PJRT_DEVICE=TPU)",
            )
        return Check("PJRT_DEVICE", "ok", "CPU: XLA runs on the CPU (no TPU here)")
    if pjrt in ("CUDA", "GPU"):
        status: Status = "warn" if devices.gpu_files else "fail"
        seen = "" if devices.gpu_files else " and no GPU is attached (no /dev/nvidia*)"
        return Check(
            "PJRT_DEVICE",
            status,
            f"PJRT_DEVICE={pjrt}: torch_xla's GPU backend is deprecated{seen}; the workbench runs GPUs "
            "through plain torch",
            f"{UNSET_PJRT}, and set train.device_type=cuda",
        )
    return Check(
        "PJRT_DEVICE",
        "fail",
        f"PJRT_DEVICE={pjrt!r} is not allowed: {PJRT_ALLOWED}",
        f"{UNSET_PJRT}, or export PJRT_DEVICE=TPU (or CPU)",
    )


def accelerator_checks(roots: DoctorRoots, devices: Devices) -> list[Check]:
    """Every accelerator check that applies here, in order."""
    found = [devices_check(devices), tpu_in_use_check(roots, devices), lock_check(roots)]
    return [c for c in found if c is not None] + environment_checks(roots, devices)


def runtime_check() -> Check:
    """Start the runtime (`detect()`) and report what it found; fail with its error when it cannot."""
    from workbench.backend.hardware import detect

    try:
        hw = detect()
    except Exception as err:  # whatever the runtime raised is the finding
        return Check(
            "runtime",
            "fail",
            f"could not start: {type(err).__name__}: {err}",
            "fix the failures above first; then see the error",
        )
    saw = f"{hw.num_devices} x {hw.device_kind} (chip {hw.chip}, {'through XLA' if hw.via_xla else 'plain torch'})"
    status: Status = "warn" if hw.notices else "ok"
    notes = "; ".join(hw.notices)
    return Check(
        "runtime",
        status,
        saw + (f"; {notes}" if notes else ""),
        "see the notice: the backend it names could not start" if notes else None,
    )


def runtime_skipped(failed: list[str]) -> Check:
    """The runtime check when earlier checks failed: starting it then would crash or hang."""
    return Check(
        "runtime",
        "warn",
        f"not started: {', '.join(failed)} failed, and starting the runtime then crashes or hangs",
        "fix the failures above, then run the doctor again with start_runtime=True (--runtime)",
    )
