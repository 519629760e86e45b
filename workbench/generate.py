"""Sampling on the model's device with a static KV cache: a bounded, known set of compiled programs.

`generate(model, prompts, max_new_tokens=N)` returns the new tokens of each prompt (and their
text, with a tokenizer) as a `GenerationResult`. It runs where the model's weights are: an XLA
device (TPU, XLA:CPU), CUDA or the CPU. Greedy by default, token for token what
``model.generate`` returns for the same weights; ``temperature > 0`` samples (optionally from
the ``top_k`` most likely tokens) with a seeded generator. ``stop=[...]`` (with a tokenizer) and
``repetition_penalty`` behave as ``model.generate``'s ``stop_strings`` and ``repetition_penalty``
(`workbench.generation_controls`: both run on the device inside each step).

How every shape stays fixed, so XLA compiles each program once:

- **Buckets.** A prompt is left-padded to its bucket: the smallest boundary of `buckets` that
  fits it (a `workbench.data.buckets.BucketPlan`, e.g. ``plan_buckets(lengths, 4,
  multiple_of=16)``, or a list of lengths), by default the next power of two of at least 16.
- **Rows.** Prompts of one bucket run together, `max_batch_size` rows at a time. On an XLA
  device every batch has exactly `max_batch_size` rows (filler rows repeat a prompt; their
  output is dropped), so the programs never depend on how many prompts a bucket holds. Off XLA
  (CUDA, the CPU: eager, nothing is compiled) a batch has its prompt count rounded up to a power
  of two rows, because fewer rows are faster there.
- **The cache.** transformers' `StaticCache` of ``bucket + max_new_tokens`` positions (the new
  tokens rounded up to a multiple of 16). Its sliding-window layers (Mistral, Gemma 2/3, any
  config with ``sliding_window`` or sliding ``layer_types``) are `StaticSlidingWindowLayer`s of
  the window's size, so a prompt longer than the window is fine.
- **One decode program.** The 2-D attention mask covers the whole cache from the start (left
  padding 0, everything else 1: causality hides the positions not written yet); the position
  ids, the cache's own length counter, the output buffer and its write index, the done mask,
  the stop-string window and the repetition mask are device tensors advanced inside the step.
  Each step is the same graph over new device data.

Programs per bucket (the rows being fixed on XLA): the prefill and one decode step. Sliding-window layers add decode programs
at the window's edges: transformers passes their kv offset as a Python int, and torch_xla makes
an offset of exactly 0 or 1 a constant, so the steps where the window fills up, turns full and
(measured on torch_xla 2.9) where the offset equals the window each compile their own. A later
call whose prompts fall in the same buckets, with the same rounded `max_new_tokens` and options,
compiles nothing, however many prompts each bucket holds. `prewarm_generation` (or
``generate(..., prewarm=True)``) compiles every bucket's programs up front, from dummy prompts.

**Host syncs.** None per token: each step ends with ``runtime.sync()`` (the step is launched,
nothing is read back). The tokens come back in one transfer per batch at the end. With an
end-of-sequence id or stop strings, whether every row has finished is read every
`stop_check_every` tokens (one small transfer each; 0: never, run to `max_new_tokens`), so a
batch may run up to that many steps past its last row's end. Tokens after a row's end are
dropped, as ``model.generate`` pads them.
"""

from __future__ import annotations

import bisect
import contextlib
import inspect
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.backend import runtime
from workbench.generation_controls import RepetitionPenalty, StopStrings, prompt_ids, resolve_options

