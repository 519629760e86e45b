"""Sampling on the model's device with a static KV cache: a bounded, known set of compiled programs.

`generate(model, prompts, max_new_tokens=N)` returns the new tokens of each prompt (and their
text, with a tokenizer) as a `GenerationResult`. It runs where the model's weights are: an XLA
device (TPU, XLA:CPU), CUDA or the CPU. Greedy by default, token for token what
``model.generate`` returns for the same weights; ``temperature > 0`` samples (optionally from
the ``top_k`` most likely tokens, then the ``top_p`` nucleus, as transformers' warpers) with a
seeded generator. ``stop=[...]`` (with a tokenizer) and ``repetition_penalty`` behave as
``model.generate``'s ``stop_strings`` and ``repetition_penalty`` (`workbench.generation_controls`:
both run on the device inside each step).

`sample_rollout(model, input_ids, attention_mask, ...)` is the sampler of reinforcement learning
(GRPO): rows already left-padded on the host in, a `DeviceRollout` out, every field a device
tensor (prompt + completion, their mask and positions, the sampled tokens' log-probs) laid out
for a training forward. It decodes in blocks of `block` steps (the one decode program run again),
reads one "every row has ended" flag after each block and stops at the first where it is set;
with ``block=0`` exactly `max_new_tokens` steps and no host read at all. `read_rollout` reads the
completions back in one transfer; `prewarm_rollout` compiles a rollout's programs up front.
The decoder itself (cache, prefill, decode step, token choice) is `workbench.decoding`.

How every shape stays fixed, so XLA compiles each program once:

- **Buckets.** A prompt is left-padded to its bucket: the smallest boundary of `buckets` that
  fits it (a `workbench.data.buckets.BucketPlan`, e.g. ``plan_buckets(lengths, 4,
  multiple_of=16)``, or a list of lengths), by default the next power of two of at least 16.
- **Rows.** Prompts of one bucket run together, `max_batch_size` rows at a time. Where each new
  shape is a compiled program (the `Backend`'s `compiles_every_shape`: an XLA device) every batch
  has exactly `max_batch_size` rows (filler rows repeat a prompt; their output is dropped), so the
  programs never depend on how many prompts a bucket holds. On an eager backend (CUDA, the CPU:
  nothing is compiled) a batch has its prompt count rounded up to a power of two rows, because
  fewer rows are faster there. A rollout's rows are the caller's.
- **The cache.** transformers' `StaticCache` of ``bucket + max_new_tokens`` positions (the new
  tokens rounded up to a multiple of 16). Its sliding-window layers (Mistral, Gemma 2/3, any
  config with ``sliding_window`` or sliding ``layer_types``) are `StaticSlidingWindowLayer`s of
  the window's size, so a prompt longer than the window is fine.
- **One decode program.** The 2-D attention mask covers the whole cache from the start (left
  padding 0, everything else 1: causality hides the positions not written yet); the position
  ids, the cache's own length counter, the output buffer and its write index, the done mask,
  the stop-string window, the repetition mask and a rollout's log-probs are device tensors
  advanced inside the step. Each step is the same graph over new device data; top-k and top-p
  are a top-k, a sort, a cumulative sum and a scatter of fixed shapes.

Programs per bucket (the rows being fixed on XLA): the prefill and one decode step (a rollout adds
one that lays out its result). Sliding-window layers add decode programs
at the window's edges: transformers passes their kv offset as a Python int, and torch_xla makes
an offset of exactly 0 or 1 a constant, so the steps where the window fills up, turns full and
(measured on torch_xla 2.9) where the offset equals the window each compile their own. A later
call whose prompts fall in the same buckets, with the same rounded `max_new_tokens` and options,
compiles nothing, however many prompts each bucket holds. `prewarm_generation` (or
``generate(..., prewarm=True)``) compiles every bucket's programs up front, from dummy prompts.

**Host syncs.** None per token: each step ends with the backend's ``step_boundary()`` (on XLA
``runtime.sync()``: the step is launched, nothing is read back). The tokens come back in one transfer per batch at the end. With an
end-of-sequence id or stop strings, whether every row has finished is read every
`stop_check_every` tokens (one small transfer each; 0: never, run to `max_new_tokens`), so a
batch may run up to that many steps past its last row's end. Tokens after a row's end are
dropped, as ``model.generate`` pads them. A rollout never checks: it reads nothing.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.backend.protocol import Backend
from workbench.backend.selection import backend_of
from workbench.decoding import (
    CACHE_MULTIPLE,
    Decoder,
    cache_budget,
    inference,
    model_backend,
    seeded,
    static_cache,
)
from workbench.generation_controls import prompt_ids, resolve_options

__all__ = [
    "CACHE_MULTIPLE",
    "MIN_BUCKET",
    "DeviceRollout",
    "GenerationResult",
    "generate",
    "prewarm_generation",
    "prewarm_rollout",
    "read_rollout",
    "sample_rollout",
    "static_cache",
]

MIN_BUCKET = 16
"""The smallest default bucket (power-of-two buckets start here)."""


@dataclass(frozen=True)
class GenerationResult:
    """What `generate` produced, one entry per prompt in the order given."""

    token_ids: list[list[int]]
    """The new tokens of each prompt, up to and including the token that ended it (end-of-sequence
    or the one completing a stop string)."""
    texts: list[str] | None
    """The new tokens decoded (None without a tokenizer)."""
    finished: list[bool]
    """Whether the prompt's generation ended on an end-of-sequence token or a completed stop string
    (rather than at `max_new_tokens`)."""
    buckets: list[int]
    """The padded prompt length each prompt ran at."""
    compiles: int
    """Programs the backend compiled during the call (`Backend.compile_count`), a prewarm's included (0 on
    an eager backend, where decoding compiles nothing)."""
    seconds: float
    """Wall time of the call, device work (and a prewarm) included."""

    @property
    def new_tokens(self) -> int:
        """New tokens over all prompts."""
        return sum(len(ids) for ids in self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def generate(
    model: Any,
    prompts: str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    tokenizer: Any = None,
    buckets: Any = None,
    max_batch_size: int = 8,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    seed: int = 0,
    eos_token_id: int | Sequence[int] | str | None = "auto",
    pad_token_id: int | None = None,
    stop: str | Sequence[str] | None = None,
    repetition_penalty: float = 1.0,
    stop_check_every: int = 16,
    skip_special_tokens: bool = True,
    prewarm: bool = False,
    backend: Backend | None = None,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens for each prompt, on the model's device.

    `prompts`: token-id lists, or strings with a `tokenizer` (one prompt alone is fine).
    `buckets`: a `BucketPlan` or boundary lengths (default: powers of two from 16).
    `temperature` 0 is greedy; above 0 samples, from the `top_k` best tokens when given, then
    the `top_p` nucleus (transformers' `TopPLogitsWarper`; 1.0: off), seeded by `seed` (on XLA the device RNG is seeded and restored afterwards).
    `eos_token_id`: "auto" takes the model's generation config, else the tokenizer's; None
    never stops early. `stop`: strings that end a row at the token completing one (needs the
    `tokenizer`). `repetition_penalty` > 0 (1.0: off) as ``model.generate``'s.
    `prewarm`: first compile every bucket of `buckets` (which must then be given), as
    `prewarm_generation` does. `backend`: the device's `Backend` (default: `backend_of` the model's
    weights). See the module docstring for the shapes and syncs.
    """
    controls: dict[str, Any] = dict(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        stop=stop,
        repetition_penalty=repetition_penalty,
    )
    options = resolve_options(
        model, tokenizer, max_new_tokens=max_new_tokens, max_batch_size=max_batch_size, **controls
    )
    backend = backend if backend is not None else model_backend(model)
    compiles_before = backend.compile_count()
    start = time.perf_counter()
    if prewarm:
        prewarm_generation(
            model,
            buckets=buckets,
            max_new_tokens=max_new_tokens,
            max_batch_size=max_batch_size,
            tokenizer=tokenizer,
            backend=backend,
            **controls,
        )
    ids = prompt_ids(prompts, tokenizer)
    decoder = Decoder(model, tokenizer, max_batch_size, stop_check_every, backend=backend, **options)
    sizes = [_bucket(len(p), buckets) for p in ids]
    budget = cache_budget(max_new_tokens)
    out: list[list[int]] = [[] for _ in ids]
    finished = [False] * len(ids)
    with inference(model):
        with seeded(decoder, seed):
            for bucket, rows in _batches(sizes, max_batch_size):
                tokens, ended = decoder.run([ids[i] for i in rows], bucket, budget, max_new_tokens)
                for i, row, end in zip(rows, tokens, ended):
                    out[i], finished[i] = row, end
        backend.wait()
    seconds = time.perf_counter() - start
    texts = None
    if tokenizer is not None:
        texts = [tokenizer.decode(t, skip_special_tokens=skip_special_tokens) for t in out]
    return GenerationResult(
        token_ids=out,
        texts=texts,
        finished=finished,
        buckets=sizes,
        compiles=backend.compile_count() - compiles_before,
        seconds=seconds,
    )


