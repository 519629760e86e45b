"""GRPO's memory (``train.objective: grpo``): the rollout's KV cache and the training rows of prompt + completion.

A GRPO step samples ``grpo.num_generations`` G completions of each of its prompts on the device
(`workbench.rl`), then trains on them. A rollout samples the prompts of ``grpo.steps_per_generation``
micro-steps at once (the generation batch); each micro-step then trains ``batch_size x G`` of its
rows. Per device, against a supervised step of ``batch_size`` rows of ``data.max_length``:

- **Training rows.** ``batch_size x G`` rows a micro-step (``train.batch_size`` counts prompts), each a
  prompt left-padded to its bucket (at most ``data.max_length``) followed by the rollout's
  completion budget: ``max_completion_length`` rounded up to 16 (`workbench.decoding.cache_budget`,
  the sampler's fixed decode length). `workbench.analysis.estimate.estimate` prices the step's
  activations over those rows (`RolloutPlan` is GRPO's term there, a
  `workbench.analysis.objective_memory.StepRows`), its logits as the GRPO objective takes them (`grpo_logits_bytes`:
  the completion's positions only, in chunks of positions under ``train.loss_chunk_tokens``, the
  next-token loss's rule), and its inputs: ids, attention mask and position ids (int64 over every
  position), the completion mask (fp32) and the advantages, for every micro-step of the generation
  (they live on the device until its last micro-step has trained).
- **Old log-probs.** When a policy other than the sampler trains the rollout (μ > 1, or a
  generation that outlives an optimizer step) the rollout's per-token log-probs (fp32, the
  generation's rows x completion budget) are kept for its steps.
- **The rollout**, at the generation batch's rows: transformers' `StaticCache` as `workbench.decoding.static_cache` lays it out:
  each layer keeps keys and values of ``rows x kv heads x positions x head_dim`` (kv heads split
  over the mesh's model axis), positions = prompt bucket + completion budget, a sliding-window
  layer only its window. Its precision is the weights' (fp32 under fp32 and bf16-mixed, bf16 under
  bf16): the keys come out of the rotary embedding in the weights' dtype. Beside the cache the rollout holds
  either one layer's forward over the prompts (the prefill: the training step's per-layer formula
  at the prompt's length, without gradients only one layer lives at a time) or the sampler's
  vocabulary-wide fp32 rows (`SAMPLER_VOCAB_COPIES`: the logits, the temperature-scaled ones, the
  probabilities and the top-p sort), whichever is larger.

The rollout and the training step never hold their transients at once: the cache is built for a
rollout and dropped when it returns (`workbench.decoding.Decoder.run`), before the step's forward.
So the peak holds the larger of the two: the ``rollout`` part of the breakdown is only what the
rollout's cache and buffers need beyond the step's activations and logits, as the attention
temporaries are added over the logits (`RolloutMemory` keeps the whole figures for display).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from workbench.analysis.activations import activation_elements_per_token
from workbench.analysis.objective_memory import StepContext, StepRows
from workbench.analysis.shape import ModelShape
from workbench.models.build import transformers_config_of

COMPLETION_MULTIPLE = 16
"""The completion budget is ``max_completion_length`` rounded up to this many positions, as the
sampler rounds its cache (`workbench.decoding.CACHE_MULTIPLE`; tests/test_rollout_memory.py checks they agree)."""
SAMPLER_VOCAB_COPIES = 4
"""Vocabulary-wide fp32 rows a decode step holds per completion: the logits, the temperature-scaled
logits, their softmax and the sorted copy top-p filters."""
FROZEN_HEAD_COPIES = 2
"""Vocabulary-wide fp32 tensors a completion position holds in the GRPO step's logits under a frozen
head (LoRA): the logits (recomputed per chunk in the backward pass) and their gradient."""
ROLLOUT_MEANINGS: dict[str, str] = {
    "rollout": "GRPO's rollout: the KV cache and the sampler's buffers, beyond the training step's activations and logits",
    "old_logps": "GRPO: the rollout's per-token log-probs, kept when another policy trains them (num_iterations > 1, or a generation that outlives an optimizer step)",
}
"""The breakdown parts a GRPO step adds (`workbench.analysis.estimate.BREAKDOWN_MEANINGS`), in display order."""


@dataclass(frozen=True)
class RolloutPlan(StepRows):
    """What a GRPO step's memory depends on, beside the batch and the prompt length: GRPO's term in the
    estimate (`estimate`'s ``objective``; `workbench.objectives.grpo.GRPO.memory` makes a config's)."""

    num_generations: int
    """G: completions per prompt (``grpo.num_generations``)."""
    max_completion_length: int
    """Most tokens sampled per completion (``grpo.max_completion_length``)."""
    num_iterations: int = 1
    """Times each rollout is trained (``grpo.num_iterations``)."""
    steps_per_generation: int = 1
    """Micro-steps whose prompts one rollout samples (`workbench.config.steps_per_generation`): the
    rollout's rows are this many micro-batches'."""
    old_logps: bool | None = None
    """Whether the rollout's log-probs are kept (`workbench.config.keeps_old_logps`); None: when
    `num_iterations` is above 1."""

    @property
    def keeps_old_logps(self) -> bool:
        return self.num_iterations > 1 if self.old_logps is None else bool(self.old_logps)

    @property
    def completion_positions(self) -> int:
        """The completion budget: `max_completion_length` rounded up to `COMPLETION_MULTIPLE`."""
        return -(-self.max_completion_length // COMPLETION_MULTIPLE) * COMPLETION_MULTIPLE

    @property
    def rows_per_example(self) -> int:  # type: ignore[override]
        """A prompt trains its G completions."""
        return self.num_generations

    def positions(self, length: int) -> int:
        """A prompt of `length` and the completion budget."""
        return length + self.completion_positions

    def head_positions(self, positions: int) -> int:
        """The head runs on the completion's positions only."""
        return self.completion_positions

    def logits_bytes(
        self,
        *,
        rows: int,
        positions: int,
        chunk: int | None,
        vocab: int,
        model_parallel: int,
        frozen_head: bool,
    ) -> int:
        return grpo_logits_bytes(rows, self, vocab, model_parallel, chunk, frozen_head=frozen_head)

    def input_bytes(self, *, rows: int, positions: int, prompt_length: int) -> int:
        return grpo_input_bytes(rows, prompt_length, self)

    def extra_parts(self, step: StepContext) -> tuple[dict[str, int], Any]:
        """The rollout's cache and buffers beyond the step's transients, the old log-probs; and the
        rollout whole (`RolloutMemory`) for display."""
        memory, parts = rollout_memory(
            step.model_config,
            step.shape,
            self,
            rows=step.rows,
            prompt_length=step.prompt_length,
            param_bytes=step.param_bytes,
            compute_bytes=step.compute_bytes,
            model_parallel=step.model_parallel,
            training_transient_bytes=step.training_transient_bytes,
        )
        return parts, memory


