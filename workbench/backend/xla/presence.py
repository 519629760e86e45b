"""Whether torch_xla and a TPU are on this machine, seen without importing torch_xla or starting anything.

`xla_installed` (the package can be imported), `env_requests_xla` (``PJRT_DEVICE``), `tpu_pci_chips`
(TPU chips on the PCI bus, as torch_xla counts them) and `tpu_present` (any cheap sign of a TPU: the
variables TPU VMs and hosted runtimes set, the device files, the PCI bus). Hardware detection, routing,
the doctor and the multi-host helpers ask these before anything imports torch_xla; what the running
runtime says is `workbench.backend.xla.runtime`'s.
"""

from __future__ import annotations

import importlib.util
import os

# ---- looking without starting anything: the machine and its environment --------------------------


def xla_installed() -> bool:
    """True when torch_xla can be imported (checked without importing it)."""
    return importlib.util.find_spec("torch_xla") is not None


def env_requests_xla() -> str | None:
    """The PJRT device the environment asks for (``PJRT_DEVICE``), upper-cased, or None."""
    value = os.environ.get("PJRT_DEVICE", "").strip()
    return value.upper() or None


# TPU chips on the PCI bus, as torch_xla counts them (torch_xla/_internal/tpu.py): Google's vendor
# id with a TPU device id. The vendor alone is not enough: GCE's gVNIC network card is Google's too.
_GOOGLE_PCI_VENDOR_ID = "0x1ae0"
_TPU_PCI_DEVICE_IDS = frozenset(
    {
        "0x0027",  # v2, v3
        "0x005e",  # v4
        "0x0063",  # v5e
        "0x006f",  # v6e
        "0x0076",  # 7x
        "0x0056",  # testing parts torch_xla also counts
        "0x0062",
    }
)


def tpu_pci_chips(pci_devices: str | os.PathLike[str] = "/sys/bus/pci/devices") -> int:
    """TPU chips attached to this host through PCI (0 where sysfs cannot be read)."""
    chips = 0
    try:
        entries = list(os.scandir(pci_devices))
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(os.path.join(entry.path, "vendor")) as vendor:
                if vendor.read().strip() != _GOOGLE_PCI_VENDOR_ID:
                    continue
            with open(os.path.join(entry.path, "device")) as device:
                chips += device.read().strip() in _TPU_PCI_DEVICE_IDS
        except OSError:
            continue
    return chips


def tpu_present() -> bool:
    """Cheap signs of a TPU on this host, without touching the runtime.

    ``PJRT_DEVICE=TPU``; the variables TPU VMs and hosted runtimes set (``TPU_ACCELERATOR_TYPE``,
    ``TPU_NAME``, ``COLAB_TPU_ADDR``, ``TPU_WORKER_ID``, ...); ``/dev/accel*`` or
    ``/dev/vfio/devices``; and, the sign that needs no variable at all, TPU chips on the PCI bus
    (Colab's and Kaggle's TPU VMs do not always set the variables).
    """
    if env_requests_xla() == "TPU":
        return True
    for var in ("TPU_ACCELERATOR_TYPE", "TPU_NAME", "COLAB_TPU_ADDR", "TPU_WORKER_ID", "TPU_SKIP_MDS_QUERY"):
        if os.environ.get(var):
            return True
    try:
        if any(name.startswith("accel") for name in os.listdir("/dev")) or os.path.isdir("/dev/vfio/devices"):
            return True
    except OSError:
        pass
    return tpu_pci_chips() > 0