def prewarm_generation(
    model: Any,
    *,
    buckets: Any,
    max_new_tokens: int,
    max_batch_size: int = 8,
    tokenizer: Any = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    eos_token_id: int | Sequence[int] | str | None = "auto",
    pad_token_id: int | None = None,
    stop: str | Sequence[str] | None = None,
    repetition_penalty: float = 1.0,
    backend: Backend | None = None,
) -> int:
    """Compile, where each new shape is a compiled program (`Backend.compiles_every_shape`: XLA),
    every program `generate` runs for prompts in `buckets` with these options; returns how many were
    compiled (0 on an eager backend, where nothing is compiled; `backend` as `generate`'s).

    `buckets` (a `BucketPlan` or boundary lengths) must be given: the default powers of two never
    end. Each bucket runs one batch of `max_batch_size` dummy rows: the prefill and enough decode
    steps to reach each sliding window's edges (module docstring), at most a call's own number.
    A later `generate` with the same buckets, rounded `max_new_tokens`, `max_batch_size` and
    options then compiles nothing. The seed is not an option here: it never changes a program.
    """
    options = resolve_options(
        model,
        tokenizer,
        max_new_tokens=max_new_tokens,
        max_batch_size=max_batch_size,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        stop=stop,
        repetition_penalty=repetition_penalty,
    )
    bounds = _bucket_bounds(buckets)
    decoder = Decoder(model, tokenizer, max_batch_size, 0, backend=backend, **options)

    def run_buckets() -> None:
        for bucket in bounds:
            decoder.prewarm(bucket, cache_budget(max_new_tokens))

    return _compiled(decoder, run_buckets)


