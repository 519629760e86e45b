"""Bucket planning, bucketed batches, collation, packing and compile prewarm."""

from __future__ import annotations

import bisect
import itertools
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.config import WorkbenchConfig
from workbench.data.buckets import padded_tokens_for, plan_buckets
from workbench.data.chat import IGNORE_INDEX
from workbench.data.collate import (
    BucketCollator,
    PackedCollator,
    _packed_attention_choice,
    pack_plan,
    pack_sequences,
    packing_efficiency,
    padded_length,
)
from workbench.data.loader import make_loader, synthetic_batch
from workbench.data.sampler import BucketBatchSampler

# ---- the planner ------------------------------------------------------------------------------


def _brute_force(lengths: list[int], k: int, multiple: int, top: int) -> int:
    """Fewest padded tokens over every set of <= k multiples of `multiple` whose largest is `top`."""
    candidates = list(range(multiple, top, multiple))
    if k > len(candidates):  # every candidate fits under the cap, and a boundary more never pads more
        return sum(min(b for b in [*candidates, top] if b >= n) for n in lengths)
    best = None
    for extra in range(k):
        for chosen in itertools.combinations(candidates, extra):
            bounds = [*chosen, top]
            cost = sum(bounds[bisect.bisect_left(bounds, n)] for n in lengths)
            best = cost if best is None else min(best, cost)
    assert best is not None
    return best


@settings(max_examples=150, deadline=None, database=None)
@given(
    lengths=st.lists(st.integers(1, 24), min_size=1, max_size=12),
    k=st.one_of(st.none(), st.integers(1, 4)),
    multiple=st.integers(1, 4),
    max_length=st.one_of(st.none(), st.integers(1, 30)),
)
def test_optimal_never_pads_more_than_brute_force(lengths, k, multiple, max_length):
    plan = plan_buckets(lengths, k, multiple_of=multiple, max_length=max_length)
    limit = max_length if max_length is not None else max(lengths)
    clipped = [min(n, limit) for n in lengths]
    top = -(-limit // multiple) * multiple
    if k is None:  # no cap: as many boundaries as there are candidate multiples
        k = top // multiple
    assert plan.boundaries == sorted(set(plan.boundaries))
    assert 1 <= plan.num_shapes <= k
    assert all(b % multiple == 0 for b in plan.boundaries)
    assert plan.boundaries[-1] == top  # every length up to max_length fits the last boundary
    assert plan.padded_tokens == padded_tokens_for(clipped, plan.boundaries)  # stats are honest
    assert plan.real_tokens == sum(clipped)
    assert plan.padded_tokens <= _brute_force(clipped, k, multiple, top)
    assert plan.truncated == sum(n > limit for n in lengths)


def test_optimal_beats_or_ties_every_other_strategy_with_as_many_shapes():
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(4.5, 0.8, size=5000).astype(int), 1, 512)
    for strategy in ("pow2", "multiple", "quantile", "max"):
        other = plan_buckets(lengths, 6, multiple_of=8, max_length=512, strategy=strategy)
        best = plan_buckets(lengths, other.num_shapes, multiple_of=8, max_length=512)
        assert best.padded_tokens <= other.padded_tokens, strategy
        assert best.efficiency >= other.efficiency


def test_plan_on_a_hand_checked_example():
    # Lengths 3,3,3,10,10,50: two buckets at 10 and 50 cost 4*10+... exactly as counted by hand.
    plan = plan_buckets([3, 3, 3, 10, 10, 50], 2)
    assert plan.boundaries == [10, 50]
    assert plan.padded_tokens == 5 * 10 + 50 and plan.real_tokens == 79
    assert plan.counts == [5, 1]
    # no cap, max_length above every length: the top boundary is an extra one, not one of the cap
    uncapped = plan_buckets([10, 20], None, max_length=30)
    assert uncapped.boundaries == [10, 20, 30] and uncapped.padded_tokens == 30
    assert plan.bucket_for(4) == 10 and plan.bucket_for(11) == 50
    assert plan.efficiency == pytest.approx(79 / 100)
    with pytest.raises(ValueError, match="longer than the last boundary"):
        plan.bucket_for(51)
    three = plan_buckets([3, 3, 3, 10, 10, 50], 3)
    assert three.boundaries == [3, 10, 50] and three.padded_tokens == 79


