"""The decoder behind `workbench.generate`: a static KV cache, a prefill and one fixed-shape decode
step, with every per-row value (tokens, ends, lengths, log-probs) a device tensor advanced inside
the step, so decoding needs no host read and XLA compiles each program once. On an eager backend
(CPU, CUDA), where shapes compile nothing, the cache grows with the tokens instead (transformers'
`DynamicCache`), so each step's attention reads only the positions written. Which of the two, what
ends a step, the sampling RNG and the host copies: the decoder asks its `Backend` (the caller's, else
`backend_of` the model's weights), never which backend it is.

`Decoder.decode` runs one batch of left-padded rows already on the device and returns their
`DecodeState`; `Decoder.run` (what `generate` calls) pads token-id lists and reads the tokens back
in one transfer. Token choice (`Decoder.pick`) follows ``model.generate``'s order: repetition
penalty, temperature, top-k, top-p (`top_p_filter`, transformers' `TopPLogitsWarper` on fixed
shapes), then a Gumbel-max sample from the device RNG (or the argmax when greedy).
`static_cache` lays out transformers' `StaticCache`, sliding-window layers included.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from workbench.backend.protocol import Backend
from workbench.backend.selection import backend_of
from workbench.generation_controls import RepetitionPenalty, StopStrings

CACHE_MULTIPLE = 16
"""`max_new_tokens` is rounded up to this many cache positions (nearby values share programs)."""


@dataclass
class DecodeState:
    """One batch's per-row device state, advanced inside each step."""

    out: torch.Tensor
    """[rows, budget] the tokens chosen so far (the pad id after a row's end and past the last step)."""
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
    logps: torch.Tensor | None = None
    """[rows, budget] fp32 log-prob of each chosen token under the temperature-scaled distribution
    before top-k/top-p (0 after a row's end); None unless asked for."""
    all_done: torch.Tensor | None = None
    """[] whether every row has ended: the one value the host reads during decoding."""
    steps: int = 0
    """Tokens chosen per row so far (the prefill's and the decode steps run): a host count, no read."""
    reads: int = 0
    """Reads of `all_done` the decoding made (one per block of `Decoder.stop_check_every` steps)."""


