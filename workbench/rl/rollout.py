"""Rollouts: prompt batches become GRPO training micro-batches, with one read and one write per rollout.

`Rollouts.run` is the one code path (training, warm-up and, greedy, eval). A rollout samples the
prompts of ``grpo.steps_per_generation`` micro-steps together (TRL's generation batch: the host
batches, each ``train.batch_size`` prompts of one bucket, left-padded to the longest of their
buckets), each prompt repeated G = ``grpo.num_generations`` times (groups on consecutive rows, so
the programs are bounded by the prompt buckets); `workbench.generate.sample_rollout` samples the
completions on the live model (LoRA adapters included: the policy is the sampler, no copy, no
sync of weights) in blocks of `ROLLOUT_BLOCK` decode steps, reading one "every row has ended"
flag per block and stopping at the first block where it is set (on an eager backend, where the read
costs no program, after every step, as transformers' ``generate`` checks). `read_rollout` brings the
completion tokens to the host in ONE transfer; they are decoded and scored
(`workbench.rl.rewards.RewardSet`, with the records' columns), turned into group-relative
advantages (`workbench.rl.advantages`) and written to the device in ONE transfer (split over the
mesh's data x fsdp like any batch). The rows are then cut into the micro-steps' batches, each
``train.batch_size`` prompts x G rows, whole groups, in one small program: what
`workbench.rl.loss.GRPOObjective` reads.

Under torchrun each rank rolls out its own share of every micro-step's prompts (whole groups: the
config check keeps ``train.batch_size`` a multiple of the ranks), through the data-parallel wrapper
(FSDP2 gathers the weights it shards), every rank decoding the same number of blocks (the flag is
every rank's); the rewards are gathered so the advantages and figures are the global batch's.

`RolloutStream` stands where the trainer's `DeviceStream` stands (``next() -> (batch, BatchInfo)``):
it rolls out every ``steps_per_generation x num_iterations`` micro-steps and serves the
generation's micro-batches in turn, as TRL's buffer does. When a micro-batch is trained by a policy
that has moved since it was sampled (μ > 1, or a generation that outlives an optimizer step:
`workbench.config_grpo.keeps_old_logps`), the batch carries the old log-probs: the sampler's own
(``log_softmax(logits / temperature)`` of each sampled token, computed while decoding), not a second
forward. They equal a no-grad forward of the training program to 1e-4 in fp32
(``tests/test_grpo.py``); under ``bf16-mixed`` they differ by the precisions of the decode and the
training step, as an importance ratio off 1 by bf16's rounding.

Each rollout's host figures (`workbench.rl.metrics.RolloutFigures`: rewards, lengths, decode steps,
seconds) go into the run's `RolloutLog`, with the seconds of the training steps between rollouts,
until the log step reads them. Nothing else crosses between host and device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from workbench.backend.protocol import Backend, OneProcess, Replicas
from workbench.backend.xla import runtime
from workbench.generate import RowSharding
from workbench.rl.completions import rollout_sample
from workbench.rl.merged_sampling import merged_linears
from workbench.rl.metrics import RolloutFigures, RolloutLog, rollout_figures
from workbench.train.stream import BatchInfo, HostStream

ROLLOUT_BLOCK = 16
"""Decode steps between two reads of a rollout's "every row has ended" flag: a rollout stops at most
this many steps after its last completion ended, at the cost of one small read per block."""


def replicated(tensor: torch.Tensor, mesh: Any) -> torch.Tensor:
    """`tensor` (a new, unsynced result) annotated to be whole on every device of `mesh`."""
    runtime.mark_sharding(tensor, mesh, (None,) * tensor.dim())
    return tensor


def row_sharding(mesh: Any, device: Any) -> RowSharding:
    """Puts a host tensor on the device with its rows split over the mesh's data x fsdp axes, as the
    trainer's batches are (`workbench.parallel.apply.batch_spec`); without a mesh, just on the device."""
    if mesh is None:
        return lambda tensor: tensor.to(device)
    from workbench.parallel.apply import axis_sizes_of, batch_spec

    sizes = axis_sizes_of(mesh)

    def place(tensor: torch.Tensor) -> torch.Tensor:
        on_device = tensor.to(device)  # the tensor itself when it is there already
        runtime.mark_sharding(on_device, mesh, batch_spec(on_device.dim(), sizes))
        return on_device

    return place


