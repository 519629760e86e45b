"""The XLA compiler's own memory figure for a training step, beside which the estimate is checked.

What a compiled program needs per device (inputs + non-aliased outputs + temporaries) is read
from torch_xla's compile log (`compile_log.enable_compile_log`,
`compile_log.compiled_memory_records`), so the log must be on before the first compile.

- `compiled_step_probe`: for a batch size, compile (not run) one training step of a fresh
  model and return its peak, or None when the log is off: the `compiled_bytes` probe with
  which `workbench.analysis.batch.find_batch_size` confirms its choice.

Both build the model as a run of the `ModelConfig` would (`step_model`): its ``attention`` kernel
('auto' resolved for this XLA device and the rows' length, as the trainer resolves it) and its
``scan_layers``; a quantized base (``quantize``) trains only under LoRA, which these full
fine-tuning steps are not, so it is refused rather than measured as something else.
- `compiled_step_memory`: run real training steps (optionally FSDP-sharded) and return the
  largest step program's analysis (`CompiledStepMemory`); ``bench/memory.py`` sets it beside
  `workbench.analysis.estimate.estimate`.
- `compiled_program_memory`: the analysis of whatever step a caller traces (`trace` returns the
  tensors the step program produces), compiled only or run. The trainer's own step (LoRA,
  quantized base, chunked loss: `workbench.train`, a layer above this one) is traced by its
  callers: tests/xla/memory_quantized.py, ``bench/memory.py``, ``bench/memory_real.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.analysis.state_bytes import OPTIMIZERS

# ---- the compiler's figure ---------------------------------------------------------------


def compiled_step_probe(
    cfg: Any, *, seq_len: int, gradient_checkpointing: bool = False, optimizer: str = "adamw", seed: int = 0
) -> Callable[[int], int | None]:
    """A `compiled_bytes` probe for `find_batch_size`: for a batch size, trace one training step of
    a fresh model of `cfg` (a workbench `ModelConfig`, built by `step_model`: its attention kernel
    and scan as a run would) and compile it without running it (``runtime.compile_only``), then
    return the compiler's per-device peak for that program.

    Returns None for every size when the compile memory log is off (the backend reports nothing).
    The probe holds a second copy of the weights on the device while it compiles: for models
    that fill the chip, pass a probe that traces the real model instead.
    """

    seen: dict[int, int | None] = {}  # a second compile of the same program hits the cache and logs nothing

    def probe(batch_size: int) -> int | None:
        if batch_size in seen:
            return seen[batch_size]
        import torch

        from workbench.backend.xla import compile_log, runtime
        from workbench.models.inputs import model_inputs

        if compile_log.compile_memory_log_path() is None:
            return None
        before = len(compile_log.compiled_memory_records())
        dev = runtime.device()
        model = step_model(cfg, seq_len=seq_len, gradient_checkpointing=gradient_checkpointing, seed=seed)
        model = model.to(dev)
        model.tie_weights()
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        ids = torch.zeros((batch_size, seq_len), dtype=torch.long, device=dev)
        loss = model(**model_inputs({"input_ids": ids}, model), labels=ids).loss  # no host read
        loss.backward()
        if optimizer == "adamw":
            # the steady-state step: moments exist, as after the first real step
            opt = torch.optim.AdamW(params, lr=1e-3)
            for p in params:
                opt.state[p] = {
                    "step": torch.tensor(1.0),
                    "exp_avg": torch.zeros_like(p),
                    "exp_avg_sq": torch.zeros_like(p),
                }
            opt.step()
            outputs = [
                loss,
                *params,
                *(t for p in params for t in (opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"])),
            ]
        else:
            outputs = [loss, *params, *(p.grad for p in params)]
        runtime.compile_only(outputs)
        records = compile_log.compiled_memory_records()[before:]
        seen[batch_size] = max(r.peak_bytes for r in records) if records else None
        return seen[batch_size]

    return probe


def step_model(cfg: Any, *, seq_len: int, gradient_checkpointing: bool = False, seed: int = 0) -> Any:
    """The model a full fine-tuning run of `cfg` (a workbench `ModelConfig`) trains on this XLA device,
    on the host: built (`build_model`), with the kernel ``cfg.attention`` resolves to for rows of
    `seq_len` tokens (as the trainer's `choose_attention` does; an explicit kernel that cannot run
    here raises ValueError naming ``model.attention``), the decoder stack scanned where
    ``cfg.scan_layers`` says so (`choose_scan`; the scan's rematerialisation is then the gradient
    checkpointing), else `gradient_checkpointing` per layer. ``cfg.quantize`` other than 'none'
    raises ValueError: a quantized base trains only under LoRA (trace the trainer's step with
    `compiled_program_memory` for that, as tests/xla/memory_quantized.py does)."""
    from workbench.backend.xla import runtime
    from workbench.models.attention_choice import (
        has_attention_dropout,
        has_softcap,
        resolve_attention,
        use_attention,
    )
    from workbench.models.build import build_model, enable_gradient_checkpointing
    from workbench.models.scan import choose_scan, install_scan

    if getattr(cfg, "quantize", "none") != "none":
        raise ValueError(
            f"model.quantize={cfg.quantize!r} is not allowed here: these probes measure a full fine-tuning "
            "step, and a quantized base trains only under LoRA; use model.quantize=none, or trace the "
            "trainer's LoRA step with compiled_program_memory"
        )
    model = build_model(cfg, seed=seed)
    kernel, _ = resolve_attention(
        getattr(cfg, "attention", "eager"),
        device_type="xla",
        is_tpu=runtime.runtime_summary().device_type == "TPU",
        seq_len=seq_len,
        softcap=has_softcap(model),
        dropout=has_attention_dropout(model),
    )
    use_attention(model, kernel)
    scan, _ = choose_scan(model, getattr(cfg, "scan_layers", False), xla=True)
    if scan:
        install_scan(model, remat=gradient_checkpointing)
    elif gradient_checkpointing:
        enable_gradient_checkpointing(model, xla=True)
    return model


@dataclass(frozen=True)
class CompiledStepMemory:
    """The compiler's memory analysis of a real training step, next to the estimate."""

    peak_bytes: int
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    programs: int
    """Programs compiled for the measured steps (the steady-state step is the largest)."""


