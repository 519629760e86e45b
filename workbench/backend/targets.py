"""Hardware targets: the machines a config can be planned for, named (v5e-8, T4, ...) or detected.

A `Target` is what planning needs to know about a machine: its chip, how many runtime devices
a run spreads over and the memory of one device. `TARGETS` holds well-known TPU slices and GPUs
(from the chip table, `workbench.backend.hardware.CHIPS`); `resolve_target` also turns the
detected hardware (or any `HardwareInfo`) into one. `mesh_factorisations` lists the
(data, fsdp, model) meshes a device count allows.

Plain Python: no UI imports, nothing initialised until `resolve_target('auto')` detects.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.backend.hardware import CHIPS, HardwareInfo
from workbench.units import GiB


@dataclass(frozen=True)
class Target:
    """A hardware target: chip type and how many runtime devices the slice has."""

    name: str
    chip: str
    num_devices: int
    memory_per_device_bytes: int | None
    topology: str | None = None
    """The slice's ICI topology in chips (``2x4``, ``2x2x4``) as Google names it; None off TPU."""
    num_slices: int = 1
    """Slices joined over the data-centre network (DCN); 1 for one slice, one host or a GPU."""

    @property
    def label(self) -> str:
        mem = (
            "unknown"
            if self.memory_per_device_bytes is None
            else f"{self.memory_per_device_bytes / GiB:.0f} GiB"
        )
        return f"{self.name} ({self.num_devices} × {mem})"


def _named_target(name: str, chip: str, chips: int, topology: str | None = None) -> Target:
    spec = CHIPS[chip]
    devices = chips * spec.devices_per_chip
    return Target(name, chip, devices, spec.hbm_bytes // spec.devices_per_chip, topology)


# TPU slice names count TensorCores for v2-v4 (v4-8 = 4 megacore chips = 4 devices) and chips
# for v5e/v6e (v5e-8 = 8 chips). Colab's TPU runtime is one v5e chip, Kaggle's is a v5e-8.
# Topologies from cloud.google.com/tpu/docs/v4, v5e and v6e (the slice shapes each page lists).
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        _named_target("v5e-1", "v5e", 1, "1x1"),
        _named_target("v5e-4", "v5e", 4, "2x2"),
        _named_target("v5e-8", "v5e", 8, "2x4"),
        _named_target("v6e-1", "v6e", 1, "1x1"),
        _named_target("v6e-8", "v6e", 8, "2x4"),
        _named_target("v4-8", "v4", 4, "2x2x1"),
        _named_target("v4-32", "v4", 16, "2x2x4"),
        _named_target("T4", "t4", 1),
        _named_target("L4", "l4", 1),
        _named_target("A100-40GB", "a100-40gb", 1),
        _named_target("A100-80GB", "a100-80gb", 1),
        _named_target("H100", "h100", 1),
    )
}


def resolve_target(target: str | Target | HardwareInfo) -> Target:
    """A `Target` from a name in `TARGETS`, 'auto' (the detected hardware) or a `HardwareInfo`."""
    if isinstance(target, Target):
        return target
    if isinstance(target, HardwareInfo):
        return _target_from_hardware(target)
    if target == "auto":
        from workbench.backend.hardware import detect

        return _target_from_hardware(detect())
    if target not in TARGETS:
        raise ValueError(f"target={target!r} is not allowed: expected 'auto' or one of {', '.join(TARGETS)}")
    return TARGETS[target]


def training_devices(hw: HardwareInfo) -> int:
    """How many devices a `Trainer` spreads a run over on `hw`.

    Only torch_xla SPMD applies a mesh: without XLA (CUDA, plain CPU) the trainer runs the
    whole batch on one device however many there are (a Kaggle T4 x2 trains on one T4).
    """
    return hw.num_devices if hw.via_xla else 1


def _target_from_hardware(hw: HardwareInfo) -> Target:
    devices = training_devices(hw)
    # Plain CPU has no device memory figure: the host's memory is what a CPU run can use.
    mem = hw.memory_per_device_bytes
    if mem is None and hw.backend == "cpu":
        mem = hw.host_memory_bytes // max(1, devices)
    name = f"detected {hw.chip}"
    if devices != hw.num_devices:
        name += f", 1 of {hw.num_devices} used (no XLA mesh)"
    return Target(name, hw.chip, devices, mem)


def mesh_factorisations(num_devices: int) -> list[tuple[int, int, int]]:
    """Every (data, fsdp, model) with data * fsdp * model == num_devices, pure data parallel first."""
    if num_devices < 1:
        raise ValueError(f"num_devices={num_devices!r} is not allowed: must be >= 1")
    out = []
    for data in range(num_devices, 0, -1):
        if num_devices % data:
            continue
        rest = num_devices // data
        for fsdp in range(rest, 0, -1):
            if rest % fsdp == 0:
                out.append((data, fsdp, rest // fsdp))
    return out


__all__ = ["TARGETS", "Target", "mesh_factorisations", "resolve_target", "training_devices"]
