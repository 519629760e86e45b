"""Recompile forensics: why a program was compiled after warm-up, in one line.

Two facts are joined. The inputs: the debug output does not list input shapes, so each step's
input signature (name -> shape, dtype of every batch tensor, read from tensor metadata on the
host, never from the device) is kept, and a step that compiled is diffed against the closest
signature of the programs already compiled (the steps before it): which inputs changed shape
or dtype. The place: torch_xla's own compilation analysis (`workbench.backend.xla.compile_log`)
lists the Python frames that triggered each compile (on plain torch, a compiled native step's
graphs are recorded with the stack and Dynamo's guard-failure reason by
`workbench.backend.native.dynamo_compiles`); the first frame in user or workbench code
(not torch, torch_xla, transformers, the standard library or the runtime seam) is named.

`RecompileTracker` does the bookkeeping for `workbench.analysis.profiler.StepProfiler`; each
`Recompile.describe()` is one line of `IntervalMetrics["recompile_causes"]`, e.g.
``step 12: input_ids, labels (8, 64) → (8, 96) int64; compiled at workbench/train/step.py:194 (train_step)``.
Everything here is pure: no torch_xla, no device.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.backend.compile_records import CompileRecord, PythonFrame

TensorSpec = tuple[tuple[int, ...], str]
"""(shape, dtype name) of one input tensor."""

SYNC_CAUSE = "torch_xla.sync"
"""Compiles whose torch_xla cause mentions this came from a step's sync: the expected kind."""


# ---- input signatures --------------------------------------------------------------------------


@dataclass(frozen=True)
class InputSignature:
    """Name -> (shape, dtype) of the tensors of one batch, sorted by name."""

    specs: tuple[tuple[str, tuple[int, ...], str], ...]

    @classmethod
    def of(cls, batch: Mapping[str, Any]) -> InputSignature:
        """The signature of a batch dict; values without ``.shape`` and ``.dtype`` are not inputs."""
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"inputs must be a dict of tensors (or a list of them), got {type(batch).__name__}"
            )
        specs = []
        for name, value in batch.items():
            shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
            if shape is not None and dtype is not None:  # shape and dtype are host-side metadata
                specs.append((str(name), tuple(int(d) for d in shape), dtype_name(dtype)))
        return cls(tuple(sorted(specs)))

    def as_dict(self) -> dict[str, TensorSpec]:
        return {name: (shape, dtype) for name, shape, dtype in self.specs}

    def __str__(self) -> str:
        return ", ".join(f"{name} {format_shape(shape)} {dtype}" for name, shape, dtype in self.specs)


def input_signatures(
    inputs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
) -> tuple[InputSignature, ...]:
    """Signatures of one step's batches: a batch dict, or a sequence of them (accumulation); () for None."""
    if inputs is None:
        return ()
    if isinstance(inputs, Mapping):
        return (InputSignature.of(inputs),)
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Iterable):
        raise TypeError(
            f"inputs={type(inputs).__name__} is not allowed: a dict of tensors, a sequence of them, or None"
        )
    return tuple(dict.fromkeys(InputSignature.of(batch) for batch in inputs))


def dtype_name(dtype: Any) -> str:
    """``torch.int64`` -> ``int64``."""
    return str(dtype).removeprefix("torch.")


def format_shape(shape: Sequence[int]) -> str:
    """``(8, 64)``; a 1-d shape as ``(8,)``; a scalar as ``()``."""
    return str(tuple(shape))


# ---- what changed ------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputChange:
    """One input whose shape or dtype differs from the closest program already compiled."""

    name: str
    before: TensorSpec | None
    """None: the input is new."""
    after: TensorSpec | None
    """None: the input is gone."""

    def change(self) -> str:
        """The change without the name: ``(4, 32) → (4, 48) int64``."""
        if self.before is None:
            return f"new {_spec(self.after)}"
        if self.after is None:
            return f"gone (was {_spec(self.before)})"
        (old_shape, old_dtype), (new_shape, new_dtype) = self.before, self.after
        if old_dtype == new_dtype:
            return f"{format_shape(old_shape)} → {format_shape(new_shape)} {new_dtype}"
        if old_shape == new_shape:
            return f"{format_shape(new_shape)} {old_dtype} → {new_dtype}"
        return f"{_spec(self.before)} → {_spec(self.after)}"

    def __str__(self) -> str:
        return f"{self.name} {self.change()}"