def test_strategies_shapes():
    lengths = [5, 20, 33, 70, 100, 129, 250]
    assert plan_buckets(lengths, None, strategy="pow2").boundaries == [8, 16, 32, 64, 128, 250]
    assert plan_buckets(lengths, 3, strategy="pow2").boundaries == [64, 128, 250]
    assert plan_buckets(lengths, None, multiple_of=128, strategy="multiple").boundaries == [128, 256]
    assert plan_buckets(lengths, None, multiple_of=8, max_length=64, strategy="max").boundaries == [64]
    quant = plan_buckets(lengths, 2, multiple_of=8, strategy="quantile")
    assert quant.boundaries[-1] == 256 and quant.num_shapes <= 2
    unlimited = plan_buckets(lengths, None)
    assert unlimited.efficiency == 1.0 and unlimited.num_shapes == len(set(lengths))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lengths": [], "max_buckets": 2}, "empty"),
        ({"lengths": [1, 0], "max_buckets": 2}, "must be >= 1"),
        ({"lengths": [3], "max_buckets": 0}, "max_buckets=0"),
        ({"lengths": [3], "max_buckets": 2, "strategy": "best"}, "strategy='best'"),
        ({"lengths": [3], "max_buckets": 2, "multiple_of": 0}, "multiple_of=0"),
    ],
)
def test_planner_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_buckets(**kwargs)


# ---- the sampler -----------------------------------------------------------------------------


def _lengths(n: int = 400, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 120, size=n)


def test_sampler_batches_stay_inside_one_bucket_and_cover_shapes():
    lengths = _lengths()
    plan = plan_buckets(lengths, 4, multiple_of=8)
    sampler = BucketBatchSampler(lengths, plan.boundaries, batch_size=6, dp_size=4, seed=3)
    shapes = set(sampler.batch_shapes())
    seen = set()
    batches = list(sampler)
    assert len(batches) == len(sampler)
    for batch in batches:
        assert len(batch) == 4  # 6 rounded down to a multiple of dp_size 4
        buckets = {plan.bucket_for(lengths[i]) for i in batch}
        assert len(buckets) == 1
        seen.add((len(batch), buckets.pop()))
    assert seen == shapes
    flat = [i for b in batches for i in b]
    assert len(flat) == len(set(flat))  # nothing twice in an epoch
    assert len(flat) + sampler.report()["dropped_remainder_per_epoch"] == len(lengths)


def test_sampler_token_budget_gives_each_bucket_its_batch_size():
    lengths = _lengths()
    sampler = BucketBatchSampler(lengths, [32, 64, 128], tokens_per_batch=512, dp_size=2)
    sizes = {b["length"]: b["batch_size"] for b in sampler.report()["buckets"]}
    assert sizes == {32: 16, 64: 8, 128: 4}
    assert all(b * n <= 512 for b, n in sampler.batch_shapes())
    tiny = BucketBatchSampler(lengths, [128], tokens_per_batch=100, dp_size=4)
    assert tiny.batch_shapes() == [(4, 128)]  # never below the data-parallel size


def test_sampler_is_deterministic_and_reshuffles_per_epoch():
    lengths = _lengths()
    a = BucketBatchSampler(lengths, [40, 80, 120], batch_size=8, seed=7)
    b = BucketBatchSampler(lengths, [40, 80, 120], batch_size=8, seed=7)
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    c = BucketBatchSampler(lengths, [40, 80, 120], batch_size=8, seed=8)
    assert list(c) != first
    still = BucketBatchSampler(lengths, [40, 80, 120], batch_size=8, shuffle=False)
    assert list(still) == list(still)


