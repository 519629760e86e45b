"""The `Trainer`: builds the run's components from the config and coordinates them, one step at a time.

What each component owns (and documents):

- `StepEngine` (``step.py``): the optimizer step on the device, token-mean accumulation,
  clipping, precision, eval loss.
- `HostStream` / `DeviceStream` (``stream.py``): batches to the device with their host-side
  facts, resuming inside an epoch.
- `LoopState` (``state.py``): step, tokens and data position, checkpointed as one object.
- ``warmup.py``: compile every step program first, then restore the state exactly.
- ``oom.py``: the out-of-memory policy (halve the micro-batch, same effective batch).
- ``ladder.py``: the batch sizes dynamic batching grows through, planned up front.
- `RunCheckpoints` (``run_checkpoints.py``): when a save is due (steps or time) and its write on a
  background thread; `CheckpointManager` (``checkpoint.py``): atomic, verified, sharded under SPMD.
- `TimeBudget` (``clock.py``): ``train.time_limit``, a clean stop with a complete checkpoint before it.
- `StepProfiler` (`workbench.analysis.profiler`): the metrics of each log interval, read
  after the step's sync (loss and grad norm: two device->host transfers per interval, none
  between), and advice.

Hardware comes from `workbench.backend.hardware.detect` (``device_type="auto"`` falls back
TPU -> CUDA -> XLA:CPU -> CPU, with notices for a backend that is present but cannot start).
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from workbench.analysis.advice import run_communication
from workbench.analysis.flops import training_flops_per_token
from workbench.analysis.metrics import ROLLOUT_KEYS, IntervalMetrics, RunMetrics, perplexity
from workbench.analysis.profiler import StepProfiler
from workbench.backend.compile_cache import enable_compile_cache
from workbench.backend.hardware import HardwareInfo, detect
from workbench.backend.selection import backend_for
from workbench.config import WorkbenchConfig
from workbench.data.records import build_datasets
from workbench.models.scan import scan_notices
from workbench.objective_registry import idle_settings, objective_for
from workbench.parallel.apply import batch_sharding, shard_model
from workbench.parallel.mesh import mesh_from_config
from workbench.trackers import with_trackers
from workbench.train import warmup
from workbench.train.adapter_files import save_model
from workbench.train.clock import ThroughputClock, TimeBudget, check_time_limit
from workbench.train.export_dir import run_protected_dirs
from workbench.train.finite import FiniteGuard
from workbench.train.ladder import batch_ladder
from workbench.train.loop_decisions import (
    eager_step_with_retry,
    halve_micro_batches,
    main_decides,
    maybe_grow_batch,
    out_of_time,
    save_final_state,
)
from workbench.train.model_setup import precision_notices, run_model
from workbench.train.objective import LossChunking
from workbench.train.optim import build_optimizer, warmup_cosine
from workbench.train.ranks import start_replicas
from workbench.train.run_checkpoints import RunCheckpoints
from workbench.train.state import LoopState, TrainingState
from workbench.train.step import StepEngine
from workbench.train.stream import DeviceStream, TrainingData
from workbench.units import duration_or_none

Callback = Callable[[RunMetrics], None]


@dataclass
class TrainResult:
    history: list[RunMetrics] = field(default_factory=list)
    """One metrics dict per log interval (the dict callbacks receive)."""
    final_loss: float | None = None
    """Training loss of the last logged step."""
    tokens_per_s: float | None = None
    """Real tokens per second over the timed part of the run (after warm-up)."""
    compiles_after_warmup: int = 0
    """Programs XLA compiled after warm-up by training steps (evals and checkpoint saves apart);
    0 when prewarm covered every shape, and off XLA."""
    checkpoint_path: str | None = None
    """The last checkpoint written, if any."""
    eval_loss: float | None = None
    """The last eval loss, if an eval ran (from `Trainer.evaluate`: with ``.perplexity``)."""
    steps: int = 0
    """Optimizer steps completed (including those before a resume)."""
    warmup_compiles: int = 0
    """Programs compiled during warm-up (prewarm)."""
    notices: list[str] = field(default_factory=list)
    """What the trainer decided on its own (hardware fallback, OOM retries, batch growth)."""
    time_limited: bool = False
    """The run stopped before ``train.steps`` because ``train.time_limit`` was near (re-run to resume)."""

    @property
    def eval_perplexity(self) -> float | None:
        """exp(eval_loss), if a next-token eval ran."""
        return getattr(self.eval_loss, "perplexity", perplexity(self.eval_loss))


class Trainer:
    """Train `cfg.model` on `cfg.data` (or the given model/datasets) with `cfg.train`.

    `teacher`: a model sharing the student's tokenizer turns the run into knowledge
    distillation (`workbench.objectives.distillation`), weighted by ``cfg.train.distill_*``. `rewards`: under
    ``train.objective: grpo``, reward functions (or their names) in place of ``grpo.reward_funcs``.
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
        rewards: Sequence[Any] = (),
    ) -> None:
        train = cfg.train
        self.budget = TimeBudget(duration_or_none(train.time_limit))  # the session's time counts from here
        check_time_limit(train.time_limit, train.checkpoint_dir)  # a limit no save fits in: before loading
        self.cfg = cfg
        self.hw = hardware or detect(train.device_type)
        self.compile_cache = cache = enable_compile_cache(train.compile_cache_dir, self.hw)  # before compiles
        self.backend = backend_for(self.hw)  # torch_xla SPMD, plain torch or TorchTPU: `workbench.backend`
        self.notices = [*self.hw.notices, *cache.notices, *self.backend.start_compile_log()]
        # under torchrun: the process group, the same config on every rank, mesh.data x mesh.fsdp over the ranks
        self.replicas = start_replicas(cfg, self.backend)  # else this process alone (SPMD is one process)
        self.is_main = self.replicas.is_main
        self.callbacks = with_trackers(cfg, callbacks) if self.is_main else []  # + report_to's: main rank
        spmd = self.backend.gspmd and cfg.mesh.enabled  # one program over a mesh of devices
        self.mesh_spec = mesh_from_config(cfg.mesh, self.hw) if spmd else None
        self.mesh = self.mesh_spec.build() if self.mesh_spec is not None else None
        # asked for after the mesh: under SPMD the virtual device the whole mesh sits behind; a rank's own
        self.device = self.replicas.device
        self.dp_size = self.replicas.world_size * (
            self.mesh_spec.dp_size if self.mesh_spec is not None else 1
        )

        self.tokenizer = tokenizer
        for message in idle_settings(cfg, teacher=teacher):  # another objective's settings: named, unread
            self._notice(message)
        self.teacher, self.rewards = teacher, list(rewards)
        # train.objective's side of the run (`workbench.objectives`): what it refuses (a teacher it takes
        # none of, a reward function that cannot be imported) stops the run before data or a model loads
        self.objective_run = objective_for(cfg).start(self, teacher=teacher)
        if train_dataset is None:
            train_dataset, built_eval, self.tokenizer = build_datasets(cfg, tokenizer)
            eval_dataset = built_eval if eval_dataset is None else eval_dataset
        self.data = TrainingData(
            cfg,
            train_dataset,
            eval_dataset,
            pad_token_id=pad_token_id(self.tokenizer),
            dp_size=self.dp_size,
            backend=self.backend,
            replicas=self.replicas,
            batch_sharding=batch_sharding(self.mesh) if self.mesh is not None else None,
        )
        self.objective_run.check_data(self)
        shares = self.mesh_spec if self.mesh_spec is not None else {"data": self.dp_size}  # torchrun: ranks
        self.model = run_model(cfg, model, self.tokenizer, hw=self.hw, notice=self._notice, mesh=shares)
        self.objective_run.prepare(self, self.model)  # what it reads of the unplaced model (DPO's reference)
        self.sharding_report = place(self.model, self.mesh, self.device)
        self.data = self.objective_run.training_data(self)  # GRPO's prompts and rollouts
        self.objective = self.objective_run.loss(self, loss_chunking(self))  # the step's loss module
        # DDP / FSDP2 under torchrun, before the optimizer: FSDP2 replaces the parameters
        self.replicas.wrap(self.model, self.objective)
        self.sharding_report = self.replicas.report(self.model, self.sharding_report)
        self.optimizer = build_optimizer(self.model, train, extra_params=self.objective.parameters())
        self.scheduler = warmup_cosine(self.optimizer, train)

        self.loop = LoopState(batch_size=train.batch_size)
        self.engine = StepEngine(
            self.model,
            self.objective,
            self.optimizer,
            self.scheduler,
            self.loop,
            train,
            backend=self.backend,
            replicas=self.replicas,
            eval_objective=self.objective_run.eval_module(self.objective),
            sharded=self.mesh is not None,
            eager_reason=self.objective_run.eager_reason,  # an objective whose step never compiles
        )
        self.training_state = TrainingState(
            self.model, self.objective, self.optimizer, self.scheduler, self.loop, self.backend
        )
        self.checkpoints, self.guard = None, FiniteGuard(train.learning_rate, train.precision)
        if train.checkpoint_dir:
            saves = RunCheckpoints(
                train, sharded=self.mesh is not None, replicas=self.replicas, guard=self.guard
            )
            self.checkpoints, saves.on_saved, saves.notice = saves, self.budget.save_done, self._notice
        self.history: list[RunMetrics] = []
        self.last_eval_loss: float | None = None
        self.ladder: list[int] = [train.batch_size]
        self._stream: DeviceStream | None = None

    def _notice(self, message: str) -> None:
        self.notices.append(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    # ---- data ----
    def _open_stream(self) -> None:
        """(Re)build the training stream at the current batch size and data position."""
        self._close_stream()
        loop = self.loop
        self._stream = self.data.stream(loop.batch_size, epoch=loop.epoch, skip=loop.batch_in_epoch)
        self.sampler = self._stream.host.sampler

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def stream_batch(self) -> tuple[dict, Any]:
        """The training stream's next batch and its facts, the stream then put back where it was."""
        batch, info = self._stream.next()
        self._open_stream()
        return batch, info

    # ---- warm-up and out of memory ----
    def _warm_up(self) -> int:
        """Compile every step program before training (XLA, a compiled native step); returns the count."""
        if not (self.engine.prewarms and self.cfg.train.prewarm):
            return 0
        evals = bool(self.cfg.train.eval_every) and self.data.eval_dataset is not None
        work = self.objective_run.warmup_work(self)  # the objective's step and eval, on every shape
        policy = functools.partial(halve_micro_batches, self)  # out of memory: halve the micro-batch
        return warmup.warm_up(self.engine, work, batch_sizes=self.ladder, evals=evals, on_oom=policy)

    def _run_step(self, batches: list[dict]) -> dict[str, torch.Tensor]:
        # a failed XLA step may have donated its buffers: only the warm-up retries; across ranks a rank
        # retrying alone would leave the others in a collective
        if not self.replicas.retries_failed_steps:
            return self.engine.train_step(batches)
        return eager_step_with_retry(self, batches)

    # ---- eval and checkpoints ----
    def evaluate(self, max_batches: int | None = None) -> float:
        """Mean eval loss (next-token, or DPO's with its ``.stats``), a float with ``.perplexity`` (one host read at the end); GRPO: greedy completions' mean reward."""
        if self.data.eval_dataset is None:
            raise ValueError("no eval dataset: pass eval_dataset= or set data.eval_fraction > 0")
        self.last_eval_loss = self.objective_run.evaluate(self, max_batches)
        return self.last_eval_loss

    def state(self) -> dict[str, Any]:
        """Everything a resume needs, as a nested dict for `CheckpointManager.save`."""
        return self.training_state.state_dict(self.cfg.to_dict())

    @property
    def checkpoint_path(self) -> str | None:
        """The last checkpoint saved or resumed from."""
        return self.checkpoints.path if self.checkpoints is not None else None

    def save_checkpoint(self, wait: bool = True) -> Path:
        """Checkpoint this step: complete on return, or written in the background with ``wait=False``."""
        if self.checkpoints is None:
            raise ValueError("train.checkpoint_dir is not set")
        return self.checkpoints.save(self.loop.step, self.state, wait=wait)

    def load_checkpoint(self, path: str | Path | None = None) -> Path:
        """Restore model, optimizer, scheduler, data position, RNG and step from a checkpoint."""
        if self.checkpoints is None:
            raise ValueError("train.checkpoint_dir is not set")
        self.checkpoints.wait()  # a write in flight (and its pruning) finishes before anything is read
        path = Path(path) if path is not None else self.checkpoints.latest()
        if path is None:
            raise ValueError(f"no checkpoint under {self.cfg.train.checkpoint_dir!r}")
        self.engine.init_optimizer_state()  # so sharded loads have (sharded) destinations
        self.training_state.load(self.checkpoints.manager, path, self.cfg.to_dict())
        self.checkpoints.loaded(path, self.loop.step)
        self._notice(f"resumed from {path} at step {self.loop.step}")
        return path

    def save_pretrained(self, path: str | Path, merged: bool = False, overwrite: bool = False) -> Path:
        """Export the model with the tokenizer beside it: a LoRA run as a peft adapter directory
        (`peft.PeftModel.from_pretrained(base, path)` loads it), a merged LoRA model (``merged=True``)
        or a full fine-tune as a `transformers` model directory (`workbench.train.adapter_files.save_model`).
        `path` is new, empty or an earlier export (``overwrite=True``: any directory but the run's base
        model and checkpoints). Under torchrun every rank calls it (FSDP2 shards are gathered) and the
        main rank writes."""
        protected = run_protected_dirs(self.cfg)
        return save_model(self.model, path, merged=merged, tokenizer=self.tokenizer, write=self.is_main,
                          overwrite=overwrite, protected=protected)  # fmt: skip

    def close(self, *, failed: bool = False) -> None:
        """This process is done with a torchrun launch (no-op otherwise): the others stop waiting for it,
        or, when it `failed`, stop too, naming it."""
        self.replicas.finish(failed=failed)

    # ---- the loop ----
    def fit(self) -> TrainResult:
        """Resume if asked, warm up, then train until `train.steps` optimizer steps are done."""
        train = self.cfg.train
        for message in precision_notices(train, self.hw) + scan_notices(
            self.cfg.model, xla=self.backend.gspmd
        ):
            self._notice(message)
        if self.checkpoints is not None and train.resume and self.checkpoints.latest() is not None:
            self.load_checkpoint()
        self.engine.init_state()
        warmup.choose_auto_buckets(self.engine, self.data, self.loop.batch_size, self._notice)
        self._open_stream()
        self.ladder = batch_ladder(
            self.model, self.cfg, self.hw, mesh=self.mesh_spec, dp_size=self.dp_size, notice=self._notice
        )
        warm = self._warm_up()
        compiles_before = self.engine.compile_count()  # XLA programs, or a compiled native step's graphs
        self.profiler = make_profiler(self, prewarmed=warm > 0)
        clock, bar = ThroughputClock(self.backend), _progress_bar(train, initial=self.loop.step)
        self.budget.expect_saves(self.training_state.nbytes() if self.checkpoints is not None else None)
        start_step = self.loop.step  # a time-limited run that keeps no step of its own must say so
        try:
            while self.loop.step < train.steps and not out_of_time(self):
                self._step(clock, bar, warm)
        finally:
            bar.close()
            self._close_stream()
            if self.checkpoints is not None:  # a write in flight completes, even when training failed
                self.checkpoints.settle(self._notice)
        self.backend.wait()
        tokens_per_s = clock.tokens_per_s(time.perf_counter())
        stopped = self.loop.step < train.steps
        save_final_state(self, clock, stopped, start_step)
        step_compiles = self.engine.compile_count() - compiles_before - clock.paused_compiles
        return TrainResult(
            history=self.history,
            final_loss=self.history[-1]["loss"] if self.history else None,
            tokens_per_s=tokens_per_s,
            compiles_after_warmup=step_compiles,
            checkpoint_path=self.checkpoint_path,
            eval_loss=self.last_eval_loss,
            steps=self.loop.step,
            warmup_compiles=warm,
            notices=[*self.notices, *self.engine.notices, *self.compile_cache.run_notices()],  # cache: once
            time_limited=stopped,
        )

    def _step(self, clock: ThroughputClock, bar: Any, warm: int) -> None:
        """One optimizer step: take its batches, run it, count it; then eval, log and save when due."""
        train, loop = self.cfg.train, self.loop
        maybe_grow_batch(self)
        wait_start = time.perf_counter()
        batches, infos = zip(*(self._stream.next() for _ in range(train.grad_accum)))
        input_wait = time.perf_counter() - wait_start
        lr = self.scheduler.get_last_lr()[0]  # the rate this step applies
        out = self._run_step(list(batches))
        tokens = loop.step_done(infos)
        self.engine.sync()
        clock.step_done(tokens)
        evaluating = self._due(train.eval_every) and self.data.eval_dataset is not None
        eval_loss = self.budget.timed_eval(lambda: clock.paused(self.evaluate)) if evaluating else None
        is_log = self._due(train.log_every) or loop.step == train.steps
        metrics = self.profiler.step(  # it reads the loss and grad norm only at log steps, after the sync
            tokens,
            loss=out["loss"] if is_log else None,
            lr=lr,
            input_wait_s=input_wait,
            eval_loss=eval_loss,
            log=is_log,
            grad_norm=out.get("grad_norm"),
            stats=out.get("stats"),
            inputs=batches,  # shapes and dtypes only: what each recompilation changed
            **self.objective_run.step_work(self),  # reads and work the objective's stream did by design
        )
        if metrics is not None:
            self._report(metrics, warm, bar)
        saves = self.checkpoints
        if saves is not None and main_decides(self, saves.due(loop.step), timed=saves.every_s is not None):
            clock.paused(lambda: self.save_checkpoint(wait=False))
            self.profiler.exclude_compiles()  # a save's programs are not a recompilation of the step
            if is_log:  # keep the save's time and host copies out of the next interval's figures
                self.profiler.reset_clock()

    def _due(self, every: int | None, step: int | None = None) -> bool:
        return bool(every) and (self.loop.step if step is None else step) % every == 0

    def _report(self, interval: IntervalMetrics, warm: int, bar: Any) -> None:
        metrics = run_metrics(self, interval, warm)
        self.history.append(metrics)
        for callback in self.callbacks:
            callback(metrics)
        saves = self.checkpoints  # inf or nan stops the run, naming the last good checkpoint
        self.guard.check(metrics, lambda: saves.settled_path(self._notice) if saves is not None else None)
        bar.update(self.loop.step - bar.n)
        if metrics["loss"] is not None:
            bar.set_postfix(loss=f"{metrics['loss']:.4f}", refresh=False)


def run_metrics(trainer: Trainer, interval: IntervalMetrics, warm: int) -> RunMetrics:
    """The interval's metrics completed with the run's own (in place, so the profiler's history holds
    the run's step numbers too): position, batch layout, time budget, the last save's stall."""
    loop, train, checkpoints = trainer.loop, trainer.cfg.train, trainer.checkpoints
    metrics = cast(RunMetrics, interval)
    metrics.update(
        step=loop.step,  # the optimizer step, also across resumes
        tokens_seen=loop.tokens_seen,
        warmup_compiles=warm,
        batch_size=loop.batch_size,
        micro_batch=loop.batch_size // loop.split,
        grad_accum=trainer.engine.micro_steps,
        time_left_s=trainer.budget.left(),
        planned_stop_step=trainer.budget.planned_stop_step(
            loop.step, train.steps, eval_every=train.eval_every
        ),
        checkpoint_stall_s=checkpoints.stall_s if checkpoints is not None else None,
    )
    metrics.update(trainer.objective_run.interval_metrics(trainer, interval))  # e.g. GRPO's rollouts
    for key in ROLLOUT_KEYS:  # a GRPO run's rollout figures, where its rollouts gave them; None elsewhere
        metrics.setdefault(key, None)
    return metrics


def place(module: torch.nn.Module, mesh: Any, device: Any) -> Any:
    """Shard `module` over the mesh (returns the sharding report), or move it to the device."""
    if mesh is not None:
        return shard_model(module, mesh)
    module.to(device)
    if hasattr(module, "tie_weights"):  # `.to(xla)` gives each user of a shared parameter its own copy
        module.tie_weights()
    return None


def loss_chunking(trainer: Trainer) -> LossChunking:
    """``train.loss_chunk_tokens`` for this run's devices (`LossChunking`: one device's memory, the rows
    it holds, the vocabulary's split), for the objective's loss."""
    spec = trainer.mesh_spec
    return LossChunking(
        trainer.cfg.train.loss_chunk_tokens,
        memory_bytes=trainer.hw.memory_per_device_bytes,
        data_parallel=spec.dp_size if spec is not None else 1,
        model_parallel=spec.model if spec is not None else 1,
    )


def make_profiler(trainer: Trainer, *, prewarmed: bool) -> StepProfiler:
    """The step profiler for this run: MFU against the peak of the devices the run drives."""
    try:  # MFU at the longest padded length: an upper bound on the attention FLOPs
        flops = training_flops_per_token(trainer.model.config, trainer.cfg.data.max_length)
    except Exception:  # a model the FLOP counter does not know: no MFU, training goes on
        flops = None
    # the mesh's devices, else one (a v5e-8 run without a mesh uses one chip)
    peak = trainer.hw.peak_bf16_flops_per_device
    devices = trainer.replicas.world_size * (
        trainer.mesh_spec.num_devices if trainer.mesh_spec is not None else 1
    )
    return StepProfiler(
        trainer.hw,
        flops_per_token=flops,
        peak_flops=peak * devices if peak else None,
        log_every=trainer.cfg.train.log_every,
        # after a prewarm every compile is a recompilation; without one, the first steps compile
        warmup_steps=0 if prewarmed else 3,
        stat_names=trainer.engine.stat_names,
        communication=run_communication(trainer.model.config, trainer.cfg, trainer.mesh_spec),
        backend=trainer.backend,
    )


def pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its end-of-sequence id, else 0."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    return int(pad) if pad is not None else 0


def _progress_bar(train: Any, *, initial: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=train.steps, initial=initial, disable=not train.progress_bar, desc="train", leave=False)


def train(cfg: WorkbenchConfig, callbacks: Sequence[Callback] = (), **kwargs: Any) -> TrainResult:
    """Build everything from `cfg` and train: the one-call entry point."""
    return Trainer(cfg, callbacks=callbacks, **kwargs).fit()
