"""What the run executes on: the execution backend protocol (`protocol`: `Backend`, `Replicas`) and its
rooms (`selection.backend_for` picks one), `xla` (torch_xla's SPMD; `xla.runtime` is the one module that imports
torch_xla, with `xla.tpu_attention` beside it), `native` (plain torch on the CPU and CUDA, torchrun's
process group) and `torchtpu` (TPU-only); hardware detection (`hardware`), which backend a run takes
and why (`routing`), the machines a config can be planned for (`targets`) and multi-host processes
(`multihost`).

The bottom layer: it uses only `workbench.units` and `workbench.config` of the rest of the workbench.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

_MOVED = {
    "runtime": "workbench.backend.xla.runtime",
    "compile_log": "workbench.backend.xla.compile_log",
    "tpu_attention": "workbench.backend.xla.tpu_attention",
    "scan_support": "workbench.backend.xla.scan_support",
    "dynamo_compiles": "workbench.backend.native.dynamo_compiles",
    "process_group": "workbench.backend.native.process_group",
}
"""Modules that moved into a backend's room, by their old name here: a notebook saved from an earlier
version (``from workbench.backend import runtime``) keeps working, with a warning naming the new path."""


def __getattr__(name: str) -> ModuleType:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"workbench.backend.{name} moved to {_MOVED[name]}: import it from there",
        DeprecationWarning,
        stacklevel=2,
    )
    return importlib.import_module(_MOVED[name])