def test_sampler_resumes_mid_epoch_from_state_dict():
    lengths = _lengths()
    sampler = BucketBatchSampler(lengths, [40, 80, 120], batch_size=8, seed=1)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.set_epoch(2)
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(5)]
    state = sampler.state_dict()
    assert state == {"epoch": 2, "position": 5, "seed": 1}
    fresh = BucketBatchSampler(lengths, [40, 80, 120], batch_size=8, seed=1)
    fresh.load_state_dict(state)
    assert head + list(fresh) == full
    with pytest.raises(ValueError, match="seed"):
        BucketBatchSampler(lengths, [120], batch_size=8, seed=2).load_state_dict(state)


def test_sampler_counts_overflow_and_never_hides_it():
    lengths = [10, 20, 30, 200, 300]
    with pytest.warns(RuntimeWarning, match="2 of 5 sequences are longer than 64 tokens: truncated"):
        trunc = BucketBatchSampler(lengths, [32, 64], batch_size=1)
    report = trunc.report()
    assert report["overflow"] == 2 and report["overflow_tokens_cut"] == 136 + 236
    assert sorted(i for b in trunc for i in b) == [0, 1, 2, 3, 4]
    with pytest.warns(RuntimeWarning, match="dropped"):
        drop = BucketBatchSampler(lengths, [32, 64], batch_size=1, overflow="drop")
    assert sorted(i for b in drop for i in b) == [0, 1, 2]
    assert drop.report()["dropped_overflow"] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BucketBatchSampler([10, 20], [32], batch_size=1)  # no overflow, no warning


def test_sampler_without_drop_last_lists_the_remainder_shapes():
    lengths = [5] * 5 + [50] * 3
    sampler = BucketBatchSampler(lengths, [8, 64], batch_size=2, drop_last=False, shuffle=False)
    assert sampler.batch_shapes() == [(1, 8), (1, 64), (2, 8), (2, 64)]
    assert sorted(i for b in sampler for i in b) == list(range(8))
    unbucketed = BucketBatchSampler([3, 5, 5, 9], None, batch_size=2)
    assert unbucketed.batch_shapes() == [(2, 5), (2, 9)]  # two members: never as short as 3
    rounded = BucketBatchSampler([3, 5, 5, 9, 17], None, batch_size=2, multiple_of=8, drop_last=False)
    assert rounded.batch_shapes() == [(1, 8), (1, 16), (1, 24), (2, 8), (2, 16), (2, 24)]


def test_sampler_rejects_bad_arguments():
    with pytest.raises(
        ValueError,
        match="exactly one of batch_size or tokens_per_batch; got batch_size=None and tokens_per_batch=None",
    ):
        BucketBatchSampler([1], [8])
    with pytest.raises(ValueError, match="got batch_size=4 and tokens_per_batch=256"):
        BucketBatchSampler([1], [8], batch_size=4, tokens_per_batch=256)
    with pytest.raises(ValueError, match="drop_last=False is not allowed with dp_size=2: use drop_last=True"):
        BucketBatchSampler([1] * 5, [8], batch_size=2, dp_size=2, drop_last=False)
    with pytest.raises(ValueError, match="multiple_of=0 is not allowed"):
        BucketBatchSampler([1], None, batch_size=1, multiple_of=0)
    with pytest.raises(ValueError, match="overflow='cut'"):
        BucketBatchSampler([1], [8], batch_size=1, overflow="cut")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dp_size=0"):
        BucketBatchSampler([1], [8], batch_size=1, dp_size=0)


# ---- collators and packing --------------------------------------------------------------------


