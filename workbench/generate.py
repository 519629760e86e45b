"""Sampling on the model's device with a static KV cache: a bounded, known set of compiled programs.

`generate(model, prompts, max_new_tokens=N)` returns the new tokens of each prompt (and their
text, with a tokenizer) as a `GenerationResult`. It runs where the model's weights are: an XLA
device (TPU, XLA:CPU), CUDA or the CPU. Greedy by default, token for token what
``model.generate`` returns for the same weights; ``temperature > 0`` samples (optionally from
the ``top_k`` most likely tokens) with a seeded generator.

How every shape stays fixed, so XLA compiles a program per (rows, bucket) once:

- **Buckets.** A prompt is left-padded to its bucket: the smallest boundary of `buckets` that
  fits it (a `workbench.data.buckets.BucketPlan`, e.g. ``plan_buckets(lengths, 4,
  multiple_of=16)``, or a list of lengths), by default the next power of two of at least 16.
- **Rows.** Prompts of one bucket run together, `max_batch_size` rows at a time; the row count
  is rounded up to a power of two (filler rows repeat a prompt; their output is dropped).
- **The cache.** transformers' `StaticCache` of ``bucket + max_new_tokens`` positions (the new
  tokens rounded up to a multiple of 16). Its sliding-window layers (Mistral, Gemma 2/3, any
  config with ``sliding_window`` or sliding ``layer_types``) are `StaticSlidingWindowLayer`s of
  the window's size, so a prompt longer than the window is fine.
- **One decode program.** The 2-D attention mask covers the whole cache from the start (left
  padding 0, everything else 1: causality hides the positions not written yet); the position
  ids, the cache's own length counter, the output buffer and its write index are device
  tensors advanced inside the step. Each step is the same graph over new device data.

Programs per (rows, bucket): the prefill and one decode step; sliding-window layers add one
decode program while the window fills and one once it slides (a position offset of exactly 0
or 1 is a constant to torch_xla and may add one more). A later call whose prompts fall in the
same buckets, with the same rows and rounded `max_new_tokens`, compiles nothing.

**Host syncs.** None per token: each step ends with ``runtime.sync()`` (the step is launched,
nothing is read back). The tokens come back in one transfer per batch at the end. With an
end-of-sequence id, whether every row has finished is read every `stop_check_every` tokens
(one small transfer each; 0: never, run to `max_new_tokens`), so a batch may run up to that
many steps past its last end-of-sequence token. Tokens after a row's end-of-sequence are
dropped, as ``model.generate`` pads them.
"""

from __future__ import annotations

import bisect
import inspect
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workbench.backend import runtime

MIN_BUCKET = 16
"""The smallest default bucket (power-of-two buckets start here)."""
CACHE_MULTIPLE = 16
"""`max_new_tokens` is rounded up to this many cache positions (nearby values share programs)."""


