"""GRPO's memory estimate: the rollout's KV cache against transformers' real cache tensors, the training
rows of prompt + completion, the old log-probs, and what the batch finder and the config make of them."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from tests.tiny import tiny
from workbench.analysis.batch import max_batch_size
from workbench.analysis.config_estimate import config_settings
from workbench.analysis.estimate import BREAKDOWN_KEYS, estimate
from workbench.analysis.objective_memory import NEXT_TOKEN
from workbench.analysis.rollout_memory import RolloutPlan, kv_cache_bytes
from workbench.analysis.shape import model_shape
from workbench.config import WorkbenchConfig
from workbench.decoding import cache_budget, static_cache
from workbench.objective_registry import objective_for
from workbench.units import GiB

MISTRAL = tf.MistralConfig(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=512,
    sliding_window=24,
)


def test_the_completion_budget_is_the_samplers():
    for length in (1, 15, 16, 17, 100, 512):
        assert RolloutPlan(8, length).completion_positions == cache_budget(length)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", ["llama", "mistral-sliding"])
def test_kv_cache_bytes_are_the_real_caches(which, dtype):
    """The estimate's cache against transformers' own tensors after a prefill, a sliding window included."""
    torch.manual_seed(0)
    if which == "llama":
        cfg = tiny("llama")
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**_llama_fields(cfg)))
    else:
        model = tf.MistralForCausalLM(MISTRAL)
    model = model.to(dtype).eval()
    rows, prompt, budget = 6, 16, cache_budget(20)
    cache = static_cache(model, prompt + budget)
    with torch.no_grad():
        model(input_ids=torch.zeros((rows, prompt), dtype=torch.long), past_key_values=cache, use_cache=True)
    real = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    estimated = kv_cache_bytes(
        model.config,
        model_shape(model.config),
        rows=rows,
        positions=prompt + budget,
        dtype_bytes=dtype.itemsize,
    )
    assert estimated == real
    if which == "mistral-sliding":  # each layer holds its window (24), not the 48 positions
        assert real == rows * 2 * 16 * 24 * 2 * dtype.itemsize * 2


def _llama_fields(cfg):
    return dict(
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        vocab_size=cfg.vocab_size,
    )


def test_a_grpo_step_trains_prompt_times_generations_rows_of_prompt_and_completion():
    cfg = tiny("llama", max_position_embeddings=2048)
    plan = RolloutPlan(num_generations=4, max_completion_length=100)  # budget 112
    grpo = estimate(cfg, batch_size=2, seq_len=64, precision="fp32", objective=plan, loss_chunk_tokens=0)
    sft = estimate(cfg, batch_size=8, seq_len=64 + 112, precision="fp32", loss_chunk_tokens=0)
    assert (
        grpo.seq_len == 176
        and grpo.objective_report.rows == 8
        and grpo.objective_report.completion_positions == 112
    )
    for part in ("params", "grads", "optimizer"):
        assert grpo.breakdown[part] == sft.breakdown[part], part
    # the same saved activations; the attention's temporaries (eager) exceed GRPO's smaller logits term
    # where they do not exceed the supervised step's
    assert grpo.breakdown["activations"] >= sft.breakdown["activations"]
    # the head on the completion's 112 positions only: the supervised term's 4 fp32 copies a position
    assert grpo.breakdown["logits"] == 8 * 112 * 512 * 4 * 4 and grpo.loss_chunk_positions is None
    # in chunks of positions (the next-token loss's rule over the completion), one chunk's; a frozen
    # head (LoRA) holds two of the four copies
    chunked = estimate(cfg, batch_size=2, seq_len=64, precision="fp32", objective=plan, loss_chunk_tokens=128)
    assert chunked.loss_chunk_positions == 16 and chunked.breakdown["logits"] == 8 * 16 * 512 * 4 * 4
    lora = estimate(cfg, batch_size=2, seq_len=64, objective=plan, loss_chunk_tokens=128, lora_rank=4)
    assert lora.breakdown["logits"] == 8 * 16 * 512 * 2 * 4
    # ids, attention mask, position ids over every position; completion mask and advantages
    assert grpo.breakdown["inputs"] == 8 * (176 * 3 * 8 + 112 * 4 + 4)
    assert grpo.breakdown["old_logps"] == 0
    assert (
        grpo.objective_report.kv_cache_bytes == 8 * 2 * 2 * 16 * 176 * 2 * 4
    )  # rows, layers, kv heads, head_dim, k+v
    # The cache lives while sampling, the activations while training: the peak holds the larger.
    transient = grpo.breakdown["activations"] + grpo.breakdown["logits"]
    assert grpo.objective_report.training_transient_bytes == transient
    assert grpo.breakdown["rollout"] == max(0, grpo.objective_report.peak_bytes - transient)
    assert grpo.total_bytes == sum(grpo.breakdown.values()) and set(grpo.breakdown) == set(BREAKDOWN_KEYS)
    reused = estimate(cfg, batch_size=2, seq_len=64, precision="fp32", objective=RolloutPlan(4, 100, 2))
    assert reused.breakdown["old_logps"] == 8 * 112 * 4
    # a rollout for 3 micro-steps: its cache and log-probs at the generation's 24 rows, the step at 8,
    # and the 3 micro-steps' batches on the device until the last has trained
    generation = estimate(
        cfg, batch_size=2, seq_len=64, precision="fp32", objective=RolloutPlan(4, 100, 1, 3, old_logps=True)
    )
    assert (
        generation.objective_report.rows == 24
        and generation.objective_report.kv_cache_bytes == 3 * grpo.objective_report.kv_cache_bytes
    )
    assert generation.breakdown["old_logps"] == 24 * 112 * 4
    assert generation.breakdown["inputs"] == 3 * grpo.breakdown["inputs"]
    for part in ("activations", "logits"):
        assert generation.breakdown[part] == grpo.breakdown[part], part
    # Without grouped-query attention, in fp32 under bf16-mixed, the cache of a deep model outgrows a
    # checkpointed step's activations and (a small vocabulary's) logits: then it sets the peak.
    deep = tiny("llama", num_layers=16, num_kv_heads=4, vocab_size=64, max_position_embeddings=2048)
    lora = estimate(
        deep,
        batch_size=4,
        seq_len=512,
        objective=plan,
        lora_rank=8,
        gradient_checkpointing=True,
        attention="flash",
    )
    assert lora.objective_report.peak_bytes > lora.objective_report.training_transient_bytes
    assert (
        lora.breakdown["rollout"]
        == lora.objective_report.peak_bytes - lora.objective_report.training_transient_bytes
        > 0
    )
    assert estimate(cfg, batch_size=2, seq_len=64).objective_report is None


def test_the_mesh_splits_the_rollouts_rows_and_kv_heads():
    cfg = tiny("llama")
    plan = RolloutPlan(num_generations=4, max_completion_length=32)
    one = estimate(cfg, batch_size=8, seq_len=32, objective=plan)
    split = estimate(cfg, batch_size=8, seq_len=32, objective=plan, mesh={"data": 2, "fsdp": 2, "model": 2})
    assert (
        split.objective_report.rows == one.objective_report.rows // 4 == 8
    )  # 2 prompts' groups on each device
    assert (
        split.objective_report.kv_cache_bytes == one.objective_report.kv_cache_bytes // 8
    )  # a quarter of the rows, half the heads


def test_a_grpo_config_reaches_the_estimate_and_the_batch_finder():
    cfg = WorkbenchConfig().with_overrides(
        {
            "model.hidden_size": 64,
            "model.num_layers": 2,
            "model.num_heads": 4,
            "model.num_kv_heads": 2,
            "model.intermediate_size": 128,
            "model.vocab_size": 512,
            "data.max_length": 64,
            "train.objective": "grpo",
            "grpo.num_generations": 4,
            "grpo.max_completion_length": 64,
        }
    )
    settings = config_settings(cfg)

    def rollout_plan(config):
        return objective_for(config).memory(config)

    assert settings["objective"] == rollout_plan(cfg) == RolloutPlan(4, 64, 1, 1, old_logps=False)
    # TRL's generation batch: steps_per_generation, or generation_batch_size in completions
    accumulated = cfg.with_overrides(
        {"train.batch_size": 2, "train.grad_accum": 4, "grpo.generation_batch_size": 2 * 4 * 8}
    )
    assert rollout_plan(accumulated) == RolloutPlan(4, 64, 1, 8, old_logps=True)  # outlives a step
    assert rollout_plan(cfg.with_overrides({"train.grad_accum": 4})) == RolloutPlan(
        4, 64, 1, 4, old_logps=False
    )
    assert config_settings(WorkbenchConfig())["objective"] is NEXT_TOKEN
    sft = dict(settings, objective=NEXT_TOKEN)
    grpo_batch = max_batch_size(cfg.model, seq_len=64, memory_bytes=GiB // 8, **settings)
    sft_batch = max_batch_size(cfg.model, seq_len=64, memory_bytes=GiB // 8, **sft)
    # a prompt brings 4 rows of twice the length: about an eighth of the supervised batch
    assert 0 < grpo_batch <= sft_batch // 6


@pytest.fixture(scope="module")
def grpo_compiler_memory(xla_scenario, tmp_path_factory):
    """tests/xla/grpo_memory.py: the compiler's figures of a GRPO step and of the supervised step at its rows."""
    log = tmp_path_factory.mktemp("grpo-memory") / "compile.log"
    return xla_scenario("grpo_memory", env={"PT_XLA_DEBUG_LEVEL": "1", "PT_XLA_DEBUG_FILE": str(log)})