def test_bucket_collator_pads_to_the_boundary():
    collate = BucketCollator(pad_token_id=0, boundaries=[4, 8, 16], max_length=12)
    batch = collate([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [1, 2, 3, 4, 5]}])
    assert batch["input_ids"].shape == (2, 8)
    assert batch["input_ids"][0].tolist() == [5, 6, 7, 0, 0, 0, 0, 0]
    assert batch["labels"][0].tolist() == [-100, 6, 7] + [IGNORE_INDEX] * 5
    assert batch["labels"][1, :5].tolist() == [1, 2, 3, 4, 5]
    assert batch["attention_mask"].sum(1).tolist() == [3, 5]
    long = collate([{"input_ids": list(range(1, 30))}])
    assert long["input_ids"].shape == (1, 16) and long["attention_mask"].sum() == 12  # cut at max_length
    dynamic = BucketCollator(0, None, 64)([[1, 2, 3], [1]])
    assert dynamic["input_ids"].shape == (2, 3)
    assert BucketCollator(0, None, 64, multiple_of=8)([[1, 2, 3], [1]])["input_ids"].shape == (2, 8)


@pytest.mark.parametrize(("boundaries", "multiple_of"), [([4, 8, 16], 1), (None, 1), (None, 8)])
def test_every_collator_pads_a_batch_to_the_same_length(boundaries, multiple_of):
    from workbench.rl.prompt_loader import PromptCollator

    assert (
        padded_length(5, [4, 8, 16]) == 8 and padded_length(0, None) == 1 and padded_length(9, None, 8) == 16
    )
    for longest in (1, 3, 4, 5, 9, 16):
        ids = [list(range(1, longest + 1)), [1]]
        training = BucketCollator(0, boundaries, multiple_of=multiple_of)(ids)["input_ids"]
        prompts = PromptCollator(0, boundaries, multiple_of=multiple_of)(
            [{"input_ids": row, "index": i, "filler": False} for i, row in enumerate(ids)]
        )["input_ids"]
        assert training.shape == prompts.shape == (2, padded_length(longest, boundaries, multiple_of))


@pytest.mark.parametrize(
    ("detects", "flag", "major", "expected"),
    [
        (False, None, 4, "mask4d"),  # transformers < 4.53: no packed detection
        (True, False, 4, "mask4d"),  # 4.x under torch < 2.6: detected, not applied
        (True, True, 4, "position_ids"),
        (True, None, 4, "mask4d"),  # a 4.x without the flag is one we do not know
        (True, None, 5, "position_ids"),  # 5.x dropped the flag with torch < 2.6: always applied
        (False, None, 5, "mask4d"),
    ],
)
def test_packed_attention_default_needs_the_mask_transformers_applies(detects, flag, major, expected):
    assert _packed_attention_choice(detects, flag, major) == expected


def test_packed_attention_default_under_the_installed_transformers():
    # transformers 4.57 (flag True under torch 2.9) and 5.x (no flag) both detect and apply
    assert PackedCollator(0, 8).attention == "position_ids"
    assert PackedCollator(0, 8, attention="mask4d").attention == "mask4d"  # asked for: kept
    with pytest.raises(ValueError, match="attention='flash'"):
        PackedCollator(0, 8, attention="flash")