def compiled_step_memory(
    cfg: Any,
    *,
    batch_size: int,
    seq_len: int,
    gradient_checkpointing: bool = False,
    fsdp: int = 1,
    optimizer: str = "adamw",
    precision: str = "fp32",
    steps: int = 2,
    seed: int = 0,
) -> CompiledStepMemory:
    """Build the model of `cfg` (a workbench `ModelConfig`, by `step_model`: the attention kernel
    ``cfg.attention`` names, 'auto' resolved for this device and `seq_len`, and ``cfg.scan_layers``),
    run `steps` real training steps on the XLA device and return the compiler's analysis of the
    largest compiled step program.

    Needs the compile memory log (`compile_log.enable_compile_log`) on before the first compile;
    `fsdp` > 1 needs SPMD on (``runtime.use_spmd()`` before any XLA tensor) and shards every
    parameter's first dimension and the batch over an ``("fsdp",)`` mesh of that many devices.
    Precision is XLA:CPU's native fp32 unless `precision='bf16'` (weights cast to bf16).
    """
    import torch

    from workbench.backend.xla import compile_log, runtime
    from workbench.models.inputs import model_inputs

    if precision not in ("fp32", "bf16"):
        raise ValueError(
            f"precision={precision!r} is not allowed here: 'fp32' or 'bf16' (XLA:CPU has no autocast check)"
        )
    if compile_log.compile_memory_log_path() is None:
        raise RuntimeError(
            "compiled_step_memory needs compile_log.enable_compile_log(path) before the first compile"
        )
    before = len(compile_log.compiled_memory_records())
    dev = runtime.device()
    model = step_model(cfg, seq_len=seq_len, gradient_checkpointing=gradient_checkpointing, seed=seed)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    model = model.to(dev)
    # moving to an XLA device unties tied weights (new Parameters per module): tie them again
    model.tie_weights()
    model.train()
    mesh = None
    if fsdp > 1:
        mesh = runtime.spmd_mesh(list(range(fsdp)), (fsdp,), ("fsdp",))
        for p in model.parameters():
            runtime.mark_sharding(p, mesh, ("fsdp",) + (None,) * (p.dim() - 1))
    if optimizer == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    elif optimizer == "adafactor":
        opt = torch.optim.Adafactor(model.parameters(), lr=1e-3)
    else:
        raise ValueError(f"optimizer={optimizer!r} is not allowed: one of {', '.join(map(repr, OPTIMIZERS))}")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch_size, seq_len), generator=gen).to(dev)
    if mesh is not None:
        runtime.mark_sharding(ids, mesh, ("fsdp", None))
    for _ in range(steps):
        loss = model(**model_inputs({"input_ids": ids}, model), labels=ids).loss  # no host read
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        runtime.sync()
    runtime.wait_device_ops()
    records = compile_log.compiled_memory_records()[before:]
    if not records:
        raise RuntimeError(
            "no compiled program was logged: was the compile memory log enabled before the first compile?"
        )
    return _largest(records)


def compiled_program_memory(
    trace: Callable[[], Sequence[Any]], *, execute: bool = False
) -> CompiledStepMemory:
    """The compiler's analysis of the step `trace` builds: `trace()` records one step's work on the
    XLA device (forward, backward, optimizer update) and returns the tensors its program must
    produce (the loss, the updated trainable weights and optimizer state, running sums: what the
    training loop's sync would materialise). They are compiled without running
    (``runtime.compile_only``: no device memory beyond the arguments already placed, so shapes
    too large to run here still compile), or, with `execute`, synced and run.

    Returns the largest program compiled while tracing and compiling (``programs``: how many
    were); needs the compile memory log on before the first compile. A program already compiled
    in this process (same graph) compiles nothing and is an error here: trace a fresh shape.
    A program compiled only donates no buffers (``alias_bytes`` 0), so the updated trainable
    weights and optimizer state count beside their inputs: a LoRA step's adapters and moments,
    measured 1% above the executed program's peak on a small LoRA step.
    """
    from workbench.backend.xla import compile_log, runtime

    if compile_log.compile_memory_log_path() is None:
        raise RuntimeError(
            "compiled_program_memory needs compile_log.enable_compile_log(path) before the first compile"
        )
    before = len(compile_log.compiled_memory_records())
    outputs = list(trace())
    if execute:
        runtime.sync()
        runtime.wait_device_ops()
    else:
        runtime.compile_only(outputs)
    records = compile_log.compiled_memory_records()[before:]
    if not records:
        raise RuntimeError(
            "no program was compiled: this step's graph was compiled earlier in the process (cache hit)"
        )
    return _largest(records)


def _largest(records: Sequence[Any]) -> CompiledStepMemory:
    """The largest of the compiled programs' analyses (the step), with how many there were."""
    biggest = max(records, key=lambda r: r.peak_bytes)
    return CompiledStepMemory(
        peak_bytes=biggest.peak_bytes,
        argument_bytes=biggest.argument_bytes,
        output_bytes=biggest.output_bytes,
        alias_bytes=biggest.alias_bytes,
        temp_bytes=biggest.temp_bytes,
        programs=len(records),
    )
