"""Text to device-ready batches: corpus and tokenizer, records, bucket plans, sampler, collators, loader.

The flow: `records.build_datasets` (load, tokenise, split, shard by host) -> `loader.make_loader`
(a bucket plan from `buckets`, the `sampler` that batches within a bucket, a `collate` function
that pads to the bucket or packs) -> the trainer's stream.
"""

from workbench.data.bucket_choice import choose_buckets
from workbench.data.buckets import STRATEGIES, BucketChoice, BucketPlan, padded_tokens_for, plan_buckets
from workbench.data.chat import IGNORE_INDEX, chat_token_ids
from workbench.data.collate import (
    BucketCollator,
    PackedCollator,
    PairCollator,
    pack_plan,
    pack_sequences,
    packing_efficiency,
)
from workbench.data.corpus import (
    ASSETS,
    CHAT_SAMPLE,
    PREFERENCE_SAMPLE,
    embedded_corpus,
    generate_chat_sample,
)
from workbench.data.loader import make_loader, plan_for_config, prewarm, synthetic_batch, training_epochs
from workbench.data.preference import is_pair_dataset, load_pairs, tokenize_pairs
from workbench.data.records import build_datasets, load_records, tokenize_records
from workbench.data.sampler import BucketBatchSampler
from workbench.data.tokenizer import CACHE_ENV, CHAT_TEMPLATE, cache_root, get_tokenizer, train_tokenizer

__all__ = [
    "ASSETS",
    "CACHE_ENV",
    "CHAT_SAMPLE",
    "CHAT_TEMPLATE",
    "IGNORE_INDEX",
    "PREFERENCE_SAMPLE",
    "STRATEGIES",
    "BucketBatchSampler",
    "BucketChoice",
    "BucketCollator",
    "BucketPlan",
    "PackedCollator",
    "PairCollator",
    "build_datasets",
    "cache_root",
    "chat_token_ids",
    "choose_buckets",
    "embedded_corpus",
    "generate_chat_sample",
    "get_tokenizer",
    "is_pair_dataset",
    "load_pairs",
    "load_records",
    "make_loader",
    "pack_plan",
    "pack_sequences",
    "packing_efficiency",
    "padded_tokens_for",
    "plan_buckets",
    "plan_for_config",
    "prewarm",
    "synthetic_batch",
    "tokenize_pairs",
    "tokenize_records",
    "train_tokenizer",
    "training_epochs",
]
