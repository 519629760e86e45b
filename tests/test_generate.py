"""Sampling (`workbench.generate`), the `generate` command, eval perplexity and the training path's
KV cache: on plain CPU in process, and on XLA:CPU in subprocesses (tests/xla/generation.py; the fixed
set of programs, prewarm, stop strings and the repetition penalty: tests/xla/generate_fixed_programs.py)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.xla.generate_fixed_programs import (
    PENALTY,
    reference_with,
    small_tokenizer,
    stop_case,
    text_prompts,
)
from tests.xla.generation import FIRST, SECOND, prompts, reference, tiny_model
from workbench.generate import GenerationResult, generate, prewarm_generation, static_cache

BUCKETS = [8, 16, 32]


# ---- plain CPU: the same tokens as model.generate ------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_matches_model_generate_for_a_batch_of_lengths(family):
    model = tiny_model(family)
    batch = prompts(FIRST + SECOND)  # several lengths, several in one bucket (left-padded together)
    result = generate(model, batch, max_new_tokens=12, buckets=BUCKETS)
    assert result.token_ids == reference(model, batch, new=12)
    assert result.buckets == [8, 8, 16, 32, 8, 8, 16, 32]
    assert result.compiles == 0 and result.new_tokens == sum(map(len, result.token_ids))


def test_greedy_matches_model_generate_on_a_sliding_window_longer_prompt():
    model = tiny_model("mistral", sliding_window=8)
    batch = prompts((5, 13, 20))  # two prompts longer than the window
    assert generate(model, batch, max_new_tokens=12, buckets=BUCKETS).token_ids == reference(model, batch, 12)
    assert all(static_cache(model, 48).is_sliding)  # StaticSlidingWindowLayer, the window's size


def test_stops_at_end_of_sequence_like_model_generate():
    model = tiny_model("llama")
    batch = prompts((3, 7, 13))
    free = generate(model, batch, max_new_tokens=12, buckets=BUCKETS, eos_token_id=None)
    eos = free.token_ids[1][4]  # a token the second prompt reaches at step 5
    model.generation_config.eos_token_id = eos
    got = generate(model, batch, max_new_tokens=12, buckets=BUCKETS, stop_check_every=2)
    assert got.token_ids == reference(model, batch, new=12)
    assert got.token_ids[1] == free.token_ids[1][:5] and got.finished[1]
    assert not got.finished[0] or got.token_ids[0][-1] == eos


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    model = tiny_model("llama")
    batch = prompts((3, 13))
    greedy = generate(model, batch, max_new_tokens=10)
    a = generate(model, batch, max_new_tokens=10, temperature=1.0, seed=1)
    assert a.token_ids == generate(model, batch, max_new_tokens=10, temperature=1.0, seed=1).token_ids
    assert a.token_ids != generate(model, batch, max_new_tokens=10, temperature=1.0, seed=2).token_ids
    assert a.token_ids != greedy.token_ids
    top1 = generate(model, batch, max_new_tokens=10, temperature=1.5, top_k=1, seed=5)
    assert top1.token_ids == greedy.token_ids


def test_strings_need_a_tokenizer_and_come_back_as_text(tiny_tokenizer):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="need a tokenizer"):
        generate(model, "hello", max_new_tokens=3)
    result = generate(model, ["the cat", "a dog sat on"], tokenizer=tiny_tokenizer, max_new_tokens=4)
    assert isinstance(result, GenerationResult)
    assert result.texts == [tiny_tokenizer.decode(ids, skip_special_tokens=True) for ids in result.token_ids]
    one = generate(model, [5, 6, 7], max_new_tokens=4)  # a single token-id prompt
    assert len(one.token_ids) == 1 and len(one.token_ids[0]) == 4


def test_bad_arguments_say_what_is_allowed():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="longer than the last bucket 8"):
        generate(model, [list(range(3, 15))], max_new_tokens=2, buckets=[4, 8])
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, [[3, 4]], max_new_tokens=0)
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, [[3, 4], []], max_new_tokens=2)


def test_default_buckets_are_powers_of_two_from_16_and_plans_are_accepted():
    from workbench.data.buckets import plan_buckets

    model = tiny_model("llama")
    result = generate(model, prompts((3, 16, 17, 40)), max_new_tokens=1)
    assert result.buckets == [16, 16, 32, 64]
    plan = plan_buckets([5, 9, 30, 31], 2, multiple_of=8)
    assert generate(model, prompts((5, 31)), max_new_tokens=1, buckets=plan).buckets == [
        plan.bucket_for(5),
        plan.bucket_for(31),
    ]


def test_a_config_the_static_cache_cannot_lay_out_names_the_family():
    from types import SimpleNamespace

    odd = SimpleNamespace(model_type="mistral", sliding_window=8)  # not a transformers config at all
    with pytest.raises(ValueError, match=r"family 'mistral' \(sliding_window=8"):
        static_cache(SimpleNamespace(config=odd), 32)


# ---- stop strings, the repetition penalty, prewarm (plain CPU) --------------------------------------


def test_stop_strings_end_a_row_where_model_generate_does(tiny_tokenizer):
    model = tiny_model("llama")
    batch = text_prompts(FIRST)
    stop = stop_case(model, tiny_tokenizer, batch)  # two tokens of the first row's greedy continuation
    got = generate(model, batch, max_new_tokens=16, buckets=[32], stop=[stop], tokenizer=tiny_tokenizer)
    assert got.token_ids == reference_with(model, batch, stop_strings=[stop], tokenizer=tiny_tokenizer)
    assert got.finished[0] and len(got.token_ids[0]) < 16  # stopped mid-way, the completing token kept
    assert got.texts[0].endswith(stop) and not any(got.finished[1:])
    both = {"stop": [stop], "tokenizer": tiny_tokenizer, "repetition_penalty": PENALTY}
    expected = reference_with(
        model, batch, stop_strings=[stop], tokenizer=tiny_tokenizer, repetition_penalty=PENALTY
    )
    assert generate(model, batch, max_new_tokens=16, buckets=[32], **both).token_ids == expected


def test_repetition_penalty_matches_model_generate():
    model = tiny_model("qwen2")  # its greedy continuations repeat tokens, so the penalty changes them
    batch = text_prompts(FIRST)
    got = generate(model, batch, max_new_tokens=16, buckets=[32], repetition_penalty=PENALTY)
    assert got.token_ids == reference_with(model, batch, repetition_penalty=PENALTY)
    assert got.token_ids != generate(model, batch, max_new_tokens=16, buckets=[32]).token_ids


def test_prewarm_compiles_nothing_off_xla_and_leaves_the_tokens_alone():
    model = tiny_model("llama")
    assert prewarm_generation(model, buckets=BUCKETS, max_new_tokens=8) == 0
    batch = prompts((3, 13))
    warmed = generate(model, batch, max_new_tokens=8, buckets=BUCKETS, prewarm=True)
    assert warmed.token_ids == generate(model, batch, max_new_tokens=8, buckets=BUCKETS).token_ids


def test_prewarm_stop_and_penalty_errors_say_what_is_needed():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="prewarm needs explicit buckets"):
        prewarm_generation(model, buckets=None, max_new_tokens=8)
    with pytest.raises(ValueError, match="prewarm needs explicit buckets"):
        generate(model, [[3, 4]], max_new_tokens=2, prewarm=True)
    for bad in (0, -1.5, float("nan")):
        with pytest.raises(
            ValueError, match=rf"repetition_penalty={bad!r} is not allowed: must be a number > 0"
        ):
            generate(model, [[3, 4]], max_new_tokens=2, repetition_penalty=bad)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        generate(model, [[3, 4]], max_new_tokens=2, stop=["\n\n"])
    with pytest.raises(ValueError, match="non-empty str"):
        generate(model, [[3, 4]], max_new_tokens=2, stop=[""], tokenizer=object())


# ---- the decoder asks its Backend -------------------------------------------------------------------


def _asked_backend(compiles_every_shape: bool):
    """Plain torch on the CPU that says whether each new shape compiles, and records what it is asked."""
    import dataclasses

    from workbench.backend.hardware import detect
    from workbench.backend.native.torch_native import NativeTorch

    class Asked(NativeTorch):
        def __init__(self) -> None:
            super().__init__(dataclasses.replace(detect("cpu"), via_xla=False))
            self.compiles_every_shape = compiles_every_shape
            self.boundaries, self.copied, self.seeds = 0, [], []

        def step_boundary(self) -> None:
            self.boundaries += 1

        def compile_count(self) -> int:  # a stand-in counter: every step ended counts as a program
            return self.boundaries

        def host_copies(self, tensors):
            self.copied.append([tuple(t.shape) for t in tensors])
            return super().host_copies(tensors)

        def seeded_rng(self, seed, device):
            self.seeds.append(seed)
            return super().seeded_rng(seed, device)

    return Asked()


def test_the_decoder_takes_fixed_rows_and_a_static_cache_where_its_backend_compiles_every_shape(monkeypatch):
    from workbench import decoding
    from workbench.generate import read_rollout, sample_rollout

    caches = []
    build = decoding.static_cache
    monkeypatch.setattr(decoding, "static_cache", lambda *args: caches.append(args[1]) or build(*args))
    model = tiny_model("llama")
    batch = prompts((3, 5, 7))  # one bucket of 8: three prompts
    eager, fixed = _asked_backend(False), _asked_backend(True)
    got = generate(model, batch, max_new_tokens=6, buckets=[8], eos_token_id=None, backend=eager)
    # eager: the rows rounded up to a power of two, a growing cache; the stand-in counter: 6 steps
    assert eager.copied == [[(4, 16)]] and caches == [] and got.compiles == 6
    same = generate(model, batch, max_new_tokens=6, buckets=[8], eos_token_id=None, backend=fixed)
    # every shape a program: max_batch_size rows and a static cache of bucket + budget, the same tokens
    assert fixed.copied == [[(8, 16)]] and caches == [8 + 16] and same.token_ids == got.token_ids
    assert prewarm_generation(model, buckets=[8], max_new_tokens=6, backend=eager) == 0
    assert eager.boundaries == 6  # nothing run
    assert prewarm_generation(model, buckets=[8], max_new_tokens=6, backend=fixed) == 3  # prefill, 2 steps
    generate(model, batch, max_new_tokens=2, temperature=1.0, seed=7, backend=eager)
    assert eager.seeds == [7]  # greedy seeds nothing; sampling asks the backend for its draws
    rows = [batch[0], batch[1][:4]]
    ids = torch.tensor([[0, *rows[0]], rows[1]])  # left-padded to 4
    options = {"max_new_tokens": 4, "temperature": 0.0, "eos_token_id": None, "pad_token_id": 0}
    rollout = sample_rollout(model, ids, (ids > 0).long(), backend=fixed, **options)
    assert fixed.boundaries == 6 + 3 + 4 + 1  # 4 tokens chosen, then the result's layout as its own program
    expected = generate(model, rows, max_new_tokens=4, eos_token_id=None).token_ids
    assert read_rollout(rollout, backend=fixed)[0] == expected and fixed.copied[-1] == [(2, 16), (2,), (2,)]


# ---- the training path keeps its KV cache off ------------------------------------------------------


def test_built_models_have_the_kv_cache_off_and_generation_turns_it_on_per_call():
    model = tiny_model("mistral", sliding_window=8)
    assert model.config.use_cache is False
    ids = torch.tensor([prompts((12,))[0]])
    assert model(input_ids=ids).past_key_values is None  # a training forward builds no cache
    assert generate(model, ids[0].tolist(), max_new_tokens=3).new_tokens == 3


# ---- eval perplexity ---------------------------------------------------------------------------------


def test_evaluate_reports_perplexity_beside_the_loss():
    from tests.test_train import tiny_cfg, token_dataset
    from workbench.analysis.metrics import perplexity
    from workbench.train import Trainer

    seen: list[dict] = []
    cfg = tiny_cfg(**{"train.steps": 2, "train.log_every": 2, "train.eval_every": 2})
    trainer = Trainer(
        cfg, train_dataset=token_dataset(16), eval_dataset=token_dataset(8, 3), callbacks=[seen.append]
    )
    result = trainer.fit()
    assert result.eval_perplexity == pytest.approx(math.exp(result.eval_loss))
    assert seen[-1]["eval_perplexity"] == pytest.approx(math.exp(seen[-1]["eval_loss"]))
    loss = trainer.evaluate()
    assert isinstance(loss, float) and loss.perplexity == pytest.approx(math.exp(loss))
    assert trainer.last_eval_loss == loss
    assert perplexity(None) is None and perplexity(1e4) == math.inf


# ---- the `generate` command --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return small_tokenizer()


def test_generate_command_prints_the_text_of_a_saved_checkpoint(tmp_path, tiny_tokenizer, capsys):
    from workbench.__main__ import main

    model = tiny_model("llama")
    model.save_pretrained(tmp_path / "ckpt")
    tiny_tokenizer.save_pretrained(tmp_path / "ckpt")
    args = ["generate", "--model", str(tmp_path / "ckpt"), "the cat", "--max-new-tokens", "5"]
    assert main([*args, "--device-type", "cpu"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("the cat") and len(out.out.strip()) > len("the cat")
    assert "tokens/s" in out.err


def test_generate_command_fails_clearly_on_a_missing_or_bad_directory(tmp_path, capsys, tiny_tokenizer):
    from workbench.__main__ import main

    assert main(["generate", "--model", str(tmp_path / "nope"), "hi", "--device-type", "cpu"]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["generate", "--model", str(tmp_path / "empty"), "hi", "--device-type", "cpu"]) == 2
    assert "is no model directory" in capsys.readouterr().err
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert main(["generate", "--model", str(tmp_path / "broken"), "hi", "--device-type", "cpu"]) == 2
    assert "has no tokenizer beside it" in capsys.readouterr().err
    tiny_tokenizer.save_pretrained(tmp_path / "broken")
    assert main(["generate", "--model", str(tmp_path / "broken"), "hi", "--device-type", "cpu"]) == 2
    assert "cannot load a causal LM and tokenizer from transformers checkpoint" in capsys.readouterr().err


# ---- XLA:CPU: compiles, transfers, sliding windows, the memory probes -------------------------------


@pytest.fixture(scope="module")
def xla_generation(xla_scenario, tmp_path_factory):
    """tests/xla/generation.py, once: generation on XLA:CPU for three families, and the memory probes
    on a sliding-window Mistral (with the compile memory log on)."""
    log = tmp_path_factory.mktemp("generation") / "compile.log"
    env = {"PT_XLA_DEBUG_LEVEL": "1", "PT_XLA_DEBUG_FILE": str(log)}
    return xla_scenario("generation", devices=1, env=env)


FAMILIES = ["llama", "qwen2", "mistral", "llama, scanned"]


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_xla_greedy_is_token_identical_to_cpu_model_generate(xla_generation, family):
    run = xla_generation[family]
    assert run["got"] == run["expected"]
    assert run["buckets"] == [[8, 8, 16, 32]] * 2


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_xla_second_call_in_the_same_buckets_compiles_nothing(xla_generation, family):
    first, second = xla_generation[family]["compiles"]
    # three (rows, bucket) batches: prefill + one decode program each, plus the window's two phases
    assert first == (9 if family == "mistral" else 6)  # scanned too: the same programs
    assert second == 0


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_xla_decoding_makes_no_per_token_host_transfers(xla_generation, family):
    run = xla_generation[family]
    assert run["transfers_second"] == run["expected_transfers_second"]


@pytest.mark.xla
@pytest.mark.slow
def test_xla_sliding_window_generation_uses_a_window_sized_static_cache(xla_generation):
    assert all(xla_generation["mistral"]["sliding_layers"])
    assert not any(xla_generation["llama"]["sliding_layers"])


@pytest.mark.xla
@pytest.mark.slow
def test_xla_sampling_is_seeded_and_compiles_once(xla_generation):
    sampled = xla_generation["llama"]["sampled"]
    assert (
        sampled["same_seed_same_tokens"] and sampled["other_seed_differs"] and sampled["differs_from_greedy"]
    )
    assert sampled["compiles"][1:] == [0, 0]


@pytest.mark.xla
@pytest.mark.slow
def test_xla_memory_probe_and_batch_finder_run_on_a_sliding_window_family(xla_generation):
    probes = xla_generation["probes"]
    assert probes["peak_bytes"] > 0 and probes["programs"] >= 2
    assert probes["batch"] == 8 and probes["batch_compiled_bytes"] > 0


# ---- XLA:CPU: a fixed set of programs, prewarm, stop strings, the repetition penalty -----------------


@pytest.fixture(scope="module")
def xla_fixed_programs(xla_scenario):
    """tests/xla/generate_fixed_programs.py, once."""
    return xla_scenario("generate_fixed_programs", devices=1)


@pytest.mark.xla
@pytest.mark.slow
def test_xla_other_prompt_counts_in_the_same_buckets_compile_nothing(xla_fixed_programs):
    run = xla_fixed_programs["prompt_counts"]
    assert run["got"] == run["expected"]  # 1 or 2 real rows in a batch of 2: the same tokens
    assert run["compiles"] == [4, 0]  # prefill + decode per bucket, then nothing for other counts


@pytest.mark.xla
@pytest.mark.slow
def test_xla_prewarm_compiles_every_program_a_sliding_window_call_runs(xla_fixed_programs):
    run = xla_fixed_programs["prewarm"]
    assert run["prewarm_compiles"] > 4 and run["compiles"] == 0  # the window's edges included
    assert run["got"] == run["expected"]


@pytest.mark.xla
@pytest.mark.slow
def test_xla_stop_strings_and_repetition_penalty_match_cpu_model_generate(xla_fixed_programs):
    run = xla_fixed_programs["controls"]
    assert run["got"] == run["expected"]
    assert run["finished"] == [True, False, False, False] and len(run["got"]["stop"][0]) < 16
    assert run["compiles"]["stop"] > 0 and run["compiles"]["stop_again"] == 0  # prewarm=True, then one prompt
    assert run["transfers_again"] == 1  # the tokens at the end: no host read per token
