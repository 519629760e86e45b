"""Rollouts: a prompt batch becomes a GRPO training batch, with one read and one write per rollout.

`Rollouts.run` is the one code path (training, warm-up and, greedy, eval): each of a batch's B
prompts is repeated G = ``grpo.num_generations`` times (B x G rows, groups on consecutive rows, so
the programs are bounded by the prompt buckets), `workbench.generate.sample_rollout` samples the
completions on the live model (LoRA adapters included: the policy is the sampler, no copy, no
sync of weights) and keeps every result on the device; `read_rollout` brings the completion tokens
to the host in ONE transfer; they are decoded and scored (`workbench.rl.rewards.RewardSet`, with the
records' columns), turned into group-relative advantages (`workbench.rl.advantages`) and written to
the device in ONE transfer (split over the mesh's data x fsdp like any batch). The training batch is
the rollout's own device tensors plus the advantages: what `workbench.rl.loss.GRPOObjective` reads.

`RolloutStream` stands where the trainer's `DeviceStream` stands (``next() -> (batch, BatchInfo)``):
with ``train.grad_accum`` > 1 each micro-batch is a rollout of its own; with ``grpo.num_iterations``
mu > 1 one round of rollouts serves mu consecutive optimizer steps, and the batch carries the old
log-probs: the sampler's own (``log_softmax(logits / temperature)`` of each sampled token, computed
while decoding), not a second forward. They equal a no-grad forward of the training program to
1e-4 in fp32 (``tests/test_grpo.py``); under ``bf16-mixed`` they differ by the precisions of the
decode and the training step, as an importance ratio off 1 by bf16's rounding.

Each rollout's host figures (`workbench.rl.metrics.RolloutFigures`: rewards, lengths, seconds) go
into the run's `RolloutLog`, with the seconds of the training steps between rollouts, until the log
step reads them. Nothing else crosses between host and device.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from workbench.backend.protocol import Backend
from workbench.backend.xla import runtime
from workbench.generate import RowSharding
from workbench.rl.completions import rollout_sample
from workbench.rl.metrics import RolloutFigures, RolloutLog, rollout_figures
from workbench.train.stream import BatchInfo, HostStream


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
    ) -> None:
        self.model, self.tokenizer, self.grpo, self.rewards = model, tokenizer, grpo, rewards
        self.columns = columns
        self.reads = 0
        """Host reads of completions so far (`completions`): the metrics' ``expected_transfers``."""
        """`workbench.rl.prompt_loader.PromptColumns` of the prompts being rolled out."""
        self.pad_token_id, self.place, self.backend, self.mesh = pad_token_id, rows_sharding, backend, mesh
        from workbench.generation_controls import eos_ids

        # as `generate` ends a row: the model's generation config (a chat model's end-of-turn ids),
        # else the tokenizer's end-of-sequence
        self.eos_token_ids = eos_ids(model, tokenizer, "auto") or None

    def sample(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, seed: int, *, greedy: bool
    ) -> Any:
        """`sample_rollout` on the live model for host rows (a `DeviceRollout`: nothing read back)."""
        from workbench.generate import sample_rollout

        grpo = self.grpo
        return sample_rollout(
            self.model,
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
            # the sampler's log-probs serve as the old policy's only when a rollout serves several steps
            keep_logps=not greedy and grpo.num_iterations > 1,
        )

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
        self, host: dict[str, torch.Tensor], seed: int, *, score: bool = True
    ) -> tuple[dict, RolloutFigures]:
        """A prompt batch (`PromptCollator`'s, host) → the GRPO training batch (device tensors) and the
        rollout's figures. `score=False` (warm-up): the same programs and transfers, zero advantages,
        no reward function called."""
        from workbench.rl.advantages import group_advantages

        start = time.perf_counter()
        generations = int(self.grpo.num_generations)
        input_ids = host["input_ids"].repeat_interleave(generations, dim=0)
        attention_mask = host["attention_mask"].repeat_interleave(generations, dim=0)
        rollout = self.sample(input_ids, attention_mask, seed, greedy=False)
        token_ids, finished = self.completions(rollout)
        rows, sample = len(token_ids), ()
        if score:
            indices = host["index"].repeat_interleave(generations).tolist()
            scores = self.score(indices, token_ids)
            total, per_function = np.asarray(scores.total, dtype=np.float32), dict(scores.per_function)
            advantages, zero_std = group_advantages(total, generations, self.grpo.scale_rewards)
            sample = rollout_sample(self, indices, token_ids, scores, advantages, finished)  # log_completions
        else:
            total, per_function = np.zeros(rows, np.float32), {}
            advantages, zero_std = np.zeros(rows, np.float32), 1.0
        batch = self.training_batch(rollout, np.asarray(advantages, dtype=np.float32))
        figures = rollout_figures(
            total,  # nan where no function scored: left out of the reward figures, as TRL leaves it out
            per_function,
            [len(ids) for ids in token_ids],
            num_generations=generations,
            zero_std_groups=zero_std,
            seconds=time.perf_counter() - start,
            finished=finished,
            sample=sample,
        )
        return batch, figures

    def training_batch(self, rollout: Any, advantages: np.ndarray) -> dict[str, torch.Tensor]:
        """The objective's batch from the rollout's device tensors and the advantages (ONE write)."""
        completion_mask = rollout.completion_mask
        if self.grpo.mask_truncated_completions:  # a cut completion teaches nothing about its end
            completion_mask = completion_mask * rollout.finished[:, None].to(completion_mask.dtype)
        batch = {
            "input_ids": rollout.sequences,
            "attention_mask": rollout.attention_mask,
            "position_ids": rollout.position_ids,
            "completion_mask": completion_mask,
            "advantages": self.place(torch.from_numpy(advantages)),
        }
        if self.grpo.num_iterations > 1:  # the sampler's log-probs: the policy that sampled them
            batch["old_logps"] = rollout.logps
        if self.grpo.mask_truncated_completions:
            # the mask as device data (a traced backend runs it now), so each of a rollout's mu steps
            # runs the same training program
            self.backend.step_boundary()
        return batch


