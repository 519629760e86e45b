"""Runs that span several hosts (TPU pods such as v4-32): which process is this, and what is its share.

On a pod every worker runs the same script; each is one *process* with its own index. This
module answers "which process is this" (`process_index`, `process_count`, `is_main`), prints
once per run (`print_on_main`), splits a global batch (`per_host_batch_size`) and a dataset
(`host_shard_bounds`, `shard_for_host`) between hosts with errors when they do not divide, and
writes the ``gcloud`` command that starts the same run on every worker (`pod_launch_command`:
printed for the user, never executed here).

Process facts come from the XLA runtime when it is (or should be) in use, else from the
launcher's environment (``TPU_WORKER_ID``, torchrun's ``RANK``/``WORLD_SIZE``), else a single
process. Asking the runtime starts it, which leaves SPMD still possible (no tensor is created).

Dataset shares are always equal: a host with one more batch than the others would run one
more step and wait forever for them at the next collective.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from workbench.backend.native import process_group
from workbench.backend.xla import presence, runtime
from workbench.units import nearby_multiples

if TYPE_CHECKING:
    from workbench.backend.hardware import HardwareInfo
    from workbench.config import WorkbenchConfig

_INDEX_VARS = ("TPU_WORKER_ID", "RANK")
_COUNT_VARS = ("TPU_WORKER_COUNT", "WORLD_SIZE")


class _DataParallelMesh(Protocol):
    """What `per_host_batch_size` reads of a resolved mesh (`workbench.parallel.mesh.MeshSpec`, a layer up)."""

    @property
    def dp_size(self) -> int: ...

    def describe(self) -> str: ...


class MultiHostError(ValueError):
    """A multi-host quantity that does not work out; the message names the numbers."""


def _use_runtime(start: bool = True) -> bool:
    if runtime.runtime_started():
        return True
    return (
        start
        and presence.xla_installed()
        and (presence.env_requests_xla() is not None or presence.tpu_present())
    )


def _env_int(names: Sequence[str]) -> int | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                raise MultiHostError(f"environment variable {name}={value!r} is not an integer") from None
    return None


def process_index(*, start_runtime: bool = True) -> int:
    """This process's index (0 on a single host; the rank under torchrun). Process 0 is the main one.

    `start_runtime=False`: only what is known without importing torch_xla or starting its runtime (one
    already started, torchrun's and the hosts' variables), for a line printed after an interrupt, which
    may have left torch_xla half imported."""
    if process_group.launched_by_torchrun() and not runtime.runtime_started():
        return int(os.environ["RANK"])
    if _use_runtime(start_runtime):
        return runtime.xla_process_index()
    value = _env_int(_INDEX_VARS)
    return 0 if value is None else value


def process_count(*, start_runtime: bool = True) -> int:
    """How many processes take part (one per host on a TPU pod; 1 on Colab/Kaggle; torchrun's ranks);
    `start_runtime` as `process_index`'s."""
    if process_group.launched_by_torchrun() and not runtime.runtime_started():
        return int(os.environ["WORLD_SIZE"])
    if _use_runtime(start_runtime):
        return runtime.xla_process_count()
    value = _env_int(_COUNT_VARS)
    return 1 if value is None else value


def is_main() -> bool:
    """True on the process that logs, saves checkpoints and writes reports."""
    return process_index() == 0


def print_on_main(*args: Any, **kwargs: Any) -> None:
    """`print` on the main process only (so a 4-host pod does not print everything 4 times)."""
    if is_main():
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def _num_processes(hw: HardwareInfo | int | None) -> int:
    if hw is None:
        return process_count()
    if isinstance(hw, int) and not isinstance(hw, bool):
        return hw
    return int(hw.num_processes)


def per_host_batch_size(
    global_batch_size: int, hw: HardwareInfo | int | None = None, *, mesh: _DataParallelMesh | None = None
) -> int:
    """Sequences each host loads per step: the global batch over the processes.

    `hw` is a `HardwareInfo` (its `num_processes`), a process count, or None (ask the runtime).
    With a resolved `mesh`, the global batch must also split over its data-parallel size.
    """
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise MultiHostError(f"global_batch_size={global_batch_size!r} is not allowed: must be an int >= 1")
    hosts = _num_processes(hw)
    if hosts < 1:
        raise MultiHostError(f"process count {hosts} is not allowed: must be >= 1")
    if mesh is not None and global_batch_size % mesh.dp_size:
        raise MultiHostError(
            f"global batch size {global_batch_size} does not split over the data-parallel size "
            f"{mesh.dp_size} of mesh {mesh.describe()}; use a multiple of {mesh.dp_size}"
        )
    if global_batch_size % hosts:
        raise MultiHostError(
            f"global batch size {global_batch_size} does not split over {hosts} hosts (processes): "
            f"{global_batch_size} % {hosts} = {global_batch_size % hosts}; use a multiple of {hosts} "
            f"(e.g. {nearby_multiples(global_batch_size, hosts)})"
        )
    return global_batch_size // hosts


def host_shard_bounds(length: int, num_processes: int, process_index: int) -> tuple[int, int]:
    """[start, stop) of host `process_index`'s contiguous share of `length` examples.

    Every host gets ``length // num_processes`` examples, so every host runs the same number of
    steps (one more batch on one host would leave it waiting for the others at the next
    collective). The remainder, fewer than `num_processes` examples at the end, is left out.
    """
    if num_processes < 1:
        raise MultiHostError(f"num_processes={num_processes} is not allowed: must be >= 1")
    if not 0 <= process_index < num_processes:
        raise MultiHostError(f"process_index={process_index} is not allowed: must be in [0, {num_processes})")
    share = length // num_processes
    if share == 0:
        raise MultiHostError(f"{length} examples cannot give each of {num_processes} hosts at least one")
    return process_index * share, (process_index + 1) * share


def shard_for_host(dataset: Any, num_processes: int | None = None, process_index: int | None = None) -> Any:
    """This host's equal, contiguous share of `dataset` (a `datasets.Dataset` or a sequence).

    The process count and index default to this run's (`process_count`, `process_index`);
    the share is `host_shard_bounds`'.
    """
    if num_processes is None or process_index is None:
        count, index = _this_process()
        num_processes = count if num_processes is None else num_processes
        process_index = index if process_index is None else process_index
    start, stop = host_shard_bounds(len(dataset), int(num_processes), int(process_index))
    if start == 0 and stop == len(dataset):
        return dataset
    if hasattr(dataset, "select"):  # datasets.Dataset
        return dataset.select(range(start, stop))
    return dataset[start:stop]


def _this_process() -> tuple[int, int]:
    """(process count, process index) of this run; the parameters of `shard_for_host` hide the names."""
    return process_count(), process_index()


# ---- launching on every worker of a pod ----------------------------------------------

_TPU_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")


def config_overrides(cfg: WorkbenchConfig) -> list[str]:
    """Dotted ``section.field=value`` strings for every field that differs from the defaults."""
    from workbench.config import WorkbenchConfig

    default, current = WorkbenchConfig().to_dict(), cfg.to_dict()
    out = []
    for section, fields in current.items():
        for name, value in fields.items():
            if default[section][name] != value:
                out.append(f"{section}.{name}={_override_value(value)}")
    return out


def _override_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _quote_path(path: str) -> str:
    # "~/dir" must stay unquoted at the tilde or the remote shell will not expand it.
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def pod_launch_command(
    cfg: WorkbenchConfig | None = None,
    *,
    tpu_name: str,
    zone: str,
    project: str | None = None,
    workdir: str = "~/xla-workbench",
    config_path: str | None = None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    python: str = "python3",
    entrypoint: str = "-m workbench train",
    worker: str = "all",
    echo: bool = False,
) -> str:
    """The ``gcloud compute tpus tpu-vm ssh`` command that runs the same job on every worker.

    The remote command changes to `workdir` (where the repository is checked out on every
    worker), sets `env` (``PJRT_DEVICE=TPU`` by default) and runs `entrypoint`, by default
    ``python3 -m workbench train`` (`workbench.run`: exit 0 trained, 1 failed while training,
    2 could not start), with ``--config config_path`` and the ``section.field=value`` overrides:
    the given ones after those generated from `cfg` (every field that differs from the defaults,
    so the workers need no config file). The overrides apply in that order, after the file.
    Everything is shell-quoted twice: once for the remote shell, once for the local one.
    Returned (and printed with `echo=True`), never executed.
    """
    if not _TPU_NAME.match(tpu_name or ""):
        raise MultiHostError(
            f"tpu_name={tpu_name!r} is not allowed: lowercase letters, digits and '-', starting with a letter"
        )
    if not _ZONE.match(zone or ""):
        raise MultiHostError(f"zone={zone!r} is not allowed: expected a zone like 'us-central2-b'")
    if worker != "all" and not re.fullmatch(r"\d+(,\d+)*", worker):
        raise MultiHostError(f"worker={worker!r} is not allowed: 'all' or worker numbers like '0' or '0,1'")
    variables = {"PJRT_DEVICE": "TPU", **dict(env or {})}
    for name in variables:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise MultiHostError(
                f"environment variable name {name!r} is not allowed: letters, digits and '_', "
                "not starting with a digit"
            )
    args = shlex.split(entrypoint)
    if config_path:
        args += ["--config", config_path]
    args += (config_overrides(cfg) if cfg is not None else []) + list(overrides)
    remote = " ".join(
        [f"cd {_quote_path(workdir)} &&"]
        + [f"{k}={shlex.quote(str(v))}" for k, v in variables.items()]
        + [shlex.quote(python)]
        + [shlex.quote(a) for a in args]
    )
    parts = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", tpu_name, f"--zone={zone}"]
    if project:
        parts.append(f"--project={shlex.quote(project)}")
    parts += [f"--worker={worker}", "--command=" + shlex.quote(remote)]
    command = " ".join(parts)
    if echo:
        print(command, file=sys.stdout, flush=True)
    return command


def describe(hw: HardwareInfo | None = None) -> str:
    """One line: process i of n (main or not), for logs."""
    index, count = (
        (hw.process_index, hw.num_processes) if hw is not None else (process_index(), process_count())
    )
    return f"process {index} of {count}" + (" (main)" if index == 0 else "")