def _spec(spec: TensorSpec | None) -> str:
    assert spec is not None
    return f"{format_shape(spec[0])} {spec[1]}"


def signature_changes(new: InputSignature, old: InputSignature) -> tuple[InputChange, ...]:
    """Inputs of `new` whose shape or dtype differ from `old`'s, by name (new and gone ones too)."""
    before, after = old.as_dict(), new.as_dict()
    return tuple(
        InputChange(name, before.get(name), after.get(name))
        for name in sorted(before.keys() | after.keys())
        if before.get(name) != after.get(name)
    )


def closest_changes(new: InputSignature, known: Sequence[InputSignature]) -> tuple[InputChange, ...] | None:
    """The changes against the closest of `known`, or None when nothing is known to compare with.

    Closest: the fewest changed inputs, then the smallest change in dimensions (so a dtype-only
    change beats a length change), then the latest seen.
    """
    best: tuple[tuple[int, int], tuple[InputChange, ...]] | None = None
    for old in reversed(known):
        changes = signature_changes(new, old)
        distance = (len(changes), sum(_dims_moved(c) for c in changes))
        if best is None or distance < best[0]:
            best = (distance, changes)
    return best[1] if best is not None else None


def _dims_moved(change: InputChange) -> int:
    before = change.before[0] if change.before is not None else ()
    after = change.after[0] if change.after is not None else ()
    if len(before) != len(after):
        return sum(before) + sum(after)
    return sum(abs(a - b) for a, b in zip(before, after))


def describe_changes(changes: Sequence[InputChange]) -> str:
    """Changes as one phrase; inputs that changed alike share it: ``input_ids, labels (4, 32) → (4, 48) int64``."""
    groups: dict[str, list[str]] = {}
    for change in changes:
        groups.setdefault(change.change(), []).append(change.name)
    return ", ".join(f"{', '.join(names)} {what}" for what, names in groups.items())


# ---- which frame ------------------------------------------------------------------------------

_LIBRARY_DIRS = tuple(
    os.path.realpath(p) + os.sep
    for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)
_BACKEND_DIR = os.sep + os.path.join("workbench", "backend") + os.sep
"""The execution backends (the torch_xla seam, the `Backend` implementations): they run a step, its
caller chose when."""
_WORKBENCH_DIR = os.sep + "workbench" + os.sep


def is_library_frame(frame: PythonFrame) -> bool:
    """Frames of installed packages (torch, torch_xla, transformers, ...), the standard library,
    Python's own (``<frozen ...>``) and the execution backends' step boundaries: never the cause to name."""
    file = frame.file
    if file.startswith("<") or _BACKEND_DIR in file:
        return True
    if _WORKBENCH_DIR in file:  # the workbench's own frames name its code, installed or not
        return False
    return os.sep + "site-packages" + os.sep in file or os.path.realpath(file).startswith(_LIBRARY_DIRS)


_SYNC_WRAPPERS = frozenset({"sync", "mark_step", "step_boundary"})
"""Functions that only sync (``StepEngine.sync``, torch_xla's own): their caller chose when to compile."""


def trigger_frame(frames: Sequence[PythonFrame]) -> PythonFrame | None:
    """The innermost frame in user or workbench code that is not a sync wrapper, else the
    innermost frame in such code, else the innermost frame, else None."""
    own = [f for f in frames if not is_library_frame(f)]
    for frame in own:
        if frame.function not in _SYNC_WRAPPERS:
            return frame
    return own[0] if own else (frames[0] if frames else None)


def display_path(file: str, root: str | None = None) -> str:
    """`file` relative to `root` (default: the working directory) when inside it, else after
    ``site-packages/`` when installed, else as given."""
    root = os.path.realpath(root or os.getcwd())
    real = os.path.realpath(file) if not file.startswith("<") else file
    if real.startswith(root + os.sep):
        return os.path.relpath(real, root)
    marker = os.sep + "site-packages" + os.sep
    return file.split(marker, 1)[1] if marker in file else file


