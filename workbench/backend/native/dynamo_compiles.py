"""torch.compile's graphs on plain torch (CPU, CUDA): counted, timed and explained, as
`workbench.backend.xla.compile_log` does for torch_xla's programs.

`counting_backend` wraps a torch.compile backend (inductor by default): each graph Dynamo hands it is
counted (`graphs_compiled`, `graph_compile_s`: this process's, like torch_xla's counters) and recorded
as a `CompileRecord` of the same shape as torch_xla's compile log gives, so the recompile forensics
(`workbench.analysis.recompiles`) explain both alike:

- **the cause**: Dynamo's own guard-failure reason for the cached graph it could not reuse (e.g.
  ``tensor 'batch['input_ids']' size mismatch at index 1. expected 32, actual 48``), read from
  ``torch._dynamo.guards.guard_failures``, where Dynamo appends the reasons of every recompile
  whatever the logging settings (torch 2.8 and 2.9); a code object's first graph is ``first graph of
  <function>``. ``torch._logging``'s ``recompiles`` artifact would need the process's log settings
  changed, and a ``guard_fail_fn`` the private ``torch._dynamo.optimize`` in place of torch.compile.
- **the place**: the Python stack when the backend was called (Dynamo compiles synchronously, in the
  caller's thread), innermost first, without this module's and the registered wrappers' frames.

Only graphs compiled through `counting_backend` count: a user's own torch.compile elsewhere does not.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from workbench.backend.compile_records import CompileRecord, PythonFrame

COMPILER = "dynamo"
"""The `CompileRecord.compiler` of a torch.compile graph."""

_lock = threading.Lock()
_count = 0
_seconds = 0.0
_records: list[CompileRecord] = []
_failures_seen: dict[Any, int] = {}


def graphs_compiled() -> int:
    """Graphs compiled through `counting_backend` so far in this process."""
    return _count


def graph_compile_s() -> float:
    """Seconds their backends spent compiling (a backward AOTAutograd compiles lazily, at the first
    backward, is not in it)."""
    return _seconds


def records() -> list[CompileRecord]:
    """Every graph compiled so far, oldest first."""
    return list(_records)


def counting_backend(
    inner: str | Callable[..., Any] = "inductor", *, wrappers: Iterable[str] = ()
) -> Callable:
    """A torch.compile backend: `inner` (a registered name such as 'inductor' or 'aot_eager', or a
    backend callable) with each graph counted and recorded. Frames of the files in `wrappers` (the
    caller's own compile wrapper) are left out of the record's stack, so it names who ran the step."""
    import torch._dynamo

    compile_graph = torch._dynamo.lookup_backend(inner) if isinstance(inner, str) else inner
    skipped = (__file__, *wrappers)

    def backend(graph: Any, example_inputs: list[Any]) -> Any:
        cause = _new_guard_failure()
        frames = caller_frames(skipped)
        start = time.perf_counter()
        compiled = compile_graph(graph, example_inputs)
        _record(time.perf_counter() - start, cause, frames, len(example_inputs))
        return compiled

    return backend


def caller_frames(skipped: Iterable[str] = ()) -> tuple[PythonFrame, ...]:
    """The Python stack here, innermost first, without the frames of the files in `skipped`."""
    skip = tuple(skipped)
    stack = traceback.extract_stack()[:-1]
    return tuple(
        PythonFrame(frame.name, frame.filename, frame.lineno or 0)
        for frame in reversed(stack)
        if frame.filename not in skip
    )


def _new_guard_failure() -> str | None:
    """The newest guard-failure reason Dynamo appended since the last call (a recompile's cause);
    None when there is none (a first compile) or this torch keeps none."""
    try:
        from torch._dynamo.guards import guard_failures
    except ImportError:
        return None
    fresh: list[str] = []
    for code, reasons in list(guard_failures.items()):
        seen = _failures_seen.get(code, 0)
        fresh += [str(r) for r in reasons[seen:]]
        _failures_seen[code] = len(reasons)
    if not fresh:
        return None
    # Dynamo checks every cached graph of the code and appends one reason per graph: the first is
    # against the newest graph; each starts with its compile id ("0/1: ")
    reason = fresh[0].split(": ", 1)[-1] if fresh[0][:1].isdigit() else fresh[0]
    others = len(fresh) - 1
    return reason + (
        f" (and the guards of {others} other cached graph{'s' * (others > 1)})" if others else ""
    )


def _record(seconds: float, cause: str | None, frames: tuple[PythonFrame, ...], inputs: int) -> None:
    global _count, _seconds
    with _lock:
        _count += 1
        _seconds += seconds
        _records.append(
            CompileRecord(
                cause=cause or "first graph of this code",
                graph_hash=None,
                graph_name=None,
                graph_inputs=inputs,
                graph_outputs=None,
                frames=frames,
                frames_truncated=False,
                computation_hash=None,
                memory=None,
                compiler=COMPILER,
            )
        )


def reader() -> DynamoCompileReader:
    """A reader of the graphs compiled from now on."""
    return DynamoCompileReader()


class DynamoCompileReader:
    """`records()` read as they grow, with `workbench.backend.xla.compile_log.CompileLogReader`'s interface:
    `new_records()` gives the graphs compiled since the last call (or `skip`)."""

    path = COMPILER
    """Never None: the record is always on (the profiler reads None as a log that is off)."""

    def __init__(self) -> None:
        self._offset = len(_records)

    def new_records(self) -> list[CompileRecord]:
        """Graphs compiled since the last call (or since `skip`)."""
        found = _records[self._offset :]
        self._offset += len(found)
        return found

    def skip(self) -> None:
        """Forget what was compiled up to now (e.g. warm-up's graphs)."""
        self._offset = len(_records)