@dataclass(frozen=True)
class GenerationResult:
    """What `generate` produced, one entry per prompt in the order given."""

    token_ids: list[list[int]]
    """The new tokens of each prompt, up to and including its end-of-sequence token."""
    texts: list[str] | None
    """The new tokens decoded (None without a tokenizer)."""
    finished: list[bool]
    """Whether the prompt's generation ended with an end-of-sequence token."""
    buckets: list[int]
    """The padded prompt length each prompt ran at."""
    compiles: int
    """Programs XLA compiled during the call (0 off XLA)."""
    seconds: float
    """Wall time of the call, device work included."""

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
    stop_check_every: int = 16,
    skip_special_tokens: bool = True,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens for each prompt, on the model's device.

    `prompts`: token-id lists, or strings with a `tokenizer` (one prompt alone is fine).
    `buckets`: a `BucketPlan` or boundary lengths (default: powers of two from 16).
    `temperature` 0 is greedy; above 0 samples, from the `top_k` best tokens when given,
    seeded by `seed` (on XLA the device RNG is seeded and restored afterwards).
    `eos_token_id`: "auto" takes the model's generation config, else the tokenizer's; None
    never stops early. See the module docstring for the shapes and syncs.
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is not allowed: must be an int >= 1")
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size={max_batch_size!r} is not allowed: must be >= 1")
    if temperature < 0:
        raise ValueError(f"temperature={temperature!r} is not allowed: 0 (greedy) or more")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k!r} is not allowed: None or >= 1")
    ids = _prompt_ids(prompts, tokenizer)
    eos = _eos_ids(model, tokenizer, eos_token_id)
    pad = _pad_id(model, tokenizer, pad_token_id, eos)
    dev = _model_device(model)
    xla = dev.type == "xla"
    sizes = [_bucket(len(p), buckets) for p in ids]
    groups: dict[int, list[int]] = {}
    for i, size in enumerate(sizes):
        groups.setdefault(size, []).append(i)
    budget = -(-max_new_tokens // CACHE_MULTIPLE) * CACHE_MULTIPLE
    decoder = _Decoder(model, dev, xla, eos, pad, temperature, top_k, stop_check_every, max_batch_size)
    out: list[list[int]] = [[] for _ in ids]
    finished = [False] * len(ids)
    compiles_before = runtime.compile_count() if xla else 0
    rng_before = runtime.rng_state() if xla and temperature > 0 else None
    if rng_before is not None:
        runtime.set_rng_state(seed)
    elif temperature > 0:
        decoder.generator = torch.Generator(device=dev).manual_seed(seed)
    was_training = getattr(model, "training", False)
    model.eval()
    start = time.perf_counter()
    try:
        with torch.no_grad():
            for bucket in sorted(groups):
                members = groups[bucket]
                for first in range(0, len(members), max_batch_size):
                    rows = members[first : first + max_batch_size]
                    tokens = decoder.run([ids[i] for i in rows], bucket, bucket + budget, max_new_tokens)
                    for i, row in zip(rows, tokens):
                        out[i], finished[i] = _until_eos(row, eos)
        if xla:
            runtime.wait_device_ops()
    finally:
        model.train(was_training)
        if rng_before is not None:
            runtime.set_rng_state(rng_before)
    seconds = time.perf_counter() - start
    texts = None
    if tokenizer is not None:
        texts = [tokenizer.decode(t, skip_special_tokens=skip_special_tokens) for t in out]
    return GenerationResult(
        token_ids=out,
        texts=texts,
        finished=finished,
        buckets=sizes,
        compiles=(runtime.compile_count() - compiles_before) if xla else 0,
        seconds=seconds,
    )


class _Decoder:
    """Prefill and fixed-shape decode steps for one batch of same-bucket prompts."""

    def __init__(
        self,
        model: Any,
        dev: torch.device,
        xla: bool,
        eos: list[int],
        pad: int,
        temperature: float,
        top_k: int | None,
        stop_check_every: int,
        max_rows: int,
    ) -> None:
        self.model, self.dev, self.xla, self.max_rows = model, dev, xla, max_rows
        self.pad, self.temperature, self.top_k = pad, temperature, top_k
        self.stop_check_every = stop_check_every if eos else 0
        self.eos = torch.tensor(eos, dtype=torch.long, device=dev) if eos else None
        self.generator: torch.Generator | None = None
        params = _forward_parameters(model)
        self.cache_position = "cache_position" in params  # transformers 4.x static caches need it
        self.logits_to_keep = "logits_to_keep" in params

    def run(self, prompts: list[list[int]], bucket: int, cache_len: int, new: int) -> list[list[int]]:
        """Generate `new` tokens for `prompts` (all at most `bucket` long); returns each row's tokens."""
        rows = min(_row_count(len(prompts)), self.max_rows)
        filled = prompts + [prompts[0]] * (rows - len(prompts))
        input_ids = torch.full((rows, bucket), self.pad, dtype=torch.long)
        mask = torch.ones((rows, cache_len), dtype=torch.long)
        for r, p in enumerate(filled):
            input_ids[r, bucket - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[r, : bucket - len(p)] = 0
        positions = (mask[:, :bucket].cumsum(-1) - 1).clamp(min=0)  # as model.generate numbers them
        mask = mask.to(self.dev)
        cache = static_cache(self.model, cache_len)
        extra: dict[str, Any] = {}
        if self.cache_position:
            extra["cache_position"] = torch.arange(bucket, device=self.dev)
        prefill_extra = dict(extra, logits_to_keep=1) if self.logits_to_keep else extra
        out = torch.zeros((rows, cache_len - bucket), dtype=torch.long, device=self.dev)
        step = torch.zeros((1,), dtype=torch.long, device=self.dev)
        done = torch.zeros((rows,), dtype=torch.bool, device=self.dev)
        logits = self._forward(input_ids.to(self.dev), mask, positions.to(self.dev), cache, prefill_extra)
        # inside the prefill graph, so every decode step reads device data of the same shapes
        pos = positions[:, -1:].to(self.dev).clone()
        cache_pos = extra["cache_position"][-1:].clone() if self.cache_position else None
        token, done, all_done = self._choose(logits, done, out, step)
        self._sync()
        for i in range(1, new):
            if self.stop_check_every and i % self.stop_check_every == 0 and bool(all_done.cpu()):
                break
            pos = pos + 1
            if cache_pos is not None:
                cache_pos = cache_pos + 1
                extra["cache_position"] = cache_pos
            logits = self._forward(token[:, None], mask, pos, cache, extra)
            token, done, all_done = self._choose(logits, done, out, step)
            self._sync()
        return out.cpu()[: len(prompts), :new].tolist()  # one transfer of the whole buffer

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

    def _choose(
        self, logits: torch.Tensor, done: torch.Tensor, out: torch.Tensor, step: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next token of each row (device tensors only), written into `out` at `step`."""
        if self.temperature > 0:
            logits = logits / self.temperature
            if self.top_k is not None and self.top_k < logits.shape[-1]:
                kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            # Gumbel-max: argmax(logits + Gumbel noise) is a sample of softmax(logits)
            u = torch.rand(logits.shape, device=self.dev, generator=self.generator)
            logits = logits - torch.log(-torch.log(u.clamp(min=torch.finfo(u.dtype).tiny)))
        token = logits.argmax(dim=-1)
        if self.eos is not None:
            token = torch.where(done, torch.full_like(token, self.pad), token)
            done = done | (token[:, None] == self.eos[None, :]).any(dim=-1)
        out.index_copy_(1, step, token[:, None])
        step.add_(1)
        return token, done, done.all()

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


def load_pretrained(
    model_dir: str | os.PathLike[str], *, attn_implementation: str = "eager"
) -> tuple[Any, Any]:
    """(model, tokenizer) from a local transformers checkpoint directory; ValueError when it is not one."""
    path = os.fspath(model_dir)
    if not os.path.isdir(path):
        raise ValueError(f"model directory {path!r} does not exist")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"{path!r} is not a transformers checkpoint: it has no config.json")
    import transformers as tf

    try:
        tokenizer = tf.AutoTokenizer.from_pretrained(path)
        model = tf.AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn_implementation)
    except (OSError, ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"cannot load a causal LM and tokenizer from {path!r}: {first}") from err
    return model, tokenizer


# ---- helpers -------------------------------------------------------------------------------


def _prompt_ids(prompts: Any, tokenizer: Any) -> list[list[int]]:
    if isinstance(prompts, str) or (
        isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], (int, torch.Tensor))
    ):
        prompts = [prompts]
    if not prompts:
        raise ValueError("prompts is empty: pass token-id lists, or strings with a tokenizer")
    ids = []
    for p in prompts:
        if isinstance(p, str):
            if tokenizer is None:
                raise ValueError("string prompts need a tokenizer: pass tokenizer=, or token-id lists")
            p = tokenizer(p)["input_ids"]
        row = [int(t) for t in p]
        if not row:
            raise ValueError("a prompt is empty: every prompt needs at least one token")
        ids.append(row)
    return ids


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (int, torch.Tensor)):
        return [int(value)]
    return [int(v) for v in value]


def _eos_ids(model: Any, tokenizer: Any, eos_token_id: Any) -> list[int]:
    if eos_token_id != "auto":
        return _as_list(eos_token_id)
    gen_config = getattr(model, "generation_config", None)
    found = _as_list(getattr(gen_config, "eos_token_id", None))
    return found or _as_list(getattr(tokenizer, "eos_token_id", None))


def _pad_id(model: Any, tokenizer: Any, pad_token_id: int | None, eos: list[int]) -> int:
    """What fills left padding and finished rows (never attended to), as model.generate picks it."""
    for value in (
        pad_token_id,
        getattr(getattr(model, "generation_config", None), "pad_token_id", None),
        getattr(tokenizer, "pad_token_id", None),
    ):
        if value is not None:
            return int(value)
    return eos[0] if eos else 0


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


def _row_count(rows: int) -> int:
    """Rows rounded up to a power of two (fewer batch shapes to compile)."""
    return 1 << (rows - 1).bit_length()


def _until_eos(tokens: list[int], eos: list[int]) -> tuple[list[int], bool]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], True
    return tokens, False
