"""What a compile was: one record type for both compilers the workbench counts.

torch_xla's compile log (`workbench.backend.xla.compile_log`) and Dynamo's graphs on plain torch
(`workbench.backend.native.dynamo_compiles`) are read into the same `CompileRecord`, so the
recompile forensics (`workbench.analysis.recompiles`) explain either with its cause and file:line.
"""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class PythonFrame:
    """One Python frame of the stack that triggered a compile, as torch_xla printed it."""

    function: str
    """The code object's name (``train_step``, ``<module>``), not its qualified name."""
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


@dataclass(frozen=True)
class CompileRecord:
    """One compiled program, read from torch_xla's own analysis of it."""

    cause: str | None
    """torch_xla's "Compilation Cause" (e.g. ``user torch_xla.sync``, ``most likely user code
    trying to access tensor value before torch_xla.sync``); None when it wrote no analysis
    (a compile with no Python frame, e.g. from autograd's thread)."""
    graph_hash: str | None
    graph_name: str | None
    graph_inputs: int | None
    graph_outputs: int | None
    frames: tuple[PythonFrame, ...]
    """The Python stack that triggered the compile, innermost first."""
    frames_truncated: bool
    """torch_xla stopped listing frames at ``PT_XLA_DEBUG_MAX_FRAME``."""
    computation_hash: str | None
    memory: CompiledMemory | None
    """The post-compilation memory analysis; None if torch_xla wrote none (a failed compile)."""
    compiler: str = "torch_xla"
    """Who compiled it: 'torch_xla' (this log), or 'dynamo' (a torch.compile graph on plain torch,
    recorded by `workbench.backend.native.dynamo_compiles`)."""