def test_pack_plan_uses_every_sequence_once_within_the_row():
    lengths = np.random.default_rng(1).integers(1, 64, size=300)
    rows = pack_plan(lengths, 64)
    assert sorted(i for r in rows for i in r) == list(range(300))
    assert all(sum(lengths[i] for i in r) <= 64 for r in rows)
    lower_bound = -(-int(lengths.sum()) // 64)
    assert len(rows) <= lower_bound * 1.1 + 1  # best-fit decreasing is close to the bound
    stats = packing_efficiency(lengths, 64)
    assert stats["rows"] == len(rows) and stats["efficiency"] > 0.9


def test_packed_rows_restart_positions_and_mask_the_border():
    rows = pack_sequences([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}, [6, 7, 8, 9, 10, 11]], 8)
    batch = PackedCollator(0, 8, attention="mask4d")(rows)
    by_len = {tuple(r["seq_lengths"]) for r in rows}
    assert by_len == {(6, 2), (3,)}
    row = [r["seq_lengths"] for r in rows].index([6, 2])
    assert batch["position_ids"][row].tolist() == [0, 1, 2, 3, 4, 5, 0, 1]
    assert batch["labels"][row].tolist() == [IGNORE_INDEX, 7, 8, 9, 10, 11, IGNORE_INDEX, 5]
    allowed = batch["attention_mask"][row, 0] == 0
    assert allowed[7, 6] and allowed[7, 7] and not allowed[7, 5] and not allowed[2, 3]
    other = [r["seq_lengths"] for r in rows].index([3])
    assert batch["position_ids"][other].tolist() == [0, 1, 2, 0, 1, 2, 3, 4]  # padding: own segment
    assert (batch["labels"][other, 3:] == IGNORE_INDEX).all()
    plain = PackedCollator(0, 8, attention="position_ids")(rows)
    assert set(plain) == {"input_ids", "labels", "position_ids"}


def _mask_from_lengths(rows, length):
    """The packed mask built independently, from each row's sequence lengths: True where attention is allowed."""
    allowed = torch.zeros((len(rows), length, length), dtype=torch.bool)
    for r, row in enumerate(rows):
        start = 0
        for n in [*row["seq_lengths"], length - sum(row["seq_lengths"])]:  # the padding is its own segment
            allowed[r, start : start + n, start : start + n] = torch.ones(n, n, dtype=torch.bool).tril()
            start += n
    return allowed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_causal_mask_is_block_diagonal_from_position_resets(dtype):
    from workbench.models.inputs import packed_causal_mask

    gen = torch.Generator().manual_seed(3)
    seqs = [[1] * int(n) for n in torch.randint(1, 24, (40,), generator=gen)]
    rows = pack_sequences(seqs, 32)
    batch = PackedCollator(0, 32, attention="position_ids")(rows)
    mask = packed_causal_mask(batch["position_ids"], dtype)
    assert mask.shape == (len(rows), 1, 32, 32) and mask.dtype == dtype
    assert set(mask.unique().tolist()) == {0.0, torch.finfo(dtype).min}
    assert torch.equal(mask[:, 0] == 0, _mask_from_lengths(rows, 32))
    host = PackedCollator(0, 32, attention="mask4d", mask_dtype=dtype)(rows)["attention_mask"]
    assert torch.equal(host, mask)  # mask4d: the same mask, built on the host from the lengths


def _tiny_model(family="llama", **overrides):
    from workbench.config import ModelConfig
    from workbench.models.build import build_model

    model = build_model(
        ModelConfig(
            family=family, hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=64, vocab_size=128
        )
    ).eval()
    for key, value in overrides.items():
        setattr(model.config, key, value)
    return model


def test_model_inputs_give_every_forward_a_mask_that_needs_no_host_read():
    """Transformers 5 reads the device (a host sync) to look for packed rows in any forward without
    an attention mask; the objective's inputs always carry one, built on the batch's device."""
    from workbench.models.inputs import model_inputs, packed_causal_mask

    model = _tiny_model()
    ids = torch.randint(0, 128, (2, 8))
    plain = model_inputs({"input_ids": ids, "labels": ids, "note": "dropped"}, model)
    assert set(plain) == {"input_ids", "attention_mask"} and torch.equal(
        plain["attention_mask"], torch.ones_like(ids)
    )
    padded = BucketCollator(0, [8])([[1, 2, 3], [4, 5, 6, 7, 8, 9]])
    assert (
        model_inputs(padded, model)["attention_mask"] is padded["attention_mask"]
    )  # a mask of its own: kept
    rows = pack_sequences([[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11]], 8)
    packed = PackedCollator(0, 8, attention="position_ids")(rows)
    inputs = model_inputs(packed, model)
    assert set(inputs) == {"input_ids", "position_ids", "attention_mask"}
    assert torch.equal(inputs["attention_mask"], packed_causal_mask(packed["position_ids"], model.dtype))
    # A sliding window shorter than the row: a ready mask would drop it, so transformers builds the mask.
    windowed = model_inputs(packed, _tiny_model("mistral", sliding_window=4))
    assert set(windowed) == {"input_ids", "position_ids"}
    assert "attention_mask" in model_inputs(packed, _tiny_model("mistral", sliding_window=8))