MIN_BUCKET = 16
"""The smallest default bucket (power-of-two buckets start here)."""
CACHE_MULTIPLE = 16
"""`max_new_tokens` is rounded up to this many cache positions (nearby values share programs)."""


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
    """Programs XLA compiled during the call, a prewarm's included (0 off XLA)."""
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
    seed: int = 0,
    eos_token_id: int | Sequence[int] | str | None = "auto",
    pad_token_id: int | None = None,
    stop: str | Sequence[str] | None = None,
    repetition_penalty: float = 1.0,
    stop_check_every: int = 16,
    skip_special_tokens: bool = True,
    prewarm: bool = False,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens for each prompt, on the model's device.

    `prompts`: token-id lists, or strings with a `tokenizer` (one prompt alone is fine).
    `buckets`: a `BucketPlan` or boundary lengths (default: powers of two from 16).
    `temperature` 0 is greedy; above 0 samples, from the `top_k` best tokens when given,
    seeded by `seed` (on XLA the device RNG is seeded and restored afterwards).
    `eos_token_id`: "auto" takes the model's generation config, else the tokenizer's; None
    never stops early. `stop`: strings that end a row at the token completing one (needs the
    `tokenizer`). `repetition_penalty` > 0 (1.0: off) as ``model.generate``'s.
    `prewarm`: first compile every bucket of `buckets` (which must then be given), as
    `prewarm_generation` does. See the module docstring for the shapes and syncs.
    """
    controls: dict[str, Any] = dict(
        temperature=temperature,
        top_k=top_k,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        stop=stop,
        repetition_penalty=repetition_penalty,
    )
    options = resolve_options(
        model, tokenizer, max_new_tokens=max_new_tokens, max_batch_size=max_batch_size, **controls
    )
    compiles_before = runtime.compile_count() if runtime.xla_imported() else 0
    start = time.perf_counter()
    if prewarm:
        prewarm_generation(
            model,
            buckets=buckets,
            max_new_tokens=max_new_tokens,
            max_batch_size=max_batch_size,
            tokenizer=tokenizer,
            **controls,
        )
    ids = prompt_ids(prompts, tokenizer)
    decoder = _Decoder(model, tokenizer, max_batch_size, stop_check_every, **options)
    sizes = [_bucket(len(p), buckets) for p in ids]
    budget = _cache_budget(max_new_tokens)
    out: list[list[int]] = [[] for _ in ids]
    finished = [False] * len(ids)
    with _inference(model):
        with _seeded(decoder, seed):
            for bucket, rows in _batches(sizes, max_batch_size):
                tokens, ended = decoder.run([ids[i] for i in rows], bucket, budget, max_new_tokens)
                for i, row, end in zip(rows, tokens, ended):
                    out[i], finished[i] = row, end
        if decoder.xla:
            runtime.wait_device_ops()
    seconds = time.perf_counter() - start
    texts = None
    if tokenizer is not None:
        texts = [tokenizer.decode(t, skip_special_tokens=skip_special_tokens) for t in out]
    return GenerationResult(
        token_ids=out,
        texts=texts,
        finished=finished,
        buckets=sizes,
        compiles=(runtime.compile_count() - compiles_before) if decoder.xla else 0,
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
    eos_token_id: int | Sequence[int] | str | None = "auto",
    pad_token_id: int | None = None,
    stop: str | Sequence[str] | None = None,
    repetition_penalty: float = 1.0,
) -> int:
    """Compile, on an XLA device, every program `generate` runs for prompts in `buckets` with these
    options; returns how many were compiled (0 off XLA, where nothing is compiled).

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
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        stop=stop,
        repetition_penalty=repetition_penalty,
    )
    bounds = _bucket_bounds(buckets)
    decoder = _Decoder(model, tokenizer, max_batch_size, 0, **options)
    if not decoder.xla:
        return 0
    before = runtime.compile_count()
    with _inference(model), _seeded(decoder, 0):
        for bucket in bounds:
            decoder.prewarm(bucket, _cache_budget(max_new_tokens))
    runtime.wait_device_ops()
    return runtime.compile_count() - before


@dataclass
class _Rows:
    """One batch's per-row device state, advanced inside each step."""

    out: torch.Tensor
    """[rows, budget] the tokens chosen so far."""
    step: torch.Tensor
    """[1] where the next token goes in `out`."""
    done: torch.Tensor
    """[rows] whether the row has ended (end-of-sequence or a stop string)."""
    lengths: torch.Tensor
    """[rows] tokens each row produced up to and including the one that ended it."""
    window: torch.Tensor | None
    """[rows, width] each row's last tokens, for the stop strings (None without)."""
    seen: torch.Tensor | None
    """[rows, vocab] the ids already in each row, for the repetition penalty (None without)."""
    all_done: torch.Tensor | None = None
    """[] whether every row has ended: the one value the host reads during decoding."""


