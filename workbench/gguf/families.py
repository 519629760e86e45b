"""The families the GGUF writer knows: llama.cpp's architecture name, tensor names and metadata for each.

Written for the workbench's own families that llama.cpp runs: **llama** (Llama 2/3, SmolLM, TinyLlama),
**mistral** (llama.cpp's ``llama`` architecture, as its converter writes it), **qwen2**, **qwen3**,
**gemma** and **gemma2**. Any other family is refused by name before any weight is read
(`GGUFFamilyError`).

What differs by family, and why:

- llama and mistral store the query and key projections with their rows regrouped per head (llama.cpp's
  rotary embedding pairs neighbouring dimensions, transformers' the two halves of a head): `permute_qk`;
- gemma and gemma2 keep their RMSNorm weights as the offset from one (``x * (1 + w)``); llama.cpp
  stores ``1 + w``;
- gemma2 has four norms per layer, softcapped logits and a sliding window; qwen3 normalises queries and
  keys per head (``attn_q_norm``, ``attn_k_norm``); qwen2 has biases on q, k and v;
- an output projection is written only when it is not the embedding itself (tied embeddings).

Rotary scaling: none, ``linear``, ``yarn`` (as metadata) and ``llama3`` (a ``rope_freqs`` tensor of
per-frequency factors, computed here from the config); any other type is refused by name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np


class GGUFFamilyError(ValueError):
    """A model the GGUF writer cannot write: the message names its family and the ones it can."""


@dataclass(frozen=True)
class GGUFFamily:
    model_type: str
    """transformers' ``config.model_type``."""
    arch: str
    """llama.cpp's ``general.architecture``."""
    permute_qk: bool = False
    norm_offset: float = 0.0
    """Added to every norm weight as written (gemma's ``1 + w``)."""
    norms: tuple[tuple[str, str], ...] = (
        ("input_layernorm", "attn_norm"),
        ("post_attention_layernorm", "ffn_norm"),
    )
    """Per-layer norms: transformers' module name -> llama.cpp's tensor name."""
    always_head_dim: bool = False
    """Write ``attention.key_length``/``value_length`` even where they equal hidden / heads."""


_GEMMA2_NORMS = (
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "post_attention_norm"),
    ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm", "post_ffw_norm"),
)

GGUF_FAMILIES = {
    f.model_type: f
    for f in (
        GGUFFamily("llama", "llama", permute_qk=True),
        GGUFFamily("mistral", "llama", permute_qk=True),
        GGUFFamily("qwen2", "qwen2"),
        GGUFFamily("qwen3", "qwen3", always_head_dim=True),
        GGUFFamily("gemma", "gemma", norm_offset=1.0, always_head_dim=True),
        GGUFFamily("gemma2", "gemma2", norm_offset=1.0, norms=_GEMMA2_NORMS, always_head_dim=True),
    )
}
"""The families written, by transformers' model type."""

_LAYER_PARTS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def family_of(config: Any) -> GGUFFamily:
    """The `GGUFFamily` of a transformers config (or its ``model_type``); `GGUFFamilyError` for others."""
    model_type = config if isinstance(config, str) else getattr(config, "model_type", None)
    family = GGUF_FAMILIES.get(str(model_type))
    if family is None:
        raise GGUFFamilyError(
            f"GGUF export does not write the {model_type!r} family: it writes {', '.join(GGUF_FAMILIES)} "
            "(export --to merged writes any family as a transformers model)"
        )
    return family


def tensor_name(family: GGUFFamily, hf_name: str) -> str | None:
    """llama.cpp's name for the transformers tensor `hf_name`; None for a tensor that is not written
    (the output projection of tied embeddings is the caller's choice); `GGUFFamilyError` when unknown."""
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    match = _LAYER.match(hf_name)
    if match is not None:
        block, part, kind = match.groups()
        name = _LAYER_PARTS.get(part) or dict(family.norms).get(part)
        if name is not None:
            return f"blk.{block}.{name}.{kind}"
    if hf_name.endswith("rotary_emb.inv_freq"):
        return None
    raise GGUFFamilyError(f"GGUF export ({family.model_type}): no llama.cpp tensor for {hf_name!r}")


def is_norm(hf_name: str) -> bool:
    return hf_name.endswith("norm.weight")