class Rollouts:
    """Samples, reads, scores and turns into training batches: the rollout's one code path."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        grpo: Any,
        rewards: Any,
        columns: Any,
        *,
        pad_token_id: int,
        rows_sharding: RowSharding,
        backend: Backend,
        mesh: Any = None,
        replicas: Replicas | None = None,
        old_logps: bool = False,
        eager: bool = False,
        merge: bool = False,
    ) -> None:
        self.model, self.tokenizer, self.grpo, self.rewards = model, tokenizer, grpo, rewards
        self.columns = columns
        """`workbench.rl.prompt_loader.PromptColumns` of the prompts being rolled out."""
        self.reads = 0
        """Host reads so far (each rollout's completions and its blocks' flags): ``expected_transfers``."""
        self.pad_token_id, self.place, self.backend, self.mesh = pad_token_id, rows_sharding, backend, mesh
        self.replicas = replicas or OneProcess(backend)
        """The data-parallel processes: this rank's prompts, the wrapper the sampler runs through."""
        self.old_logps = old_logps
        """Whether the training batches carry the sampler's log-probs (`keeps_old_logps`)."""
        self.eager = eager
        """A backend that compiles no program per shape: the flag is read after every decode step (as
        transformers' ``generate`` checks its rows) and the completions are cut to the tokens decoded."""
        self.merge = merge
        """Sample with the LoRA adapters merged (`workbench.rl.merged_sampling.merges_for_sampling`)."""
        from workbench.generation_controls import eos_ids

        # as `generate` ends a row: the model's generation config (a chat model's end-of-turn ids),
        # else the tokenizer's end-of-sequence
        self.eos_token_ids = eos_ids(model, tokenizer, "auto") or None

    def sample(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        seed: int,
        *,
        greedy: bool,
        prewarm: bool = False,
    ) -> Any:
        """`sample_rollout` on the live model for host rows (a `DeviceRollout`: nothing read back but
        the blocks' flags), through the data-parallel wrapper where there is one; `prewarm`: only the
        decode steps that reach every program (warm-up)."""
        from workbench.generate import sample_rollout

        grpo = self.grpo

        def draw(model: torch.nn.Module, _batch: Any) -> Any:
            with merged_linears(model) if self.merge else contextlib.nullcontext():
                return sample(model)

        def sample(model: torch.nn.Module) -> Any:
            return sample_rollout(
                model,
                input_ids,
                attention_mask,
                max_new_tokens=grpo.max_completion_length,
                temperature=0.0 if greedy else grpo.temperature,
                top_p=1.0 if greedy else grpo.top_p,
                top_k=None if greedy or grpo.top_k == 0 else grpo.top_k,
                eos_token_id=self.eos_token_ids,
                pad_token_id=self.pad_token_id,
                row_sharding=self.place,
                seed=seed,
                # the sampler's log-probs serve as the old policy's only when another policy trains them
                keep_logps=not greedy and self.old_logps,
                block=1 if self.eager else ROLLOUT_BLOCK,
                all_ended=self.all_ended,
                trim=self.eager,
                backend=self.backend,
                prewarm=prewarm,
            )

        with torch.no_grad():  # no data-parallel wrapper prepares a backward for it
            rollout = self.replicas.forward(self.model, draw, {})
        self.reads += rollout.flag_reads
        return rollout

    def all_ended(self, flag: torch.Tensor) -> bool:
        """Whether every row of every rank has ended (each rank decodes as many blocks as the others,
        so the collectives of a sharded model stay in step): the flag's one read, shared."""
        ended = bool(flag.cpu())
        return ended if self.replicas.world_size == 1 else all(self.replicas.gather(ended))

    def completions(self, rollout: Any) -> tuple[list[list[int]], list[bool]]:
        """The completion tokens and whether each ended: the rollout's ONE host read. Under a mesh what
        is read is first gathered whole on the device (`replicated`): torch_xla 2.9 compiles a program
        for every read of a row-split tensor, again at each read; a replicated one reads as it is."""
        from workbench.generate import read_rollout

        self.reads += 1
        if self.mesh is not None:
            rollout = dataclasses.replace(
                rollout,
                completion_ids=replicated(rollout.completion_ids + 0, self.mesh),
                lengths=replicated(rollout.lengths + 0, self.mesh),
                finished=replicated(rollout.finished.logical_and(rollout.finished), self.mesh),
            )
            self.backend.step_boundary()  # one small program (compiled in warm-up): the gathers
        return read_rollout(rollout)

    def score(self, indices: list[int], token_ids: list[list[int]]) -> Any:
        """`RewardSet.score` of the completions of the records at `indices` (one per row): the prompts
        as given, the decoded completions (a chat prompt's as TRL's assistant message), every other
        column of the records and ``completion_ids``."""
        prompts, others = self.columns.rows(indices)
        texts = [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in token_ids]
        columns = {**others, "completion_ids": [list(ids) for ids in token_ids]}
        return self.rewards.score(prompts, texts, columns)

    def run(
        self, hosts: list[dict[str, torch.Tensor]], seed: int, *, score: bool = True, prewarm: bool = False
    ) -> tuple[list[dict], RolloutFigures, list[int]]:
        """The prompt batches of a generation's micro-steps (`PromptCollator`'s, host, global) → one
        training batch per micro-step (device tensors), the rollout's figures and each micro-step's
        completion tokens over every rank. `score=False` (warm-up): the same programs, zero advantages,
        no reward function called; `prewarm` (warm-up too): only the decode steps that reach every
        program (`workbench.generate.sample_rollout`)."""
        from workbench.rl.advantages import group_advantages

        start = time.perf_counter()
        generations = int(self.grpo.num_generations)
        prompts = joined_prompts([self.replicas.take_rows(h) for h in hosts], self.pad_token_id)
        input_ids = prompts["input_ids"].repeat_interleave(generations, dim=0)
        attention_mask = prompts["attention_mask"].repeat_interleave(generations, dim=0)
        rollout = self.sample(input_ids, attention_mask, seed, greedy=False, prewarm=prewarm)
        token_ids, finished = self.completions(rollout)
        lengths = np.asarray([len(ids) for ids in token_ids], dtype=np.int64)
        # every rank's rows, rank by rank: the global generation's lengths and which ended before the budget
        parts, ended = zip(*self.replicas.gather((lengths, np.asarray(finished, dtype=bool))))
        rows, sample = len(token_ids), ()
        if score:
            indices = prompts["index"].repeat_interleave(generations).tolist()
            own = self.score(indices, token_ids)
            scores = merged_scores(self.replicas.gather(own), self.rewards.names)
            total, per_function = np.asarray(scores.total, dtype=np.float32), dict(scores.per_function)
            everyone, zero_std = group_advantages(total, generations, self.grpo.scale_rewards)
            first = sum(len(p) for p in parts[: self.replicas.rank])
            advantages = everyone[first : first + rows]
            sample = rollout_sample(self, indices, token_ids, own, advantages, finished)  # log_completions
        else:
            total, per_function = np.zeros(sum(len(p) for p in parts), np.float32), {}
            advantages, zero_std = np.zeros(rows, np.float32), 1.0
        batches = self.training_batches(rollout, np.asarray(advantages, dtype=np.float32), len(hosts))
        figures = rollout_figures(
            total,  # nan where no function scored: left out of the reward figures, as TRL leaves it out
            per_function,
            np.concatenate(parts),
            num_generations=generations,
            zero_std_groups=zero_std,
            seconds=time.perf_counter() - start,
            finished=np.concatenate(ended),
            sample=sample,
            decode_steps=rollout.decode_steps,
        )
        per_step = [int(sum(p.reshape(len(hosts), -1)[k].sum() for p in parts)) for k in range(len(hosts))]
        return batches, figures, per_step

    def training_batches(
        self, rollout: Any, advantages: np.ndarray, parts: int
    ) -> list[dict[str, torch.Tensor]]:
        """The objective's batches from the rollout's device tensors and the advantages (ONE write): the
        rows cut into `parts` micro-steps' batches of whole groups, in one small program of their own
        (each micro-step's training program then reads device data, the same program for each)."""
        completion_mask = rollout.completion_mask
        if self.grpo.mask_truncated_completions:  # a cut completion teaches nothing about its end
            completion_mask = completion_mask * rollout.finished[:, None].to(completion_mask.dtype)
        whole = {
            "input_ids": rollout.sequences,
            "attention_mask": rollout.attention_mask,
            "position_ids": rollout.position_ids,
            "completion_mask": completion_mask,
            "advantages": self.place(torch.from_numpy(advantages)),
        }
        if self.old_logps:  # the sampler's log-probs: the policy that sampled them
            whole["old_logps"] = rollout.logps
        if parts == 1 and not self.grpo.mask_truncated_completions:
            return [whole]
        size = int(rollout.sequences.shape[0]) // parts
        # each part split over the mesh like any batch (on one device, or off XLA, just the slice)
        batches = [
            {k: self.place(v[i * size : (i + 1) * size]) for k, v in whole.items()} for i in range(parts)
        ]
        # the parts (and the mask) as device data (a traced backend runs them now), so each of a
        # rollout's micro-steps runs the same training program
        self.backend.step_boundary()
        return batches


