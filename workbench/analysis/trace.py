"""Profiler traces: N training steps after warm-up, captured into a directory TensorBoard reads.

`trace` runs the warm-up steps first, so their compiles stay out of the trace, then captures
the measured steps with the device's own profiler where `torch.profiler` cannot see the device
(torch_xla's on TPU: `workbench.backend.xla.device_trace`) or with `torch.profiler` on CPU and GPU,
XLA:CPU included. It asks the run's `Backend` both, and never which backend it is.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.backend.selection import backend_for

if TYPE_CHECKING:
    from workbench.backend.hardware import HardwareInfo
    from workbench.backend.protocol import Backend


# ---- traces -----------------------------------------------------------------------------


def trace(
    step_fn: Callable[[], Any],
    steps: int,
    logdir: str | Path,
    warmup: int = 2,
    *,
    hw: HardwareInfo | None = None,
    port: int = 9012,
    backend: Backend | None = None,
) -> Path:
    """Run `step_fn` `warmup` times (compiles land there), then capture a trace of `steps` more
    calls into `logdir`, readable by TensorBoard (the profile plugin).

    The device's own profiler where `torch.profiler` does not see its work (`Backend.capture_trace`:
    torch_xla's on a TPU, its server and a detached capture of the measured steps' duration); else
    `torch.profiler` (XLA:CPU included) with the backend's activities, one ``*.pt.trace.json`` per
    capture, each step waited for (`Backend.wait`). `step_fn` runs one whole step (including its
    ``Backend.step_boundary()``). `backend`: the run's (default: `backend_for(hw)`).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} is not allowed: an int >= 1")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} is not allowed: an int >= 0")
    logdir = Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    backend = backend if backend is not None else backend_for(hw)
    t0 = time.perf_counter()
    for _ in range(warmup):
        step_fn()
    backend.wait()
    per_step = (time.perf_counter() - t0) / max(warmup, 1)
    if backend.capture_trace(step_fn, steps, logdir, step_s=per_step, port=port):
        return logdir
    import torch

    with warnings.catch_warnings():
        # the warm-up steps ran above, outside the profiler: its "no warmup" warning does not apply
        warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
        profile = torch.profiler.profile(
            activities=backend.profiler_activities(),
            schedule=torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(logdir)),
            record_shapes=False,
        )
    with profile as prof:
        for i in range(steps):
            with torch.profiler.record_function(f"train_step_{i}"):
                step_fn()
                backend.wait()
            prof.step()
    return logdir
