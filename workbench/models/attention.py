"""Memory-efficient attention for every family that goes through transformers' attention interface.

Eager attention materialises (and saves for backward) ``[batch, heads, T, T]`` scores per layer.
This module registers two implementations with ``transformers.AttentionInterface`` and
``masking_utils.AttentionMaskInterface`` (`register_attention`), so a model built or switched with
their names (`workbench.models.attention_choice.use_attention`) runs them in every layer:

- **chunked** (`CHUNKED`, any device; meant for XLA): `chunked_attention`, the queries in static
  blocks of `query_chunk` rows. Each block's fp32 scores are ``[B, kv_heads, groups, C, keys]``
  (grouped-query attention by broadcasting, never repeating k/v), a causal block reads only the
  keys it can see (about half of eager's FLOPs at long rows), and one `torch.autograd.Function`
  saves only q, k, v, the output and each row's log-sum-exp: the backward recomputes each
  block's probabilities (flash-attention's backward). On XLA the blocks are chained by data
  dependencies (`workbench.models.lm_head._after`), or the compiler runs them side by side.
  The compiler's analysis (tests/xla/attention_memory.py: 4 heads, one 2048-token row, forward
  and backward) gives 197 MiB of temporaries eager and 54 MiB chunked for one layer, 270 and 64
  for two: eager adds each layer's 64 MiB of scores; chunked holds three 16 MiB block buffers.
- **flash** (`FLASH`, TPU only): torch_xla's Pallas kernels (`workbench.backend.xla.tpu_attention`);
  what they cannot do (a logit softcap, a full 4-D mask, an odd length) falls back to chunked.

Masks. transformers turns a 2-D mask into bool and hands it to the mask interface, and passes any
4-D tensor through untouched. `compact_mask` (the registered mask function) answers a training
forward (no past keys: as many keys as queries, offsets 0) with ``[B, 1, 1, T]`` int32 segment
ids, 0 for a padding key and k >= 1 for the k-th packed document, and anything else (generation
with a static cache, overlays) with transformers' eager 4-D mask, which the blocks slice.
`workbench.models.inputs.model_inputs` builds the segment ids of packed rows directly, on the
device: no ``T x T`` mask exists on the chunked and flash paths. The sliding window comes from
the layer (its ``sliding_window`` keyword), never from the compact mask.

Which kernel a run uses (``model.attention``, 'auto''s rule) is `workbench.models.attention_choice`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workbench.models.lm_head import _after

CHUNKED = "workbench_chunked"
"""The ``attn_implementation`` name of `chunked_attention`."""
FLASH = "workbench_pallas"
"""The ``attn_implementation`` name of `flash_attention` (TPU only). Not "...flash...": transformers
takes any implementation named so for a flash-attn kernel to fetch from the hub."""
QUERY_CHUNK = 512
"""Query rows per block of chunked attention (`query_chunk`)."""


def query_chunk(length: int) -> int:
    """Query rows per block for rows of `length` tokens: `QUERY_CHUNK`, never more than the row.
    The rule the memory estimate shares: a block's scores are ``heads x query_chunk(T) x T``."""
    return max(1, min(QUERY_CHUNK, int(length)))


# ---- registration and the compact mask --------------------------------------------------------


