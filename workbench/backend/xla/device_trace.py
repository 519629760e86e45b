"""torch_xla's profiler on a TPU (TPU-only): a trace of training steps captured into a directory
TensorBoard reads, for `workbench.analysis.trace` through `XlaSpmd.capture_trace`.

`torch.profiler` sees none of a TPU's work, so the capture is torch_xla's own: its profiler server
(started once per process) and a capture in the background lasting about the measured steps, each
step marked with a `StepTrace`. On XLA:CPU the trace is `torch.profiler`'s (the backend says so).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.backend.xla import runtime

_SERVER: Any = None
"""torch_xla's profiler server of this process (one per process, on the first capture's port)."""


def capture(
    step_fn: Callable[[], Any], steps: int, logdir: Path, step_s: float, port: int
) -> None:  # pragma: no cover - torch_xla's TPU profiler
    """Start the server once, capture in the background while `steps` calls of `step_fn` run."""
    global _SERVER
    xp = runtime.profiler()
    if _SERVER is None:
        _SERVER = xp.start_server(port)
    duration_ms = max(1000, math.ceil(1000 * step_s * steps * 1.5) + 500)
    thread = threading.Thread(
        target=xp.trace,
        args=(f"localhost:{port}", str(logdir)),
        kwargs={"duration_ms": duration_ms},
        daemon=True,
    )
    thread.start()
    time.sleep(0.5)  # let the capture attach before the measured steps
    for i in range(steps):
        with xp.StepTrace("train_step", step_num=i):
            step_fn()
    runtime.wait_device_ops()
    thread.join()
