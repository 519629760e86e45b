"""Prompt batches for rollouts: the prompt dataset bucketed, left-padded and indexed, on the host.

A GRPO step samples completions for a batch of prompts, so its batches are prompts, not training
rows. They come from the project's own pieces: the bucket plan of ``cfg.bucketing`` over the
prompts' lengths (`workbench.data.loader.plan_for_config`) and a `BucketBatchSampler` over them, so
every batch has one planned prompt length and the rollout's programs are bounded by the buckets.
`PromptCollator` left-pads each prompt to its bucket (generation appends on the right) and carries
each row's dataset index, through which the rollout finds the record's prompt and answer columns
for the rewards (`PromptColumns`). An eval loader (``fill_last``) fills a bucket's last batch with
copies marked as fillers, so every held-out prompt is scored once and no new shape appears.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from workbench.data.collate import padded_length
from workbench.data.loader import dataset_lengths, plan_for_config
from workbench.data.sampler import BucketBatchSampler

NOT_REWARD_COLUMNS = frozenset({"input_ids", "attention_mask", "labels", "length"})
"""Dataset columns that are the workbench's own tokens, not the record's: never passed to a reward."""


class IndexedPrompts(torch.utils.data.Dataset):
    """The prompts' token ids by dataset index; a ``fill_last`` filler index ``-1 - i`` is prompt ``i``
    marked as a filler (its completion is not scored)."""

    def __init__(self, dataset: Any) -> None:
        names = getattr(dataset, "column_names", None)
        column = (
            dataset["input_ids"]
            if names is not None
            else [dataset[i]["input_ids"] for i in range(len(dataset))]
        )
        self.ids = [list(x) for x in column]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        real = index >= 0
        row = index if real else -1 - index
        return {"input_ids": self.ids[row], "index": row, "filler": not real}


class PromptCollator:
    """Prompts left-padded to their bucket: ``input_ids`` and ``attention_mask`` [B, bucket] (0 on the
    padding), ``index`` [B] (each row's dataset index) and ``filler`` [B] (True on an eval's fillers)."""

    def __init__(self, pad_token_id: int, boundaries: Sequence[int] | None, *, multiple_of: int = 1) -> None:
        self.pad_token_id = int(pad_token_id)
        self.boundaries = None if boundaries is None else sorted(int(b) for b in boundaries)
        self.multiple_of = int(multiple_of)

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        length = padded_length(max(len(e["input_ids"]) for e in examples), self.boundaries, self.multiple_of)
        rows = len(examples)
        input_ids = torch.full((rows, length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((rows, length), dtype=torch.long)
        for row, example in enumerate(examples):
            ids = example["input_ids"]
            input_ids[row, length - len(ids) :] = torch.as_tensor(ids, dtype=torch.long)
            mask[row, length - len(ids) :] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": mask,
            "index": torch.tensor([int(e["index"]) for e in examples], dtype=torch.long),
            "filler": torch.tensor([bool(e["filler"]) for e in examples], dtype=torch.bool),
        }


def prompt_loader(
    dataset: Any,
    cfg: Any,
    batch_size: int,
    *,
    pad_token_id: int,
    seed: int,
    epochs: float | None = None,
    fill_last: bool = False,
) -> tuple[torch.utils.data.DataLoader, BucketBatchSampler]:
    """Batches of `batch_size` prompts of one bucket each (``cfg.bucketing``'s plan over the prompt
    lengths, at most ``data.max_length``), shuffled per epoch by `seed`; `fill_last`: every prompt once,
    the last batch of a bucket filled with fillers. The rows a batch becomes (prompts x G) are split
    over the mesh, so the sampler itself batches prompts without a data-parallel rounding."""
    from torch.utils.data import DataLoader

    if len(dataset) == 0:
        raise ValueError("the prompt dataset is empty: nothing to roll out")
    lengths = dataset_lengths(dataset)
    plan = plan_for_config(lengths, cfg, epochs=epochs)
    boundaries = plan.boundaries if plan is not None else None
    b = cfg.bucketing
    sampler = BucketBatchSampler(
        lengths,
        boundaries,
        batch_size=batch_size,
        seed=seed,
        overflow="drop",  # the prompt builder drops long prompts with a notice; never cut one here
        fill_last=fill_last,
        max_length=int(cfg.data.max_length),
        multiple_of=b.multiple_of,
    )
    collate = PromptCollator(pad_token_id, boundaries, multiple_of=b.multiple_of)
    return DataLoader(IndexedPrompts(dataset), batch_sampler=sampler, collate_fn=collate), sampler


class PromptColumns:
    """A prompt dataset's record columns for the rewards: the prompt as given and every other column
    (answers, ids of the source), read once, looked up per row by dataset index."""

    def __init__(self, dataset: Any, tokenizer: Any) -> None:
        names = list(getattr(dataset, "column_names", None) or (dataset[0].keys() if len(dataset) else []))
        kept = [n for n in names if n not in NOT_REWARD_COLUMNS]
        if getattr(dataset, "column_names", None) is not None:
            self.columns = {n: list(dataset[n]) for n in kept}
        else:
            self.columns = {n: [dataset[i][n] for i in range(len(dataset))] for n in kept}
        if "prompt" not in self.columns:  # a dataset of token ids alone: the prompt is its text
            ids = IndexedPrompts(dataset).ids
            self.columns["prompt"] = [tokenizer.decode(x, skip_special_tokens=True) for x in ids]

    def rows(self, indices: Sequence[int]) -> tuple[list[Any], dict[str, list[Any]]]:
        """(prompts, other columns) of the records at `indices`, in that order."""
        prompts = [self.columns["prompt"][i] for i in indices]
        others = {n: [v[i] for i in indices] for n, v in self.columns.items() if n != "prompt"}
        return prompts, others
