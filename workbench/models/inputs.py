"""A forward's inputs: the batch's model keys, with an attention mask that never makes transformers read the device.

Transformers 5 reads the device when a forward comes without an ``attention_mask``: it takes
the position ids (the batch's, or ``arange`` when there are none) and checks whether any row
holds packed sequences (``masking_utils.find_packed_sequence_indices``, which turns
``(...).all()`` into a Python bool). That is a device-to-host transfer in every forward, and
on XLA a sync that cuts the step's program in two. A 2-D or 4-D mask skips the check (and
transformers 4.x, which never read the device here, builds the same masks from them), so
`model_inputs` gives every forward one, made on the batch's device from what it already holds:

- no mask and no position ids (rows without padding): a 2-D all-ones mask, what transformers
  assumes without one. Eager attention (what `workbench.models.build.build_model` uses)
  never reads a padding mask's values.
- packed rows under the workbench's chunked or flash attention (`takes_segment_ids`): their
  ``[B, 1, 1, T]`` int32 segment ids (`workbench.models.attention.segment_ids_from_positions`),
  which transformers passes through like any 4-D tensor; the attention applies causality and
  the layer's sliding window itself, so no ``T x T`` mask is ever built.
- packed rows otherwise (position ids that restart for each sequence, no mask;
  `workbench.data.collate.PackedCollator`): their block-diagonal causal mask
  (`packed_causal_mask`) in the model's dtype, which transformers passes to attention
  unchanged. Only the ``batch x length`` position ids cross to the device, as before.
  A ready mask replaces transformers' own, sliding windows included, so a model with a sliding
  window shorter than the row gets no mask and transformers builds it (correct, and under
  transformers 5 with its host read).

Every workbench forward of a training model goes through here: the training objectives
(`workbench.train.objective`, `workbench.objectives.distillation`) and the memory probes
(`workbench.analysis.probe`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids")
"""The batch keys a causal LM's forward takes; the others (labels, notes) stay out."""


def model_inputs(batch: dict[str, Any], model: Any) -> dict[str, Any]:
    """The batch's `MODEL_INPUT_KEYS`, plus an attention mask where it has none (see the module)."""
    import torch

    inputs = {k: v for k, v in batch.items() if k in MODEL_INPUT_KEYS}
    if "attention_mask" in inputs:
        return inputs
    if "position_ids" not in inputs:
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    elif takes_segment_ids(model):
        from workbench.models.attention import segment_ids_from_positions

        inputs["attention_mask"] = segment_ids_from_positions(inputs["position_ids"])
    elif not window_shorter_than(model, inputs["position_ids"].shape[-1]):
        dtype = getattr(model, "dtype", None)
        dtype = dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32
        inputs["attention_mask"] = packed_causal_mask(inputs["position_ids"], dtype)
    return inputs


def packed_causal_mask(position_ids: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The ``(batch, 1, length, length)`` additive causal mask of packed rows, from their position ids.

    A new sequence starts wherever a position is not its predecessor plus one (the rule of
    transformers' ``find_packed_sequence_indices``); a token attends to the earlier tokens of
    its own sequence and to itself. Allowed entries are 0, the others ``torch.finfo(dtype).min``
    (`dtype` defaults to float32). Tensor operations only, on the ids' device: nothing is read
    on the host, so on XLA the mask is part of the step's program.
    """
    import torch

    dtype = torch.float32 if dtype is None else dtype
    first = position_ids[:, :1] - 1
    starts = torch.diff(position_ids, prepend=first, dim=-1) != 1
    segments = starts.to(torch.int32).cumsum(-1)
    length = position_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    allowed = (segments[:, :, None] == segments[:, None, :]) & causal
    zero = torch.zeros((), dtype=dtype, device=position_ids.device)
    return torch.where(allowed[:, None], zero, torch.finfo(dtype).min)


def takes_segment_ids(model: Any) -> bool:
    """Whether `model` runs the workbench's chunked or flash attention (`workbench.models.attention`),
    whose packed rows take ``[B, 1, 1, T]`` segment ids instead of a ``T x T`` mask."""
    from workbench.models.attention import CHUNKED, FLASH

    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return implementation in (CHUNKED, FLASH)


def window_shorter_than(model: Any, length: int) -> bool:
    """Whether some attention layer of `model` sees only a sliding window shorter than `length` tokens."""
    config = getattr(model, "config", None)
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return False
    return int(length) > int(window)
