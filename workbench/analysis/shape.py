"""The sizes of a decoder-only transformer that memory and FLOPs depend on, read from any config.

`model_shape` turns a `transformers` config or model, or a workbench `ModelConfig`, into a
`ModelShape` through the family registry (`workbench.families`: where each family's
config keeps its sizes and how its blocks are laid out). `ModelShape.parameter_shapes` lists
every parameter tensor the family's `transformers` implementation creates, the ground the
memory estimate (`workbench.analysis.estimate`) and the FLOPs count (`workbench.analysis.flops`)
stand on; `quantized_matrices` picks out those a quantized base (``model.quantize``,
`workbench.models.quantize`) stores as integers, `lora_adapter_shapes` the adapters LoRA adds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.families import FAMILIES, FAMILY_NAMES
from workbench.models.build import transformers_config_of
from workbench.models.quantize import logical_parameter_count


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that memory and FLOPs depend on."""

    family: str
    """`transformers` model_type: a name in `workbench.families.FAMILIES`."""
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    tied: bool
    """Input embedding shared with the LM head."""
    gated_mlp: bool
    """SwiGLU/GeGLU MLP (gate, up, down) rather than GPT-2's fc -> act -> proj."""
    qkv_bias: bool = False
    gpt2_style: bool = False
    """LayerNorm with biases, biased linears, learned position embeddings."""
    norms_per_layer: int = 2
    """Norms on a block's residual path: 2, or 4 where the MLP is wrapped too (Gemma 2 and 3)."""
    qk_norm: bool = False
    """A norm over each head's query and key (Qwen3, Gemma 3)."""
    fused_projections: bool = False
    """One qkv_proj and one gate_up_proj instead of q/k/v and gate/up (Phi-3)."""
    attention: str = "eager"
    """How the model's attention runs (`workbench.models.attention`): 'eager' materialises and saves the
    T x T scores; 'chunked' holds one block of queries' scores at a time and saves none; 'flash' and
    'sdpa' (fused kernels) hold none."""
    num_parameters_override: int | None = None
    """The real model's unique parameter count, when a model (not a config) was given."""

    def parameter_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every parameter tensor the family's `transformers` implementation creates (tied ones once)."""
        H, hd, kvd, inter = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        )
        shapes: list[tuple[str, tuple[int, ...]]] = [("embed_tokens", (self.vocab, H))]
        if self.gpt2_style:
            shapes.append(("position_embeddings", (self.max_positions, H)))
        for i in range(self.layers):
            p = f"layers.{i}."
            if self.gpt2_style:
                shapes += [
                    (p + "ln_1.weight", (H,)),
                    (p + "ln_1.bias", (H,)),
                    (p + "attn.c_attn.weight", (H, 3 * H)),
                    (p + "attn.c_attn.bias", (3 * H,)),
                    (p + "attn.c_proj.weight", (H, H)),
                    (p + "attn.c_proj.bias", (H,)),
                    (p + "ln_2.weight", (H,)),
                    (p + "ln_2.bias", (H,)),
                    (p + "mlp.c_fc.weight", (H, inter)),
                    (p + "mlp.c_fc.bias", (inter,)),
                    (p + "mlp.c_proj.weight", (inter, H)),
                    (p + "mlp.c_proj.bias", (H,)),
                ]
                continue
            shapes.append((p + "input_layernorm.weight", (H,)))
            if self.fused_projections:
                shapes.append((p + "qkv_proj.weight", (hd + 2 * kvd, H)))
            else:
                shapes += [
                    (p + "q_proj.weight", (hd, H)),
                    (p + "k_proj.weight", (kvd, H)),
                    (p + "v_proj.weight", (kvd, H)),
                ]
            shapes.append((p + "o_proj.weight", (H, hd)))
            if self.qk_norm:
                shapes += [(p + "q_norm.weight", (self.head_dim,)), (p + "k_norm.weight", (self.head_dim,))]
            shapes.append((p + "post_attention_layernorm.weight", (H,)))
            shapes += [(p + f"extra_norm_{j}.weight", (H,)) for j in range(self.norms_per_layer - 2)]
            if self.fused_projections:
                shapes.append((p + "gate_up_proj.weight", (2 * inter, H)))
            else:
                shapes += [(p + "gate_proj.weight", (inter, H)), (p + "up_proj.weight", (inter, H))]
            shapes.append((p + "down_proj.weight", (H, inter)))
            if self.qkv_bias:
                shapes += [
                    (p + "q_proj.bias", (hd,)),
                    (p + "k_proj.bias", (kvd,)),
                    (p + "v_proj.bias", (kvd,)),
                ]
        shapes.append(("final_norm.weight", (H,)))
        if self.gpt2_style:
            shapes.append(("final_norm.bias", (H,)))
        if not self.tied:
            shapes.append(("lm_head.weight", (self.vocab, H)))
        return shapes

    @property
    def num_parameters(self) -> int:
        """Unique parameters (the real model's count when one was given)."""
        if self.num_parameters_override is not None:
            return self.num_parameters_override
        return sum(math.prod(shape) for _, shape in self.parameter_shapes())

    @property
    def matmul_parameters(self) -> int:
        """Parameters that take part in matrix multiplies: all but the lookup-only embeddings.

        The input embedding is a table lookup, unless tied to the LM head (then it is the LM
        head's matmul); learned position embeddings are always lookups.
        """
        n = self.num_parameters
        if self.gpt2_style:
            n -= self.max_positions * self.hidden
        if not self.tied:
            n -= self.vocab * self.hidden
        return n