def _per_sequence_losses(model, batch, rows):
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
    packed, alone = [], []
    for r, row in enumerate(rows):
        start = 0
        for n in row["seq_lengths"]:
            ids = batch["input_ids"][r, start : start + n]
            packed.append(torch.nn.functional.cross_entropy(logits[r, start : start + n - 1], ids[1:]).item())
            alone.append(model(input_ids=ids[None], labels=ids[None], use_cache=False).loss.item())
            start += n
    return packed, alone


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("attention", ["position_ids", "mask4d", "objective"])
def test_packed_loss_equals_loss_alone_on_cpu(family, attention):
    """ "position_ids": transformers' own packed mask; "mask4d": the host's; "objective": the
    position-ids batch through `model_inputs`, the mask built where the batch is."""
    from workbench.models.inputs import model_inputs

    model = _tiny_model(family)
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (7, 13, 5, 20, 9, 2)]
    rows = pack_sequences(seqs, 32)
    assert len(rows) < len(seqs)  # several sequences really share a row
    batch = PackedCollator(0, 32, attention="position_ids" if attention == "objective" else attention)(rows)
    if attention == "objective":
        batch = {**model_inputs(batch, model), "labels": batch["labels"]}
        assert batch["attention_mask"].dim() == 4
    with torch.no_grad():
        packed, alone = _per_sequence_losses(model, batch, rows)
    assert packed == pytest.approx(alone, abs=1e-5)


# ---- make_loader ---------------------------------------------------------------------------


def _token_dataset(n: int = 96, seed: int = 0):
    import datasets

    rng = np.random.default_rng(seed)
    ids = [rng.integers(3, 100, size=int(k)).tolist() for k in rng.integers(2, 60, size=n)]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids, "length": [len(x) for x in ids]})


def test_make_loader_buckets_per_config():
    ds = _token_dataset()
    cfg = WorkbenchConfig().with_overrides(
        ["data.max_length=64", "bucketing.max_buckets=3", "bucketing.multiple_of=8", "train.batch_size=8"]
    )
    loader, sampler = make_loader(ds, cfg, pad_token_id=0, dp_size=2, seed=0)
    assert loader.batch_sampler is sampler and len(sampler.batch_shapes()) <= 3
    shapes = set()
    for batch in loader:
        shapes.add(tuple(batch["input_ids"].shape))
        assert batch["input_ids"].shape[1] % 8 == 0
        real = batch["attention_mask"].sum().item()
        assert (batch["labels"] != IGNORE_INDEX).sum().item() == real
    assert shapes == set(sampler.batch_shapes())
    budget = cfg.with_overrides(["bucketing.tokens_per_batch=256"])
    _, s2 = make_loader(ds, budget, pad_token_id=0, dp_size=2)
    assert all(b * n <= 256 and b % 2 == 0 for b, n in s2.batch_shapes())
    _, pad_max = make_loader(ds, cfg.with_overrides(["bucketing.strategy=max"]), pad_token_id=0)
    assert pad_max.batch_shapes() == [(8, 64)]
    _, none = make_loader(ds, cfg.with_overrides(["bucketing.strategy=none"]), pad_token_id=0)
    assert len(none.batch_shapes()) > 3  # one shape per possible longest member


