"""GRPO's run (`GRPORun`): the trainer's side of ``train.objective: grpo`` (`workbench.objectives.grpo`).

The `Trainer` runs one loop for every objective and asks the run's `ObjectiveRun` what differs; under
GRPO that is `GRPORun`. Its `training_data` resolves the reward functions (``Trainer(cfg,
rewards=[...])``, else ``grpo.reward_funcs``) and swaps the trainer's `TrainingData` for
`RolloutData`, its `loss` is the `GRPOObjective`. `RolloutData` is the same data with prompt batches
instead of training rows: its ``stream`` is a `RolloutStream` (the trainer's ``next() -> (batch,
BatchInfo)``), its loaders batch prompts (`workbench.rl.prompt_loader`), and it holds the run's
`RolloutLog` (the rollouts' figures for `GRPORun.interval_metrics`) and the held-out eval
(`GRPORun.evaluate`: greedy completions scored by the rewards, ``grpo.eval_reward_funcs`` when set).
At each log step the interval's traps are said (`workbench.rl.traps`: completions cut at the budget,
groups without signal, a function that scored nothing), the kept completions get their step
(``grpo.log_completions``), and an interval that scored nothing stops the run (`NothingScoredError`,
raised by the run's last callback, `stop_when_nothing_scored`, once the others have the interval's
metrics). Its `warmup_work` is every prompt bucket's rollout and training step and the eval's sampling,
which the shared warm-up (`workbench.train.warmup`) runs and restores the state after.

Prompt batches: ``train.batch_size`` prompts, each sampled ``grpo.num_generations`` times, so a step
trains ``batch_size x G`` rows per micro-batch; a rollout samples ``grpo.steps_per_generation``
micro-batches' prompts at once (`workbench.config_grpo.steps_per_generation`). The rows split over
the mesh's data x fsdp axes (the rollout runs on the same mesh as the training step), or under
torchrun each rank rolls out its share of the prompts; either way every device holds whole groups
(``train.batch_size`` a multiple of the data-parallel size, `GRPORun.check_data`). An eval batch is
``batch_size x G`` prompts, each completed once, so its programs are the rollout's at one micro-step,
greedy.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any

import torch

from workbench.config_grpo import keeps_old_logps, steps_per_generation
from workbench.data.loader import synthetic_batch
from workbench.rl.merged_sampling import merges_for_sampling
from workbench.rl.metrics import RolloutLog
from workbench.rl.prompt_loader import PromptColumns, prompt_loader
from workbench.rl.rollout import Rollouts, RolloutStream, row_sharding
from workbench.rl.traps import NothingScoredError, TrapNotices, interval_traps, nothing_scored
from workbench.train.objective import LossChunking
from workbench.train.objective_run import ObjectiveRun
from workbench.train.step import EvalLoss
from workbench.train.stream import HostStream, TrainingData
from workbench.train.warmup import WarmupWork

AUTO_PROMPT_BUCKETS = 4
"""Prompt buckets under ``bucketing.max_buckets: auto`` on XLA, where GRPO does not measure step costs."""


class RolloutData(TrainingData):
    """A GRPO run's data: prompt batches, the rollouts that turn them into training batches, the
    rollouts' figures and the held-out eval by reward. Built from the run's `TrainingData`."""

    def __init__(
        self,
        data: TrainingData,
        model: torch.nn.Module,
        tokenizer: Any,
        rewards: Any,
        mesh: Any,
        eval_rewards: Any = None,
        *,
        replicas: Any = None,
        eager: bool = False,
        merge: bool = False,
    ) -> None:
        self.__dict__.update(vars(data))
        grpo = self.cfg.grpo
        self.generations = int(grpo.num_generations)
        self.steps_per_generation = steps_per_generation(self.cfg)
        self.log = RolloutLog()
        """The rollouts' figures and training seconds since the last log step."""
        place = row_sharding(mesh, self.device)  # a mesh is torch_xla's SPMD: elsewhere None
        common = dict(
            pad_token_id=self.pad_token_id,
            rows_sharding=place,
            backend=self.backend,
            mesh=mesh,
            replicas=replicas,
            eager=eager,
            merge=merge,
        )
        self.rollouts = Rollouts(
            model,
            tokenizer,
            grpo,
            rewards,
            PromptColumns(self.train_dataset, tokenizer),
            old_logps=keeps_old_logps(self.cfg),
            **common,
        )
        self.eval_rollouts = None
        if self.eval_dataset is not None:
            columns = PromptColumns(self.eval_dataset, tokenizer)
            scoring = eval_rewards if eval_rewards is not None else rewards  # grpo.eval_reward_funcs
            self.eval_rollouts = Rollouts(model, tokenizer, grpo, scoring, columns, **common)
        self.current: RolloutStream | None = None
        self.traps = TrapNotices(_repeat_notice, _repeat_notice)
        """Says the traps of each log interval (`grpo_objective` routes the first of each kind to the run's notices)."""
        self.stop_reason: str | None = None
        """The line that stops the run after this log step's callbacks (`workbench.rl.traps.nothing_scored`)."""

    def take_reads(self) -> int:
        """The rollouts' and evals' reads of completions since the last call (one per rollout or eval batch)."""
        rollouts = [r for r in (self.rollouts, self.eval_rollouts) if r is not None]
        reads = sum(r.reads for r in rollouts)
        for r in rollouts:
            r.reads = 0
        return reads

    def loader(self, dataset: Any, batch_size: int) -> tuple[Any, Any]:
        """Prompt batches of `dataset`: `batch_size` prompts for training, ``batch_size x G`` (each once,
        the last of a bucket filled) for the eval."""
        evaluating = dataset is not self.train_dataset
        return prompt_loader(
            dataset,
            self.cfg,
            batch_size * self.generations if evaluating else batch_size,
            pad_token_id=self.pad_token_id,
            seed=int(self.cfg.train.seed),
            epochs=self.eval_passes() if evaluating else self.train_epochs(),
            fill_last=evaluating,
        )

    def stream(self, batch_size: int, *, epoch: int, skip: int) -> RolloutStream:  # type: ignore[override]
        """Rollout batches at `batch_size` prompts from batch `skip` of `epoch` on, endlessly."""
        loader, sampler = self.loader(self.train_dataset, batch_size)
        host = HostStream(loader, sampler, start_epoch=epoch, skip=skip)
        train = self.cfg.train
        self.current = RolloutStream(
            host,
            self.rollouts,
            self.log,
            seed=int(train.seed),
            grad_accum=int(train.grad_accum),
            iterations=int(self.cfg.grpo.num_iterations),
            steps_per_generation=self.steps_per_generation,
        )
        return self.current

    def shapes(self, batch_size: int, dataset: Any) -> list[tuple[int, int]]:
        """Every (prompts, prompt length) a prompt loader for `dataset` emits at `batch_size`."""
        _, sampler = self.loader(dataset, batch_size)
        return sorted((int(r), int(n)) for r, n in sampler.batch_shapes())

    def eval_batches(self, batch_size: int) -> Iterable[dict]:
        """One pass over the eval prompts (host batches: the rollout places them)."""
        loader, _ = self.loader(self.eval_dataset, batch_size)
        return loader

    def evaluate(self, batch_size: int, max_batches: int | None = None) -> EvalLoss:
        """The held-out eval: greedy completions scored by the rewards (`evaluate_rewards`); its time is
        left out of the training seconds of the step it follows."""
        import time

        from workbench.rl.evaluation import evaluate_rewards

        if self.eval_rollouts is None:
            raise ValueError("no eval dataset: pass eval_dataset= or set data.eval_fraction > 0")
        start = time.perf_counter()
        result = evaluate_rewards(self.eval_rollouts, self.eval_batches(batch_size), max_batches=max_batches)
        if self.current is not None:
            self.current.excluded_s += time.perf_counter() - start
        return result


