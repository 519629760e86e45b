"""The ``grpo`` config section: GRPO's knobs under TRL's own names and defaults, as plain data.

`GRPOConfig` is a section of `workbench.config.WorkbenchConfig` like ``train`` or ``lora``: its
fields carry the names and defaults of TRL's ``GRPOConfig`` where TRL has them (so a TRL user's
keys copy over, without a prefix), each with the docstring the config reference and
``python -m workbench config --explain grpo.KEY`` show. The section is read only under
``train.objective: grpo``: the GRPO objective (`workbench.objectives.grpo`) owns it, checks it
against the rest of a run's config and names its keys when another objective's run sets them.

`validate_grpo` checks the section's own values (`workbench.config`'s validation calls it, as it
checks every section's), every refusal naming the key, the value and what is allowed
(`workbench.config_parse.require`); `steps_per_generation` and `keeps_old_logps` are what the section
decides with the rest of the config, for the rollouts and the memory estimate.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from workbench.config_parse import require

BUILTIN_REWARD_NAMES = ("math_answer", "format", "length")
"""The built-in reward functions' names (`workbench.rl.rewards.BUILTIN_REWARDS` makes each), checked with
the config; 'module:function' specs are imported when a run starts (`workbench.rl.rewards.check_reward_specs`)."""

GSM8K_FORMAT = r"(?s).*####\s*-?[0-9][0-9,]*(\.[0-9]+)?\s*"
"""The default of `GRPOConfig.format_pattern`: the whole completion ends with GSM8K's ``#### N``."""

