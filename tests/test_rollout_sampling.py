"""The GRPO sampler (`workbench.generate.sample_rollout`, `read_rollout`) and top-p: on plain CPU in
process (log-probs against a training forward, top-p against transformers' warper), and on XLA:CPU
in one subprocess (tests/xla/rollout.py: compiles, host transfers, rows split over data x fsdp)."""

from __future__ import annotations

import pytest
import torch

from tests.xla.generation import prompts, tiny_model
from workbench.decoding import top_p_filter
from workbench.generate import generate, read_rollout, sample_rollout

PAD = 0
LENGTHS = (3, 7, 13, 9)  # one bucket of 16, four rows


def left_padded(batch: list[list[int]], bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(batch), bucket), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(batch):
        ids[r, bucket - len(p) :] = torch.tensor(p)
        mask[r, bucket - len(p) :] = 1
    return ids, mask


def training_logps(model, rollout, temperature: float) -> torch.Tensor:
    """What a GRPO training step computes: a forward of the whole rows, logits[:, P-1:-1] / T at the completion."""
    with torch.no_grad():
        logits = model(
            input_ids=rollout.sequences,
            attention_mask=rollout.attention_mask,
            position_ids=rollout.position_ids,
        ).logits.float()
    prompt_len = rollout.sequences.shape[1] - rollout.completion_ids.shape[1]
    scaled = logits[:, prompt_len - 1 : -1] / (temperature if temperature > 0 else 1.0)
    return torch.log_softmax(scaled, dim=-1).gather(-1, rollout.completion_ids[..., None])[..., 0]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.mark.parametrize("temperature, top_p", [(0.7, 0.9), (0.0, 1.0)])
def test_rollout_logps_equal_a_training_forward_of_its_sequences(model, temperature, top_p):
    batch = prompts(LENGTHS)
    ids, mask = left_padded(batch, 16)
    kwargs = dict(max_new_tokens=12, temperature=temperature, top_p=top_p, pad_token_id=PAD, seed=3)
    free = sample_rollout(model, ids, mask, eos_token_id=None, **kwargs)
    eos = int(free.completion_ids[1, 4])  # the second row reaches it by its fifth token
    rollout = sample_rollout(model, ids, mask, eos_token_id=eos, **kwargs)
    budget = rollout.completion_ids.shape[1]
    assert budget == 16 and rollout.sequences.shape == (4, 16 + budget)

    tokens, finished = read_rollout(rollout)
    assert finished[1] and len(tokens[1]) <= 5 and tokens[1][-1] == eos
    assert all(len(t) == 12 or (f and t[-1] == eos) for t, f in zip(tokens, finished))
    assert rollout.lengths.tolist() == [len(t) for t in tokens]
    for r, row in enumerate(tokens):  # same draws until a row ends: the eos run is the free run cut
        assert row == free.completion_ids[r, : len(row)].tolist()
        assert rollout.completion_ids[r, len(row) :].eq(PAD).all()
        assert rollout.completion_mask[r].tolist() == [1.0] * len(row) + [0.0] * (budget - len(row))
        assert rollout.logps[r, len(row) :].eq(0).all() and rollout.logps[r, : len(row)].lt(0).all()
    expected_mask = torch.cat([mask, rollout.completion_mask.long()], dim=1)
    assert torch.equal(rollout.attention_mask, expected_mask)
    assert torch.equal(rollout.sequences, torch.cat([ids, rollout.completion_ids], dim=1))

    expected = training_logps(model, rollout, temperature) * rollout.completion_mask
    torch.testing.assert_close(rollout.logps, expected, atol=1e-5, rtol=0)


