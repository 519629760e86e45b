"""The metrics contract: what one logged interval reports, shared by the profiler, the trainer and the dashboard.

`StepProfiler` fills the `IntervalMetrics` fields; the trainer adds the `RunMetrics` fields
(the loop's own position and batch layout) before it hands the dict to callbacks. Values that
cannot be known on this hardware are None, never guessed.

The two types are the one definition of the keys. A key only one objective fills (None in every
other run) says so in its annotation, ``Annotated[float | None, ONLY_GRPO]``, beside its docstring; every
list of keys is read from the types in declaration order (`INTERVAL_KEYS`, `METRIC_KEYS`, the
objectives' `KEYS_ONLY_IN`, `PREFERENCE_KEYS`, `GRPO_KEYS`, `OBJECTIVE_KEYS`, `ROLLOUT_KEYS`), so no
list of names is kept by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict, get_type_hints


@dataclass(frozen=True)
class OnlyIn:
    """The mark of a contract key that only one objective's runs fill (None in every other run)."""

    objective: str
    """The objective's name: 'preference' (``train.objective: dpo``, any ``train.dpo_loss``) or 'grpo'."""


ONLY_PREFERENCE = OnlyIn("preference")
ONLY_GRPO = OnlyIn("grpo")


def perplexity(loss: float | None) -> float | None:
    """exp(mean next-token loss): inf where it overflows a float, None without a loss."""
    if loss is None:
        return None
    try:
        return math.exp(float(loss))
    except OverflowError:
        return math.inf


class IntervalMetrics(TypedDict):
    """One log interval, as `StepProfiler.step` measures it (host-side counters and one loss read)."""

    step: int
    """The optimizer step the interval ends at (counted across resumes)."""
    loss: float | None
    """Training loss of the log step, as the objective averages it (over tokens for SFT)."""
    lr: float | None
    """The learning rate the log step applied."""
    step_time_s: float
    """Mean wall-clock seconds per step over the interval."""
    tokens_per_s: float
    """Real (unpadded) tokens trained per second over the interval."""
    mfu: float | None
    """Model FLOPs utilisation: achieved training FLOPs over the devices' peak (`workbench.analysis.flops`); None where the peak is unknown."""
    compiles: int
    """Programs compiled during the interval (off XLA: a compiled native step's torch.compile graphs, `train.compile`)."""
    compile_time_s: float
    """Seconds spent compiling during the interval."""
    total_compiles: int
    """Programs compiled in this process so far, warm-up included (torch_xla's counter; off XLA the compiled native step's graphs, 0 for an eager step)."""
    recompiled: bool
    """A compile after warm-up happened in the interval."""
    transfers: int
    """Device-to-host transfers the loop made in the interval (the profiler's own reads excluded)."""
    expected_transfers: int | None
    """Of `transfers`, the reads the loop made by design, as it declared them to `StepProfiler.step`
    (a GRPO run's: each rollout's read of its completions and of its blocks' "every row has ended"
    flags, each eval batch's read); the host-transfer advice counts only the rest. None where the
    loop declared none (every run but a GRPO one)."""
    host_rss_bytes: int
    """Resident memory of this host process."""
    device_memory_bytes: int | None
    """Device memory in use at the log step, as the backend reports it (None where it reports none, as XLA:CPU)."""
    device_memory_limit_bytes: int | None
    """Memory of one device, from the backend or the chip table (None where unknown)."""
    tokens_seen: int
    """Real tokens trained since the run began (across resumes)."""
    elapsed_s: float
    """Seconds since the profiler started (this process's run)."""
    eval_loss: float | None
    """Mean held-out loss per token, when an eval ran in the interval (`train.eval_every`)."""
    eval_perplexity: float | None
    """exp(eval_loss), when an eval ran in the interval."""
    steps_in_interval: int
    """Optimizer steps in the interval."""
    interval_s: float
    """Wall-clock seconds the interval took."""
    input_wait_s: float
    """Seconds the loop waited for its next batches during the interval."""
    input_wait_fraction: float
    """`input_wait_s` over `interval_s`: the share of the interval spent waiting on input."""
    compiled_program_bytes: int | None
    """The largest compiled program's memory by the compiler's own analysis (the compile memory log; None where it is off or off-XLA)."""
    recompile_steps: list[int]
    """Steps after warm-up at which a program compiled, during the interval."""
    recompile_causes: list[str]
    """Why each compile after warm-up happened, aligned with `recompile_steps`: the inputs whose
    shape or dtype changed and the Python frame that triggered it (`workbench.analysis.recompiles`)."""
    grad_norm: float | None
    """Global gradient norm of the log step, before clipping (`train.max_grad_norm`)."""
    reward_accuracy: Annotated[float | None, ONLY_PREFERENCE]
    """Preference tuning (``train.objective: dpo``): the log step's share of pairs whose chosen answer the
    policy rewards above the rejected one (reward = beta x (policy - reference) log-prob); None otherwise."""
    reward_margin: Annotated[float | None, ONLY_PREFERENCE]
    """Preference tuning: the log step's mean chosen reward minus rejected reward."""
    chosen_logp: Annotated[float | None, ONLY_PREFERENCE]
    """Preference tuning: the policy's mean summed log-prob of the chosen answers at the log step."""
    rejected_logp: Annotated[float | None, ONLY_PREFERENCE]
    """Preference tuning: the policy's mean summed log-prob of the rejected answers at the log step."""
    eval_reward_accuracy: Annotated[float | None, ONLY_PREFERENCE]
    """Preference tuning: `reward_accuracy` over the held-out pairs, when an eval ran in the interval."""
    eval_reward_margin: Annotated[float | None, ONLY_PREFERENCE]
    """Preference tuning: `reward_margin` over the held-out pairs, when an eval ran in the interval."""
    eval_chosen_logp: Annotated[float | None, ONLY_PREFERENCE]
    """Preference tuning: `chosen_logp` over the held-out pairs, when an eval ran in the interval."""
    eval_rejected_logp: Annotated[float | None, ONLY_PREFERENCE]
    """Preference tuning: `rejected_logp` over the held-out pairs, when an eval ran in the interval."""
    clip_ratio: Annotated[float | None, ONLY_GRPO]
    """GRPO (``train.objective: grpo``): the log step's share of completion tokens whose importance
    ratio the clip held (TRL's region-clipped share: below ``1 - epsilon`` with a negative advantage
    or above ``1 + epsilon_high`` with a positive one); always 0 while ``grpo.num_iterations`` is 1
    (the ratio is then 1); None outside GRPO."""
    kl: Annotated[float | None, ONLY_GRPO]
    """GRPO: the log step's mean per-token KL of the policy from the reference (the adapters switched
    off; TRL's k3 estimator) over the completion tokens; None when ``grpo.beta`` is 0 and outside GRPO."""
    eval_reward_mean: Annotated[float | None, ONLY_GRPO]
    """GRPO: mean total reward of greedy completions of the held-out prompts, scored by the run's
    reward functions (``grpo.eval_reward_funcs`` when set), when an eval ran in the interval; the
    completions no function scored left out, None when none was scored and when no eval ran."""