_REWARD_SPEC = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class GRPOConfig:
    num_generations: int = 8
    """G: completions sampled per prompt (a group), >= 2; advantages compare a completion with its group. A step trains on `train.batch_size` prompts x G rows."""
    max_completion_length: int = 256
    """Most tokens generated per completion (the rollout's decode steps); a completion still going at this length is truncated (the share cut is the metric clipped_ratio). 256 (TRL 1.x says 512) so that the defaults run: the default 256-token prompts (data.max_length) plus 256 fill the default model's 512 positions; a real checkpoint's reasoning usually wants more: set it per run."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts, > 0; the loss divides the policy's logits by it too, as TRL does, so its log-probs are the sampler's."""
    top_p: float = 1.0
    """Nucleus sampling in (0, 1]: keep the smallest set of likeliest tokens whose probability reaches top_p (at least one); 1.0 keeps every token."""
    top_k: int = 0
    """Sample among the k likeliest tokens only; 0 turns top-k off (TRL's convention)."""
    beta: float = 0.0
    """KL coefficient towards the reference (TRL's k3 estimator per token); 0.0 (TRL's default) computes no reference at all. With LoRA the reference is the same weights with the adapters switched off, no copy; a full fine-tune refuses beta > 0."""
    epsilon: float = 0.2
    """Lower clip of the importance ratio: the ratio is clipped to [1 - epsilon, 1 + epsilon_high]."""
    epsilon_high: float | None = None
    """Upper clip of the importance ratio; null: the same as epsilon. DAPO's clip-higher recommends 0.28."""
    num_iterations: int = 1
    """mu: times each rollout is trained (TRL's num_iterations). When a policy other than the sampler trains a rollout (mu > 1, or steps_per_generation x mu not dividing train.grad_accum) the old log-probs are the sampler's, kept with the rollout, so the ratio and its clip act; otherwise the ratio is 1 (the old log-probs are the policy's own, detached), as TRL's."""
    steps_per_generation: int | None = None
    """Micro-steps whose prompts one rollout samples together (TRL's name): a rollout of train.batch_size x steps_per_generation prompts x G rows, then trained train.batch_size prompts x G rows a micro-step, a group never split; null: train.grad_accum (one rollout per optimizer step). Give this or generation_batch_size, not both."""
    generation_batch_size: int | None = None
    """Completions one rollout samples, all devices together (TRL's name): train.batch_size x num_generations x steps_per_generation, so a multiple of train.batch_size x num_generations; null: from steps_per_generation. Give this or steps_per_generation, not both."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """The importance ratio per completion token ('token', GRPO) or per completion, the exp of its tokens' mean log-ratio ('sequence': GSPO), as TRL's importance_sampling_level."""
    loss_type: Literal["grpo", "dr_grpo", "dapo"] = "dapo"
    """How token losses are averaged: 'grpo' (each completion's mean over its tokens, then the mean over completions: favours short right answers and long wrong ones), 'dr_grpo' (the sum over tokens divided by completions x max_completion_length: Dr. GRPO), 'dapo' (the mean over every completion token of the optimizer step: DAPO; TRL's default)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Advantages are the reward minus its group's mean, divided by the group's std ('group', TRL's default), by the whole batch's std ('batch') or by nothing ('none', Dr. GRPO's advice: no difficulty bias)."""
    mask_truncated_completions: bool = False
    """Leave completions cut at max_completion_length out of the loss (DAPO's advice for stability); they still count in the rewards and advantages of their group."""
    reward_funcs: list[str] = field(default_factory=lambda: ["math_answer"])
    """Reward functions by name: built-ins ('math_answer': the answer after '####' or in \\boxed{} equals the record's answer; 'format': the completion matches format_pattern; 'length': a penalty growing with the distance from length_target) or 'module:function' (TRL's signature: fn(prompts, completions, **columns) -> list of float or None). On the command line: grpo.reward_funcs=math_answer,format."""
    reward_weights: list[float] | None = None
    """One weight per reward function, in reward_funcs' order; a completion's reward is the weighted sum. null: every weight 1.0."""
    format_pattern: str = GSM8K_FORMAT
    """The 'format' reward's regular expression (Python re, matched against the whole completion): 1.0 when it matches, else 0.0. The default asks for a completion that ends with GSM8K's '#### N'."""
    length_target: int = 256
    """The 'length' reward's target: completions of this many tokens get 0, longer or shorter ones a penalty growing with the distance."""
    eval_reward_funcs: list[str] | None = None
    """Reward functions of the held-out eval (train.eval_every), by name as reward_funcs, each weighted 1.0; null: the run's own (reward_funcs with reward_weights). A run trained on format + answer is judged on the answer alone with [math_answer]."""
    log_completions: bool = False
    """At each log step, keep the latest rollout's completions with their prompts, each reward function's value, the total and the advantage: a 'completions' list in the metrics (the dashboard's table) and, from the command line, a JSONL file beside --metrics-out (or in train.checkpoint_dir). TRL's name."""
    num_completions_to_print: int | None = None
    """With log_completions: how many of the latest rollout's completions each log step keeps (the first ones, a group's together); null keeps all of them. TRL's name."""


def validate_grpo(obj: GRPOConfig, p: str) -> None:
    """The section's own values: ranges, the reward list and its weights, the pattern."""
    require(obj.num_generations >= 2, f"{p}num_generations", obj.num_generations, "must be >= 2 (a group)")
    for name in ("max_completion_length", "num_iterations", "length_target"):
        require(getattr(obj, name) >= 1, f"{p}{name}", getattr(obj, name), "must be >= 1")
    for name in ("steps_per_generation", "generation_batch_size"):
        value = getattr(obj, name)
        require(value is None or value >= 1, f"{p}{name}", value, "must be >= 1 or null")
    require(
        obj.steps_per_generation is None or obj.generation_batch_size is None,
        f"{p}generation_batch_size",
        obj.generation_batch_size,
        f"cannot be set with steps_per_generation={obj.steps_per_generation} (as in TRL): give one of them",
    )
    require(obj.temperature > 0, f"{p}temperature", obj.temperature, "must be > 0")
    require(0.0 < obj.top_p <= 1.0, f"{p}top_p", obj.top_p, "must be in (0, 1]")
    require(obj.top_k >= 0, f"{p}top_k", obj.top_k, "must be >= 0 (0 turns top-k off)")
    require(obj.beta >= 0, f"{p}beta", obj.beta, "must be >= 0 (0: no KL term, no reference)")
    require(0.0 < obj.epsilon < 1.0, f"{p}epsilon", obj.epsilon, "must be in (0, 1)")
    require(
        obj.epsilon_high is None or obj.epsilon_high >= obj.epsilon,
        f"{p}epsilon_high",
        obj.epsilon_high,
        f"must be >= epsilon={obj.epsilon} or null (the same as epsilon)",
    )
    require(
        bool(obj.reward_funcs) and all(_REWARD_SPEC.fullmatch(s.strip()) for s in obj.reward_funcs),
        f"{p}reward_funcs",
        obj.reward_funcs,
        "a non-empty list of reward names (math_answer, format, length) or 'module:function' entries",
    )
    require(
        obj.reward_weights is None or len(obj.reward_weights) == len(obj.reward_funcs),
        f"{p}reward_weights",
        obj.reward_weights,
        f"must give one weight per reward function (reward_funcs has {len(obj.reward_funcs)}) or be null",
    )
    require(
        obj.reward_weights is None or all(math.isfinite(w) for w in obj.reward_weights),
        f"{p}reward_weights",
        obj.reward_weights,
        "every weight must be a finite number",
    )
    require(
        obj.eval_reward_funcs is None
        or (
            bool(obj.eval_reward_funcs)
            and all(_REWARD_SPEC.fullmatch(s.strip()) for s in obj.eval_reward_funcs)
        ),
        f"{p}eval_reward_funcs",
        obj.eval_reward_funcs,
        "null (the run's own reward functions) or a non-empty list of reward names or 'module:function' entries",
    )
    require(
        obj.num_completions_to_print is None or obj.num_completions_to_print >= 1,
        f"{p}num_completions_to_print",
        obj.num_completions_to_print,
        "must be >= 1 or null (every completion of the latest rollout)",
    )
    require(
        _compiles(obj.format_pattern),
        f"{p}format_pattern",
        obj.format_pattern,
        "must be a valid Python regular expression",
    )


def steps_per_generation(cfg: Any) -> int:
    """Micro-steps one rollout serves: ``grpo.steps_per_generation``, or ``grpo.generation_batch_size``
    over a micro-step's completions, or (neither set) ``train.grad_accum``, as TRL resolves them."""
    grpo = cfg.grpo
    if grpo.steps_per_generation is not None:
        return int(grpo.steps_per_generation)
    if grpo.generation_batch_size is not None:
        return max(1, int(grpo.generation_batch_size) // (cfg.train.batch_size * grpo.num_generations))
    return max(1, int(cfg.train.grad_accum))


def keeps_old_logps(cfg: Any) -> bool:
    """Whether a rollout's completions are trained by a policy other than the one that sampled them,
    so the objective needs the sampler's log-probs as the old ones (TRL's rule): a rollout serves
    ``steps_per_generation x num_iterations`` micro-steps, and unless those end with an optimizer
    step (``train.grad_accum`` a multiple of them) some are trained after an update."""
    return int(cfg.train.grad_accum) % (steps_per_generation(cfg) * int(cfg.grpo.num_iterations)) != 0


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True
