"""[from train] The training loop: one loop, correct on XLA (TPU, XLA:CPU) and plain on CUDA and CPU.

How a step runs (and why):

- **Loss normalisation.** Each micro-batch contributes the *sum* of its token losses and its
  count of real (label != -100) next-token positions. Gradients of the sums accumulate, and
  before the optimizer step they are scaled by 1 / (real tokens in the whole optimizer step).
  That is the mean over every real token of the effective batch: the same gradient as one
  batch `grad_accum` times larger, however the tokens are spread over the micro-batches
  (averaging per-micro-batch means instead would over-weight short micro-batches). The
  count stays on the device, so nothing waits for the host.
- **Syncs.** With one micro-batch per step, forward, backward and the optimizer update are
  one XLA program per batch shape and one `runtime.sync()`. With accumulation each micro-batch
  is its own program (per shape) and the update a separate one: unrolling the micro-batches
  into one program would compile one program per *combination* of bucket shapes. Gradients
  and the running sums then live in persistent buffers, zeroed inside the update program,
  so every micro-step has the same inputs and compiles once per shape.
- **No hidden syncs.** Loss, token counts and grad norm stay device tensors. Real-token counts
  for throughput are taken on the host from the CPU batch as the loader produces it. At log
  steps, after the step's `sync`, `StepProfiler` reads the loss and the loop the grad norm (two
  device->host transfers per interval, none between). Gradient clipping is `clip_grad_norm_`
  on the device. The progress bar and callbacks move only at log steps.
- **Prewarm.** On XLA, before the first step, every (batch, length) shape the sampler can
  emit (at every batch size dynamic growth will reach, and the eval split's shapes when
  ``eval_every`` is set) goes through the real step on synthetic tokens; the model, optimizer,
  scheduler and RNG are snapshotted to the host first and copied back *into* the live tensors
  after (keeping their sharding), so training continues exactly as it would have without
  prewarm. `TrainResult.compiles_after_warmup` counts what compiled after that (0 on a
  bucketed run). Optimizer state is created up front and, under SPMD, sharded like its
  parameter, so it cannot drift to another layout after a step or a checkpoint load.
- **Precision.** 'bf16-mixed': fp32 weights, bf16 autocast (``torch.autocast("xla")`` on XLA,
  CUDA autocast where the GPU has bf16, CPU autocast on plain CPU, which is correct but on
  CPUs without native bf16 usually slower than fp32). On XLA:CPU bf16 is emulated. Losses and
  the softmax of the loss are computed in fp32. 'bf16': bf16 weights, no autocast.
- **Out of memory.** An OOM during warm-up (or any step on CUDA/CPU, where a failed step leaves
  the weights intact) restores the pre-step state and splits every loaded batch into two
  micro-batches (twice the accumulation): same effective batch, same data order, same math.
- **Dynamic batch.** With ``dynamic_batch_every=N`` the loader's batch grows by
  ``dynamic_batch_factor`` every N steps, up to the smallest of ``dynamic_batch_max``, the memory
  estimate for the device, and the sizes prewarmed at the start (the ladder is planned and
  compiled up front, so growth never compiles mid-run). After a growth the rest of the epoch
  is re-drawn at the new size, skipping as many batches as cover the sequences already seen.
- **Checkpoints.** `CheckpointManager` (atomic, verified): model, optimizer, scheduler, data
  position (epoch, batch index; resuming skips consumed index lists without collating them),
  batch size and split, RNG states and step. Under SPMD, sharded parts go through
  torch.distributed.checkpoint and load in place. Resume is bitwise on plain CPU.
- **Hardware.** ``device_type="auto"`` tries TPU, then CUDA, then XLA:CPU (when PJRT_DEVICE=CPU),
  then CPU; a backend that is present but fails to start is reported in `Trainer.notices`
  (and warned about) before the next one is tried.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.backend import runtime
from workbench.backend.hardware import HardwareInfo, detect
from workbench.config import WorkbenchConfig
from workbench.data.loader import prewarm, synthetic_batch
from workbench.data.records import IGNORE_INDEX
from workbench.models.build import build_model, enable_gradient_checkpointing
from workbench.train.checkpoint import CheckpointManager
from workbench.train.distill import DistillationObjective, DistillSettings
from workbench.train.objective import MODEL_INPUT_KEYS, CausalLMObjective, shift_for_next_token, token_ce_sum
from workbench.train.optim import build_optimizer, init_optimizer_state, warmup_cosine
from workbench.train.state_io import capture_rng, restore_rng
from workbench.train.stream import BatchInfo, HostStream

Callback = Callable[[dict], None]


@dataclass
class TrainResult:
    history: list[dict] = field(default_factory=list)
    """One metrics dict per log interval (the dict callbacks receive)."""
    final_loss: float | None = None
    """Training loss of the last logged step."""
    tokens_per_s: float | None = None
    """Real tokens per second over the timed part of the run (after warm-up)."""
    compiles_after_warmup: int = 0
    """Programs XLA compiled after warm-up (0 when prewarm covered every shape); 0 off XLA."""
    checkpoint_path: str | None = None
    """The last checkpoint written, if any."""
    eval_loss: float | None = None
    """The last eval loss, if an eval ran."""
    steps: int = 0
    """Optimizer steps completed (including those before a resume)."""
    warmup_compiles: int = 0
    """Programs compiled during warm-up (prewarm)."""
    notices: list[str] = field(default_factory=list)
    """What the trainer decided on its own (hardware fallback, OOM retries, batch growth)."""


# ---- hardware ----------------------------------------------------------------------------------


def _is_oom_error(exc: BaseException) -> bool:
    from workbench.train.oom import is_oom_error

    return bool(is_oom_error(exc))


# ---- the trainer ---------------------------------------------------------------------------------


class Trainer:
    """Train `cfg.model` on `cfg.data` (or the given model/datasets) with `cfg.train`.

    `teacher`: a model sharing the student's tokenizer turns the run into knowledge
    distillation (`workbench.distill`), weighted by ``cfg.train.distill_*``.
    `callbacks`: callables receiving the metrics dict every log interval, on the host.
    """

    def __init__(
        self,
        cfg: WorkbenchConfig,
        *,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        callbacks: Sequence[Callback] = (),
        hardware: HardwareInfo | None = None,
        teacher: torch.nn.Module | None = None,
    ) -> None:
        self.cfg = cfg
        self.notices: list[str] = []
        self.callbacks = list(callbacks)
        self.hw = hardware or detect(cfg.train.device_type)
        self.notices.extend(self.hw.notices)
        self._xla = self.hw.via_xla
        self.mesh_spec, self.mesh = None, None
        if self._xla and cfg.mesh.enabled:
            from workbench.parallel.mesh import mesh_from_config

            self.mesh_spec = mesh_from_config(cfg.mesh, self.hw)
            self.mesh = self.mesh_spec.build() if self.mesh_spec is not None else None
        # asked for after the mesh: under SPMD this is the virtual device the whole mesh sits behind
        self.device = runtime.device() if self._xla else torch.device(self.hw.backend)
        self.dp_size = self.mesh_spec.dp_size if self.mesh_spec is not None else 1

        self.train_dataset, self.eval_dataset, self.tokenizer = train_dataset, eval_dataset, tokenizer
        if self.train_dataset is None:
            from workbench.data.records import build_datasets

            self.train_dataset, built_eval, self.tokenizer = build_datasets(cfg, tokenizer)
            if self.eval_dataset is None:
                self.eval_dataset = built_eval
        self.pad_token_id = _pad_id(self.tokenizer)

        train = cfg.train
        if model is None:
            vocab = len(self.tokenizer) if self.tokenizer is not None else None
            model = build_model(cfg.model, vocab_size=vocab, seed=train.seed)
        self.model = model
        if train.precision == "bf16":
            self.model.to(torch.bfloat16)
        if getattr(self.model, "config", None) is not None:
            self.model.config.use_cache = False
        if train.gradient_checkpointing:
            enable_gradient_checkpointing(self.model, xla=self._xla)
        self.sharding_report = self._place(self.model)

        self.teacher = teacher
        if teacher is not None:
            settings = DistillSettings(
                train.distill_alpha, train.distill_temperature, train.distill_hidden_weight
            )
            self.objective: torch.nn.Module = DistillationObjective(teacher, self.model, settings)
            if train.precision == "bf16":
                teacher.to(torch.bfloat16)
            self._place(teacher)
        else:
            self.objective = CausalLMObjective()
        self.objective.to(self.device)
        if self.mesh is not None:
            for p in self.objective.parameters():  # the distillation projection: small, replicated
                runtime.mark_sharding(p, self.mesh, (None,) * p.dim())

        self.optimizer = build_optimizer(self.model, train, extra_params=self.objective.parameters())
        self.scheduler = warmup_cosine(self.optimizer, train)
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]

        # Loop state (all of it goes into checkpoints).
        self.step = 0
        self.tokens_seen = 0
        self.epoch, self.batch_in_epoch, self.sequences_in_epoch = 0, 0, 0
        self.batch_size = train.batch_size
        self.split = 1  # each loaded batch is split into this many micro-batches (OOM retry)
        self.history: list[dict] = []
        self.checkpoint_path: str | None = None
        self.last_eval_loss: float | None = None
        self.checkpoints = (
            CheckpointManager(
                train.checkpoint_dir, keep=train.keep_checkpoints, sharded=self.mesh is not None
            )
            if train.checkpoint_dir
            else None
        )
        self._stream: HostStream | None = None
        self._device_iter: Iterator[dict] | None = None
        self._compiles_at_warm = 0
        self._checkpointed_step: int | None = None
        """The step the last checkpoint saved or loaded holds (no need to save it again)."""
        self._batch_ladder: list[int] = [train.batch_size]

    # ---- setup helpers ----
    def _place(self, module: torch.nn.Module) -> Any:
        if self.mesh is not None:
            from workbench.parallel.apply import shard_model

            return shard_model(module, self.mesh)
        module.to(self.device)
        return None

    @property
    def micro_steps(self) -> int:
        return self.cfg.train.grad_accum * self.split

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.cfg.train.precision != "bf16-mixed":
            return contextlib.nullcontext()
        if self._xla:
            return torch.autocast("xla", dtype=torch.bfloat16)
        if self.hw.backend == "cuda":
            if not torch.cuda.is_bf16_supported():
                return contextlib.nullcontext()  # told once in _check_precision
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", dtype=torch.bfloat16)

    def _loader_for(self, dataset: Any, batch_size: int, *, shuffle_seed: int) -> tuple[Any, Any]:
        from workbench.data.loader import make_loader

        cfg = (
            self.cfg.with_overrides({"train.batch_size": batch_size})
            if batch_size != self.cfg.train.batch_size
            else self.cfg
        )
        return make_loader(
            dataset, cfg, pad_token_id=self.pad_token_id, dp_size=self.dp_size, seed=shuffle_seed
        )

    def _open_stream(self) -> None:
        """(Re)build the host loader at the current batch size and position, and its device loader."""
        self._close_stream()
        self.loader, self.sampler = self._loader_for(
            self.train_dataset, self.batch_size, shuffle_seed=self.cfg.train.seed
        )
        self._stream = HostStream(self.loader, start_epoch=self.epoch, skip=self.batch_in_epoch)
        if self._xla:
            sharding = None
            if self.mesh is not None:
                from workbench.parallel.apply import batch_sharding

                sharding = batch_sharding(self.mesh)
            self._device_loader = runtime.device_loader(self._stream, self.device, batch_sharding=sharding)
            self._device_iter = iter(self._device_loader)
        else:
            non_blocking = self.hw.backend == "cuda"
            self._device_iter = (
                {k: v.to(self.device, non_blocking=non_blocking) for k, v in b.items()} for b in self._stream
            )

    def _close_stream(self) -> None:
        """Stop the device loader's background threads (they would otherwise prefetch forever)."""
        parallel = getattr(
            self._device_iter, "_loader", None
        )  # torch_xla's PerDeviceLoader -> ParallelLoader
        if parallel is not None and hasattr(parallel, "close"):
            with contextlib.suppress(Exception):
                parallel.close()
        self._device_iter = None
        self._device_loader = None

    def _next_batch(self) -> tuple[dict, BatchInfo]:
        assert self._device_iter is not None and self._stream is not None
        batch = next(self._device_iter)
        info = self._stream.infos.popleft()
        return batch, info

    # ---- the step ----
    def _init_optimizer_state(self) -> None:
        """Create the optimizer state now; under SPMD shard each tensor like its parameter."""
        init_optimizer_state(self.optimizer)
        if self.mesh is None:
            return
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                for value in self.optimizer.state[p].values():
                    unannotated = isinstance(value, torch.Tensor) and value.device.type == "xla"
                    if unannotated and value.shape == p.shape and not runtime.sharding_spec(value):
                        runtime.copy_sharding(p, value)

    def _init_buffers(self) -> None:
        """Optimizer state, gradient buffers and running sums exist before the first step (one program per shape)."""
        self._init_optimizer_state()
        with torch.no_grad():
            self._loss_acc = torch.zeros((), dtype=torch.float32, device=self.device)
            self._tokens_acc = torch.zeros((), dtype=torch.float32, device=self.device)
            if self.micro_steps > 1:
                for p in self.params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
            else:
                self.optimizer.zero_grad(set_to_none=True)
        self._sync()

    def _sync(self) -> None:
        if self._xla:
            runtime.sync()

    def _micro_step(self, batch: dict[str, torch.Tensor]) -> None:
        with self._autocast():
            out = self.objective(self.model, batch)
        out["loss_sum"].backward()
        with torch.no_grad():
            self._loss_acc.add_(out["loss_sum"].detach().float())
            self._tokens_acc.add_(out["tokens"].float())

    def _update(self) -> dict[str, torch.Tensor]:
        """Scale accumulated gradients to the token mean, clip, step; returns device tensors to log."""
        with torch.no_grad():
            inv_tokens = 1.0 / self._tokens_acc.clamp(min=1.0)
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(inv_tokens.to(p.grad.dtype))
        grad_norm = None
        if self.cfg.train.max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.train.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        with torch.no_grad():
            loss = self._loss_acc * inv_tokens
            self._loss_acc.zero_()
            self._tokens_acc.zero_()
        self.optimizer.zero_grad(set_to_none=self.micro_steps == 1)
        out = {"loss": loss}
        if grad_norm is not None:
            out["grad_norm"] = grad_norm.detach()
        return out

    def _split_batch(self, batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        if self.split == 1:
            return [batch]
        rows = batch["input_ids"].shape[0]
        if rows % self.split:
            raise ValueError(
                f"cannot split a batch of {rows} rows into {self.split} equal micro-batches after an "
                "out-of-memory retry; use a batch size (or bucketing.tokens_per_batch) divisible by it"
            )
        size = rows // self.split
        return [{k: v[i * size : (i + 1) * size] for k, v in batch.items()} for i in range(self.split)]

    def train_step(self, batches: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """One optimizer step over `batches` (already on the device), with the loop's syncs.

        Public so tests and benchmarks can drive the exact step the loop runs.
        """
        self.model.train()
        self.objective.train()
        micro = [m for b in batches for m in self._split_batch(b)]
        if len(micro) == 1:
            self._micro_step(micro[0])
        else:
            for m in micro:
                self._micro_step(m)
                self._sync()
        out = self._update()
        return out

    # ---- warm-up ----
    def _snapshot(self) -> dict[str, Any]:
        from workbench.train.state_io import flatten_state, host_tensors

        state = {
            "model": self.model.state_dict(),
            "objective": self.objective.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        structure, tensors = flatten_state(state)
        host = host_tensors(tensors)
        # Tensors already on the host (AdamW's step counters) come back as themselves: copy them,
        # or the prewarm steps would advance the "snapshot" too.
        host = {k: (v.clone() if tensors[k].device.type == "cpu" else v) for k, v in host.items()}
        return {
            "structure": structure,
            "tensors": host,
            "scheduler": self.scheduler.state_dict(),
            "lrs": [g["lr"] for g in self.optimizer.param_groups],
            "rng": capture_rng(self._xla),
        }

    def _restore(self, snap: dict[str, Any]) -> None:
        """Copy the snapshot back *into* the live tensors (keeps their device placement and sharding)."""
        from workbench.train.state_io import flatten_state, unflatten_state

        live = {
            "model": self.model.state_dict(),
            "objective": self.objective.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        _, live_tensors = flatten_state(live)
        with torch.no_grad():
            for key, value in snap["tensors"].items():
                live_tensors[key].copy_(value)
        saved = unflatten_state(snap["structure"], snap["tensors"])
        _restore_optimizer_scalars(self.optimizer, saved["optimizer"])
        self.scheduler.load_state_dict(snap["scheduler"])
        for group, lr in zip(self.optimizer.param_groups, snap["lrs"]):
            group["lr"] = lr
        restore_rng(snap["rng"])
        with torch.no_grad():
            self._loss_acc.zero_()
            self._tokens_acc.zero_()
        self.optimizer.zero_grad(set_to_none=self.micro_steps == 1)
        if self.micro_steps > 1:
            with torch.no_grad():
                for p in self.params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
        self._sync()

    def _plan_ladder(self) -> list[int]:
        """Batch sizes the run will use: the start size, grown every N steps, within every cap."""
        train = self.cfg.train
        ladder = [train.batch_size]
        if not train.dynamic_batch_every:
            return ladder
        growths = (train.steps - 1) // train.dynamic_batch_every
        cap = train.dynamic_batch_max
        memory_cap = self._memory_cap()
        if memory_cap is not None:
            cap = memory_cap if cap is None else min(cap, memory_cap)
            if memory_cap < train.batch_size:
                self._notice(
                    f"dynamic batch: the memory estimate allows only {memory_cap} sequences; not growing"
                )
        for _ in range(growths):
            nxt = round(ladder[-1] * train.dynamic_batch_factor)
            nxt -= nxt % self.dp_size
            if nxt <= ladder[-1] or (cap is not None and nxt > cap):
                break
            ladder.append(nxt)
        return ladder

    def _memory_cap(self) -> int | None:
        limit = self.hw.memory_per_device_bytes
        if limit is None:
            return None
        from workbench.analysis.batch import max_batch_size

        kwargs: dict[str, Any] = {
            "optimizer": self.cfg.train.optimizer,
            "precision": self.cfg.train.precision,
            "gradient_checkpointing": self.cfg.train.gradient_checkpointing,
            "mesh": self.mesh_spec,
        }
        try:  # global batch, a multiple of the data-parallel size, at the longest sequence length
            return int(
                max_batch_size(
                    self.model.config,
                    seq_len=self.cfg.data.max_length,
                    memory_bytes=limit,
                    multiple_of=self.dp_size,
                    **kwargs,
                )
            )
        except Exception as err:  # an estimate that cannot be made must not stop training
            self._notice(
                f"dynamic batch: no memory estimate ({err}); growth is capped only by dynamic_batch_max"
            )
            return None

    def _shapes_for(self, batch_size: int, dataset: Any = None) -> list[tuple[int, int]]:
        """Every (batch, length) the loader for `dataset` (default: train) can emit at `batch_size`."""
        dataset = self.train_dataset if dataset is None else dataset
        loader, sampler = self._loader_for(dataset, batch_size, shuffle_seed=self.cfg.train.seed)
        owner = sampler if sampler is not None else getattr(loader, "batch_sampler", None)
        if owner is not None and hasattr(owner, "batch_shapes"):
            return sorted({tuple(s) for s in owner.batch_shapes()})
        return []

    def _warm_up(self) -> int:
        """Compile every step program before training (XLA only); returns programs compiled."""
        before = runtime.compile_count() if self._xla else 0
        if not (self._xla and self.cfg.train.prewarm):
            return 0
        self._batch_ladder = self._plan_ladder()
        template, _ = self._next_batch()  # a real batch: which keys, dtypes and layout a batch has
        self._open_stream()  # put it back: the real stream restarts at the same position
        vocab = int(self.model.get_input_embeddings().weight.shape[0])
        snapshot = self._snapshot()

        def make_batch(shape: tuple[int, int]) -> dict[str, torch.Tensor]:
            fake = synthetic_batch(shape, vocab_size=vocab, pad_token_id=self.pad_token_id, template=template)
            return self._to_device_like_loader(fake)

        def train_step(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return self.train_step([batch] * self.cfg.train.grad_accum)

        while True:
            try:
                for batch_size in self._batch_ladder:
                    shapes = self._shapes_for(batch_size) or [tuple(template["input_ids"].shape[:2])]
                    prewarm(train_step, shapes, make_batch)
                    if self.cfg.train.eval_every and self.eval_dataset is not None:
                        # the eval split has its own bucket plan: compile its forward shapes too
                        eval_shapes = self._shapes_for(batch_size, self.eval_dataset)
                        prewarm(lambda batch: self._eval_over([batch]), eval_shapes, make_batch)
                break
            except Exception as err:
                if not _is_oom_error(err) or not self._can_split():
                    raise
                self._restore(snapshot)
                self._grow_split(err)
        self._restore(snapshot)
        return runtime.compile_count() - before

    def _to_device_like_loader(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Move a host batch exactly as the device loader does (same sharding, so the same program)."""
        sharding = None
        if self.mesh is not None:
            from workbench.parallel.apply import batch_sharding

            sharding = batch_sharding(self.mesh)
        return next(iter(runtime.device_loader([batch], self.device, batch_sharding=sharding)))

    def _can_split(self) -> bool:
        """Whether every loaded batch can be cut in two more pieces that still split over the mesh."""
        pieces = self.split * 2
        smallest = min(self._batch_ladder[0], self.batch_size)
        return smallest % pieces == 0 and (smallest // pieces) % self.dp_size == 0

    def _grow_split(self, err: BaseException) -> None:
        self.split *= 2
        self._notice(
            f"out of memory ({str(err).splitlines()[0][:120]}); retrying with micro-batch "
            f"{self.batch_size // self.split} x {self.micro_steps} accumulation (same effective batch {self.batch_size * self.cfg.train.grad_accum})"
        )
        with torch.no_grad():
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        self._sync()

    def _notice(self, message: str) -> None:
        self.notices.append(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    # ---- eval ----
    def _eval_batch(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        self.model.eval()
        with torch.no_grad(), self._autocast():
            inputs = {k: v for k, v in batch.items() if k in MODEL_INPUT_KEYS}
            logits = self.model(**inputs, use_cache=False).logits
            s, y = shift_for_next_token(logits, batch["labels"])
            loss_sum = token_ce_sum(s, y)
            tokens = (y != IGNORE_INDEX).sum().to(torch.float32)
        self.model.train()
        return loss_sum, tokens

    def _eval_over(self, batches: Iterable[dict], max_batches: int | None = None) -> float:
        """Mean loss over device batches: one program per shape (the running sums enter as device data)."""
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        count = torch.zeros((), dtype=torch.float32, device=self.device)
        self._sync()
        for i, batch in enumerate(batches):
            if max_batches is not None and i >= max_batches:
                break
            loss_sum, tokens = self._eval_batch(batch)
            total = total + loss_sum
            count = count + tokens
            self._sync()
        return float((total / count.clamp(min=1.0)).cpu())

    def evaluate(self, max_batches: int | None = None) -> float:
        """Mean next-token loss over the eval set (one host read at the end)."""
        if self.eval_dataset is None:
            raise ValueError("no eval dataset: pass eval_dataset= or set data.eval_fraction > 0")
        loader, _ = self._loader_for(self.eval_dataset, self.batch_size, shuffle_seed=self.cfg.train.seed)
        if self._xla:
            sharding = None
            if self.mesh is not None:
                from workbench.parallel.apply import batch_sharding

                sharding = batch_sharding(self.mesh)
            batches: Iterable[dict] = runtime.device_loader(loader, self.device, batch_sharding=sharding)
        else:
            batches = ({k: v.to(self.device) for k, v in b.items()} for b in loader)
        value = self._eval_over(batches, max_batches)
        self.last_eval_loss = value
        return value

    # ---- checkpoints ----
    def state(self) -> dict[str, Any]:
        """Everything a resume needs, as a nested dict for `CheckpointManager.save`."""
        loop = {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "sequences_in_epoch": self.sequences_in_epoch,
            "batch_size": self.batch_size,
            "split": self.split,
        }
        state: dict[str, Any] = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "loop": loop,
            "rng": capture_rng(self._xla),
            "config": self.cfg.to_dict(),
        }
        if any(True for _ in self.objective.parameters()):
            state["objective"] = self.objective.state_dict()
        return state

    def save_checkpoint(self) -> Path:
        if self.checkpoints is None:
            raise ValueError("train.checkpoint_dir is not set")
        path = self.checkpoints.save(self.step, self.state())
        self.checkpoint_path, self._checkpointed_step = str(path), self.step
        return path

    def load_checkpoint(self, path: str | Path | None = None) -> Path:
        """Restore model, optimizer, scheduler, data position, RNG and step from a checkpoint."""
        if self.checkpoints is None:
            raise ValueError("train.checkpoint_dir is not set")
        path = Path(path) if path is not None else self.checkpoints.latest()
        if path is None:
            raise ValueError(f"no checkpoint under {self.cfg.train.checkpoint_dir!r}")
        self._init_optimizer_state()  # so sharded loads have (sharded) destinations
        into = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if any(True for _ in self.objective.parameters()):
            into["objective"] = self.objective.state_dict()
        state = self.checkpoints.load(path, into=into)
        with torch.no_grad():
            if state["model"] is not into["model"]:
                self.model.load_state_dict(state["model"])
            if "objective" in state:
                self.objective.load_state_dict(state["objective"])
        _load_optimizer(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr
        loop = state["loop"]
        self.step, self.tokens_seen = int(loop["step"]), int(loop["tokens_seen"])
        self.epoch, self.batch_in_epoch = int(loop["epoch"]), int(loop["batch_in_epoch"])
        self.sequences_in_epoch = int(loop["sequences_in_epoch"])
        self.batch_size, self.split = int(loop["batch_size"]), int(loop["split"])
        restore_rng(state["rng"])
        self.checkpoint_path, self._checkpointed_step = str(path), self.step
        self._notice(f"resumed from {path} at step {self.step}")
        return path

    # ---- the loop ----
    def fit(self) -> TrainResult:
        train = self.cfg.train
        self._check_precision()
        if self.checkpoints is not None and train.resume and self.checkpoints.latest() is not None:
            self.load_checkpoint()
        self._init_buffers()
        self._open_stream()
        warm = self._warm_up()
        self._compiles_at_warm = runtime.compile_count() if self._xla else 0

        from tqdm.auto import tqdm

        bar = tqdm(
            total=train.steps, initial=self.step, disable=not train.progress_bar, desc="train", leave=False
        )
        profiler = self._make_profiler(prewarmed=warm > 0)
        timed_tokens, timed_start = 0, None
        paused_s = 0.0  # in-loop evals and checkpoint saves: not training time
        try:
            while self.step < train.steps:
                self._maybe_grow_batch()
                batches, tokens = [], 0
                wait_start = time.perf_counter()
                for _ in range(train.grad_accum):
                    batch, info = self._next_batch()
                    batches.append(batch)
                    tokens += info.tokens
                    self.epoch, self.batch_in_epoch = info.epoch, info.index + 1
                    first_of_epoch = info.index == 0
                    self.sequences_in_epoch = info.sequences + (
                        0 if first_of_epoch else self.sequences_in_epoch
                    )
                input_wait = time.perf_counter() - wait_start
                lr = self.scheduler.get_last_lr()[0]  # the rate this step applies
                out = self._run_step(batches)
                self.step += 1
                self.tokens_seen += tokens
                self._sync()
                if timed_start is None:
                    # The clock starts once the first step has finished (it fills the input pipeline).
                    # XLA runs a step asynchronously after its sync, so wait for it, once per run:
                    # otherwise its tail would be billed to the timed steps.
                    if self._xla:
                        runtime.wait_device_ops()
                    timed_start = time.perf_counter()
                else:
                    timed_tokens += tokens
                eval_loss = None
                if train.eval_every and self.step % train.eval_every == 0 and self.eval_dataset is not None:
                    pause = time.perf_counter()
                    eval_loss = self.evaluate()
                    paused_s += time.perf_counter() - pause
                is_log = self.step % train.log_every == 0 or self.step == train.steps
                # The profiler reads the loss (and the grad norm) only at log steps, after the
                # step's sync; between them nothing leaves the device.
                metrics = profiler.step(
                    tokens,
                    loss=out["loss"] if is_log else None,
                    lr=lr,
                    input_wait_s=input_wait,
                    eval_loss=eval_loss,
                    log=is_log,
                    extras={"grad_norm": out.get("grad_norm")},
                )
                if metrics is not None:
                    metrics["step"] = self.step  # the optimizer step, also across resumes
                    metrics["tokens_seen"] = self.tokens_seen
                    metrics["warmup_compiles"] = warm
                    metrics["batch_size"] = self.batch_size
                    metrics["micro_batch"] = self.batch_size // self.split
                    metrics["grad_accum"] = self.micro_steps
                    self.history.append(metrics)
                    for cb in self.callbacks:
                        cb(metrics)
                    bar.update(self.step - bar.n)
                    if metrics["loss"] is not None:
                        bar.set_postfix(loss=f"{metrics['loss']:.4f}", refresh=False)
                if (
                    self.checkpoints is not None
                    and train.checkpoint_every
                    and self.step % train.checkpoint_every == 0
                ):
                    pause = time.perf_counter()
                    self.save_checkpoint()
                    paused_s += time.perf_counter() - pause
                    if is_log:  # keep the save's time and host copies out of the next interval's figures
                        profiler.reset_clock()
        finally:
            bar.close()
            self._close_stream()
        if self._xla:
            runtime.wait_device_ops()
        end = time.perf_counter()
        if self.checkpoints is not None and self._checkpointed_step != self.step:
            self.save_checkpoint()  # the final state, unless the loop (or a resume) has this step already
        elapsed = end - timed_start - paused_s if timed_start is not None else 0.0
        after = (runtime.compile_count() - self._compiles_at_warm) if self._xla else 0
        self.profiler = profiler
        return TrainResult(
            history=self.history,
            final_loss=self.history[-1]["loss"] if self.history else None,
            tokens_per_s=(timed_tokens / elapsed) if elapsed > 0 and timed_tokens else None,
            compiles_after_warmup=after,
            checkpoint_path=self.checkpoint_path,
            eval_loss=self.last_eval_loss,
            steps=self.step,
            warmup_compiles=warm,
            notices=list(self.notices),
        )

    def _run_step(self, batches: list[dict]) -> dict[str, torch.Tensor]:
        if self._xla:
            return self.train_step(batches)
        while True:  # eager backends: a failed step leaves weights intact, so it can be retried
            snapshot_lr = [g["lr"] for g in self.optimizer.param_groups]
            try:
                return self.train_step(batches)
            except Exception as err:
                if not _is_oom_error(err) or not self._can_split():
                    raise
                self.optimizer.zero_grad(set_to_none=True)
                with torch.no_grad():
                    self._loss_acc.zero_()
                    self._tokens_acc.zero_()
                for group, lr in zip(self.optimizer.param_groups, snapshot_lr):
                    group["lr"] = lr
                if self.hw.backend == "cuda":
                    torch.cuda.empty_cache()
                self._grow_split(err)

    def _maybe_grow_batch(self) -> None:
        every = self.cfg.train.dynamic_batch_every
        if not every or self.step == 0 or self.step % every:
            return
        ladder = self._batch_ladder if len(self._batch_ladder) > 1 else self._plan_ladder()
        bigger = [b for b in ladder if b > self.batch_size]
        if not bigger:
            return
        old, new = self.batch_size, bigger[0]
        self.batch_size = new
        # the same epoch continues at the new size, past the sequences already seen
        self.batch_in_epoch = self.sequences_in_epoch // new
        self._open_stream()
        self._notice(f"dynamic batch: step {self.step}: batch {old} -> {new}")

    def _check_precision(self) -> None:
        if (
            self.cfg.train.precision == "bf16-mixed"
            and self.hw.backend == "cuda"
            and not torch.cuda.is_bf16_supported()
        ):
            self._notice("precision bf16-mixed: this GPU has no bf16; running fp32")

    def _make_profiler(self, *, prewarmed: bool) -> Any:
        from workbench.analysis.flops import training_flops_per_token
        from workbench.analysis.profiler import StepProfiler

        try:  # MFU at the longest padded length: an upper bound on the attention FLOPs
            flops = training_flops_per_token(self.model.config, self.cfg.data.max_length)
        except Exception:  # a model the FLOP counter does not know: no MFU, training goes on
            flops = None
        # MFU against the devices this run drives: the mesh's, else one (an XLA run without a
        # mesh, one GPU, the CPU), not every chip the host has (a v5e-8 without a mesh uses one).
        peak = self.hw.peak_bf16_flops_per_device
        devices = self.mesh_spec.num_devices if self.mesh_spec is not None else 1
        return StepProfiler(
            self.hw,
            flops_per_token=flops,
            peak_flops=peak * devices if peak else None,
            log_every=self.cfg.train.log_every,
            # after a prewarm every compile is a recompilation; without one, the first steps compile
            warmup_steps=0 if prewarmed else 3,
        )


# ---- helpers -------------------------------------------------------------------------------------


def _pad_id(tokenizer: Any) -> int:
    if tokenizer is None:
        return 0
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    return int(pad) if pad is not None else 0


def _restore_optimizer_scalars(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Put back non-tensor per-parameter state (e.g. a Python-number step) after in-place tensor copies."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for index, state in saved.get("state", {}).items():
        live = optimizer.state[params[int(index)]]
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                live[key] = value


def _load_optimizer(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Load optimizer state *into* the live state tensors (created by `init_optimizer_state`).

    Copying in place keeps each tensor's device, dtype and SPMD sharding, so the step program
    after a resume is the one compiled before (`optimizer.load_state_dict` would replace them
    with fresh, unsharded tensors). Non-tensor state and group hyper-parameters are set directly.
    """
    params = [p for g in optimizer.param_groups for p in g["params"]]
    saved_state = saved.get("state", {})
    saved_params = sum(len(g["params"]) for g in saved["param_groups"])
    if len(params) != saved_params or len(optimizer.param_groups) != len(saved["param_groups"]):
        raise ValueError(
            f"the checkpoint's optimizer holds {saved_params} parameters in {len(saved['param_groups'])} "
            f"groups; this model's holds {len(params)} in {len(optimizer.param_groups)}: "
            "resume with the model and optimizer settings the checkpoint was written with"
        )
    with torch.no_grad():
        for index, state in saved_state.items():
            live = optimizer.state[params[int(index)]]
            for key, value in state.items():
                current = live.get(key)
                if isinstance(value, torch.Tensor) and isinstance(current, torch.Tensor):
                    if value is not current:
                        current.copy_(value.to(current.dtype))
                else:
                    live[key] = value
    for group, saved_group in zip(optimizer.param_groups, saved["param_groups"]):
        for key, value in saved_group.items():
            if key != "params":
                group[key] = tuple(value) if isinstance(group.get(key), tuple) else value


def train(cfg: WorkbenchConfig, callbacks: Sequence[Callback] = (), **kwargs: Any) -> TrainResult:
    """Build everything from `cfg` and train: the one-call entry point."""
    return Trainer(cfg, callbacks=callbacks, **kwargs).fit()