class RunMetrics(IntervalMetrics):
    """What `Trainer.fit` hands to callbacks: the interval plus the loop's position and batch layout."""

    warmup_compiles: int
    """Programs compiled by the warm-up before the first step (XLA's, or a compiled native step's graphs)."""
    batch_size: int
    """Sequences in one loaded batch, all devices together (`train.batch_size`, or what dynamic growth made it); an optimizer step takes `train.grad_accum` of them."""
    micro_batch: int
    """Sequences per forward pass: `batch_size` divided by any OOM split."""
    grad_accum: int
    """Micro-steps per optimizer step (the configured accumulation times any OOM split)."""
    time_left_s: float | None
    """Seconds left before ``train.time_limit`` (None without a limit)."""
    planned_stop_step: int | None
    """The step the run is expected to end at: ``train.steps``, or earlier where the time limit comes
    first (None without a limit)."""
    checkpoint_stall_s: float | None
    """Seconds the last checkpoint save held the training loop (with ``train.async_checkpoint``: the
    copy to the host only); None before the first save."""
    reward_mean: Annotated[float | None, ONLY_GRPO]
    """GRPO (``train.objective: grpo``): mean total reward (the weighted sum of the reward functions)
    of the interval's sampled completions. A completion no function scored (each returned None or NaN)
    is left out, here, in ``eval_reward_mean`` and in ``eval --rewards`` alike (TRL's logged
    ``reward``); None when the interval scored none (and outside GRPO): a run that scores nothing
    for a whole interval stops."""
    reward_std: Annotated[float | None, ONLY_GRPO]
    """GRPO: the spread of the completions' total rewards within their group (a prompt's completions):
    the mean over a rollout's groups of each group's standard deviation (TRL's ``reward_std``; its
    unscored completions left out, a group with fewer than two scored left out), averaged over the
    interval's rollouts."""
    rewards: Annotated[dict[str, float | None] | None, ONLY_GRPO]
    """GRPO: each reward function's mean over the interval's completions, by its name (TRL's
    ``rewards/<name>/mean``; the dashboard's traces are named ``reward/<name>``); a function that
    skipped (None) every completion is None."""
    completion_length: Annotated[float | None, ONLY_GRPO]
    """GRPO: mean tokens per sampled completion (its ending token included) over the interval."""
    clipped_ratio: Annotated[float | None, ONLY_GRPO]
    """GRPO: share of the interval's completions cut at ``grpo.max_completion_length`` (still going
    when the budget ran out; TRL's ``completions/clipped_ratio``). Above 0.5 the run says so and
    names the key to raise: a cut completion's reward judges an unfinished answer."""
    completion_length_max: Annotated[int | None, ONLY_GRPO]
    """GRPO: the longest sampled completion of the interval, in tokens (TRL's ``completions/max_length``)."""
    rollout_decode_steps: Annotated[float | None, ONLY_GRPO]
    """GRPO: tokens each rollout decoded per row, averaged over the interval's rollouts: the completion
    budget (``grpo.max_completion_length``) when some completion ran to it, fewer when every completion
    had ended (the rollout checks once per block of decode steps)."""
    zero_std_groups: Annotated[float | None, ONLY_GRPO]
    """GRPO: share of the interval's groups (a prompt's ``grpo.num_generations`` completions) whose
    rewards were all equal, so their advantages are 0 and they teach nothing (TRL's
    ``frac_reward_zero_std``)."""
    rollout_s: Annotated[float | None, ONLY_GRPO]
    """GRPO: seconds per optimizer step spent in rollouts (sampling on the device, the one read of the
    completions, rewards, advantages and their write); with ``grpo.num_iterations`` above 1 a rollout
    is shared by that many steps."""
    train_s: Annotated[float | None, ONLY_GRPO]
    """GRPO: seconds per optimizer step spent in the training step itself, outside the rollout."""
    rollout_tokens_per_s: Annotated[float | None, ONLY_GRPO]
    """GRPO: completion tokens sampled per second of rollout time over the interval (filler tokens
    after a completion's end not counted)."""
    completions: Annotated[list[dict[str, Any]] | None, ONLY_GRPO]
    """GRPO with ``grpo.log_completions``: the interval's last rollout's completions (the first
    ``grpo.num_completions_to_print``), one dict each: ``step``, ``group`` (the prompt's place in the
    rollout), ``prompt`` (as the record gives it), ``completion`` (the decoded text), ``rewards`` (each
    function's value, None where it skipped), ``reward`` (the weighted total, None when unscored),
    ``advantage`` and ``clipped`` (cut at the budget); None otherwise. The host already holds them
    (no extra read); the dashboard shows them as a table and the command line appends them to a
    JSONL file."""


