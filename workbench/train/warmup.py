"""Warm-up: compile every step program before training, then put the training state back exactly.

On XLA, and on plain torch with a compiled native step (``train.compile``,
`workbench.train.compiled_step`: one torch.compile graph per shape), before the first step, every
(batch, length) shape the sampler can emit (at every batch size dynamic growth will reach, and on
XLA the eval split's shapes when evals run) goes through the real step on synthetic tokens. What a
step and an eval are, on which shapes, is the objective's (`WarmupWork`, from
`workbench.train.objective_run.ObjectiveRun.warmup_work`: the next-token step on synthetic batches
laid out like a real one; GRPO's rollout and step on dummy prompts). The model, objective, optimizer,
scheduler and RNG are snapshotted to the host first and copied back *into* the live tensors after
(keeping their device placement and sharding), so training continues exactly as it would have
without the warm-up, and after it nothing compiles on a bucketed run. An out-of-memory error on the
way restores the state and asks the trainer's policy (halve the micro-batch) whether to go again.

With ``bucketing.max_buckets: auto``, `choose_auto_buckets` first measures what one shape costs
to compile and what a padded token costs to train, on the one shape every plan has (the full
``data.max_length`` batch), and fixes both in the run's data config so every loader plans with
them (`workbench.data.bucket_choice.choose_buckets`). A resumed run measures again and may
plan other boundaries, and so other batches, than the run it resumes: for runs that will be
resumed, put the two measured figures (the notice prints them) into the config.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workbench.data.buckets import BucketChoice, round_up
from workbench.data.loader import dataset_lengths, plan_for_config, synthetic_batch
from workbench.data.preference import is_pair_dataset
from workbench.data.sampler import batch_rows
from workbench.train.oom import retry_on_oom
from workbench.train.optim import restore_optimizer_scalars
from workbench.train.state_io import (
    capture_rng,
    flatten_state,
    host_tensors,
    restore_rng,
    shard_like,
    unflatten_state,
)
from workbench.train.step import StepEngine
from workbench.train.stream import TrainingData


def _live_state(engine: StepEngine) -> dict[str, Any]:
    # the trainable parameters as they live (a stacked layer weight whole, not per-layer slices:
    # restoring it is one copy, not a program of slice updates); a frozen base never changes
    trainable = {name: p.detach() for name, p in engine.model.named_parameters() if p.requires_grad}
    return {
        "model": trainable,
        "objective": engine.objective.state_dict(),
        "optimizer": engine.optimizer.state_dict(),
    }


def snapshot(engine: StepEngine) -> dict[str, Any]:
    """A host copy of everything a warm-up step changes."""
    structure, tensors = flatten_state(_live_state(engine))
    # copied: tensors already on the host (AdamW's step counters) would otherwise advance with the warm-up
    host = host_tensors(tensors, copy=True)
    return {
        "structure": structure,
        "tensors": host,
        "scheduler": engine.scheduler.state_dict(),
        "lrs": [g["lr"] for g in engine.optimizer.param_groups],
        "rng": capture_rng(backend=engine.backend),
    }


def restore(engine: StepEngine, snap: dict[str, Any]) -> None:
    """Copy `snap` back *into* the live tensors (keeps their device placement and sharding)."""
    _, live_tensors = flatten_state(_live_state(engine))
    # under FSDP2 (torchrun) each rank copies back its own piece of the whole host copy, no collective
    values = shard_like(snap["tensors"], live_tensors)
    with torch.no_grad():
        for key, value in values.items():
            live_tensors[key].copy_(value)
    saved = unflatten_state(snap["structure"], snap["tensors"])
    restore_optimizer_scalars(engine.optimizer, saved["optimizer"])
    engine.scheduler.load_state_dict(snap["scheduler"])
    for group, lr in zip(engine.optimizer.param_groups, snap["lrs"]):
        group["lr"] = lr
    restore_rng(snap["rng"], backend=engine.backend)
    engine.clear()
    engine.sync()


@dataclass
class WarmupWork:
    """What warm-up runs, as the run's objective runs it: for each batch size, the step once on each of
    its training shapes and, with evals, the eval once on each eval shape. Each call returns what the
    loop would keep alive across the step's boundary (a tensor alive at an XLA sync is a program output:
    dropping it first would compile another program)."""

    train_shapes: Callable[[int], list[tuple[int, int]]]
    """The shapes the training loader emits at a batch size."""
    train_step: Callable[[tuple[int, int]], Any]
    """One optimizer step (every micro-batch) on a batch of that shape."""
    eval_shapes: Callable[[int], list[tuple[int, int]]]
    """The shapes the eval loader emits at a batch size."""
    eval_step: Callable[[tuple[int, int]], Any]
    """One eval batch of that shape."""
    finish: Callable[[], None] = lambda: None
    """Called once the state is back (GRPO forgets the warm-up's reads of completions)."""


def warm_up(
    engine: StepEngine,
    work: WarmupWork,
    *,
    batch_sizes: list[int],
    evals: bool,
    on_oom: Callable[[BaseException], bool],
) -> int:
    """Compile every step program (`compile_step_programs`) and put the state back exactly; an
    out-of-memory error restores the state and asks `on_oom` (the trainer's policy: halve the
    micro-batch) whether to try again. Returns the programs compiled."""
    before = engine.compile_count()
    snap = snapshot(engine)

    def compile_all() -> None:
        compile_step_programs(engine, work, batch_sizes=batch_sizes, evals=evals)

    def shrink(err: BaseException) -> bool:
        restore(engine, snap)
        return on_oom(err)

    retry_on_oom(compile_all, shrink)
    restore(engine, snap)
    work.finish()
    return engine.compile_count() - before


def compile_step_programs(
    engine: StepEngine, work: WarmupWork, *, batch_sizes: list[int], evals: bool
) -> None:
    """Run `work`'s training step (and its eval when `evals`) once for every shape its loaders can
    emit at each of `batch_sizes`."""
    plans = [work.train_shapes(size) for size in batch_sizes]
    if engine.compiled is not None:  # Dynamo keeps every shape's graph (past its limit it runs eager)
        engine.compiled.expect_graphs(sum(map(len, plans)))
    for size, shapes in zip(batch_sizes, plans):
        run_each_shape(engine, work.train_step, shapes)
        if evals and engine.backend.compiles_every_shape:  # the eval split has its own bucket plan
            # (a native eval runs eager: nothing to compile)
            run_each_shape(engine, work.eval_step, work.eval_shapes(size))


def run_each_shape(
    engine: StepEngine, step: Callable[[tuple[int, int]], Any], shapes: list[tuple[int, int]]
) -> None:
    """`step` once on each shape, each followed by the step's boundary with its outputs alive across it,
    as in the loop; then wait for the device. On plain torch a compiled step's graphs compile as it
    runs and the boundary does nothing."""
    for shape in shapes:
        out = step(tuple(shape))
        engine.sync()
        del out
    engine.backend.wait()


def measure_step_costs(
    engine: StepEngine, data: TrainingData, *, batch_size: int, repeats: int = 3
) -> dict[str, Any]:
    """Compile seconds of one step shape and training seconds per padded token, measured on XLA on
    the full-length shape (``batch_size`` x ``data.max_length`` rounded up to ``multiple_of``: the
    last boundary of every plan, so warm-up reuses the program). The training state is restored
    after. With gradient accumulation the first step also compiles the shape-independent update,
    so the compile figure is then an upper bound."""
    cfg = data.cfg
    length = int(round_up(cfg.data.max_length, cfg.bucketing.multiple_of))
    # preference pairs: the loader's sizes count pairs, each two rows, laid out like a real batch
    # (a precomputed reference's log-probs included)
    pairs = is_pair_dataset(data.train_dataset)
    budget = cfg.bucketing.tokens_per_batch
    # the rows the run's loader gives that length (a token budget gives fewer): the same program
    batch_size = batch_rows(
        length,
        batch_size=None if budget else batch_size,
        tokens_per_batch=max(1, budget // 2) if budget and pairs else budget,
        dp_size=data.dp_size,
    )
    template = next(iter(data.loader(data.train_dataset, batch_size)[0])) if pairs else None
    grad_accum = cfg.train.grad_accum
    vocab = int(engine.model.get_input_embeddings().weight.shape[0])
    fake = synthetic_batch(
        (batch_size * (2 if pairs else 1), length),
        vocab_size=vocab,
        pad_token_id=data.pad_token_id,
        template=template,
    )
    batch = data.to_device(fake)
    snap = snapshot(engine)
    backend = engine.backend

    def run_step() -> None:
        out = engine.train_step([batch] * grad_accum)
        engine.sync()  # with the step's outputs alive, as the loop does: the loop's own program
        del out

    compiles, compile_s = backend.compile_count(), backend.compile_time_s()
    run_step()
    backend.wait()
    compiled, compile_s = backend.compile_count() - compiles, backend.compile_time_s() - compile_s
    start = time.perf_counter()
    for _ in range(repeats):
        run_step()
    backend.wait()
    elapsed = time.perf_counter() - start
    restore(engine, snap)
    if not compiled:
        # The program was already compiled in this process or loaded from the persistent cache:
        # no compile to time. The mean of this process's compiles stands in; without any, None.
        count = backend.compile_count()
        compile_s = backend.compile_time_s() / count if count else None
    return {
        "compile_seconds": None if compile_s is None else max(compile_s, 1e-6),
        "seconds_per_padded_token": max(elapsed, 1e-9) / (repeats * grad_accum * batch_size * length),
        "shape": [batch_size, length],
        "programs": compiled,
        "timed_steps": repeats,
    }


FALLBACK_BUCKETS = 4
"""Shapes ``max_buckets: auto`` allows when it cannot time a compile (the config's default count)."""


def choose_auto_buckets(
    engine: StepEngine, data: TrainingData, batch_size: int, notice: Callable[[str], None]
) -> BucketChoice | None:
    """For ``bucketing.max_buckets: auto``: on XLA, measure the costs the config leaves unset
    (`measure_step_costs`) and fix them in ``data.cfg``; then keep the choice in ``data.bucket_choice``
    and tell `notice` it in one line.
    Off XLA nothing is measured: no compiles, so the plan with the fewest padded tokens."""
    b = data.cfg.bucketing
    if b.max_buckets != "auto" or b.packing or b.strategy == "none":
        return None
    measurement: dict[str, Any] = {}
    costs_unset = b.compile_seconds is None or b.seconds_per_padded_token is None
    if engine.backend.compiles_every_shape and costs_unset:
        measurement = measure_step_costs(engine, data, batch_size=batch_size)
        if b.compile_seconds is None and measurement["compile_seconds"] is None:
            # Every program came from the compile cache: a compile's cost is unknown here, and a
            # near-zero guess would plan one shape per length. Keep the default bound instead.
            data.cfg = data.cfg.with_overrides({"bucketing.max_buckets": FALLBACK_BUCKETS})
            notice(
                f"bucketing.max_buckets auto: no compile to time (the programs came from the compile "
                f"cache), so at most {FALLBACK_BUCKETS} shapes; set bucketing.compile_seconds to choose"
            )
            return None
        unset = [k for k in ("compile_seconds", "seconds_per_padded_token") if getattr(b, k) is None]
        data.cfg = data.cfg.with_overrides({f"bucketing.{k}": measurement[k] for k in unset})
    plan = plan_for_config(dataset_lengths(data.train_dataset), data.cfg)
    choice = plan.choice if plan is not None else None
    if choice is None:
        return None
    if measurement:
        choice = dataclasses.replace(choice, source="measured", extra=measurement)
    data.bucket_choice = choice
    notice(choice.describe())
    return choice