@dataclass(frozen=True)
class RolloutMemory:
    """A GRPO step's rollout per device, whole: what `MemoryEstimate.objective_report` shows beside the breakdown."""

    rows: int
    """Completions sampled per device by one rollout: prompts per device x G x steps per generation."""
    prompt_length: int
    """The prompt bucket planned for (the longest: ``data.max_length``)."""
    completion_positions: int
    """The completion budget (positions decoded per rollout)."""
    kv_cache_bytes: int
    """The rollout's KV cache."""
    sampler_bytes: int
    """The larger of the prefill's one layer and the sampler's vocabulary-wide rows, beside the cache."""
    training_transient_bytes: int
    """What the training step holds instead: its activations and logits."""

    @property
    def peak_bytes(self) -> int:
        """The rollout's own transient: its cache and the larger of its prefill and sampler buffers."""
        return self.kv_cache_bytes + self.sampler_bytes

    @property
    def excess_bytes(self) -> int:
        """What the rollout adds at the step's peak: its transient beyond the training step's."""
        return max(0, self.peak_bytes - self.training_transient_bytes)


def cache_positions(model_config: Any, positions: int) -> list[int]:
    """Positions each layer's static KV cache keeps for ``positions`` tokens: all of them, or a
    sliding-window layer's window (transformers' own `StaticCache` layout, read without allocating)."""
    import transformers as tf

    config = transformers_config_of(model_config)
    try:
        cache = tf.StaticCache(config=config, max_cache_len=positions)
    except (KeyError, ValueError, TypeError, AttributeError):
        # a layout the static cache cannot make (the sampler refuses it, naming the family): every
        # layer at full length, the most it could hold
        return [positions] * int(config.get_text_config().num_hidden_layers)
    return [int(layer.max_cache_len) for layer in cache.layers]


