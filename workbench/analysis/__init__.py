"""Before and during a run: memory estimates and batch search, FLOPs and MFU, the step profiler.

Before: `shape` (a model's sizes), `estimate` (memory of one step), `batch` (the largest batch that fits), `probe` (the
compiler's own figure), `tables`. During: `flops` (FLOPs, MFU), `profiler` (`StepProfiler`,
advice), `metrics` (the metrics contract), `trace` (profiler traces).
"""

from workbench.analysis.batch import find_batch_size, max_batch_size
from workbench.analysis.estimate import MemoryEstimate, estimate
from workbench.analysis.profiler import Advice, StepProfiler
from workbench.analysis.shape import ModelShape, model_shape
from workbench.analysis.tables import estimate_table, fit_across_targets, format_table

__all__ = [
    "Advice",
    "MemoryEstimate",
    "ModelShape",
    "StepProfiler",
    "estimate",
    "estimate_table",
    "find_batch_size",
    "fit_across_targets",
    "format_table",
    "max_batch_size",
    "model_shape",
]
