"""The config panel's controls for the settings that shrink a big model's step: a quantized
base (``model.quantize``), a chunked loss (``train.loss_chunk_tokens``), the attention kernel
(``model.attention``), the layers' checkpoints in host memory (``train.offload_activations``) and the
MLP in tiles (``model.mlp_chunk_tokens``); beside their readouts, a GRPO run's rows and rollout KV cache.

`MemorySavingControls` holds the three widgets; the panel (`widgets.config_panel.ConfigPanel`) asks
it for its config overrides and wires its widgets like its own. What each setting saves is drawn
by `widgets.config_figures.quantize_readout`, `loss_chunk_readout` and `attention_readout`; under
``train.objective: grpo`` `rollout_readout` adds the step's rows and the rollout's KV cache.

- Quantized base: 'none' (the training precision), 'int8' (per output channel) or 'int4'
  (blockwise). Only LoRA trains on top of integers: with LoRA off the config refuses it, and the
  panel shows that message instead of an estimate.
- Loss chunk: 'auto' (chunk when the whole batch's logits would take a large share of the
  device's memory, as the trainer does), never (0), or a number of tokens per chunk.
- Attention: 'auto' (what the trainer picks on the panel's target: flash on a TPU, sdpa on a GPU),
  or one kernel of `workbench.models.attention.ATTENTION_KERNELS`.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as ipw

from widgets.config_figures import (
    attention_readout,
    long_context_readout,
    loss_chunk_readout,
    quantize_readout,
    rollout_readout,
)
from workbench.models.attention_choice import ATTENTION_KERNELS
from workbench.models.quantize import QUANTIZE_MODES

QUANTIZE_LABELS = {
    "none": "none (training precision)",
    "int8": "int8 (per channel)",
    "int4": "int4 (blockwise)",
}
"""How the quantize dropdown names each of `workbench.models.quantize.QUANTIZE_MODES`."""
LOSS_CHUNK_TOKENS: list[int | str] = ["auto", 0, 256, 512, 1024, 2048, 4096, 8192]
"""The loss chunk sizes offered (tokens per chunk; 'auto'; 0: never), plus the config's own."""
ATTENTION_LABELS = {
    "auto": "auto (for the target)",
    "eager": "eager (T × T scores saved)",
    "sdpa": "sdpa (fused, CUDA)",
    "flash": "flash (Pallas, TPU)",
    "chunked": "chunked (query blocks, XLA)",
}
"""How the attention dropdown names each of `workbench.models.attention.ATTENTION_KERNELS`."""
OFFLOAD_LABELS = {
    "auto": "auto (where the chip is short)",
    "on": "on (host memory)",
    "off": "off (on the chip)",
}
"""How the offload dropdown names each ``train.offload_activations`` value."""
MLP_CHUNK_TOKENS: list[int | str | None] = [None, "auto", 2048, 4096, 8192, 16384]
"""The MLP tile sizes offered (tokens per tile; 'auto'; None: whole), plus the config's own."""
TOOLTIP = "tooltip" if int(ipw.__version__.split(".")[0]) >= 8 else "description_tooltip"
"""A control's hover text: ``tooltip`` in ipywidgets 8, ``description_tooltip`` in 7 (Colab's 7.7.1,
which its frontend draws; 8 keeps the old name only as a deprecated alias)."""


def _tile_label(value: int | str | None) -> str:
    if value is None:
        return "whole (never tiled)"
    if value == "auto":
        return "auto (when the MLP is large)"
    return f"{value} tokens"


def _chunk_label(value: int | str) -> str:
    if value == "auto":
        return "auto (when the logits are large)"
    if value == 0:
        return "never (whole batch at once)"
    return f"{value} tokens"


