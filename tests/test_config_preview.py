"""What the config panel recomputes on a change (`widgets.config_preview`), without any widget."""

from __future__ import annotations

import pytest

from widgets.config_preview import BucketPreview, load_lengths, preview_config
from workbench.analysis.batch import max_batch_size
from workbench.analysis.estimate import estimate
from workbench.backend.targets import TARGETS, Target
from workbench.config import WorkbenchConfig
from workbench.data.buckets import plan_buckets

LENGTHS = [12, 17, 30, 31, 45, 60, 64, 90, 120, 128, 200, 250] * 20
COSTS = (10.0, 1e-6)


def _cfg(**overrides):
    base = {"mesh.enabled": True, "mesh.data": 4, "mesh.fsdp": 2, "mesh.model": 1, "bucketing.max_buckets": 3}
    return WorkbenchConfig().with_overrides({**base, **overrides})


def test_the_preview_is_what_the_estimator_and_the_planners_say():
    cfg, target = _cfg(), TARGETS["v5e-8"]
    lengths, missing = load_lengths(LENGTHS, cfg)
    assert missing is None
    preview = preview_config(cfg, target, headroom=0.1, buckets=BucketPreview(lengths), costs=COSTS)
    settings = dict(
        optimizer=cfg.train.optimizer,
        precision=cfg.train.precision,
        mesh={"data": 4, "fsdp": 2, "model": 1},
        attention="flash",  # model.attention=auto on a TPU
    )
    memory = target.memory_per_device_bytes
    direct = estimate(cfg.model, batch_size=8, seq_len=256, memory_bytes=memory, **settings)
    assert preview.estimate.total_bytes == direct.total_bytes
    largest = max_batch_size(
        cfg.model, seq_len=256, memory_bytes=memory, headroom=0.1, multiple_of=8, **settings
    )
    assert preview.largest_batch == largest > 0 and preview.largest_batch % 8 == 0
    expected = plan_buckets(
        [min(n, 256) for n in LENGTHS], 3, multiple_of=8, max_length=256, strategy="optimal"
    )
    assert preview.plan.boundaries == expected.boundaries
    assert preview.bucket_choice.compile_seconds == 10.0
    # memory unknown (a plain CPU's): no largest batch
    cpu = Target("cpu", "cpu", 8, memory_per_device_bytes=None)
    assert (
        preview_config(cfg, cpu, headroom=0.1, buckets=BucketPreview(lengths), costs=COSTS).largest_batch
        is None
    )


def test_bucket_plans_are_computed_once_per_setting():
    buckets = BucketPreview(load_lengths(LENGTHS, _cfg())[0])
    plan, choice = buckets.plan(_cfg(), COSTS)
    # a memory setting changes no plan: the same objects come back, nothing is replanned
    assert buckets.plan(_cfg(**{"train.optimizer": "sgd", "lora.rank": 0}), COSTS) == (plan, choice)
    assert buckets.plan(_cfg(), COSTS)[0] is plan
    other, _ = buckets.plan(_cfg(**{"bucketing.max_buckets": 5}), COSTS)
    assert other is not plan and len(other.boundaries) > len(plan.boundaries)
    auto, auto_choice = buckets.plan(_cfg(**{"bucketing.max_buckets": "auto"}), COSTS)
    assert auto.choice is auto_choice is choice and auto.num_shapes == choice.chosen
    assert buckets.plan(_cfg(), (100.0, 1e-6))[1] is not choice  # dearer compiles: choose again
    assert BucketPreview(None).plan(_cfg(), COSTS) == (None, None)


def test_lengths_come_from_a_column_or_say_why_they_are_missing():
    from datasets import Dataset

    lengths, missing = load_lengths(Dataset.from_dict({"length": [3, 5, 8], "text": ["a", "b", "c"]}), _cfg())
    assert list(lengths) == [3, 5, 8] and missing is None
    with pytest.raises(ValueError, match="positive token counts"):
        load_lengths([4, 0], _cfg())
    lengths, missing = load_lengths(None, _cfg(**{"data.source": "/no/such/data.jsonl"}))
    assert lengths is None and missing.startswith("no length sample (FileNotFoundError: ")
    assert "/no/such/data.jsonl" in missing
