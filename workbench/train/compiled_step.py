"""The compiled native step: ``train.compile`` on plain torch (CPU, CUDA, one process or torchrun).

`compiled_forward` decides whether the training step's forward and loss go through
``torch.compile(dynamic=False)`` and builds the `CompiledForward` the step engine calls in place
of ``objective(model, batch)`` (under torchrun: of the DDP/FSDP2-wrapped `ObjectiveStep`). Backward,
clipping and the optimizer stay eager (on CUDA the optimizer is fused AdamW, `workbench.train.optim`).

- **Bounded graphs.** Shapes are static (``dynamic=False``: every dimension, the batch's rows and
  length included, is specialised), so there is one graph per batch shape, as there is one XLA
  program per shape; the trainer's warm-up runs every shape the samplers can emit before the first
  step (`workbench.train.warmup`), so graphs compiled = bucket shapes and none after warm-up.
  Dynamo's per-function cache limit is raised to cover them (past it Dynamo silently runs eager).
  Under DDP, Dynamo's DDP optimizer splits each shape's graph at the gradient buckets, and under
  FSDP2 at its hooks: several graphs per shape there, still bounded by the shapes.
- **Forensics.** The graphs are compiled through `workbench.backend.native.dynamo_compiles.counting_backend`,
  which counts them and records each one's cause (Dynamo's guard-failure reason) and stack, so the
  profiler explains a compile after warm-up as it does an XLA one (``recompile_causes``).
- **The rule for 'auto'**: on with CUDA, off on the CPU. Measured on a 2-core CPU host
  (`bench/compile_native.py`, inductor, cold caches; docs/explanation/measurements.md): the
  quickstart (2 layers, 4 bucket shapes) compiled in 66 s for 1.46x the eager tokens/s, which pays
  back after about 7,200 steps (it runs 30); SmolLM2-135M (one shape, 256 tokens a step) compiled in
  86 s for 1.09x, back after about 90 steps: a model of that size spends its CPU step in matmuls,
  the same kernels compiled or not. A CPU run long enough to pay sets 'on'. On CUDA the eager step
  launches a kernel per elementwise op, which the compiled graph fuses around the matmuls, and the
  eager native step ran 12-16% behind `transformers.Trainer` (issue #38); the compiled step has not
  yet been timed on a GPU (`bench/cuda.py` runs it, 'auto', beside Trainer).
- **Not compiled**: XLA (it compiles every step anyway; 'on' is noted once and ignored), GRPO (its
  rollouts have a step of their own, `workbench.rl`), the eval forward (run eagerly; it is outside
  the throughput clock).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from workbench.backend.native import dynamo_compiles
from workbench.backend.protocol import Backend
from workbench.backend.routing import compile_backend

BACKEND: str | None = None
"""The torch.compile backend of the compiled step where set; None: the run's own
(`workbench.backend.routing.compile_backend`: inductor, 'tpu' on TorchTPU). The tests set 'aot_eager':
the same graphs and guards without inductor's C++ build of each CPU graph, 17-86 s a shape on a 2-core host."""

MIN_CACHED_GRAPHS = 64
"""Graphs per compiled function Dynamo keeps before falling back to eager (its default is 8): bucket
shapes times the batch sizes dynamic growth reaches; warm-up raises it further when it sees more."""


def compile_wanted(
    setting: str, *, backend: Backend, eager_reason: str | None = None
) -> tuple[bool, list[str]]:
    """Whether ``train.compile`` = `setting` compiles the step on `backend`, and the notices saying why not
    where the user asked for it ('on'). A backend that compiles every shape (torch_xla) has nothing
    to gain from it; an objective whose step runs eagerly says why (`eager_reason`,
    `workbench.train.objective_run.ObjectiveRun.eager_reason`)."""
    if backend.compiles_every_shape:
        notices = ["train.compile: on is not read on XLA, which compiles every step already"] * (
            setting == "on"
        )
        return False, notices
    if setting == "off":
        return False, []
    if eager_reason is not None:
        return False, [f"train.compile: on {eager_reason}; it runs eager"] * (setting == "on")
    if setting == "on":
        return True, []
    return torch.device(backend.device()).type == "cuda", []


class CompiledForward:
    """``torch.compile`` of the training forward: `model` through `objective` (``objective(model,
    batch)``) or, under torchrun, the wrapped step module (``step(batch)``), one static graph per
    batch shape, counted by `workbench.backend.native.dynamo_compiles`."""

    def __init__(
        self, model: torch.nn.Module, objective: torch.nn.Module, *, compiler: str, wrapped: Any = None
    ) -> None:
        import torch._dynamo

        self.model = model
        self.wrapped = wrapped is not None
        self.backend = compiler
        self.expect_graphs(0)
        backend = dynamo_compiles.counting_backend(compiler, wrappers=(__file__,))
        self._compiled = torch.compile(wrapped if self.wrapped else objective, backend=backend, dynamic=False)

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        if self.wrapped:
            return self._compiled(batch)
        return self._compiled(self.model, batch)

    @staticmethod
    def expect_graphs(count: int) -> None:
        """Let Dynamo keep `count` graphs per function (and at least `MIN_CACHED_GRAPHS`)."""
        config = torch._dynamo.config
        needed = max(MIN_CACHED_GRAPHS, 2 * count)
        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(config, name):
                setattr(config, name, max(int(getattr(config, name)), needed))


def compiled_forward(
    setting: str,
    model: torch.nn.Module,
    objective: torch.nn.Module,
    *,
    backend: Backend,
    eager_reason: str | None = None,
    wrapped: Any = None,
) -> tuple[CompiledForward | None, list[str]]:
    """The run's `CompiledForward` when ``train.compile`` = `setting` compiles on `backend`
    (`compile_wanted`; `eager_reason`: why the objective's step never compiles), else None; with its
    notices, warned once here (the trainer's result lists them). `wrapped`: the data-parallel wrapper to
    compile in place of `objective` (under torchrun)."""
    wanted, notices = compile_wanted(setting, backend=backend, eager_reason=eager_reason)
    compiler = BACKEND or compile_backend(backend.hw)
    step = CompiledForward(model, objective, compiler=compiler, wrapped=wrapped) if wanted else None
    if step is not None:
        notices.append(
            f"train.compile {setting}: the step's forward and loss run through torch.compile ({step.backend}, "
            "static shapes), one graph per batch shape, compiled in warm-up (train.prewarm)"
        )
    for message in notices:  # said once, now; the run's result lists them too
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    return step, notices