# ---- rollouts: device tensors in, device tensors out ---------------------------------------------


@dataclass
class DeviceRollout:
    """A batch of sampled completions, every field a device tensor (nothing read back), laid out as
    a training step takes them: ``P`` the prompts' padded length, ``C`` the cache budget
    (`max_new_tokens` rounded up to `CACHE_MULTIPLE`; positions past `max_new_tokens` are padding)."""

    sequences: torch.Tensor
    """[rows, P + C] the left-padded prompt followed by the completion (the pad id after a row's end)."""
    attention_mask: torch.Tensor
    """[rows, P + C] long: 0 on left padding and after a completion's end, 1 elsewhere."""
    position_ids: torch.Tensor
    """[rows, P + C] ``(attention_mask.cumsum(-1) - 1).clamp(min=0)``: the positions generation used."""
    completion_ids: torch.Tensor
    """[rows, C] the sampled tokens, the pad id after a row's end."""
    completion_mask: torch.Tensor
    """[rows, C] fp32: 1 on the completion's tokens up to and including the ending token."""
    logps: torch.Tensor | None
    """[rows, C] fp32: ``log_softmax(logits / temperature)`` at each sampled token, before top-k and
    top-p (with temperature 0, greedy: of the unscaled logits); 0 past a row's end. None when the
    caller asked for none (``keep_logps=False``: no full-vocabulary log-softmax per token)."""
    lengths: torch.Tensor
    """[rows] long: tokens per completion, its ending token included."""
    finished: torch.Tensor
    """[rows] bool: the row ended on an end-of-sequence token (False: cut at `max_new_tokens`)."""
    decode_steps: int = 0
    """Tokens chosen per row (the prefill's and the decode steps run): `max_new_tokens`, or fewer when
    every row ended before (a host count)."""
    flag_reads: int = 0
    """Host reads of the "every row has ended" flag (one per block decoded)."""