def kv_cache_bytes(
    model_config: Any,
    shape: ModelShape,
    *,
    rows: int,
    positions: int,
    dtype_bytes: int,
    model_parallel: int = 1,
) -> int:
    """Bytes of the static KV cache of `rows` rows and `positions` tokens: keys and values of every
    layer, ``rows x kv heads x its positions x head_dim`` each, the kv heads split over `model_parallel`."""
    heads = math.ceil(shape.kv_heads / model_parallel)
    per_position = rows * heads * shape.head_dim * 2 * dtype_bytes
    return per_position * sum(cache_positions(model_config, positions))


def rollout_memory(
    model_config: Any,
    shape: ModelShape,
    plan: RolloutPlan,
    *,
    rows: int,
    prompt_length: int,
    param_bytes: int,
    compute_bytes: int,
    model_parallel: int,
    training_transient_bytes: int,
) -> tuple[RolloutMemory, dict[str, int]]:
    """The rollout after prompts of `prompt_length` for a micro-step of `rows` training rows (per device;
    the rollout samples `plan.steps_per_generation` times as many), and the breakdown parts it adds
    (`ROLLOUT_MEANINGS`): the cache in the weights' precision (`param_bytes`), the prefill layer in the
    compute precision, the old log-probs when the plan keeps them."""
    budget = plan.completion_positions
    rows = rows * plan.steps_per_generation  # the generation batch
    cache = kv_cache_bytes(
        model_config,
        shape,
        rows=rows,
        positions=prompt_length + budget,
        dtype_bytes=param_bytes,
        model_parallel=model_parallel,
    )
    layer = activation_elements_per_token(shape, prompt_length, model_parallel=model_parallel)["layer"]
    prefill = math.ceil(rows * prompt_length * layer * compute_bytes)
    sampler = rows * shape.vocab * 4 * SAMPLER_VOCAB_COPIES // model_parallel
    memory = RolloutMemory(
        rows=rows,
        prompt_length=prompt_length,
        completion_positions=budget,
        kv_cache_bytes=cache,
        sampler_bytes=max(prefill, sampler),
        training_transient_bytes=training_transient_bytes,
    )
    old_logps = rows * budget * 4 if plan.keeps_old_logps else 0
    return memory, {"rollout": memory.excess_bytes, "old_logps": old_logps}


def grpo_logits_bytes(
    rows: int,
    plan: RolloutPlan,
    vocab: int,
    model_parallel: int = 1,
    chunk: int | None = None,
    *,
    frozen_head: bool = False,
) -> int:
    """The GRPO objective's logits term (`workbench.rl.loss.GRPOObjective.policy_logps`): the head on the
    completion's positions only (`plan`'s budget), a `chunk` of positions at a time when the loss is
    chunked (None: all of them at once). A trained head holds the supervised term's four vocabulary-wide fp32 tensors a
    position (`workbench.models.lm_head.logits_bytes`: logits, log-softmax and their gradients); a
    frozen one (LoRA) `FROZEN_HEAD_COPIES` (the logits and their gradient: nothing feeds a weight
    gradient), as XLA:CPU's memory analysis of the step shows (tests/xla/grpo_memory.py)."""
    from workbench.models.lm_head import LOGITS_BYTES_PER_ELEMENT, logits_bytes

    whole = logits_bytes(
        rows=rows, positions=chunk or plan.completion_positions, vocab=vocab, model_parallel=model_parallel
    )
    return whole * FROZEN_HEAD_COPIES * 4 // LOGITS_BYTES_PER_ELEMENT if frozen_head else whole


def grpo_input_bytes(rows: int, prompt_length: int, plan: RolloutPlan) -> int:
    """The training batches a rollout builds for its `plan.steps_per_generation` micro-steps of `rows`
    rows (per device), live until the last has trained: ids, attention mask and position ids (int64)
    over every position, the completion mask (fp32) and the advantages (fp32)."""
    budget = plan.completion_positions
    return plan.steps_per_generation * rows * ((prompt_length + budget) * 3 * 8 + budget * 4 + 4)
