"""The training data stream: endless batches from the data loader to the device, with their facts.

`HostStream` walks epochs of a `make_loader` loader from a (epoch, batch index) position and
records, for every batch it produces, a `BatchInfo` (epoch, index, real tokens, shape) taken
from the CPU batch. `DeviceStream` puts the batches on the device through the run's `Backend`
(``device_batches``: torch_xla's background loader, sharded over the mesh's batch axes;
``.to(device)`` in plain torch), each cut first to this process's rows by the run's `Replicas`,
and hands the trainer each device batch with its facts. The trainer thereby knows its exact data
position and real-token counts without reading a device tensor. `TrainingData` builds these streams,
the eval batches and the list of shapes a loader can emit (what the warm-up compiles).

Resuming inside an epoch uses the sampler's own position (`BucketBatchSampler.load_state_dict`):
the consumed index lists are skipped without collating them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from workbench.backend.protocol import Backend, Batch, Replicas
from workbench.data.buckets import BucketChoice
from workbench.data.chat import IGNORE_INDEX
from workbench.data.loader import dataset_lengths, make_loader, training_epochs
from workbench.data.preference import is_pair_dataset
from workbench.data.sampler import BucketBatchSampler


@dataclass
class BatchInfo:
    """Host-side facts of one batch, recorded as the loader produced it."""

    epoch: int
    index: int
    """Position of the batch within its epoch (0-based)."""
    sequences: int
    """Dataset examples in the batch (a preference pair, two rows, counts once)."""
    tokens: int
    """Real (non-padding) input tokens."""
    shape: tuple[int, int]


def real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Real (non-padding) tokens of a CPU batch: its 2-D attention mask, else its labels, else all."""
    if "attention_mask" in batch and batch["attention_mask"].dim() == 2:
        return int(batch["attention_mask"].sum())
    if "labels" in batch:
        return int((batch["labels"] != IGNORE_INDEX).sum())
    return int(batch["input_ids"].numel())


class HostStream:
    """Endless host batches over epochs, starting at (epoch, batch index), recording each batch's facts.

    Facts (`BatchInfo`) are appended to `infos` in order as batches are produced (possibly
    ahead, in the device loader's thread); the consumer pops one per batch it takes.
    """

    def __init__(
        self,
        loader: Any,
        sampler: BucketBatchSampler,
        *,
        start_epoch: int = 0,
        skip: int = 0,
        rows_per_example: int = 1,
    ) -> None:
        self.loader, self.sampler = loader, sampler
        self.rows_per_example = rows_per_example
        """Rows a dataset example becomes (2 for a preference pair): `BatchInfo.sequences` counts examples."""
        self.start_epoch, self.skip = start_epoch, skip
        self.infos: deque[BatchInfo] = deque()

    def __iter__(self) -> Iterator[dict]:
        epoch, skip = self.start_epoch, self.skip
        while True:
            if skip:
                self.sampler.load_state_dict({"epoch": epoch, "position": skip})
            else:
                self.sampler.set_epoch(epoch)
            produced = 0
            for index, batch in enumerate(self.loader, start=skip):
                ids = batch["input_ids"]
                self.infos.append(
                    BatchInfo(
                        epoch,
                        index,
                        int(ids.shape[0]) // self.rows_per_example,
                        real_tokens(batch),
                        tuple(ids.shape[:2]),
                    )
                )
                produced += 1
                yield batch
            if produced == 0 and skip == 0:
                raise ValueError(
                    "the training loader produced no batch: the dataset is empty or smaller than one batch"
                )
            epoch, skip = epoch + 1, 0


class DeviceStream:
    """Batches of a `HostStream` on the device, each with its `BatchInfo`; `close()` stops prefetching.

    Each batch's facts are the whole batch's; the device gets this process's rows of it
    (`Replicas.take_rows`: a torchrun rank's slice, every row in one process)."""

    def __init__(
        self,
        host: HostStream,
        device: Any,
        *,
        backend: Backend,
        replicas: Replicas,
        batch_sharding: Any = None,
    ) -> None:
        self.host, self.backend = host, backend
        rows = host.rows_per_example
        # cut as the host batches are produced (in torch_xla's loader thread, ahead of use)
        self._batches: Iterator[Batch] = backend.device_batches(
            (replicas.take_rows(b, rows) for b in host), device, sharding=batch_sharding
        )

    def next(self) -> tuple[dict, BatchInfo]:
        batch = next(self._batches)
        return batch, self.host.infos.popleft()

    def close(self) -> None:
        """Stop the device loader's background threads (they would otherwise prefetch forever)."""
        self.backend.close_batches(self._batches)