class MemorySavingControls:
    """The quantized-base dropdown and the loss-chunk dropdown, as widgets."""

    def __init__(self, cfg: Any, *, style: dict[str, str], layout: ipw.Layout) -> None:
        self.quantize = ipw.Dropdown(
            options=[(QUANTIZE_LABELS.get(m, m), m) for m in QUANTIZE_MODES],
            value=cfg.model.quantize,
            description="Quantized base",
            style=style,
            layout=layout,
            **{TOOLTIP: "frozen base weights stored as integers under LoRA (model.quantize)"},
        ).add_class("wb-quantize")
        own = cfg.train.loss_chunk_tokens
        chunks = [*LOSS_CHUNK_TOKENS, *([] if own in LOSS_CHUNK_TOKENS else [own])]
        self.loss_chunk = ipw.Dropdown(
            options=[(_chunk_label(v), v) for v in chunks],
            value=own,
            description="Loss chunk",
            style=style,
            layout=layout,
            **{TOOLTIP: "LM head + cross-entropy a chunk of tokens at a time (train.loss_chunk_tokens)"},
        ).add_class("wb-loss-chunk")
        self.attention = ipw.Dropdown(
            options=[(ATTENTION_LABELS.get(k, k), k) for k in ATTENTION_KERNELS],
            value=cfg.model.attention,
            description="Attention",
            style=style,
            layout=layout,
            **{TOOLTIP: "the attention kernel (model.attention): what the T × T scores cost"},
        ).add_class("wb-attention")
        self.offload = ipw.Dropdown(
            options=[(label, value) for value, label in OFFLOAD_LABELS.items()],
            value=cfg.train.offload_activations,
            description="Offload checkpoints",
            style=style,
            layout=layout,
            **{
                TOOLTIP: "each layer's checkpoint in host memory (train.offload_activations; needs checkpointing)"
            },
        ).add_class("wb-offload")
        own_tile = cfg.model.mlp_chunk_tokens
        tiles = [*MLP_CHUNK_TOKENS, *([] if own_tile in MLP_CHUNK_TOKENS else [own_tile])]
        self.mlp_tiles = ipw.Dropdown(
            options=[(_tile_label(v), v) for v in tiles],
            value=own_tile,
            description="MLP tiles",
            style=style,
            layout=layout,
            **{
                TOOLTIP: "the MLP a tile of tokens at a time, recomputed in backward (model.mlp_chunk_tokens)"
            },
        ).add_class("wb-mlp-tiles")
        self.quantize_html = ipw.HTML().add_class("wb-quantize-saving")
        self.loss_chunk_html = ipw.HTML().add_class("wb-loss-chunk-saving")
        self.attention_html = ipw.HTML().add_class("wb-attention-saving")
        self.rollout_html = ipw.HTML().add_class("wb-rollout")
        self.long_context_html = ipw.HTML().add_class("wb-long-context")

    @property
    def widgets(self) -> list[ipw.Widget]:
        return [self.quantize, self.loss_chunk, self.attention, self.offload, self.mlp_tiles]

    @property
    def readouts(self) -> list[ipw.HTML]:
        """What each setting saves: the quantized base, the loss chunks, the attention scores; a GRPO
        step's rows and rollout cache (empty for other objectives); the checkpoints in host memory and
        the MLP's tiles (empty when neither is on)."""
        return [
            self.quantize_html,
            self.loss_chunk_html,
            self.attention_html,
            self.rollout_html,
            self.long_context_html,
        ]

    def draw(self, est: Any, cfg: Any) -> None:
        """Redraw the readouts for the estimate `est` of config `cfg`."""
        self.quantize_html.value = quantize_readout(est)
        self.loss_chunk_html.value = loss_chunk_readout(est, cfg.train.loss_chunk_tokens)
        self.attention_html.value = attention_readout(est, est.eager_scores_bytes, cfg.model.attention)
        self.rollout_html.value = rollout_readout(est)
        self.long_context_html.value = long_context_readout(est)

    def overrides(self) -> dict[str, Any]:
        """The ``model.quantize``, ``train.loss_chunk_tokens``, ``model.attention``, ``train.offload_activations``
        and ``model.mlp_chunk_tokens`` settings these controls describe."""
        return {
            "model.quantize": self.quantize.value,
            "train.loss_chunk_tokens": self.loss_chunk.value,
            "model.attention": self.attention.value,
            "train.offload_activations": self.offload.value,
            "model.mlp_chunk_tokens": self.mlp_tiles.value,
        }


__all__ = [
    "ATTENTION_LABELS",
    "LOSS_CHUNK_TOKENS",
    "MLP_CHUNK_TOKENS",
    "OFFLOAD_LABELS",
    "QUANTIZE_LABELS",
    "MemorySavingControls",
]