RowSharding = Callable[[torch.Tensor], torch.Tensor]
"""Puts one host tensor whose dim 0 is the rows on the device, split as the caller wants (under SPMD
e.g. ``lambda t: shard_batch({"t": t}, mesh)["t"]``, rows over data x fsdp)."""


def sample_rollout(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    top_k: int | None = None,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int,
    seed: int = 0,
    row_sharding: RowSharding | None = None,
    keep_logps: bool = True,
    block: int = 0,
    all_ended: Callable[[torch.Tensor], bool] | None = None,
    trim: bool = False,
    backend: Backend | None = None,
    prewarm: bool = False,
) -> DeviceRollout:
    """Sample one completion per row of `input_ids` [rows, P] (host, left-padded, `attention_mask`
    0 on the padding) on the model's device, and return them as a `DeviceRollout`.

    Up to `max_new_tokens` tokens are chosen (the prefill's and ``max_new_tokens - 1`` decode steps;
    a row that ended on `eos_token_id` gets the pad id after it). With `block` > 0 and an
    `eos_token_id`, after every `block` decode steps one flag is read, whether every row has ended
    (`all_ended` turns it into the decision: by default its value), and decoding stops at the first
    block where it is set; the steps are the one decode program either way, so stopping early
    compiles nothing. With ``block=0`` nothing is read: the only transfers are the inputs going to
    the device. `trim` (eager backends, where a new shape compiles nothing) cuts the completion
    columns to the tokens chosen; otherwise they stay the cache budget's, so the training programs
    keep their shapes.
    The rows are fixed by the caller, so on XLA the programs are one prefill, one decode step and
    one that lays out the result per prompt length ``P`` (plus a sliding window's edges, module
    docstring). `temperature` 0 is greedy; above 0 samples from the device RNG seeded by `seed`
    (restored afterwards), after `top_k` and `top_p` (transformers' order and semantics).
    `row_sharding` places each input tensor (default: ``.to(device)``); the KV cache and outputs
    follow the inputs' sharding by propagation. `keep_logps`: the sampled tokens' log-probs are
    computed and returned (a full-vocabulary log-softmax each step; without them ``logps`` is None).
    `backend`: the device's `Backend` (default: `backend_of` the model's weights). `prewarm`: decode only
    the steps that reach every decode program a rollout of this prompt length can run
    (`Decoder.prewarm_steps`: two, or through a sliding window's edges), laid out as a whole rollout:
    a warm-up compiles every program without decoding the whole budget.
    """
    options = _rollout_options(
        model,
        input_ids,
        attention_mask,
        max_new_tokens,
        temperature,
        top_p,
        top_k,
        eos_token_id,
        pad_token_id,
    )
    if isinstance(block, bool) or not isinstance(block, int) or block < 0:
        raise ValueError(f"block={block!r} is not allowed: an int >= 0 (0: decode every step, read nothing)")
    decoder = Decoder(model, None, int(input_ids.shape[0]), block, backend=backend, **options)
    reach = decoder.prewarm_steps(int(input_ids.shape[1]), cache_budget(max_new_tokens)) + 1
    steps = min(max_new_tokens, reach) if prewarm else max_new_tokens
    with inference(model), seeded(decoder, seed):
        return _rollout(
            decoder,
            input_ids,
            attention_mask,
            max_new_tokens,
            steps,
            row_sharding,
            keep_logps,
            all_ended=all_ended,
            trim=trim,
        )


