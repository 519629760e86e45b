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

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from workbench.data.records import IGNORE_INDEX

# ---- data streams ----------------------------------------------------------------------------------


@dataclass
class BatchInfo:
    epoch: int
    index: int
    """Position of the batch within its epoch (0-based)."""
    sequences: int
    tokens: int
    """Real (non-padding) input tokens."""
    shape: tuple[int, int]


class _SkipBatches:
    """A batch sampler that drops its first `skip` index lists (resuming inside an epoch)."""

    def __init__(self, batch_sampler: Iterable[list[int]], skip: int) -> None:
        self.batch_sampler, self.skip = batch_sampler, skip

    def __iter__(self) -> Iterator[list[int]]:
        for i, indices in enumerate(self.batch_sampler):
            if i >= self.skip:
                yield indices

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip)  # type: ignore[arg-type]


def _real_tokens(batch: dict[str, torch.Tensor]) -> int:
    if "attention_mask" in batch and batch["attention_mask"].dim() == 2:
        return int(batch["attention_mask"].sum())
    if "labels" in batch:
        return int((batch["labels"] != IGNORE_INDEX).sum())
    return int(batch["input_ids"].numel())


class HostStream:
    """Endless host batches over epochs, starting at (epoch, batch index), recording each batch's facts.

    Facts (`BatchInfo`) are appended to `infos` in order as batches are produced (possibly
    ahead, in the device loader's thread); the trainer pops one per batch it consumes, so it
    knows real-token counts and its exact data position without touching device tensors.
    """

    def __init__(self, loader: Any, *, start_epoch: int = 0, skip: int = 0) -> None:
        self.loader = loader
        self.start_epoch, self.skip = start_epoch, skip
        self.infos: deque[BatchInfo] = deque()

    def _epoch_loader(self, skip: int) -> Iterable[dict]:
        if skip == 0:
            return self.loader
        from torch.utils.data import DataLoader

        return DataLoader(
            self.loader.dataset,
            batch_sampler=_SkipBatches(self.loader.batch_sampler, skip),
            collate_fn=self.loader.collate_fn,
            num_workers=self.loader.num_workers,
        )

    def __iter__(self) -> Iterator[dict]:
        epoch, skip = self.start_epoch, self.skip
        while True:
            for owner in (getattr(self.loader, "batch_sampler", None), getattr(self.loader, "sampler", None)):
                if hasattr(owner, "set_epoch"):
                    owner.set_epoch(epoch)
            produced = 0
            for index, batch in enumerate(self._epoch_loader(skip), start=skip):
                ids = batch["input_ids"]
                self.infos.append(
                    BatchInfo(epoch, index, int(ids.shape[0]), _real_tokens(batch), tuple(ids.shape[:2]))
                )
                produced += 1
                yield batch
            if produced == 0 and skip == 0:
                raise ValueError(
                    "the training loader produced no batch: the dataset is empty or smaller than one batch"
                )
            epoch, skip = epoch + 1, 0
