"""torch_xla's compile log: what each compiled program needs in memory, read from its own analysis.

torch_xla writes a "Post Compilation Analysis" per compiled program when ``PT_XLA_DEBUG_LEVEL``
is at least 1 and ``PT_XLA_DEBUG_FILE`` names a file. Both are read once, at the first compile
or execution, so they are set before any XLA work (`enable_compile_memory_log`). This module only
reads text: it never imports torch_xla.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from workbench.backend import runtime


@dataclass(frozen=True)
class CompiledMemory:
    """The XLA compiler's memory analysis of one compiled program (per device under SPMD).

    Read from torch_xla's "Post Compilation Analysis", which prints the executable's
    ``CompiledMemoryStats`` in GiB with six decimals: each field is exact to about 1 KiB.
    """

    argument_bytes: int
    """Graph inputs (parameters, optimizer state, batch) the program reads."""
    output_bytes: int
    """Graph outputs."""
    alias_bytes: int
    """Outputs written in place over inputs (donated buffers: updated parameters and state)."""
    temp_bytes: int
    """Intermediate buffers (activations, gradients, temporaries), after XLA's buffer reuse."""
    program_bytes: int
    """Generated code."""

    @property
    def peak_bytes(self) -> int:
        """Device memory the program needs while it runs: inputs + non-aliased outputs + temporaries."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes


_POST_COMPILE_FIELDS = (
    ("argument_bytes", "Graph input size"),
    ("output_bytes", "Graph output size"),
    ("alias_bytes", "Aliased Input size"),
    ("temp_bytes", "Intermediate tensor size"),
    ("program_bytes", "Compiled program size"),
)


def enable_compile_memory_log(path: str | os.PathLike[str]) -> None:
    """Have torch_xla append each compiled program's memory analysis to `path`.

    Sets ``PT_XLA_DEBUG_LEVEL=1`` (compile analyses only, nothing per execution) and
    ``PT_XLA_DEBUG_FILE``. torch_xla reads both once, at its first compile or execution,
    so call this before any XLA work in the process (best: before importing torch_xla).
    """
    if runtime.runtime_started() and runtime.compile_count() > 0 and compile_memory_log_path() is None:
        raise RuntimeError(
            "enable_compile_memory_log() must run before the first XLA compile in this process "
            "(torch_xla reads PT_XLA_DEBUG_LEVEL/PT_XLA_DEBUG_FILE once); set them in the environment instead"
        )
    os.environ["PT_XLA_DEBUG_LEVEL"] = os.environ.get("PT_XLA_DEBUG_LEVEL", "1") or "1"
    os.environ["PT_XLA_DEBUG_FILE"] = str(path)


def compile_memory_log_path() -> str | None:
    """Where compiled-program memory analyses go, or None when the log is off."""
    try:
        level = int(os.environ.get("PT_XLA_DEBUG_LEVEL", "0") or 0)
    except ValueError:
        level = 0
    path = os.environ.get("PT_XLA_DEBUG_FILE")
    return path if level >= 1 and path else None


def compiled_memory_records(path: str | os.PathLike[str] | None = None) -> list[CompiledMemory]:
    """Every compiled program's memory analysis logged so far, oldest first ([] when none)."""
    path = path or compile_memory_log_path()
    if not path or not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    records: list[CompiledMemory] = []
    for block in text.split("Post Compilation Analysis: " + "=" * 80)[1:]:
        values: dict[str, int] = {}
        for name, label in _POST_COMPILE_FIELDS:
            match = re.search(re.escape(label) + r": ([0-9.]+) GB", block)
            if match:
                values[name] = round(float(match.group(1)) * 1024**3)
        if len(values) == len(_POST_COMPILE_FIELDS):
            records.append(CompiledMemory(**values))
    return records
