"""What a layer saves for the backward pass and what its attention holds while it runs, per token.

The activation formula counts the tensors autograd saves in the `transformers` implementations, per
token of one layer (H hidden, h heads of size d, I MLP width, T length):

    H                 the layer input (all that checkpointing keeps)
    2H + 2H           each norm's input and normalised output (kept in fp32 by HF norms)
    4hd               q, k and v after repeat_kv (GQA materialises k and v for every head),
                      and the attention output that feeds o_proj
    hT                the softmax probabilities, when attention is materialised ("eager");
                      a flash/fused kernel or chunked attention keeps only a per-head log-sum-exp
    4I (gated MLP)    gate, up, act(gate), act(gate)*up; 2I for a plain MLP (GPT-2)

Beside what is saved, one layer's backward pass holds attention temporaries
(`attention_transient_elements_per_token`: eager's ``2hT`` gradients of the probabilities and scores
and its ``T``-wide mask, chunked's `CHUNKED_BLOCK_COPIES` copies of one query block's scores). With
checkpointing a layer keeps only its input, and one layer at a time is recomputed in the backward pass.
`estimate_attention` says which kernel a setting runs on a chip, for the estimate to price.
"""

from __future__ import annotations

from typing import Any

from workbench.analysis.shape import ModelShape

ATTENTIONS: tuple[str, ...] = ("eager", "sdpa", "flash", "chunked")
CHUNKED_BLOCK_COPIES = 3
"""Score-sized fp32 tensors of one query block live at once under chunked attention (scores,
probabilities and, in the backward pass, their gradient)."""


def activation_elements_per_token(
    shape: ModelShape, seq_len: int, *, gradient_checkpointing: bool = False, model_parallel: int = 1
) -> dict[str, float]:
    """Elements saved per token for the backward pass: ``{"layer": one layer, "all_layers": all,
    "fp32_part": of those, the norm tensors HF keeps in fp32, "scores": attention probabilities saved,
    "attention_transient": fp32 attention temporaries of one layer, not saved}`` (`attention_transient_elements_per_token`)."""
    H, inner, mp = shape.hidden, shape.heads * shape.head_dim, model_parallel
    norms = 2 * shape.norms_per_layer * H  # each norm's input + normalised output
    qkvo = 4 * inner / mp
    scores = shape.heads * seq_len / mp if shape.attention == "eager" else 0.0
    mlp = (4 if shape.gated_mlp else 2) * shape.intermediate / mp
    layer = H + norms + qkvo + scores + mlp
    if gradient_checkpointing:
        # every layer keeps its input; the backward pass recomputes one layer at a time
        all_layers = shape.layers * H + (norms + qkvo + scores + mlp)
        fp32_norms = norms
        n_scores = scores
    else:
        all_layers = shape.layers * layer
        fp32_norms = shape.layers * norms
        n_scores = shape.layers * scores
    final = 3 * H  # embedding output, final norm input + output
    return {
        "layer": layer,
        "all_layers": all_layers + final,
        "fp32_part": fp32_norms + 2 * H,
        "scores": n_scores,
        "attention_transient": attention_transient_elements_per_token(shape, seq_len, model_parallel=mp),
    }


def estimate_attention(setting: str, target: Any, *, seq_len: int, model_config: Any = None) -> str:
    """The kernel ``model.attention=setting`` runs on `target` (a `workbench.backend.targets.Target`)
    for rows of `seq_len` tokens and the model of `model_config` (its logit softcap and attention
    dropout): the one the estimate should price. A TPU chip (v2 ... v6e) runs flash; a GPU, sdpa; the
    CPU is planned as XLA:CPU (the workbench's CPU device under ``PJRT_DEVICE=CPU``)."""
    from workbench.models.attention_choice import (
        has_attention_dropout,
        has_softcap,
        readable_config,
        resolve_attention,
    )

    tpu = target.chip[:1] == "v" and target.chip[1:2].isdigit()
    device_type = "xla" if tpu or target.chip == "cpu" else "cuda"
    config = readable_config(model_config)  # read once for both questions
    return resolve_attention(
        setting,
        device_type=device_type,
        is_tpu=tpu,
        seq_len=seq_len,
        softcap=has_softcap(config),
        dropout=has_attention_dropout(config),
    )[0]


def attention_transient_elements_per_token(
    shape: ModelShape, seq_len: int, *, model_parallel: int = 1
) -> float:
    """fp32 elements per token of the attention temporaries one layer holds and frees (its backward
    pass's peak), on top of what is saved: under 'eager' the gradients of one layer's probabilities and
    scores (``2 x heads x T``) and transformers' ``[rows, 1, T, T]`` additive mask (``T``); under
    'chunked' `CHUNKED_BLOCK_COPIES` copies of one query block's scores (``heads x block``, the block
    from `workbench.models.attention.query_chunk`); none under the fused kernels."""
    from workbench.models.attention import query_chunk

    if shape.attention == "eager":
        return 2 * shape.heads * seq_len / model_parallel + seq_len
    if shape.attention == "chunked":
        return CHUNKED_BLOCK_COPIES * shape.heads * query_chunk(seq_len) / model_parallel
    return 0.0
