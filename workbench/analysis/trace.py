"""Profiler traces: N training steps after warm-up, captured into a directory TensorBoard reads.

`trace` runs the warm-up steps first, so their compiles stay out of the trace, then captures
the measured steps with torch_xla's profiler on TPU (its server, started once per process,
and a capture in the background) or with `torch.profiler` on CPU and GPU, XLA:CPU included.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.backend.xla import runtime

if TYPE_CHECKING:
    from workbench.backend.hardware import HardwareInfo


# ---- traces -----------------------------------------------------------------------------


def trace(
    step_fn: Callable[[], Any],
    steps: int,
    logdir: str | Path,
    warmup: int = 2,
    *,
    hw: HardwareInfo | None = None,
    port: int = 9012,
) -> Path:
    """Run `step_fn` `warmup` times (compiles land there), then capture a trace of `steps` more
    calls into `logdir`, readable by TensorBoard (the profile plugin).

    TPU: torch_xla's profiler server and a detached capture of the measured steps' duration.
    CPU and GPU (XLA:CPU included): `torch.profiler`, one ``*.pt.trace.json`` per capture.
    `step_fn` runs one whole step (including ``runtime.sync()`` on XLA).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} is not allowed: an int >= 1")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} is not allowed: an int >= 0")
    logdir = Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    xla = hw.via_xla if hw is not None else runtime.xla_imported()
    t0 = time.perf_counter()
    for _ in range(warmup):
        step_fn()
    if xla:
        runtime.wait_device_ops()
    per_step = (time.perf_counter() - t0) / max(warmup, 1)
    if hw is not None and hw.backend == "tpu" and hw.via_xla:  # pragma: no cover - torch_xla's TPU profiler
        return _trace_tpu(step_fn, steps, logdir, per_step, port)
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if hw is not None and hw.backend == "cuda" and not hw.via_xla:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with warnings.catch_warnings():
        # the warm-up steps ran above, outside the profiler: its "no warmup" warning does not apply
        warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
        profile = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(logdir)),
            record_shapes=False,
        )
    with profile as prof:
        for i in range(steps):
            with torch.profiler.record_function(f"train_step_{i}"):
                step_fn()
                if xla:
                    runtime.wait_device_ops()
            prof.step()
    return logdir


def _trace_tpu(
    step_fn: Callable[[], Any], steps: int, logdir: Path, per_step: float, port: int
) -> Path:  # pragma: no cover
    """torch_xla's profiler: start the server once, capture in the background while the steps run."""
    import threading

    xp = runtime.profiler()
    global _TPU_SERVER
    if _TPU_SERVER is None:
        _TPU_SERVER = xp.start_server(port)
    duration_ms = max(1000, math.ceil(1000 * per_step * steps * 1.5) + 500)
    capture = threading.Thread(
        target=xp.trace,
        args=(f"localhost:{port}", str(logdir)),
        kwargs={"duration_ms": duration_ms},
        daemon=True,
    )
    capture.start()
    time.sleep(0.5)  # let the capture attach before the measured steps
    for i in range(steps):
        with xp.StepTrace("train_step", step_num=i):
            step_fn()
    runtime.wait_device_ops()
    capture.join()
    return logdir


_TPU_SERVER: Any = None