def test_rollout_samples_what_generate_samples_and_greedy_is_model_generate(model):
    from tests.xla.generation import reference

    batch = prompts(LENGTHS)
    ids, mask = left_padded(batch, 16)
    opts = dict(max_new_tokens=8, temperature=0.8, top_k=50, top_p=0.9)
    rollout = sample_rollout(model, ids, mask, eos_token_id=None, pad_token_id=PAD, seed=7, **opts)
    same = generate(model, batch, buckets=[16], max_batch_size=4, eos_token_id=None, seed=7, **opts)
    assert read_rollout(rollout)[0] == same.token_ids  # the same rows, generator and filters

    expected = reference(model, batch, new=8)
    greedy = sample_rollout(
        model, ids, mask, max_new_tokens=8, temperature=0, eos_token_id=None, pad_token_id=PAD
    )
    assert read_rollout(greedy)[0] == expected
    tiny_nucleus = generate(model, batch, max_new_tokens=8, temperature=1.0, top_p=1e-6, seed=1)
    assert tiny_nucleus.token_ids == expected  # only the most likely token is left


@pytest.mark.parametrize("top_p", [0.9, 0.5, 0.999, 1e-4])
def test_top_p_keeps_exactly_the_tokens_transformers_keeps(top_p):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn((16, 300), generator=gen) * 3 / 0.7  # after a temperature of 0.7
    theirs = TopPLogitsWarper(top_p)(None, logits.clone())
    ours = top_p_filter(logits, top_p)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    assert torch.isfinite(ours).sum(-1).min() >= 1 and torch.equal(
        ours[torch.isfinite(ours)], logits[torch.isfinite(ours)]
    )
    top_k = TopKLogitsWarper(40)(None, logits.clone())  # after top-k, as model.generate orders them
    assert torch.equal(
        torch.isfinite(top_p_filter(top_k, top_p)), torch.isfinite(TopPLogitsWarper(top_p)(None, top_k))
    )


def test_bad_rollout_arguments_say_what_is_allowed(model):
    ids, mask = left_padded(prompts((3, 5)), 8)
    common = dict(max_new_tokens=4, temperature=1.0, eos_token_id=None, pad_token_id=PAD)
    with pytest.raises(ValueError, match=r"top_p=1.5 is not allowed: must be a number in \(0, 1\]"):
        sample_rollout(model, ids, mask, top_p=1.5, **common)
    with pytest.raises(ValueError, match="top_p=0 is not allowed"):
        generate(model, [[3, 4]], max_new_tokens=2, temperature=1.0, top_p=0)
    with pytest.raises(ValueError, match="must be left-padded"):
        sample_rollout(model, ids, mask.flip(1), **common)
    with pytest.raises(ValueError, match="must match input_ids"):
        sample_rollout(model, ids, mask[:, 1:], **common)


# ---- XLA:CPU: one subprocess -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def xla_rollout(xla_scenario):
    """tests/xla/rollout.py, once: unsharded and data x fsdp rollouts on 8 virtual devices."""
    return xla_scenario("rollout", devices=8)


@pytest.mark.xla
@pytest.mark.slow
def test_xla_a_second_rollout_compiles_nothing_and_reads_nothing(xla_rollout):
    plain = xla_rollout["plain"]
    assert plain["compiles"] == [3, 0]  # prefill, decode step, layout; then nothing for other prompts
    assert plain["transfers_sampling"] == 0 and plain["transfers_read"] == 1
    assert plain["logps_max_error"] < 1e-4
    assert plain["prewarm"] == [3, 0]  # prewarm_rollout compiled what a rollout in its bucket runs


@pytest.mark.xla
@pytest.mark.slow
def test_xla_rollout_rows_split_over_data_and_fsdp(xla_rollout):
    plain, sharded = xla_rollout["plain"], xla_rollout["sharded"]
    assert sharded["input_sharding"].startswith("{devices=[8,1]")  # rows over all 8: data x fsdp
    assert sharded["output_sharding"].startswith("{devices=[8,1]")
    assert sharded["cache_sharding"].startswith("{devices=[8,")  # the KV cache followed the rows
    assert sharded["compiles"] == [3, 0] and sharded["transfers_sampling"] == 0
    assert sharded["transfers_read"] == 1 and sharded["logps_max_error"] < 1e-4
    assert sharded["sampled"] == plain["sampled"]  # the same seed draws the same tokens when split
    assert sharded["greedy_matches_cpu"]