def register_attention() -> None:
    """Register `CHUNKED` and `FLASH` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name, fn in ((CHUNKED, chunked_attention), (FLASH, flash_attention)):
        if AttentionInterface._global_mapping.get(name) is not fn:
            AttentionInterface.register(name, fn)
        if AttentionMaskInterface._global_mapping.get(name) is not compact_mask:
            AttentionMaskInterface.register(name, compact_mask)


def compact_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    mask_function: Callable[..., Any] | None = None,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    allow_is_causal_skip: bool = True,
    use_vmap: bool = False,
    dtype: torch.dtype = torch.float32,
    device: Any = "cpu",
    config: Any = None,
    **kwargs: Any,
) -> torch.Tensor:
    """The mask function of `CHUNKED` and `FLASH`: ``[B, 1, 1, T]`` int32 segment ids (1 a real
    key, 0 padding) for a plain causal or sliding-window training forward, else the eager 4-D mask."""
    from transformers import masking_utils as mu

    full = mask_function is mu.causal_mask_function or (
        local_size is not None
        and local_size == getattr(config, "sliding_window", None)
        and not getattr(config, "attention_chunk_size", None)
    )
    # offsets are tensors under a static cache: test them only when they are Python ints (no host read)
    training = (
        q_length == kv_length
        and isinstance(q_offset, int)
        and isinstance(kv_offset, int)
        and q_offset == 0
        and kv_offset == 0
        and allow_is_causal_skip  # False: packed overlay, or/and functions, or a mask to be concatenated
        and not use_vmap
        and full
        and (attention_mask is None or attention_mask.shape[-1] == kv_length)
    )
    if training:
        if attention_mask is None:
            return torch.ones((batch_size, 1, 1, kv_length), dtype=torch.int32, device=device)
        return attention_mask[:, None, None, :].to(torch.int32)
    return mu.eager_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function or mu.causal_mask_function,
        attention_mask=attention_mask,
        dtype=dtype,
        use_vmap=use_vmap,
        device=device,
    )


def segment_ids_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """``[B, 1, 1, T]`` int32 segment ids of packed rows (1 for the first document, 2 for the next...):
    a document starts wherever a position is not its predecessor plus one. Device ops only."""
    first = position_ids[:, :1] - 1
    starts = torch.diff(position_ids, prepend=first, dim=-1) != 1
    return (starts.to(torch.int32).cumsum(-1, dtype=torch.int32) + 1)[:, None, None, :]


# ---- chunked attention ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """What one call computes, all static: one program per shape."""

    scale: float
    softcap: float | None
    mode: str
    """'positional' (no mask), 'segments' (compact ids) or 'mask' (a full 4-D mask, sliced per block)."""
    causal: bool
    window: int | None
    offset: int
    """Query i sits at key position ``offset + i`` (bottom-right alignment; 0 in training)."""
    blocks: tuple[tuple[int, int, int, int], ...]
    """(query start, query end, first key, key end) per block."""


def _plan(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float,
    softcap: float | None,
    window: int | None,
    causal: bool,
) -> _Plan:
    tq, tk = query.shape[2], key.shape[2]
    if mask is None:
        mode = "positional"
    elif mask.dim() == 4 and not mask.dtype.is_floating_point and mask.dtype != torch.bool:
        mode = "segments"
        if tq != tk or mask.shape[-1] != tk or mask.shape[-2] != 1:
            raise ValueError(
                f"compact segment ids {tuple(mask.shape)} need as many queries as keys ({tq} vs {tk}); "
                "a forward with past keys takes a 2-D mask (transformers builds the full one)"
            )
    elif mask.dim() == 4:
        mode = "mask"
    else:
        raise ValueError(f"chunked attention takes a 4-D mask or none, got shape {tuple(mask.shape)}")
    offset = tk - tq if mode != "segments" else 0
    # a full 4-D mask carries causality and the window itself (a sliding cache's keys are not positions)
    window = window if mode != "mask" and window and window < tk else None
    causal = causal and mode != "mask"
    chunk = query_chunk(tq)
    blocks = []
    for qs in range(0, tq, chunk):
        qe = min(tq, qs + chunk)
        hi = min(tk, offset + qe) if causal else tk
        lo = max(0, offset + qs - window + 1) if window else 0
        blocks.append((qs, qe, lo, max(hi, lo + 1)))
    return _Plan(scale, softcap, mode, causal, window, offset, tuple(blocks))


def _allowed(
    plan: _Plan,
    mask: torch.Tensor | None,
    block: tuple[int, int, int, int],
    heads: tuple[int, int],
    device: torch.device,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(allowed ``[.., C, L]`` bool or None, additive fp32 bias or None) for one block."""
    qs, qe, lo, hi = block
    allowed, bias = None, None
    if plan.causal or plan.window:
        qpos = torch.arange(qs, qe, device=device)[:, None] + plan.offset
        kpos = torch.arange(lo, hi, device=device)[None, :]
        allowed = kpos <= qpos if plan.causal else None
        if plan.window:
            inside = kpos > qpos - plan.window
            allowed = inside if allowed is None else allowed & inside
    if plan.mode == "segments":
        seg = mask.reshape(mask.shape[0], -1)
        keys, queries = seg[:, None, lo:hi], seg[:, qs:qe, None]
        same = ((keys == queries) & (keys != 0))[:, None, None]
        allowed = same if allowed is None else allowed & same
    elif plan.mode == "mask":
        kv_heads, groups = heads
        part = mask[:, :, qs:qe, lo:hi]
        shape = (part.shape[0], kv_heads, groups) if part.shape[1] > 1 else (part.shape[0], 1, 1)
        part = part.reshape(*shape, qe - qs, hi - lo)
        if part.dtype == torch.bool:
            allowed = part if allowed is None else allowed & part
        else:
            keep = part > torch.finfo(part.dtype).min / 2
            allowed = keep if allowed is None else allowed & keep
            bias = part.float()
    return allowed, bias