def joined_prompts(hosts: list[dict[str, torch.Tensor]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """One host prompt batch of the micro-steps' `hosts` (`PromptCollator`'s), in order, each
    left-padded to the longest of their buckets (so a generation stays in the bucket plan's shapes)."""
    if len(hosts) == 1:
        return hosts[0]
    length = max(int(h["input_ids"].shape[1]) for h in hosts)

    def left(t: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (length - t.shape[1], 0), value=value)

    return {
        "input_ids": torch.cat([left(h["input_ids"], pad_token_id) for h in hosts]),
        "attention_mask": torch.cat([left(h["attention_mask"], 0) for h in hosts]),
        "index": torch.cat([h["index"] for h in hosts]),
        "filler": torch.cat([h["filler"] for h in hosts]),
    }


def merged_scores(parts: list[Any], names: list[str]) -> Any:
    """Every rank's `RewardScores` (`Replicas.gather`, rank by rank) as one: totals and tables in rank
    order, each function's mean over every completion it scored."""
    if len(parts) == 1:
        return parts[0]
    total = np.concatenate([p.total for p in parts])
    table = np.concatenate([p.table for p in parts])
    per_function = {
        name: float(np.nanmean(column)) if not np.isnan(column).all() else math.nan
        for name, column in zip(names, table.T)
    }
    return dataclasses.replace(parts[0], total=total, table=table, per_function=per_function)


def rollout_seed(seed: int, epoch: int, index: int, rank: int = 0) -> int:
    """The sampling seed of the rollout starting at batch `index` of `epoch` (on torchrun's `rank`): a
    resumed run samples the same."""
    return (int(seed) * 1_000_003 + int(epoch) * 100_003 + int(index) * 7_919 + int(rank) * 104_729) % (
        2**31 - 1
    )


class RolloutStream:
    """GRPO training batches, ``next() -> (batch, BatchInfo)`` as `workbench.train.stream.DeviceStream`.

    Every ``steps_per_generation x iterations`` micro-steps one rollout samples the prompts of the next
    `steps_per_generation` host batches; its micro-batches are then served in turn, each generation
    served `iterations` times (TRL's ``_buffered_inputs``). `BatchInfo.sequences` counts prompts,
    `.tokens` the real tokens trained (prompts x G plus the completions, every rank's). The rollouts'
    figures, and the seconds between them (the training steps), go into `log`."""

    def __init__(
        self,
        host: HostStream,
        rollouts: Rollouts,
        log: RolloutLog,
        *,
        seed: int,
        grad_accum: int,
        iterations: int,
        steps_per_generation: int | None = None,
    ) -> None:
        self.host, self.rollouts, self.log, self.seed = host, rollouts, log, seed
        self.sampler = host.sampler
        self.grad_accum, self.iterations = max(1, grad_accum), max(1, iterations)
        self.steps_per_generation = max(1, steps_per_generation or self.grad_accum)
        self.period = self.steps_per_generation * self.iterations
        """Micro-steps between two rollouts."""
        self._batches: Iterator[dict] = iter(host)
        self._served = 0
        self._generation: list[tuple[dict, BatchInfo]] = []
        self._handed_at: float | None = None
        self.excluded_s = 0.0
        """Seconds between two steps that were neither training nor a rollout (an eval): left out."""

    def next(self) -> tuple[dict, BatchInfo]:
        rolls = self._served % self.period == 0
        if rolls and self._served % self.grad_accum == 0:
            self.rollouts.backend.wait()  # the last step's device time is the step's, not the rollout's
        if self._served % self.grad_accum == 0:
            self.step_ended()
        if rolls:
            self._generation = []  # the old one's tensors go before the new rollout's
            self._generation = self._rollout()
        item = self._generation[self._served % self.steps_per_generation]
        self._served += 1
        self._handed_at = time.perf_counter()
        return item

    def step_ended(self) -> None:
        """The time since the last batch was handed out was the training step's (an eval's excluded)."""
        if self._handed_at is not None:
            self.log.trained(max(0.0, time.perf_counter() - self._handed_at - self.excluded_s))
        self._handed_at, self.excluded_s = None, 0.0

    def _rollout(self) -> list[tuple[dict, BatchInfo]]:
        hosts = [next(self._batches) for _ in range(self.steps_per_generation)]
        infos = [self.host.infos.popleft() for _ in hosts]
        rank = self.rollouts.replicas.rank
        seed = rollout_seed(self.seed, infos[0].epoch, infos[0].index, rank)
        batches, figures, completion_tokens = self.rollouts.run(hosts, seed)
        self.log.add(figures)
        generations = int(self.rollouts.grpo.num_generations)
        served = []
        for host, info, batch, completed in zip(hosts, infos, batches, completion_tokens):
            tokens = int(host["attention_mask"].sum()) * generations + completed
            shape = (int(batch["input_ids"].shape[0]), int(batch["input_ids"].shape[1]))
            served.append((batch, BatchInfo(info.epoch, info.index, info.sequences, tokens, shape)))
        return served

    def close(self) -> None:
        """Nothing runs in the background (the host batches are collated when a rollout needs them)."""
        self._generation = []