def prewarm_rollout(
    model: Any,
    *,
    buckets: Any,
    rows: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    top_k: int | None = None,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int,
    row_sharding: RowSharding | None = None,
    keep_logps: bool = True,
    backend: Backend | None = None,
) -> int:
    """Compile, where each new shape is a compiled program (XLA), every program `sample_rollout` runs
    for `rows` prompts padded to each of `buckets` with these options (`keep_logps` as it is given);
    returns how many were compiled (0 on an eager backend). Each bucket decodes only the steps that
    reach its programs (`prewarm_generation`)."""
    bounds = _bucket_bounds(buckets)
    probe = torch.full((rows, bounds[0]), pad_token_id, dtype=torch.long)
    options = _rollout_options(
        model,
        probe,
        torch.ones_like(probe),
        max_new_tokens,
        temperature,
        top_p,
        top_k,
        eos_token_id,
        pad_token_id,
    )
    decoder = Decoder(model, None, rows, 0, backend=backend, **options)
    budget = cache_budget(max_new_tokens)

    def run_buckets() -> None:
        for bucket in bounds:
            ids = torch.full((rows, bucket), pad_token_id, dtype=torch.long)
            steps = min(max_new_tokens, decoder.prewarm_steps(bucket, budget) + 1)
            _rollout(decoder, ids, torch.ones_like(ids), max_new_tokens, steps, row_sharding, keep_logps)

    return _compiled(decoder, run_buckets)


def read_rollout(
    rollout: DeviceRollout, *, backend: Backend | None = None
) -> tuple[list[list[int]], list[bool]]:
    """(each row's completion tokens up to and including its ending token, whether it ended on an
    end-of-sequence token), read from the device in one transfer (`Backend.host_copies`; `backend`:
    the device's, default `backend_of` the completions)."""
    backend = backend if backend is not None else backend_of([rollout.completion_ids])
    ids, lengths, finished = backend.host_copies([rollout.completion_ids, rollout.lengths, rollout.finished])
    return [row[:n] for row, n in zip(ids.tolist(), lengths.tolist())], [bool(f) for f in finished.tolist()]


def _rollout_options(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int | None,
    eos_token_id: Any,
    pad_token_id: int,
) -> dict[str, Any]:
    """The decoder's options for a rollout, the inputs checked (a ValueError naming the bad value)."""
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(
            f"input_ids of shape {tuple(input_ids.shape)} is not allowed: must be [rows >= 1, length >= 1]"
        )
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask of shape {tuple(attention_mask.shape)} is not allowed: must match input_ids "
            f"{tuple(input_ids.shape)}"
        )
    if attention_mask.device.type == "cpu":  # a host tensor: checking it reads no device
        left_padded = bool((attention_mask[:, 1:] >= attention_mask[:, :-1]).all()) and bool(
            attention_mask[:, -1].all()
        )
        if not left_padded:
            raise ValueError(
                "attention_mask is not allowed: every row must be left-padded (0s, then at least one 1)"
            )
    return resolve_options(
        model,
        None,
        max_new_tokens=max_new_tokens,
        max_batch_size=int(input_ids.shape[0]),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        stop=None,
        repetition_penalty=1.0,
    )