class TrainingData:
    """The run's datasets and how they become device batches: a loader at a batch size, the
    training stream from a data position, eval batches, and every shape a loader can emit."""

    def __init__(
        self,
        cfg: Any,
        train_dataset: Any,
        eval_dataset: Any,
        *,
        pad_token_id: int,
        dp_size: int,
        backend: Backend,
        replicas: Replicas,
        batch_sharding: Any = None,
    ) -> None:
        self.cfg, self.train_dataset, self.eval_dataset = cfg, train_dataset, eval_dataset
        self.pad_token_id, self.dp_size = pad_token_id, dp_size
        self.backend, self.replicas, self.batch_sharding = backend, replicas, batch_sharding
        """How batches reach the device; whose rows of each batch this process takes (torchrun's ranks)."""
        self.bucket_choice: BucketChoice | None = None
        """With ``bucketing.max_buckets: auto``: how the training plan's number of shapes was chosen."""

    @property
    def device(self) -> torch.device:
        """The device batches go to (asked late: under SPMD the one the whole mesh sits behind)."""
        return self.replicas.device

    def loader(self, dataset: Any, batch_size: int) -> tuple[Any, BucketBatchSampler]:
        cfg = self.cfg
        if batch_size != cfg.train.batch_size:
            cfg = cfg.with_overrides({"train.batch_size": batch_size})
        return make_loader(
            dataset,
            cfg,
            pad_token_id=self.pad_token_id,
            dp_size=self.dp_size,
            seed=cfg.train.seed,
            epochs=self.train_epochs() if dataset is self.train_dataset else self.eval_passes(),
            fill_last=dataset
            is not self.train_dataset,  # an eval counts every example, in the planned shapes
        )

    def train_epochs(self) -> float | None:
        """Passes over the training split at the configured batch size (for ``max_buckets: auto``;
        one figure for every training loader, so a batch that grows keeps the same plan)."""
        if self.cfg.bucketing.max_buckets != "auto":
            return None
        return training_epochs(dataset_lengths(self.train_dataset), self.cfg)

    def eval_passes(self) -> float:
        """Passes over the eval split in the run (for ``max_buckets: auto``; at least one)."""
        train = self.cfg.train
        return float(max(1, train.steps // train.eval_every)) if train.eval_every else 1.0

    def stream(self, batch_size: int, *, epoch: int, skip: int) -> DeviceStream:
        """Training batches at `batch_size` from batch `skip` of `epoch` on, endlessly."""
        loader, sampler = self.loader(self.train_dataset, batch_size)
        rows = 2 if is_pair_dataset(self.train_dataset) else 1
        host = HostStream(loader, sampler, start_epoch=epoch, skip=skip, rows_per_example=rows)
        return DeviceStream(
            host,
            self.device,
            backend=self.backend,
            replicas=self.replicas,
            batch_sharding=self.batch_sharding,
        )

    def eval_batches(self, batch_size: int) -> Iterable[dict]:
        """One pass over the eval split, on the device."""
        loader, _ = self.loader(self.eval_dataset, batch_size)
        rows = 2 if is_pair_dataset(self.eval_dataset) else 1
        return self._on_device(self.replicas.take_rows(b, rows) for b in loader)

    def shapes(self, batch_size: int, dataset: Any) -> list[tuple[int, int]]:
        """Every (rows, length) the loader for `dataset` can emit at `batch_size`: the collated batch's
        shape, so a preference pair counts two rows (the sampler batches pairs, `PairCollator`
        gives each side a row)."""
        _, sampler = self.loader(dataset, batch_size)
        rows = 2 if is_pair_dataset(dataset) else 1
        return sorted({(rows * int(s[0]), int(s[1])) for s in sampler.batch_shapes()})

    def to_device(self, batch: Batch, *, whole: bool = False) -> Batch:
        """Move one host batch exactly as the stream does (same sharding, so the same program); `whole`:
        every row of it, also under torchrun (a pass whose results are indexed by the batch's examples)."""
        return next(self._on_device([batch if whole else self.replicas.take_rows(batch)]))

    def _on_device(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        return self.backend.device_batches(batches, self.device, sharding=self.batch_sharding)