def test_make_loader_without_buckets_lists_exactly_the_shapes_it_pads_to():
    import datasets

    # Mostly short sequences, so that even "all four members pad to 8" occurs every epoch.
    rng = np.random.default_rng(2)
    sizes = [*rng.integers(2, 9, size=150), *rng.integers(9, 17, size=30), *rng.integers(17, 30, size=20)]
    ids = [rng.integers(3, 100, size=int(k)).tolist() for k in sizes]
    ds = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids, "length": [len(x) for x in ids]})
    cfg = WorkbenchConfig().with_overrides(
        ["data.max_length=64", "bucketing.strategy=none", "bucketing.multiple_of=8", "train.batch_size=4"]
    )
    loader, sampler = make_loader(ds, cfg, pad_token_id=0, dp_size=2, seed=0)
    listed = set(sampler.batch_shapes())
    assert listed == {(4, 8), (4, 16), (4, 24), (4, 32)}  # padded as the collator pads, not raw lengths
    produced = set()
    for epoch in range(3):  # which longest members occur depends on the shuffle: a few epochs see all
        sampler.set_epoch(epoch)
        shapes = {tuple(batch["input_ids"].shape) for batch in loader}
        assert shapes <= listed  # never a shape prewarm did not compile
        produced |= shapes
    assert produced == listed  # and none it compiled for nothing


def test_make_loader_packs_per_config():
    ds = _token_dataset()
    long = _token_dataset(4, seed=5).map(
        lambda r: {"input_ids": r["input_ids"] * 3, "labels": r["labels"] * 3}
    )
    cfg_long = WorkbenchConfig().with_overrides(
        ["data.max_length=32", "bucketing.packing=true", "bucketing.overflow=drop"]
    )
    with pytest.warns(RuntimeWarning, match="dropped before packing"):
        _, dropped = make_loader(long, cfg_long.with_overrides(["train.batch_size=1"]), pad_token_id=0)
    assert dropped.report()["packing"]["overflow"] >= 1
    cfg = WorkbenchConfig().with_overrides(
        ["data.max_length=64", "bucketing.packing=true", "train.batch_size=4"]
    )
    loader, sampler = make_loader(ds, cfg, pad_token_id=0, seed=0)
    assert sampler.batch_shapes() == [(4, 64)]
    assert (
        sampler.report()["packing"]["sequences"] == len(ds)
        and sampler.report()["packing"]["efficiency"] > 0.9
    )
    total = 0
    for batch in loader:
        assert batch["input_ids"].shape == (4, 64)
        total += int((batch["position_ids"] == 0).sum())
    assert total >= len(ds) * 0.7  # most sequences start a segment somewhere in the epoch's rows


def test_synthetic_batch_has_the_loader_layout():
    batch = synthetic_batch((4, 24), vocab_size=50)
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (4, 24),
        "attention_mask": (4, 24),
        "labels": (4, 24),
    }
    assert batch["input_ids"].dtype == torch.long and int(batch["input_ids"].max()) < 50


def test_synthetic_batch_follows_a_packed_template():
    rows = pack_sequences([{"input_ids": list(range(1, 9))}, {"input_ids": list(range(1, 6))}], 16)
    template = PackedCollator(0, 16, attention="mask4d")(rows)
    fake = synthetic_batch((3, 16), vocab_size=50, template=template)
    assert set(fake) == set(template)
    assert {k: tuple(v.shape) for k, v in fake.items()} == {
        "input_ids": (3, 16),
        "labels": (3, 16),
        "position_ids": (3, 16),
        "attention_mask": (3, 1, 16, 16),
    }
    assert all(fake[k].dtype == template[k].dtype for k in fake)
    assert torch.equal(fake["position_ids"][2], torch.arange(16))
    assert torch.equal(
        fake["attention_mask"][2], template["attention_mask"][0]
    )  # the mask's layout, broadcast
    again = synthetic_batch((3, 16), vocab_size=50, template=template)
    assert torch.equal(fake["input_ids"], again["input_ids"])  # deterministic, private generator