def _rollout(
    decoder: Decoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    steps: int,
    row_sharding: RowSharding | None,
    keep_logps: bool,
    *,
    all_ended: Callable[[torch.Tensor], bool] | None = None,
    trim: bool = False,
) -> DeviceRollout:
    """Up to `steps` decode steps of a `max_new_tokens` rollout (fewer when the decoder stops at a
    block where every row ended), laid out as a `DeviceRollout` and synced."""
    place = row_sharding or (lambda t: t.to(decoder.dev))
    rows, prompt_len = input_ids.shape
    budget = cache_budget(max_new_tokens)
    prompt_mask = attention_mask.long()
    cache_mask = torch.cat([prompt_mask, prompt_mask.new_ones((rows, budget))], dim=1)
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # as model.generate numbers them
    ids_dev, mask_dev = place(input_ids.long()), place(cache_mask)
    state = decoder.decode(
        ids_dev,
        mask_dev,
        place(positions),
        budget,
        steps,
        check_stops=decoder.stop_check_every > 0,
        keep_logps=keep_logps,
        all_ended=all_ended,
    )
    width = state.steps if trim else budget  # the columns past the last token chosen are padding
    out = state.out[:, :width] if trim else state.out
    logps = state.logps[:, :width] if trim and state.logps is not None else state.logps
    columns = torch.arange(width, device=decoder.dev)
    completion_mask = (columns[None, :] < state.lengths[:, None]).long()
    full_mask = torch.cat([mask_dev[:, :prompt_len], completion_mask], dim=1)
    rollout = DeviceRollout(
        sequences=torch.cat([ids_dev, out], dim=1),
        attention_mask=full_mask,
        position_ids=(full_mask.cumsum(-1) - 1).clamp(min=0),
        completion_ids=out,
        completion_mask=completion_mask.float(),
        logps=logps,
        lengths=state.lengths,
        finished=state.done,
        decode_steps=state.steps,
        flag_reads=state.reads,
    )
    decoder.backend.step_boundary()  # the layout as its own small program (XLA): the next graph starts clean
    return rollout


# ---- helpers -------------------------------------------------------------------------------


def _compiled(decoder: Decoder, run: Callable[[], Any]) -> int:
    """A prewarm: `run` (greedy or seeded 0, without gradients) where each new shape is a compiled
    program, and how many it compiled; nothing run and 0 on an eager backend (nothing to compile)."""
    backend = decoder.backend
    if not backend.compiles_every_shape:
        return 0
    before = backend.compile_count()
    with inference(decoder.model), seeded(decoder, 0):
        run()
    backend.wait()
    return backend.compile_count() - before


def _bucket(length: int, buckets: Any) -> int:
    """The padded length of a `length`-token prompt."""
    if buckets is None:
        return max(MIN_BUCKET, 1 << (length - 1).bit_length())
    if hasattr(buckets, "bucket_for"):  # a BucketPlan
        return int(buckets.bucket_for(length))
    bounds = sorted(int(b) for b in buckets)
    index = bisect.bisect_left(bounds, length)
    if index == len(bounds):
        raise ValueError(
            f"a prompt of {length} tokens is longer than the last bucket {bounds[-1]}: "
            "truncate it or pass larger buckets"
        )
    return bounds[index]


def _bucket_bounds(buckets: Any) -> list[int]:
    """Every bucket of an explicit `buckets` (a `BucketPlan` or lengths), for a prewarm."""
    if buckets is None:
        raise ValueError(
            "prewarm needs explicit buckets: pass buckets= (a BucketPlan or a list of prompt lengths); "
            "the default powers of two have no last bucket to stop at"
        )
    bounds = sorted({int(b) for b in getattr(buckets, "boundaries", buckets)})
    if not bounds or bounds[0] < 1:
        raise ValueError(f"buckets={buckets!r} is not allowed for a prewarm: give lengths >= 1")
    return bounds


def _batches(sizes: list[int], max_rows: int) -> list[tuple[int, list[int]]]:
    """(bucket, prompt indices) per batch: prompts grouped by bucket (smallest first), `max_rows` at a time."""
    groups: dict[int, list[int]] = {}
    for i, size in enumerate(sizes):
        groups.setdefault(size, []).append(i)
    return [
        (bucket, groups[bucket][first : first + max_rows])
        for bucket in sorted(groups)
        for first in range(0, len(groups[bucket]), max_rows)
    ]