def model_shape(model_config: Any) -> ModelShape:
    """The `ModelShape` of a `transformers` config, a model (``.config``), or a workbench `ModelConfig`.

    The family (``config.model_type``) must be in `workbench.families.FAMILIES`, whose
    entry says where the config keeps the sizes and how the family's blocks are laid out.
    """
    real_params: int | None = None
    config = transformers_config_of(model_config)  # a ModelConfig's checkpoint config is read from disk
    if hasattr(model_config, "parameters") and hasattr(model_config, "config"):  # a model
        # tied weights once; a quantized layer's weight as out x in, not its packed integers
        real_params = logical_parameter_count(model_config)
    family_name = getattr(config, "model_type", None)
    family = FAMILIES.get(family_name) if isinstance(family_name, str) else None
    if family is None:
        raise ValueError(
            f"model_config of type {type(model_config).__name__} (model_type={family_name!r}) is not supported: "
            f"expected a transformers config or model of the families {', '.join(FAMILY_NAMES)}, "
            "or a workbench ModelConfig"
        )
    fields = family.fields
    hidden = int(getattr(config, fields.hidden_size))
    heads = int(getattr(config, fields.num_heads))
    kv = (getattr(config, fields.num_kv_heads, None) if fields.num_kv_heads else None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    inner = getattr(config, fields.intermediate_size, None)
    if inner is None:  # GPT-2's n_inner=None means 4 x hidden
        inner = 4 * hidden
    return ModelShape(
        family=family.name,
        hidden=hidden,
        layers=int(getattr(config, fields.num_layers)),
        heads=heads,
        kv_heads=int(kv),
        head_dim=int(head_dim),
        intermediate=int(inner),
        vocab=int(config.vocab_size),
        max_positions=int(getattr(config, fields.max_position_embeddings, 0) or 0),
        tied=bool(getattr(config, "tie_word_embeddings", family.tied_default)),
        gated_mlp=family.gated_mlp,
        qkv_bias=family.qkv_bias or bool(getattr(config, "attention_bias", False)),
        gpt2_style=family.gpt2_style,
        norms_per_layer=family.norms_per_layer,
        qk_norm=family.qk_norm,
        fused_projections=family.fused_projections,
        attention=_attention_of(model_config, config),
        num_parameters_override=real_params,
    )


def _attention_of(model_config: Any, config: Any) -> str:
    """The estimate's name for the attention `model_config` runs: a workbench `ModelConfig`'s
    ``attention`` when it names a kernel ('auto' depends on the device and the rows: the caller's to
    resolve, e.g. with `workbench.analysis.estimate.estimate_attention`), else the transformers
    config's ``_attn_implementation``."""
    from workbench.models.attention_choice import ATTENTION_KERNELS, kernel_of

    setting = (
        getattr(model_config, "attention", None) if type(model_config).__name__ == "ModelConfig" else None
    )
    if setting in ATTENTION_KERNELS and setting != "auto":
        return str(setting)
    return kernel_of(getattr(config, "_attn_implementation", None))


def quantized_matrices(shape: ModelShape) -> list[tuple[str, int, int]]:
    """``(name, out_features, in_features)`` of every matrix a quantized base stores as integers.

    What `workbench.models.quantize.quantize_model` swaps, every ``nn.Linear``: the attention and
    MLP projections of the transformer blocks (the 2-D matrices under ``layers.``), and the LM head
    when it is not tied to the input embedding. Embeddings, norms and biases stay in the parameter
    precision, and so do GPT-2's blocks: their projections are `transformers` Conv1D modules, not
    ``nn.Linear`` (only an untied GPT-2 head is quantized).
    """
    out = []
    for name, (rows, cols) in (item for item in shape.parameter_shapes() if len(item[1]) == 2):
        if name == "lm_head.weight" or (name.startswith("layers.") and not shape.gpt2_style):
            out.append((name, rows, cols))  # nn.Linear weights are [out, in]
    return out


def lora_adapter_shapes(
    shape: ModelShape, rank: int, targets: str | Sequence[str] = "auto"
) -> list[tuple[str, tuple[int, ...]]]:
    """The LoRA adapters' tensors: ``A [rank, in]`` and ``B [out, rank]`` for every targeted matrix.

    ``"auto"`` targets every matrix of the transformer blocks (the attention and MLP projections,
    what `workbench.train.lora` adapts); a list names modules by their last name part (``q_proj``,
    ``c_attn``, ...). Linear weights are ``[out, in]``, GPT-2's Conv1D ones ``[in, out]``.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"lora_rank={rank!r} is not allowed: an int >= 1")
    matrices = [(name.removesuffix(".weight"), s) for name, s in shape.parameter_shapes() if len(s) == 2]
    if targets == "auto":
        chosen = [(name, s) for name, s in matrices if name.startswith("layers.")]
    else:
        wanted = {t.rsplit(".", 1)[-1] for t in targets}
        chosen = [(name, s) for name, s in matrices if name.rsplit(".", 1)[-1] in wanted]
        found = {name.rsplit(".", 1)[-1] for name, _ in chosen}
        if wanted - found:
            existing = list(dict.fromkeys(name.rsplit(".", 1)[-1] for name, _ in matrices))
            raise ValueError(
                f"lora_targets {sorted(wanted - found)} match no matrix of this {shape.family} model "
                f"(its matrices: {', '.join(existing)})"
            )
    out = []
    for name, (rows, cols) in chosen:
        n_in, n_out = (rows, cols) if shape.gpt2_style else (cols, rows)
        out += [(f"{name}.lora_A", (rank, n_in)), (f"{name}.lora_B", (n_out, rank))]
    return out


__all__ = ["ModelShape", "lora_adapter_shapes", "model_shape", "quantized_matrices"]