def permute_for_rope(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q or k projection regrouped per head from transformers' half-split rotary layout to
    llama.cpp's interleaved one: within each head, row ``i`` of the first half and row ``i`` of the second
    half become neighbours."""
    rows = weight.shape[0]
    per_head = rows // heads
    return weight.reshape(heads, 2, per_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def transform(family: GGUFFamily, hf_name: str, weight: np.ndarray, config: Any) -> np.ndarray:
    """The values llama.cpp expects for `hf_name` (rotary regrouping, norm offsets)."""
    if family.norm_offset and is_norm(hf_name):
        return weight + np.asarray(family.norm_offset, dtype=weight.dtype)
    if family.permute_qk and (".q_proj." in hf_name or ".k_proj." in hf_name):
        heads = config.num_attention_heads if ".q_proj." in hf_name else config.num_key_value_heads
        return permute_for_rope(weight, int(heads))
    return weight


def head_dim(config: Any) -> int:
    value = getattr(config, "head_dim", None)
    return int(value) if value else int(config.hidden_size // config.num_attention_heads)


def rope_parameters(config: Any) -> dict[str, Any]:
    """The config's rotary settings in transformers 5's ``rope_parameters`` shape (4.x: rope_theta, rope_scaling)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    scaling = getattr(config, "rope_scaling", None)
    if isinstance(scaling, dict) and "rope_type" not in params:
        params.update(scaling)
        params.setdefault("rope_type", scaling.get("type", "default"))
    params.setdefault("rope_type", "default")
    return params


def metadata(family: GGUFFamily, config: Any) -> list[tuple[str, str, Any]]:
    """(key, GGUF value type, value) of the model's hyperparameters under ``{arch}.``."""
    arch, dim = family.arch, head_dim(config)
    rope = rope_parameters(config)
    rows: list[tuple[str, str, Any]] = [
        ("context_length", "uint32", int(config.max_position_embeddings)),
        ("embedding_length", "uint32", int(config.hidden_size)),
        ("block_count", "uint32", int(config.num_hidden_layers)),
        ("feed_forward_length", "uint32", int(config.intermediate_size)),
        ("attention.head_count", "uint32", int(config.num_attention_heads)),
        (
            "attention.head_count_kv",
            "uint32",
            int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads),
        ),
        ("attention.layer_norm_rms_epsilon", "float32", float(config.rms_norm_eps)),
        ("rope.freq_base", "float32", float(rope["rope_theta"])),
        ("vocab_size", "uint32", int(config.vocab_size)),
    ]
    if family.arch == "llama":
        rows.append(("rope.dimension_count", "uint32", dim))
    if family.always_head_dim or dim != config.hidden_size // config.num_attention_heads:
        rows += [("attention.key_length", "uint32", dim), ("attention.value_length", "uint32", dim)]
    if family.model_type == "gemma2":
        _check_gemma2_query_scale(config, dim)
        rows += [
            ("attn_logit_softcapping", "float32", float(config.attn_logit_softcapping or 0.0)),
            ("final_logit_softcapping", "float32", float(config.final_logit_softcapping or 0.0)),
            ("attention.sliding_window", "uint32", int(config.sliding_window)),
        ]
    kind = rope["rope_type"]
    if kind in ("linear", "yarn"):
        rows += [
            ("rope.scaling.type", "string", kind),
            ("rope.scaling.factor", "float32", float(rope["factor"])),
        ]
        if kind == "yarn" and rope.get("original_max_position_embeddings"):
            rows.append(
                (
                    "rope.scaling.original_context_length",
                    "uint32",
                    int(rope["original_max_position_embeddings"]),
                )
            )
    elif kind not in ("default", "llama3"):
        raise GGUFFamilyError(
            f"GGUF export ({family.model_type}): rotary scaling {kind!r} is not written (default, linear, yarn, llama3 are)"
        )
    return [(f"{arch}.{key}", vtype, value) for key, vtype, value in rows]


def _check_gemma2_query_scale(config: Any, dim: int) -> None:
    """Refuse a Gemma 2 whose query scale llama.cpp would get wrong: GGUF has no key for
    ``query_pre_attn_scalar``, and llama.cpp scales queries by 1/sqrt(head_dim), or for a 46-layer model
    (Gemma-2-27B) by 1/sqrt(hidden_size / heads), as every published Gemma 2 does."""
    layers, heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    assumed, rule = (
        (config.hidden_size / heads, "hidden_size / num_attention_heads")
        if layers == 46
        else (dim, "head_dim")
    )
    scalar = float(getattr(config, "query_pre_attn_scalar", None) or dim)
    if scalar != assumed:
        raise GGUFFamilyError(
            f"GGUF export (gemma2): query_pre_attn_scalar={scalar:g}, but llama.cpp scales a {layers}-layer "
            f"Gemma 2's queries by 1/sqrt({rule}) = 1/sqrt({assumed:g}) and GGUF has no key to say otherwise: "
            "the file would run a different model (export --to merged keeps it exact)"
        )


def extra_tensors(family: GGUFFamily, config: Any) -> dict[str, np.ndarray]:
    """Tensors llama.cpp wants that transformers computes: Llama 3's rotary frequency factors."""
    rope = rope_parameters(config)
    if rope["rope_type"] != "llama3":
        return {}
    return {"rope_freqs.weight": llama3_rope_factors(rope, head_dim(config))}


def llama3_rope_factors(rope: dict[str, Any], dim: int) -> np.ndarray:
    """Llama 3's per-frequency divisors of the rotary angles: 1 for short wavelengths, `factor` for long
    ones (beyond the original context over ``low_freq_factor``), a smooth blend between."""
    factor = float(rope.get("factor", 8.0))
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    original = float(rope.get("original_max_position_embeddings", 8192))
    inverse = 1.0 / (float(rope["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    out = []
    for frequency in inverse:
        wavelength = 2 * math.pi / frequency
        if wavelength < original / high:
            out.append(1.0)
        elif wavelength > original / low:
            out.append(factor)
        else:
            blend = (original / wavelength - low) / (high - low)
            out.append(1.0 / ((1 - blend) / factor + blend))
    return np.asarray(out, dtype=np.float32)
