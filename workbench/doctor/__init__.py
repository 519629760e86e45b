"""`doctor()`: a preflight check of a notebook or VM session before training starts.

It answers, without starting the XLA runtime or importing torch_xla, the questions behind
most "it does not start" reports (GitHub issue #20):

- versions (`versions`): torch and torch_xla of one major.minor, the libtpu torch_xla pins,
  transformers / peft / datasets within the project's pins, the notebook libraries; TorchTPU's
  pins where it is installed (`torchtpu_pins`);
- the accelerator (`accelerator`): which devices are attached, another process holding the
  TPU (named by PID and command line), a stale libtpu lock, ``PJRT_DEVICE`` and friends that
  contradict the hardware;
- the session (`session`): Colab with or without Drive, Kaggle's output room, free disk where
  checkpoints and the compile cache go and free host RAM, against the configured model's needs
  (`sizing`; only with a config, since sizing imports torch), and the host RAM offloaded layer
  checkpoints take (`offload`).

Every check reads through `DoctorRoots`, so each branch is tested on made-up trees. The result
is a `DoctorReport` of `Check`s (ok / warn / fail, what was seen, the exact fix);
``python -m workbench doctor`` prints it and exits 1 when a check fails, and
`widgets.doctor_view` draws it in a notebook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.doctor.accelerator import accelerator_checks, runtime_check, runtime_skipped, scan_devices
from workbench.doctor.checks import Check, DoctorError, DoctorReport
from workbench.doctor.offload import offload_check
from workbench.doctor.roots import DoctorRoots
from workbench.doctor.session import detect_session, session_checks
from workbench.doctor.sizing import model_check
from workbench.doctor.torchtpu_pins import torchtpu_checks
from workbench.doctor.versions import version_checks

if TYPE_CHECKING:
    from workbench.config import WorkbenchConfig

__all__ = ["Check", "DoctorError", "DoctorReport", "DoctorRoots", "doctor"]


def doctor(
    cfg: WorkbenchConfig | None = None, *, roots: DoctorRoots | None = None, start_runtime: bool = False
) -> DoctorReport:
    """Check this session before training: versions, accelerator, storage and memory.

    `cfg`: the run's config; its model is sized (checkpoint bytes, bytes to load) and compared
    with the free disk under ``train.checkpoint_dir`` and the compile cache, and with the free
    host RAM. None checks the default settings' places without a model to compare (no torch
    import). `roots`: where the checks read (the real machine by default; tests pass made-up
    trees). `start_runtime`: also start the XLA runtime (`workbench.backend.hardware.detect`)
    and report its devices; otherwise nothing here starts it or imports torch_xla.
    """
    from workbench.config import WorkbenchConfig

    roots = roots or DoctorRoots()
    packages = roots.packages()
    devices = scan_devices(roots)
    checks = version_checks(packages, tpu=devices.tpu, hosted=detect_session(roots) != "local")
    checks += torchtpu_checks(packages, tpu=devices.tpu)  # none unless a torch-tpu is installed
    checks += accelerator_checks(roots, devices)
    needs = None
    if cfg is not None:
        model, needs = model_check(cfg, roots)
        checks.append(model)
        offload = offload_check(cfg, roots, devices)  # None unless the run may offload its checkpoints
        checks += [offload] if offload is not None else []
    checks += session_checks(
        roots, cfg or WorkbenchConfig(), needs, devices, xla_version=packages.version("torch_xla")
    )
    if start_runtime:
        # starting it with a mismatched torch_xla or a held TPU crashes or hangs: fix those first
        failed = [c.name for c in checks if c.status == "fail"]
        checks.append(runtime_check() if not failed else runtime_skipped(failed))
    return DoctorReport(tuple(checks))