def _repeat_notice(message: str) -> None:
    """A trap seen before in the run: its notice line again, not again in the summary."""
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def stop_when_nothing_scored(data: RolloutData) -> Any:
    """The run's last callback: raises `NothingScoredError` when the interval just reported scored nothing."""

    def check(metrics: Any) -> None:
        reason, data.stop_reason = data.stop_reason, None
        if reason is not None:
            raise NothingScoredError(reason)

    return check


def grpo_step_work(trainer: Any) -> dict[str, Any]:
    """What the GRPO step just run did by design, as `StepProfiler.step` takes it: the reads of completions
    and flags since the last step (``expected_transfers``: its rollout's, its eval's) and the seconds its
    rollout ran inside the stream's ``next()`` (``input_work_s``: the step's work, not a wait on input)."""
    data = trainer.data
    return {"expected_transfers": data.take_reads(), "input_work_s": data.log.take_rollout_seconds()}


def grpo_run_metrics(trainer: Any, interval: Any) -> dict[str, Any]:
    """The interval's rollout figures (`workbench.rl.metrics.ROLLOUT_KEYS`) for `run_metrics`; the
    eval's figure is its reward (``eval_reward_mean``), so the eval-loss keys stay None."""
    data = trainer.data
    if data.current is not None:  # the log step's own training time (its loss is read: the step is done)
        data.current.step_ended()
    steps = max(1, int(interval.get("steps_in_interval") or 1))
    figures = data.log.take(steps)
    step = int(interval["step"])
    if figures.get("completions"):  # grpo.log_completions: the rows of the interval's last rollout
        figures["completions"] = [{"step": step, **row} for row in figures["completions"]]
    data.traps.say(interval_traps(figures, trainer.cfg.grpo, step))
    data.stop_reason = nothing_scored(figures, data.rollouts.rewards.names, step)
    # the eval's figure is its reward (eval_reward_mean), not a loss
    eval_reward = interval.get("eval_reward_mean")  # nan: the eval scored nothing (n/a)
    return {
        **figures,
        "eval_loss": None,
        "eval_perplexity": None,
        "eval_reward_mean": eval_reward if eval_reward is None or math.isfinite(eval_reward) else None,
    }