def frame_text(frame: PythonFrame) -> str:
    """``workbench/train/step.py:194 (train_step)``."""
    return f"{display_path(frame.file)}:{frame.line} ({frame.function})"


# ---- one recompilation -----------------------------------------------------------------------


@dataclass(frozen=True)
class Recompile:
    """A step that compiled after warm-up, with what is known of why."""

    step: int
    programs: int
    """Programs compiled at this step (torch_xla's compile counter; torch.compile's graphs on plain torch)."""
    changes: tuple[InputChange, ...] | None
    """Inputs that changed shape or dtype against the closest compiled program; () when none did;
    None when unknown (no inputs given, or no earlier step to compare with)."""
    signatures: tuple[InputSignature, ...]
    """This step's input signatures (empty when no inputs were given)."""
    records: tuple[CompileRecord, ...]
    """torch_xla's analyses of the programs compiled at this step (empty when the log is off), or the
    records of the torch.compile graphs (`workbench.backend.native.dynamo_compiles`)."""
    log_on: bool

    @property
    def frames(self) -> tuple[PythonFrame, ...]:
        """The triggering frame of each program compiled here, without repeats."""
        found = (trigger_frame(r.frames) for r in self.records)
        return tuple(dict.fromkeys(f for f in found if f is not None))

    @property
    def frame(self) -> PythonFrame | None:
        """The frame that triggered the (first) compile at this step."""
        frames = self.frames
        return frames[0] if frames else None

    def describe(self) -> str:
        """One line: ``step 12: input_ids (8, 64) → (8, 96) int64; compiled at workbench/train/step.py:194 (train_step)``."""
        return f"step {self.step}: {self._what()}; {self._where()}"

    def _what(self) -> str:
        if self.changes:
            return describe_changes(self.changes)
        if self.changes is not None:
            return "no input changed shape or dtype (the graph itself changed: a Python value or branch in the step)"
        if not self.signatures:
            return "input shapes not recorded (pass inputs= to StepProfiler.step)"
        return f"first step seen, inputs {'; '.join(map(str, self.signatures))}"

    def _where(self) -> str:
        count = f"{self.programs} programs " if self.programs > 1 else ""
        if not self.log_on:
            return (
                f"{count}compiled at an unknown frame (compile log off: compile_log.enable_compile_log "
                "before the first compile)"
            )
        frames = self.frames
        if not frames:
            return (
                f"{count}compiled with no frame in torch_xla's compile log (it names none for a compile "
                "without a Python frame, and writes none off the first local process)"
            )
        causes = {(r.compiler, r.cause) for r in self.records if r.cause and SYNC_CAUSE not in r.cause}
        why = "; ".join(f"{compiler}: {cause}" for compiler, cause in sorted(causes))
        why = f" ({why})" if why else ""
        return f"{count}compiled at {', '.join(map(frame_text, frames))}{why}"


class RecompileTracker:
    """The input signatures of the programs compiled so far, and the recompilations found.

    `observe` is called once per step with that step's signatures and the compiles it saw;
    the signatures of every step, compiled or not, count as compiled programs afterwards.
    """

    def __init__(self) -> None:
        self.known: list[InputSignature] = []
        self._known_set: set[InputSignature] = set()
        self.recompiles: list[Recompile] = []

    def remember(self, signatures: Iterable[InputSignature]) -> None:
        """`signatures` ran with a compiled program (warm-up, or a step that did not compile)."""
        for signature in signatures:
            if signature not in self._known_set:
                self._known_set.add(signature)
                self.known.append(signature)

    def observe(
        self,
        step: int,
        signatures: Sequence[InputSignature],
        programs: int,
        records: Sequence[CompileRecord] = (),
        *,
        log_on: bool = True,
    ) -> Recompile:
        """Record a step that compiled `programs` programs after warm-up; returns its `Recompile`."""
        fresh = [s for s in signatures if s not in self._known_set]
        if not signatures or (fresh and not self.known):
            changes = None
        else:
            changes = tuple(dict.fromkeys(c for s in fresh for c in closest_changes(s, self.known) or ()))
        recompile = Recompile(step, programs, changes, tuple(signatures), tuple(records), log_on)
        self.recompiles.append(recompile)
        self.remember(signatures)
        return recompile