def rollout_seed(seed: int, epoch: int, index: int) -> int:
    """The sampling seed of the rollout of batch `index` of `epoch`: a resumed run samples the same."""
    return (int(seed) * 1_000_003 + int(epoch) * 100_003 + int(index) * 7_919) % (2**31 - 1)


class RolloutStream:
    """GRPO training batches, one rollout per micro-batch, each served `iterations` optimizer steps;
    ``next() -> (batch, BatchInfo)`` as `workbench.train.stream.DeviceStream`. `BatchInfo.sequences`
    counts prompts, `.tokens` the real tokens trained (prompts x G plus the completions). The
    rollouts' figures, and the seconds between them (the training steps), go into `log`."""

    def __init__(
        self,
        host: HostStream,
        rollouts: Rollouts,
        log: RolloutLog,
        *,
        seed: int,
        grad_accum: int,
        iterations: int,
    ) -> None:
        self.host, self.rollouts, self.log, self.seed = host, rollouts, log, seed
        self.sampler = host.sampler
        self.grad_accum, self.iterations = max(1, grad_accum), max(1, iterations)
        self._batches: Iterator[dict] = iter(host)
        self._served = 0
        self._round: list[tuple[dict, BatchInfo]] = []
        self._handed_at: float | None = None
        self.excluded_s = 0.0
        """Seconds between two steps that were neither training nor a rollout (an eval): left out."""

    def next(self) -> tuple[dict, BatchInfo]:
        slot = self._served % self.grad_accum
        if slot == 0:
            new_round = (self._served // self.grad_accum) % self.iterations == 0
            if new_round:
                self.rollouts.backend.wait()  # the last step's device time is the step's, not the rollout's
            self.step_ended()
            if new_round:
                self._round = []  # a new round of rollouts for the next mu optimizer steps
        if len(self._round) <= slot:
            self._round.append(self._rollout())
        self._served += 1
        self._handed_at = time.perf_counter()
        return self._round[slot]

    def step_ended(self) -> None:
        """The time since the last batch was handed out was the training step's (an eval's excluded)."""
        if self._handed_at is not None:
            self.log.trained(max(0.0, time.perf_counter() - self._handed_at - self.excluded_s))
        self._handed_at, self.excluded_s = None, 0.0

    def _rollout(self) -> tuple[dict, BatchInfo]:
        host = next(self._batches)
        info = self.host.infos.popleft()
        batch, figures = self.rollouts.run(host, rollout_seed(self.seed, info.epoch, info.index))
        self.log.add(figures)
        prompt_tokens = int(host["attention_mask"].sum()) * int(self.rollouts.grpo.num_generations)
        tokens = prompt_tokens + figures.completion_tokens
        shape = (int(batch["input_ids"].shape[0]), int(batch["input_ids"].shape[1]))
        return batch, BatchInfo(info.epoch, info.index, info.sequences, tokens, shape)

    def close(self) -> None:
        """Nothing runs in the background (the host batches are collated when a rollout needs them)."""
        self._round = []