class _Decoder:
    """Prefill and fixed-shape decode steps for one batch of same-bucket prompts."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_rows: int,
        stop_check_every: int,
        *,
        eos: list[int],
        pad: int,
        temperature: float,
        top_k: int | None,
        stop: list[str],
        repetition_penalty: float,
    ) -> None:
        self.model, self.max_rows = model, max_rows
        self.dev = _model_device(model)
        self.xla = self.dev.type == "xla"
        self.pad, self.temperature, self.top_k = pad, temperature, top_k
        self.stop = StopStrings(tokenizer, stop, self.dev) if stop else None
        self.penalty = RepetitionPenalty(repetition_penalty) if repetition_penalty != 1.0 else None
        self.eos = torch.tensor(eos, dtype=torch.long, device=self.dev) if eos else None
        self.ends_early = self.eos is not None or self.stop is not None
        self.stop_check_every = stop_check_every if self.ends_early else 0
        self.generator: torch.Generator | None = None
        params = _forward_parameters(model)
        self.cache_position = "cache_position" in params  # transformers 4.x static caches need it
        self.logits_to_keep = "logits_to_keep" in params

    def run(
        self, prompts: list[list[int]], bucket: int, budget: int, new: int, *, check_stops: bool = True
    ) -> tuple[list[list[int]], list[bool]]:
        """Generate up to `new` tokens for `prompts` (all at most `bucket` long) with a cache of
        ``bucket + budget`` positions; returns each prompt's tokens and whether it ended early."""
        rows = self.max_rows if self.xla else min(_row_count(len(prompts)), self.max_rows)
        cache_len = bucket + budget
        input_ids, mask = self._left_padded(prompts, rows, bucket, cache_len)
        positions = (mask[:, :bucket].cumsum(-1) - 1).clamp(min=0)  # as model.generate numbers them
        window = self.stop.start(input_ids, mask[:, :bucket], self.dev) if self.stop is not None else None
        input_ids, mask = input_ids.to(self.dev), mask.to(self.dev)
        cache = static_cache(self.model, cache_len)
        extra: dict[str, Any] = {}
        if self.cache_position:
            extra["cache_position"] = torch.arange(bucket, device=self.dev)
        prefill_extra = dict(extra, logits_to_keep=1) if self.logits_to_keep else extra
        logits = self._forward(input_ids, mask, positions.to(self.dev), cache, prefill_extra)
        state = _Rows(
            out=torch.zeros((rows, budget), dtype=torch.long, device=self.dev),
            step=torch.zeros((1,), dtype=torch.long, device=self.dev),
            done=torch.zeros((rows,), dtype=torch.bool, device=self.dev),
            lengths=torch.zeros((rows,), dtype=torch.long, device=self.dev),
            window=window,
            seen=self.penalty.start(input_ids, mask[:, :bucket], logits.shape[-1]) if self.penalty else None,
        )
        # inside the prefill graph, so every decode step reads device data of the same shapes
        pos = positions[:, -1:].to(self.dev).clone()
        cache_pos = extra["cache_position"][-1:].clone() if self.cache_position else None
        token = self._record(self._pick(logits, state), state)
        self._sync()
        for i in range(1, new):
            due = check_stops and self.stop_check_every and i % self.stop_check_every == 0
            if due and bool(state.all_done.cpu()):  # the one host read while decoding
                break
            pos = pos + 1
            if cache_pos is not None:
                cache_pos = cache_pos + 1
                extra["cache_position"] = cache_pos
            logits = self._forward(token[:, None], mask, pos, cache, extra)
            token = self._record(self._pick(logits, state), state)
            self._sync()
        return self._read(state, len(prompts), new)

    def _left_padded(
        self, prompts: list[list[int]], rows: int, bucket: int, cache_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(input ids [rows, bucket], attention mask [rows, cache_len]) on the host: each prompt
        left-padded to `bucket`, filler rows repeating the first prompt, the mask 0 on padding only."""
        input_ids = torch.full((rows, bucket), self.pad, dtype=torch.long)
        mask = torch.ones((rows, cache_len), dtype=torch.long)
        for r, p in enumerate(prompts + [prompts[0]] * (rows - len(prompts))):
            input_ids[r, bucket - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[r, : bucket - len(p)] = 0
        return input_ids, mask

    def prewarm(self, bucket: int, budget: int) -> None:
        """Run one batch of dummy prompts in `bucket` through every program a call can reach."""
        layers = static_cache(self.model, bucket + budget).layers
        windows = [int(layer.max_cache_len) for layer in layers if getattr(layer, "is_sliding", False)]
        steps = _prewarm_steps(windows, bucket, budget)
        self.run([[self.pad] * bucket], bucket, budget, steps + 1, check_stops=False)

    def _forward(
        self, input_ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any, extra: dict
    ) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,  # the models are built with use_cache=False for training
            **extra,
        )
        return out.logits[:, -1, :].float()

    def _pick(self, logits: torch.Tensor, state: _Rows) -> torch.Tensor:
        """Each row's next token from `logits`: penalised, then greedy or sampled (device tensors only)."""
        if state.seen is not None:  # before temperature and top-k, as model.generate orders them
            logits = self.penalty.apply(logits, state.seen)
        if self.temperature > 0:
            logits = logits / self.temperature
            if self.top_k is not None and self.top_k < logits.shape[-1]:
                kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            # Gumbel-max: argmax(logits + Gumbel noise) is a sample of softmax(logits)
            u = torch.rand(logits.shape, device=self.dev, generator=self.generator)
            logits = logits - torch.log(-torch.log(u.clamp(min=torch.finfo(u.dtype).tiny)))
        return logits.argmax(dim=-1)

    def _record(self, token: torch.Tensor, state: _Rows) -> torch.Tensor:
        """Write `token` into `state` (the pad id for rows already ended, as model.generate pads them)
        and advance the rows' ends, window and seen ids; returns the token each row feeds back."""
        if self.ends_early:
            token = torch.where(state.done, torch.full_like(token, self.pad), token)
            state.lengths = state.lengths + (~state.done).long()  # the token that ends a row counts
            ended = torch.zeros_like(state.done)
            if self.eos is not None:
                ended = (token[:, None] == self.eos[None, :]).any(dim=-1)
            if self.stop is not None:
                state.window, matched = self.stop.advance(state.window, token)
                ended = ended | matched
            state.done = state.done | ended
            state.all_done = state.done.all()
        if state.seen is not None:
            state.seen = self.penalty.observe(state.seen, token)
        state.out.index_copy_(1, state.step, token[:, None])
        state.step.add_(1)
        return token

    def _read(self, state: _Rows, prompts: int, new: int) -> tuple[list[list[int]], list[bool]]:
        """Each real row's tokens (cut after the token that ended it) and whether it ended: one transfer."""
        if not self.ends_early:
            (out,) = self._to_host([state.out])
            return out[:prompts, :new].tolist(), [False] * prompts
        out, lengths, done = self._to_host([state.out, state.lengths, state.done])
        rows = range(prompts)
        return [out[r, : int(lengths[r])].tolist() for r in rows], [bool(done[r]) for r in rows]

    def _to_host(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return runtime.to_cpu(tensors) if self.xla else [t.cpu() for t in tensors]

    def _sync(self) -> None:
        if self.xla:
            runtime.sync()


def static_cache(model: Any, max_cache_len: int) -> Any:
    """transformers' `StaticCache` for `model`: full layers of `max_cache_len` positions, sliding-window
    layers of their window (`StaticSlidingWindowLayer`). A config the static cache cannot lay out
    raises a ValueError naming the family and what to change, rather than failing on the device."""
    import transformers as tf

    config = model.config
    try:
        return tf.StaticCache(config=config, max_cache_len=max_cache_len)
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        family = getattr(config, "model_type", type(config).__name__)
        layers = sorted(set(getattr(config, "layer_types", None) or []))
        raise ValueError(
            f"generate: transformers {tf.__version__} cannot build a static KV cache for model family "
            f"{family!r} (sliding_window={getattr(config, 'sliding_window', None)!r}, "
            f"layer_types={layers or None}): {err}. Set config.layer_types to 'full_attention'/"
            "'sliding_attention' entries (and config.sliding_window to the window), or upgrade transformers"
        ) from err


# ---- helpers -------------------------------------------------------------------------------


@contextlib.contextmanager
def _inference(model: Any) -> Iterator[None]:
    """The model in eval mode without gradients, its training mode restored afterwards."""
    was_training = getattr(model, "training", False)
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def _seeded(decoder: _Decoder, seed: int) -> Iterator[None]:
    """Sampling seeded by `seed`: on XLA the device RNG, restored afterwards; elsewhere a generator."""
    if decoder.temperature <= 0:
        yield
        return
    if not decoder.xla:
        decoder.generator = torch.Generator(device=decoder.dev).manual_seed(seed)
        yield
        return
    before = runtime.rng_state()
    runtime.set_rng_state(seed)
    try:
        yield
    finally:
        runtime.set_rng_state(before)


def _model_device(model: Any) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _forward_parameters(model: Any) -> set[str]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT wrapper
    try:
        return set(inspect.signature(base.forward).parameters)
    except (TypeError, ValueError):
        return set()


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


def _cache_budget(max_new_tokens: int) -> int:
    """Cache positions for the new tokens: `max_new_tokens` rounded up to `CACHE_MULTIPLE`."""
    return -(-max_new_tokens // CACHE_MULTIPLE) * CACHE_MULTIPLE


def _prewarm_steps(windows: list[int], bucket: int, budget: int) -> int:
    """Decode steps that reach every decode program a call in `bucket` can run (module docstring).

    Decode step i runs with ``bucket + i - 1`` positions cached. Full attention gives one program
    from the first step on; run two. A sliding window of W gives its own programs at W cached
    positions (it turns full: kv offset 1, a constant to torch_xla), W + 1 (the sliding steps),
    2W - 1 (offset W, measured) and 2W; run through the step after each one a call can reach, and
    never past a call's own last step (``budget - 1``).
    """
    last = bucket + budget - 2  # positions cached at the last decode step of a call
    reach = [bucket + 1]
    for w in windows:
        reach += [edge + 1 for edge in (w, w + 1, 2 * w - 1, 2 * w) if bucket <= edge <= last]
    return max(1, min(budget - 1, max(reach) - bucket + 1))


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


def _row_count(rows: int) -> int:
    """Rows off XLA: the prompt count rounded up to a power of two (few batch shapes, few filler rows)."""
    return 1 << (rows - 1).bit_length()