# ---- on XLA: packed attention and compile counts ------------------------------------------------


@pytest.fixture(scope="module")
def packed_on_xla(xla_scenario):
    """tests/xla/packed_attention.py: three sequences packed into one row, Llama and Qwen2, with
    position_ids, with a 4-D mask, and with position_ids through the workbench's model inputs."""
    return xla_scenario("packed_attention")


@pytest.mark.xla
@pytest.mark.slow
def test_three_short_sequences_pack_into_one_row(packed_on_xla):
    assert packed_on_xla["rows"] == 1


@pytest.mark.xla
@pytest.mark.slow
def test_packed_loss_equals_loss_alone_on_xla(packed_on_xla):
    for key, diff in packed_on_xla["diffs"].items():
        assert diff < 1e-5, key


@pytest.mark.xla
@pytest.mark.slow
def test_packed_forward_through_model_inputs_reads_nothing_on_the_host(packed_on_xla):
    """The objective's packed forward and a host-built 4-D mask need no device read. (The bare
    position-ids forward, transformers' own detection, reads the device once under
    transformers 5: ``find_packed_sequence_indices``.)"""
    for family in ("llama", "qwen2"):
        for layout in ("objective", "mask4d"):
            assert packed_on_xla["transfers"][f"{family}/{layout}"] == 0, (family, layout, packed_on_xla)


@pytest.fixture(scope="module")
def packed_training(xla_scenario):
    """tests/xla/packed_training.py: a packed Trainer run, data=2 x fsdp=4 over 8 devices."""
    return xla_scenario("packed_training")


@pytest.mark.xla
@pytest.mark.slow
def test_packed_sharded_training_runs_the_position_ids_layout(packed_training):
    assert packed_training["keys"] == ["input_ids", "labels", "position_ids"], packed_training
    assert packed_training["packing"]["rows"] < packed_training["packing"]["sequences"]
    assert all(x == x for x in packed_training["losses"]), packed_training


@pytest.mark.xla
@pytest.mark.slow
def test_packed_sharded_training_makes_no_host_transfers_between_log_steps(packed_training):
    # transformers 5 without the objective's mask: one transfer per forward ([3, 3] here)
    assert packed_training["transfers"] == [0, 0], packed_training


@pytest.mark.xla
@pytest.mark.slow
def test_packed_sharded_training_compiles_nothing_after_warmup(packed_training):
    assert packed_training["compiles_after_warmup"] == 0, packed_training


@pytest.fixture(scope="module")
def bucket_compiles(xla_scenario):
    """tests/xla/bucketed_compiles.py: a two-micro-batch step (two programs) over a bucketed
    loader after prewarm, then over an unbucketed one."""
    return xla_scenario("bucketed_compiles")


PROGRAMS_PER_STEP = 2  # the scenario's step: a first and an accumulating micro-batch pass


@pytest.mark.xla
@pytest.mark.slow
def test_prewarm_compiles_each_bucket_shape(bucket_compiles):
    bucketed = bucket_compiles["bucketed"]
    assert bucketed["warm"] == bucketed["shapes"] * PROGRAMS_PER_STEP


@pytest.mark.xla
@pytest.mark.slow
def test_bucketed_run_compiles_only_in_prewarm(bucket_compiles):
    assert bucket_compiles["bucketed"]["during"] == 0


@pytest.mark.xla
@pytest.mark.slow
def test_bucketed_run_makes_no_hidden_host_transfers(bucket_compiles):
    assert bucket_compiles["bucketed"]["transfers"] == 0  # no hidden device->host syncs in the step


@pytest.mark.xla
@pytest.mark.slow
def test_unbucketed_run_compiles_per_length(bucket_compiles):
    unbucketed = bucket_compiles["unbucketed"]
    assert unbucketed["lengths"] >= 3
    assert unbucketed["during"] == unbucketed["lengths"] * PROGRAMS_PER_STEP