def _mm(x5: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``[B, h, g, C, n] @ [B, h, n, m] -> [B, h, g, C, m]``: the groups folded into the rows, so the
    product is one plain batched matmul over the k/v heads (no repeated k/v, no transposed copies)."""
    b, h, g, c, n = x5.shape
    return torch.matmul(x5.reshape(b, h, g * c, n), y).view(b, h, g, c, y.shape[-1])


def _mm_t(x5: torch.Tensor, y5: torch.Tensor) -> torch.Tensor:
    """``Σ_{g, C} x5[B, h, g, C, n] · y5[B, h, g, C, m] -> [B, h, n, m]`` (the k/v gradients).

    Computed as ``(y5ᵀ x5)ᵀ``: the small ``[.., C, m]`` operand is the one transposed. Written as
    ``x5ᵀ y5``, XLA:CPU copies the block-sized ``x5`` transposed (measured: two extra block copies
    live at the backward's peak)."""
    b, h, g, c, n = x5.shape
    rows_y = y5.reshape(b, h, g * c, -1)
    return torch.matmul(rows_y.transpose(-1, -2), x5.reshape(b, h, g * c, n)).transpose(-1, -2)


def _scores(
    plan: _Plan, qb: torch.Tensor, kb: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(scores after scale, softcap and bias, tanh of the capped scores or None), fp32."""
    s = _mm(qb, kb.transpose(-1, -2)) * plan.scale
    t = None
    if plan.softcap:
        t = torch.tanh(s / plan.softcap)
        s = t * plan.softcap
    if bias is not None:
        s = s + bias
    return s, t


class _ChunkedAttention(torch.autograd.Function):
    """Attention in query blocks; saves q, k, v, the output and each row's log-sum-exp; the
    backward recomputes each block's probabilities. Blocks run one after another on XLA: each
    block's queries are computed from the previous block's output (backward: its dq)."""

    @staticmethod
    def forward(ctx: Any, plan: _Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> Any:
        b, h, tq, _ = q.shape
        kvh = k.shape[1]
        q5 = q.reshape(b, kvh, h // kvh, tq, q.shape[-1])
        outs, lses, dep = [], [], None
        for block in plan.blocks:
            qs, qe, lo, hi = block
            qb = _after(q5[:, :, :, qs:qe], dep).float()
            allowed, bias = _allowed(plan, mask, block, (kvh, h // kvh), q.device)
            s, _ = _scores(plan, qb, k[:, :, lo:hi].float(), bias)
            if allowed is not None:
                s = torch.where(allowed, s, float("-inf"))
            m = s.amax(-1, keepdim=True)
            m = torch.where(m == float("-inf"), 0.0, m)  # a row that sees no key: p = 0, output 0
            p = torch.exp(s - m)
            denom = p.sum(-1, keepdim=True)
            o = _mm(p, v[:, :, lo:hi].float())
            o = o / torch.where(denom == 0, 1.0, denom)
            lses.append((m + torch.log(torch.where(denom == 0, 1.0, denom))).squeeze(-1))
            dep = o
            outs.append(o.to(q.dtype))
        out5 = torch.cat(outs, dim=3) if len(outs) > 1 else outs[0]
        lse = torch.cat(lses, dim=3) if len(lses) > 1 else lses[0]
        ctx.plan = plan
        ctx.has_mask = mask is not None
        ctx.save_for_backward(q, k, v, out5, lse, *([mask] if mask is not None else []))
        return out5.reshape(b, h, tq, -1).transpose(1, 2).contiguous()

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> Any:
        plan: _Plan = ctx.plan
        q, k, v, out5, lse, *rest = ctx.saved_tensors
        mask = rest[0] if ctx.has_mask else None
        b, h, tq, d = q.shape
        kvh = k.shape[1]
        g = h // kvh
        q5 = q.reshape(b, kvh, g, tq, d)
        do5 = dout.transpose(1, 2).reshape(b, kvh, g, tq, -1).float()
        delta = (do5 * out5.float()).sum(-1)  # rowsum(dO ⊙ O), the softmax backward's row term
        need_q, need_k, need_v = ctx.needs_input_grad[1:4]
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device) if need_k else None
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device) if need_v else None
        dqs, dep = [], delta  # the first recompute waits for the incoming gradient: never merged into forward
        for block in plan.blocks:
            qs, qe, lo, hi = block
            qb = _after(q5[:, :, :, qs:qe], dep).float()
            kb, vb = k[:, :, lo:hi].float(), v[:, :, lo:hi].float()
            allowed, bias = _allowed(plan, mask, block, (kvh, g), q.device)
            s, t = _scores(plan, qb, kb, bias)
            s = s - lse[:, :, :, qs:qe, None]
            # masked before the exp, one elementwise chain: XLA fuses it into one block-sized buffer
            p = torch.exp(s if allowed is None else torch.where(allowed, s, float("-inf")))
            dob = _after(do5[:, :, :, qs:qe], dep)  # dO·Vᵀ too waits for the previous block
            done = []  # every product of this block: the next block waits for all of them
            if dv is not None:
                dvb = _mm_t(p, dob)
                dv[:, :, lo:hi] += dvb
                done.append(dvb)
            ds = p * (_mm(dob, vb.transpose(-1, -2)) - delta[:, :, :, qs:qe, None])
            if t is not None:  # d(cap·tanh(s/cap))/ds = 1 - tanh²
                ds = ds * (1 - t * t)
            dqb = _mm(ds, kb) * plan.scale
            if dk is not None:
                dkb = _mm_t(ds, qb) * plan.scale
                dk[:, :, lo:hi] += dkb
                done.append(dkb)
            dqs.append(dqb)
            dep = sum((x.sum() for x in done), dqb.sum())
        dq = None
        if need_q:
            dq = (torch.cat(dqs, dim=3) if len(dqs) > 1 else dqs[0]).reshape(b, h, tq, d).to(q.dtype)
        dk, dv = (None if x is None else x.to(y.dtype) for x, y in ((dk, k), (dv, v)))
        return None, dq, dk, dv, None


def chunked_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention contract: query ``[B, heads, Tq, d]``, key/value ``[B, kv_heads, Tk, d]``
    -> (output ``[B, Tq, heads, d]``, None), in query blocks of `query_chunk` rows (see the module).

    `attention_mask`: None (causal), compact ``[B, 1, 1, T]`` integer segment ids, or a full
    ``[B, 1|heads, Tq, Tk]`` additive or boolean mask. `sliding_window` (a key is seen iff
    ``q - window < k <= q``) and `softcap` (scores become ``tanh(s / cap) · cap``) as the layer
    passes them. A query that sees no key gets 0. Attention dropout is not supported.
    """
    if dropout and dropout > 0:
        raise ValueError(
            f"chunked attention does not do attention dropout (got {dropout}): set the model config's "
            "attention_dropout to 0, or model.attention: eager"
        )
    if kwargs.get("s_aux") is not None or kwargs.get("position_bias") is not None:
        raise ValueError(
            "chunked attention takes no attention sinks or position bias: use model.attention: eager"
        )
    if query.shape[1] % key.shape[1]:
        raise ValueError(f"{query.shape[1]} query heads are not a multiple of {key.shape[1]} key/value heads")
    causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True) if causal is None else causal)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    plan = _plan(
        query,
        key,
        attention_mask,
        scale=scale,
        softcap=float(softcap) if softcap else None,
        window=int(sliding_window) if sliding_window else None,
        causal=causal,
    )
    return _ChunkedAttention.apply(plan, query, key, value, attention_mask), None


# ---- flash attention (TPU only) ---------------------------------------------------------------


def flash_plan(
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    sliding_window: int | None,
    softcap: float | None,
    mesh: Any,
) -> tuple[str, str]:
    """(route, why): 'flash' (Pallas flash), 'splash' (Pallas splash, sliding window) or 'chunked'
    (the fallback) for one call of `flash_attention`."""
    tq, tk = query.shape[2], key.shape[2]
    if softcap:
        return "chunked", "logit softcap (no Pallas kernel for it in torch_xla 2.9)"
    if attention_mask is not None and (
        attention_mask.dtype.is_floating_point or attention_mask.dtype == torch.bool
    ):
        return "chunked", "a full 4-D mask (generation with a cache)"
    if tq != tk:
        return "chunked", f"{tq} queries over {tk} keys (past keys)"
    if tq % min(QUERY_CHUNK, tq):
        return "chunked", f"{tq}-token rows are not a multiple of the kernels' {QUERY_CHUNK}-token block"
    if sliding_window and sliding_window < tk:
        if mesh is None:
            return "chunked", "a sliding window without an SPMD mesh (splash attention runs under shard_map)"
        return "splash", f"sliding window {sliding_window} < {tk}"
    return "flash", "causal, segment ids"


def flash_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """`FLASH`: torch_xla's Pallas flash attention on a TPU (splash for sliding windows under a
    mesh), k/v repeated to the query heads as the kernels need, compact masks as segment ids;
    `chunked_attention` for what the kernels cannot do (`flash_plan`). Same contract."""
    from workbench.backend.xla import tpu_attention

    if dropout and dropout > 0:
        raise ValueError(f"flash attention here does not do attention dropout (got {dropout})")
    mesh = tpu_attention.current_mesh()
    route, _ = flash_plan(
        query, key, attention_mask, sliding_window=sliding_window, softcap=softcap, mesh=mesh
    )
    if route == "chunked":
        return chunked_attention(
            module, query, key, value, attention_mask, scaling, dropout, sliding_window, softcap, **kwargs
        )
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # the kernels take as many k/v heads as query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    segments = None
    if attention_mask is not None:
        segments = attention_mask.reshape(attention_mask.shape[0], -1).to(torch.int32)
        segments = segments.expand(query.shape[0], -1)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    if route == "splash":
        out = tpu_attention.splash(
            query, key, value, segment_ids=segments, scale=scale, window=sliding_window, mesh=mesh
        )
    else:
        out = tpu_attention.flash(query, key, value, segment_ids=segments, scale=scale, mesh=mesh)
    return out.transpose(1, 2).contiguous(), None