class Decoder:
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
        top_p: float = 1.0,
        stop: list[str],
        repetition_penalty: float,
        backend: Backend | None = None,
    ) -> None:
        self.model, self.max_rows = model, max_rows
        self.dev = model_device(model)
        self.backend = backend if backend is not None else model_backend(model)
        """What the decoder asks of the device: whether each new shape compiles a program (then the
        rows and the cache keep their shapes), the step's end, its RNG, the compile count."""
        self.pad, self.temperature, self.top_k, self.top_p = pad, temperature, top_k, top_p
        self.stop = StopStrings(tokenizer, stop, self.dev) if stop else None
        self.penalty = RepetitionPenalty(repetition_penalty) if repetition_penalty != 1.0 else None
        self.eos = torch.tensor(eos, dtype=torch.long, device=self.dev) if eos else None
        self.ends_early = self.eos is not None or self.stop is not None
        self.stop_check_every = stop_check_every if self.ends_early else 0
        self.generator: torch.Generator | None = None
        params = forward_parameters(model)
        self.cache_position = "cache_position" in params  # transformers 4.x static caches need it
        self.logits_to_keep = "logits_to_keep" in params

    def run(
        self, prompts: list[list[int]], bucket: int, budget: int, new: int, *, check_stops: bool = True
    ) -> tuple[list[list[int]], list[bool]]:
        """Generate up to `new` tokens for `prompts` (all at most `bucket` long) with a cache of
        ``bucket + budget`` positions; returns each prompt's tokens and whether it ended early."""
        fixed_rows = self.backend.compiles_every_shape  # each batch shape would be a program
        rows = self.max_rows if fixed_rows else min(row_count(len(prompts)), self.max_rows)
        input_ids, mask = self.left_padded(prompts, rows, bucket, bucket + budget)
        positions = (mask[:, :bucket].cumsum(-1) - 1).clamp(min=0)  # as model.generate numbers them
        window = self.stop.start(input_ids, mask[:, :bucket], self.dev) if self.stop is not None else None
        state = self.decode(
            input_ids.to(self.dev),
            mask.to(self.dev),
            positions.to(self.dev),
            budget,
            new,
            window=window,
            check_stops=check_stops,
        )
        return self._read(state, len(prompts), new)

    def decode(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        budget: int,
        new: int,
        *,
        window: torch.Tensor | None = None,
        check_stops: bool = True,
        keep_logps: bool = False,
        all_ended: Callable[[torch.Tensor], bool] | None = None,
    ) -> DecodeState:
        """Prefill `input_ids` [rows, bucket] and decode up to `new` tokens, all on the device.

        `mask` [rows, bucket + budget] is 0 on left padding only; `positions` [rows, bucket] the
        prompt's position ids. Every `stop_check_every` steps (when `check_stops`) the host reads
        whether all rows ended and stops then; without, exactly `new` steps run and nothing is read.
        `all_ended` turns that flag (a device scalar) into the decision (default: its value; across
        processes that decode in step, whether every process's rows ended).
        """
        rows, bucket = input_ids.shape
        # compiled per shape (XLA): one static cache and mask of the whole budget, so every step is one
        # program; eager: a cache that grows with the tokens, so attention reads only the positions written
        grows = not self.backend.compiles_every_shape
        cache = dynamic_cache(self.model) if grows else static_cache(self.model, bucket + budget)

        def seen(positions: int) -> torch.Tensor:
            return mask[:, :positions] if grows else mask

        extra: dict[str, Any] = {}
        if self.cache_position:
            extra["cache_position"] = torch.arange(bucket, device=self.dev)
        prefill_extra = dict(extra, logits_to_keep=1) if self.logits_to_keep else extra
        logits = self._forward(input_ids, seen(bucket), positions, cache, prefill_extra)
        state = DecodeState(
            out=torch.full((rows, budget), self.pad, dtype=torch.long, device=self.dev),
            step=torch.zeros((1,), dtype=torch.long, device=self.dev),
            done=torch.zeros((rows,), dtype=torch.bool, device=self.dev),
            lengths=torch.zeros((rows,), dtype=torch.long, device=self.dev),
            window=window,
            seen=self.penalty.start(input_ids, mask[:, :bucket], logits.shape[-1]) if self.penalty else None,
            logps=torch.zeros((rows, budget), dtype=torch.float32, device=self.dev) if keep_logps else None,
        )
        # inside the prefill graph, so every decode step reads device data of the same shapes
        pos = positions[:, -1:].clone()
        cache_pos = extra["cache_position"][-1:].clone() if self.cache_position else None
        token = self._record(*self.pick(logits, state), state)
        self.backend.step_boundary()
        state.steps = 1
        ended = all_ended or (lambda flag: bool(flag.cpu()))
        for i in range(1, new):
            due = check_stops and self.stop_check_every and i % self.stop_check_every == 0
            if due:
                state.reads += 1
                if ended(state.all_done):  # the one host read while decoding, once per block
                    break
            pos = pos + 1
            if cache_pos is not None:
                cache_pos = cache_pos + 1
                extra["cache_position"] = cache_pos
            logits = self._forward(token[:, None], seen(bucket + i), pos, cache, extra)
            token = self._record(*self.pick(logits, state), state)
            self.backend.step_boundary()
            state.steps = i + 1
        return state

    def left_padded(
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
        self.run(
            [[self.pad] * bucket], bucket, budget, self.prewarm_steps(bucket, budget) + 1, check_stops=False
        )

    def prewarm_steps(self, bucket: int, budget: int) -> int:
        """Decode steps that reach every decode program of `bucket` (`prewarm_steps`)."""
        layers = static_cache(self.model, bucket + budget).layers
        windows = [int(layer.max_cache_len) for layer in layers if getattr(layer, "is_sliding", False)]
        return prewarm_steps(windows, bucket, budget)

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

    def pick(self, logits: torch.Tensor, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Each row's next token from `logits` (device tensors only): penalised, then greedy or
        sampled; and with `state.logps` its log-prob under ``log_softmax(logits / temperature)``
        (the unscaled logits when greedy), before top-k and top-p filter it."""
        if state.seen is not None:  # before temperature and top-k, as model.generate orders them
            logits = self.penalty.apply(logits, state.seen)
        if self.temperature > 0:
            logits = logits / self.temperature
        logps = torch.log_softmax(logits, dim=-1) if state.logps is not None else None
        if self.temperature > 0:
            if self.top_k is not None and self.top_k < logits.shape[-1]:
                kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            if self.top_p < 1.0:
                logits = top_p_filter(logits, self.top_p)
            # Gumbel-max: argmax(logits + Gumbel noise) is a sample of softmax(logits)
            u = torch.rand(logits.shape, device=self.dev, generator=self.generator)
            logits = logits - torch.log(-torch.log(u.clamp(min=torch.finfo(u.dtype).tiny)))
        token = logits.argmax(dim=-1)
        chosen = logps.gather(1, token[:, None])[:, 0] if logps is not None else None
        return token, chosen

    def _record(self, token: torch.Tensor, logp: torch.Tensor | None, state: DecodeState) -> torch.Tensor:
        """Write `token` (and its `logp`) into `state` (the pad id and log-prob 0 for rows already
        ended, as model.generate pads them) and advance the rows' ends, window and seen ids;
        returns the token each row feeds back."""
        if self.ends_early:
            token = torch.where(state.done, torch.full_like(token, self.pad), token)
            if logp is not None:
                logp = torch.where(state.done, torch.zeros_like(logp), logp)
            state.lengths = state.lengths + (~state.done).long()  # the token that ends a row counts
            ended = torch.zeros_like(state.done)
            if self.eos is not None:
                ended = (token[:, None] == self.eos[None, :]).any(dim=-1)
            if self.stop is not None:
                state.window, matched = self.stop.advance(state.window, token)
                ended = ended | matched
            state.done = state.done | ended
            state.all_done = state.done.all()
        else:
            state.lengths = state.lengths + 1
        if state.seen is not None:
            state.seen = self.penalty.observe(state.seen, token)
        state.out.index_copy_(1, state.step, token[:, None])
        if logp is not None and state.logps is not None:
            state.logps.index_copy_(1, state.step, logp[:, None])
        state.step.add_(1)
        return token

    def _read(self, state: DecodeState, prompts: int, new: int) -> tuple[list[list[int]], list[bool]]:
        """Each real row's tokens (cut after the token that ended it) and whether it ended: one transfer."""
        if not self.ends_early:
            (out,) = self.backend.host_copies([state.out])
            return out[:prompts, :new].tolist(), [False] * prompts
        out, lengths, done = self.backend.host_copies([state.out, state.lengths, state.done])
        rows = range(prompts)
        return [out[r, : int(lengths[r])].tolist() for r in rows], [bool(done[r]) for r in rows]


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """transformers' `TopPLogitsWarper` on fixed shapes (sort, cumsum, scatter; no host read): keep
    the smallest set of most likely tokens whose probabilities reach `top_p` (always the most likely
    one), the others set to -inf. Apply it after temperature and top-k, as ``model.generate`` does."""
    sorted_logits, sorted_indices = torch.sort(logits, descending=False, dim=-1)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - top_p)
    remove_sorted[..., -1:] = False  # the most likely token stays, whatever top_p is
    remove = remove_sorted.scatter(-1, sorted_indices, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


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


def dynamic_cache(model: Any) -> Any:
    """transformers' `DynamicCache` for `model` (sliding-window layers keep their window): the eager
    backends' cache, which grows with the tokens decoded."""
    import transformers as tf

    return tf.DynamicCache(config=model.config)


@contextlib.contextmanager
def inference(model: Any) -> Iterator[None]:
    """The model in eval mode without gradients, its training mode restored afterwards."""
    was_training = getattr(model, "training", False)
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def seeded(decoder: Decoder, seed: int) -> Iterator[None]:
    """Sampling seeded by `seed` (`Backend.seeded_rng`): a generator of the decoder's, or the device's
    own RNG (XLA), seeded and restored afterwards. Greedy decoding draws nothing: nothing is seeded."""
    if decoder.temperature <= 0:
        yield
        return
    with decoder.backend.seeded_rng(seed, decoder.dev) as generator:
        decoder.generator = generator
        yield


def model_device(model: Any) -> torch.device:
    """Where `model`'s weights are (the CPU for a model without parameters)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def model_backend(model: Any) -> Backend:
    """The `Backend` of the device `model`'s weights are on (`backend_of`), for a caller that holds none."""
    return backend_of(list(itertools.islice(model.parameters(), 1)))


def forward_parameters(model: Any) -> set[str]:
    """The names `model`'s forward takes (a PEFT wrapper's base model's)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return set(inspect.signature(base.forward).parameters)
    except (TypeError, ValueError):
        return set()


def cache_budget(max_new_tokens: int) -> int:
    """Cache positions for the new tokens: `max_new_tokens` rounded up to `CACHE_MULTIPLE`."""
    return -(-max_new_tokens // CACHE_MULTIPLE) * CACHE_MULTIPLE


def prewarm_steps(windows: list[int], bucket: int, budget: int) -> int:
    """Decode steps that reach every decode program a call in `bucket` can run (`workbench.generate`).

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


def row_count(rows: int) -> int:
    """Rows where shapes compile nothing (eager backends): the prompt count rounded up to a power of two
    (few batch shapes, few filler rows)."""
    return 1 << (rows - 1).bit_length()