@pytest.mark.slow
@pytest.mark.xla
def test_the_grpo_estimate_is_within_15_percent_above_the_compiler(grpo_compiler_memory):
    m = grpo_compiler_memory
    # the step at B x G rows of prompt + completion, as the supervised estimate prices it
    assert abs(m["sft_estimate"] - m["sft_compiled"]) <= 0.15 * m["sft_compiled"], m
    # the GRPO objective's own step: on the safe side of the compiler, by less than 15%
    assert m["grpo_compiled"] <= m["grpo_estimate"] <= 1.15 * m["grpo_compiled"], m
    # where the logits dominate (LoRA, vocabulary 32768): each estimate within 15% of the compiler
    for name in ("chunked", "unchunked"):
        compiled, estimated = m[f"{name}_compiled"], m[f"{name}_estimate"]
        assert abs(estimated - compiled) <= 0.15 * compiled, (name, m)


@pytest.mark.slow
@pytest.mark.xla
def test_log_probs_in_chunks_cut_the_compilers_peak_where_the_logits_dominate(grpo_compiler_memory):
    m = grpo_compiler_memory
    # against the objective before chunking (every position's logits at once): over 3x less
    assert m["whole_logits_compiled"] >= 3 * m["chunked_compiled"], m
    # the head on the completion's positions alone already saves the prompt's logits
    assert m["unchunked_compiled"] < m["whole_logits_compiled"], m