class GRPORun(ObjectiveRun):
    """The trainer's side of a GRPO run (see the module docstring): rollouts in place of training rows,
    the clipped loss, the rollouts' warm-up, the eval by reward and the rollouts' figures."""

    eager_reason = "does not compile a GRPO step (its rollouts run eagerly)"

    def check_data(self, trainer: Any) -> None:
        """Prompts whose groups stay whole on every device (and no preference pairs, as for SFT)."""
        super().check_data(trainer)
        cfg = trainer.cfg
        if cfg.train.batch_size % trainer.dp_size:
            raise ValueError(
                f"train.batch_size={cfg.train.batch_size} prompts must be a multiple of the data-parallel size "
                f"{trainer.dp_size} (the mesh's data x fsdp, or torchrun's ranks): each device takes whole "
                f"groups of grpo.num_generations={cfg.grpo.num_generations} completions; e.g. "
                f"train.batch_size={trainer.dp_size * max(1, cfg.train.batch_size // trainer.dp_size)}"
            )

    def training_data(self, trainer: Any) -> RolloutData:
        """The run's data as `RolloutData` with its `RewardSet` (``Trainer(cfg, rewards=[...])``: functions,
        built-in names or 'module:function' strings, in place of ``grpo.reward_funcs``; weighted by
        ``grpo.reward_weights``), the eval's (``grpo.eval_reward_funcs``), the traps' notices and the
        stop when nothing is scored."""
        from workbench.rl.rewards import RewardSet, resolve_reward_funcs

        cfg = trainer.cfg
        grpo = cfg.grpo
        given = list(getattr(trainer, "rewards", None) or [])
        if given:
            rewards = RewardSet(resolve_reward_funcs(given, grpo), grpo.reward_weights)
        else:
            rewards = RewardSet.from_config(grpo)
        eval_rewards = None  # the run's own, unless grpo.eval_reward_funcs names others (each weighing 1.0)
        if grpo.eval_reward_funcs is not None:
            eval_rewards = RewardSet(
                resolve_reward_funcs(grpo.eval_reward_funcs, grpo, field="grpo.eval_reward_funcs")
            )
        # an eager backend (a GRPO step is never torch.compiled: no program per shape) checks the rollout's
        # rows after every decode step and trains only the completion columns decoded
        eager = not trainer.backend.compiles_every_shape
        processes, memory = trainer.replicas.world_size, trainer.hw.memory_per_device_bytes
        merge = merges_for_sampling(trainer.model, eager=eager, processes=processes, memory_bytes=memory)
        data = RolloutData(
            trainer.data,
            trainer.model,
            trainer.tokenizer,
            rewards,
            trainer.mesh,
            eval_rewards,
            replicas=trainer.replicas,
            eager=eager,
            merge=merge,
        )
        data.traps = TrapNotices(trainer._notice, _repeat_notice)
        # after the user's callbacks, so they see the interval; on every rank (the figures are every rank's)
        trainer.callbacks.append(stop_when_nothing_scored(data))
        if trainer.backend.compiles_every_shape and cfg.bucketing.max_buckets == "auto":
            data.cfg = data.cfg.with_overrides({"bucketing.max_buckets": AUTO_PROMPT_BUCKETS})
            trainer._notice(
                f"bucketing.max_buckets auto: GRPO does not time its steps to choose, so at most "
                f"{AUTO_PROMPT_BUCKETS} prompt buckets; set bucketing.max_buckets to choose"
            )
        # train.time_limit plans a step with its rollout: one every steps_per_generation x mu micro-steps
        micro_steps = data.steps_per_generation * int(grpo.num_iterations)
        trainer.budget.expect_rollouts(-(-micro_steps // int(cfg.train.grad_accum)))
        return data

    def loss(self, trainer: Any, chunking: LossChunking) -> torch.nn.Module:
        """TRL's clipped loss over the completion tokens, its log-probs in chunks of positions as
        `chunking` (``train.loss_chunk_tokens`` for the run's devices) says."""
        from workbench.rl.loss import GRPOObjective

        return GRPOObjective(trainer.cfg.grpo, chunking, notice=trainer._notice).to(trainer.device)

    def eval_module(self, loss: torch.nn.Module) -> torch.nn.Module:
        """A GRPO eval is the reward of greedy completions (`evaluate`), not a loss on a batch; asked for a
        loss on one, the objective gives its own."""
        return loss

    def warmup_work(self, trainer: Any) -> WarmupWork:
        """Every program a GRPO run runs, for warm-up to compile: at each prompt bucket a rollout (a dummy
        one through `Rollouts.run`: sampling, the read, the write of the advantages) and the training
        step on its batches; with evals, the greedy eval's sampling of each eval bucket."""
        engine, data = trainer.engine, trainer.data
        grad_accum, vocab = int(trainer.cfg.train.grad_accum), int(trainer.model.config.vocab_size)
        parts = data.steps_per_generation

        def train_step(shape: tuple[int, int]) -> Any:
            prompts, length = shape
            hosts = [dummy_prompts(prompts, length, vocab)] * parts
            batches, _, _ = data.rollouts.run(hosts, 0, score=False, prewarm=True)  # every program, few steps
            return engine.train_step([batches[i % parts] for i in range(grad_accum)])

        def eval_step(shape: tuple[int, int]) -> Any:
            host = dummy_prompts(*shape, vocab)
            ids, mask = host["input_ids"], host["attention_mask"]
            rollout = data.eval_rollouts.sample(ids, mask, 0, greedy=True, prewarm=True)
            return data.eval_rollouts.completions(rollout)

        return WarmupWork(
            train_shapes=lambda size: data.shapes(size, data.train_dataset),
            train_step=train_step,
            eval_shapes=lambda size: data.shapes(size, data.eval_dataset),
            eval_step=eval_step,
            finish=data.take_reads,  # the warm-up's reads are not the first interval's
        )

    def evaluate(self, trainer: Any, max_batches: int | None = None) -> EvalLoss:
        """The mean reward of greedy completions of the eval prompts."""
        return trainer.data.evaluate(trainer.loop.batch_size, max_batches)

    def step_work(self, trainer: Any) -> dict[str, Any]:
        """The reads of completions and flags the step's rollout (and an eval) made by design, and the
        seconds the rollout ran inside the stream (`grpo_step_work`)."""
        return grpo_step_work(trainer)

    def interval_metrics(self, trainer: Any, interval: Any) -> dict[str, Any]:
        """The interval's rollout figures (`workbench.rl.metrics.ROLLOUT_KEYS`); the eval's figure is its
        reward (``eval_reward_mean``), so the eval-loss keys stay None."""
        return grpo_run_metrics(trainer, interval)


def dummy_prompts(prompts: int, length: int, vocab: int) -> dict[str, torch.Tensor]:
    """A host prompt batch of `prompts` x `length` random tokens (`synthetic_batch`'s: a private
    generator, the training RNG does not move), laid out as `PromptCollator`'s."""
    batch = synthetic_batch((prompts, length), vocab_size=vocab)
    del batch["labels"]  # a prompt has none
    return {
        **batch,
        "index": torch.zeros((prompts,), dtype=torch.long),
        "filler": torch.zeros((prompts,), dtype=torch.bool),
    }