INTERVAL_KEYS: tuple[str, ...] = tuple(get_type_hints(IntervalMetrics))
"""Every key `StepProfiler` reports for an interval, in declaration order."""

METRIC_KEYS: tuple[str, ...] = tuple(get_type_hints(RunMetrics))
"""Every key of a callback's metrics dict: the interval's, then the run's."""


def _only_in(cls: type) -> dict[str, tuple[str, ...]]:
    """The keys `cls` declares that only one objective fills, by objective, in declaration order."""
    groups: dict[str, tuple[str, ...]] = {}
    for key, hint in get_type_hints(cls, include_extras=True).items():
        for mark in getattr(hint, "__metadata__", ()):
            if isinstance(mark, OnlyIn):
                groups[mark.objective] = (*groups.get(mark.objective, ()), key)
    return groups


KEYS_ONLY_IN: dict[str, tuple[str, ...]] = _only_in(RunMetrics)
"""The keys only one objective fills, by objective ('preference', 'grpo'): None in any other run."""

PREFERENCE_KEYS: tuple[str, ...] = KEYS_ONLY_IN["preference"]
"""The keys only preference tuning fills (None in any other run); all of them interval keys."""

GRPO_KEYS: tuple[str, ...] = KEYS_ONLY_IN["grpo"]
"""The keys only GRPO fills (None in any other run)."""

OBJECTIVE_KEYS: tuple[str, ...] = tuple(k for keys in _only_in(IntervalMetrics).values() for k in keys)
"""The interval keys an objective's own figures fill (its ``stats`` sums, read at the log step, and
its eval's, as ``eval_<name>``); `StepProfiler` sets the rest of them to None."""

ROLLOUT_KEYS: tuple[str, ...] = tuple(k for k in GRPO_KEYS if k not in INTERVAL_KEYS)
"""The run keys a GRPO run's rollouts fill (`workbench.rl.metrics.rollout_metrics`); None elsewhere."""
