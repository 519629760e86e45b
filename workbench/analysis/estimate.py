"""Will it fit? Per-device memory of one training step, estimated before anything compiles.

`estimate` adds up, per device, what a training step holds at its peak: parameters,
gradients, optimizer state, the activations saved for the backward pass (a per-layer
formula for the family's attention and MLP, with and without materialised attention
scores, with and without activation checkpointing), the logits and loss temporaries, and
the batch itself. A mesh (`MeshSpec` sizes; nothing is built) divides parameters, gradients
and optimizer state over ``fsdp x model`` and the batch over ``data x fsdp``.

The activation formula counts the tensors autograd saves in the `transformers`
implementations, per token of one layer (H hidden, h heads of size d, I MLP width, T length):

    H                 the layer input (all that checkpointing keeps)
    2H + 2H           each norm's input and normalised output (kept in fp32 by HF norms)
    4hd               q, k and v after repeat_kv (GQA materialises k and v for every head),
                      and the attention output that feeds o_proj
    hT                the softmax probabilities, when attention is materialised ("eager");
                      a flash/fused kernel or chunked attention keeps only a per-head log-sum-exp
    4I (gated MLP)    gate, up, act(gate), act(gate)*up; 2I for a plain MLP (GPT-2)

beside what is saved, one layer's backward pass holds attention temporaries
(`attention_transient_elements_per_token`: eager's ``2hT`` gradients of the probabilities and scores
and its ``T``-wide mask, chunked's three copies of one query block's scores), which only add where
they exceed the loss's logits (freed before the layers' backward passes); and the loss keeps 4
vocab-sized fp32 tensors per token (logits, log-softmax and the two
gradients: HF upcasts logits to fp32 for the loss). With checkpointing a layer keeps only
its input, and one layer at a time is recomputed in the backward pass.

Two settings shrink the largest terms of a LoRA run on a big model. A chunked loss
(``train.loss_chunk_tokens``, `workbench.models.lm_head.loss_chunk_length`: the same rule the
training objective uses) keeps one chunk's logits: ``rows x chunk positions x 4 x vocab x 4``
bytes instead of every token's. A quantized base (``model.quantize``, the layout of
`workbench.models.quantize`) holds the frozen linears as integers plus fp32 scales; int8
multiplies by the integers and scales the matmul's output, and materialises nothing (its
backward's integer-to-compute-dtype convert is taken as fused into the matmul, as XLA does on
TPU); int4 is unpacked and dequantized one layer's weight at a time, right before its matmul and
again in the backward pass (``dequant``: the largest quantized weight in the compute precision,
an untied LM head included). Under a chunked loss an int4 head is dequantized once for all the
chunks (XLA merges their identical dequantizations) and once for their backward passes, both
live through the loss: ``dequant`` is then two copies of the head.

The estimate was checked against the XLA compiler's own memory analysis of the real
training step on XLA:CPU (``bench/memory.py`` prints both side by side and writes
``bench/results/memory.json``; the compiler's figure comes from
`workbench.analysis.probe.compiled_step_memory`, and for the trainer's LoRA step with a
quantized base and a chunked loss from `workbench.analysis.probe.compiled_program_memory`,
tests/xla/memory_quantized.py). Two things the compiler does that a formula cannot see: under
FSDP it keeps the all-gathered weights alive between forward and backward (counted here as one
full copy, ``gathered_params``), and on XLA:CPU, with its default scheduler, checkpointing saves
almost nothing: its optimizer pipeline removes the optimization barriers torch_xla's checkpoint
inserts, and the compiled step keeps about as much as an unchecked one (also with CSE switched
off). The estimate models checkpointing as it is meant to work, so checkpointed rows on XLA:CPU
miss. (With XLA:CPU's memory-minimising scheduler, ``--xla_cpu_enable_concurrency_optimized_
scheduler=false``, a checkpointed LoRA step does keep less: 211 against 259 MiB in
tests/xla/memory_quantized.py's int4 shape.)

Three more XLA:CPU differences, measured on the quantized rows: XLA:CPU computes a bf16 program's
intermediates in fp32 (no bf16 buffer is live at the peak of a bf16 step), so bf16 activations
and logits are checked in fp32 there; its dot takes no converted operand, so each int8 weight is
converted to fp32 before its matmul (the estimate's int8 model has none: on TPU the convert
fuses into the matmul), and an int8 head under a chunked loss is held twice, like int4's, through
the loss; and the plain loss over a frozen head (LoRA) holds 2 to 3 of the 4 vocabulary-wide
fp32 tensors counted here per token (the fourth feeds the head's own gradient), so plain-loss
LoRA rows on XLA:CPU come out high by up to a quarter of the logits term.

The model's shape comes from the family registry (`model_shape`, `workbench.analysis.shape`,
re-exported here); the largest batch that fits is `workbench.analysis.batch`'s question. A GRPO step
(``rollout=``) trains rows of prompt + completion after a rollout: `workbench.analysis.rollout_memory`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# `estimate`'s arguments from a run's config: their own module's, importable from here as before
from workbench.analysis.config_estimate import config_settings as config_settings
from workbench.analysis.config_estimate import preference_reference as preference_reference
from workbench.analysis.long_context import HOST_KEYS, LONG_CONTEXT_MEANINGS, long_context_terms
from workbench.analysis.rollout_memory import (
    ROLLOUT_MEANINGS,
    RolloutPlan,
    grpo_input_bytes,
    grpo_logits_bytes,
    rollout_memory,
)
from workbench.analysis.shape import ModelShape, model_shape, quantized_matrices
from workbench.analysis.shape import lora_adapter_shapes as lora_adapter_shapes
from workbench.config import ModelConfig
from workbench.models.lm_head import logits_bytes, loss_chunk_length
from workbench.models.quantize import QUANTIZE_MODES, quantized_weight_bytes

# The mesh sizes and the batch divisibility rule are the mesh's own, so the estimate refuses
# exactly the batches `workbench.parallel.apply.shard_batch` would.
from workbench.parallel.mesh import axis_sizes_of, batch_size_problem, data_parallel_size
from workbench.units import GiB, format_bytes

Precision = Literal["fp32", "bf16-mixed", "bf16"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16-mixed", "bf16")
OPTIMIZERS: tuple[str, ...] = ("adamw", "adafactor", "sgd")
ATTENTIONS: tuple[str, ...] = ("eager", "sdpa", "flash", "chunked")
CHUNKED_BLOCK_COPIES = 3
"""Score-sized fp32 tensors of one query block live at once under chunked attention (scores,
probabilities and, in the backward pass, their gradient)."""
BREAKDOWN_KEYS: tuple[str, ...] = (
    "params",
    "grads",
    "optimizer",
    "activations",
    "logits",
    "inputs",
    "gathered_params",
    "param_casts",
    "grad_accum_buffer",
    "dequant",
    "reference",
    *ROLLOUT_MEANINGS,
    *HOST_KEYS,
)
"""Every key of `MemoryEstimate.breakdown`, in display order (`HOST_KEYS`, in host memory, last)."""

PREFERENCE_REFERENCES = ("adapters_off", "copy", "precompute")
"""How a DPO run gets its reference log-probs (``train.dpo_reference`` resolved; `preference_reference`)."""


BREAKDOWN_MEANINGS: dict[str, str] = {
    "params": "the weights (a quantized base at its integer bytes and scales) and the LoRA adapters",
    "grads": "gradients of the trainable weights",
    "optimizer": "optimizer state of the trainable weights",
    "activations": "tensors the forward pass saves for the backward pass",
    "logits": "the LM head's fp32 logits, log-softmax and their gradients (one chunk's when chunked)",
    "inputs": "input ids and labels",
    "gathered_params": "FSDP's all-gathered full weights, live through the step",
    "param_casts": "autocast's compute-precision copies of fp32 weights",
    "grad_accum_buffer": "the running gradient sum under gradient accumulation",
    "dequant": "the largest int4 weight dequantized to the compute precision for its matmul (an int4 head under a chunked loss: two copies)",
    "reference": "DPO's frozen reference copy of the starting weights, in the parameter precision",
    **ROLLOUT_MEANINGS,
    **LONG_CONTEXT_MEANINGS,
}
"""What each breakdown part holds, for legends and tables."""


# ---- precision and optimizer -----------------------------------------------------------


@dataclass(frozen=True)
class _Bytes:
    param: int
    grad: int
    compute: int
    """Activations and the weights as the matmuls see them."""
    state: int
    """One optimizer state element."""


def _bytes_for(precision: str) -> _Bytes:
    if precision == "fp32":
        return _Bytes(param=4, grad=4, compute=4, state=4)
    if precision == "bf16-mixed":  # fp32 master weights, grads and state; bf16 autocast compute
        return _Bytes(param=4, grad=4, compute=2, state=4)
    if precision == "bf16":  # everything in bf16
        return _Bytes(param=2, grad=2, compute=2, state=2)
    raise ValueError(f"precision={precision!r} is not allowed: one of {', '.join(map(repr, PRECISIONS))}")


def optimizer_state_elements(shape: ModelShape, optimizer: str) -> int:
    """Optimizer state elements for the whole model.

    What `workbench.train.optim.build_optimizer` creates: adamw, two moments per parameter;
    adafactor (no momentum), a row and a column second-moment vector per matrix, the full
    second moment for vectors; sgd (momentum 0.9), one momentum buffer per parameter.
    """
    if optimizer in ("adamw", "sgd"):  # counted from the real model's parameter total when there is one
        return (2 if optimizer == "adamw" else 1) * shape.num_parameters
    return state_elements([s for _, s in shape.parameter_shapes()], optimizer)


def state_elements(shapes: list[tuple[int, ...]], optimizer: str) -> int:
    """Optimizer state elements for parameters of `shapes` (see `optimizer_state_elements`)."""
    n = sum(math.prod(s) for s in shapes)
    if optimizer == "adamw":
        return 2 * n
    if optimizer == "sgd":
        return n
    if optimizer == "adafactor":
        return sum(s[0] + s[1] if len(s) == 2 else math.prod(s) for s in shapes)
    raise ValueError(f"optimizer={optimizer!r} is not allowed: one of {', '.join(map(repr, OPTIMIZERS))}")


# ---- the estimate ----------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-device bytes of one training step at its peak."""

    total_bytes: int
    breakdown: dict[str, int]
    """Bytes per part; keys in `BREAKDOWN_KEYS` (params, grads, optimizer, activations, logits, ...)."""
    batch_size: int
    """Global micro-batch (sequences per forward pass, all devices together)."""
    seq_len: int
    per_device_batch: int
    precision: str
    optimizer: str
    gradient_checkpointing: bool
    mesh: dict[str, int] = field(default_factory=dict)
    attention: str = "eager"
    num_parameters: int = 0
    lora_rank: int = 0
    """LoRA rank (0: full fine-tuning)."""
    trainable_parameters: int = 0
    """Parameters with gradients and optimizer state: all of them, or the LoRA adapters."""
    quantize: str = "none"
    """How the frozen base is stored: 'none' (the parameter precision), 'int8' or 'int4'."""
    base_weight_bytes: int = 0
    """The model's own weights per device as held (integers and scales where quantized; no adapters)."""
    unquantized_weight_bytes: int = 0
    """The same weights in the parameter precision: what quantizing saves is the difference."""
    loss_chunk_positions: int | None = None
    """Positions per chunk of the LM head and loss (`workbench.models.lm_head.loss_chunk_length`);
    None: the whole batch's logits at once."""
    preference: str | None = None
    """A DPO step's reference (`PREFERENCE_REFERENCES`): each of the batch's pairs is two rows; None: SFT."""
    scores_bytes: int = 0
    """Of the activations, the attention scores: every layer's under 'eager' (one layer's when
    checkpointed), one query block's under 'chunked', none under 'flash'/'sdpa'."""
    eager_scores_bytes: int = 0
    """What the scores would hold under 'eager', for comparison."""
    rollout: Any = None
    """A GRPO step's rollout, whole (`workbench.analysis.rollout_memory.RolloutMemory`); None: no rollout."""
    host_bytes: int = 0
    """Host memory the step takes beside the device's `total_bytes`: the `HOST_KEYS` parts (offloaded checkpoints)."""
    offload_activations: bool = False
    """Whether the layers' checkpoints live in host memory (``train.offload_activations`` resolved)."""
    mlp_chunk_positions: int | None = None
    """Positions per MLP tile (`workbench.models.mlp_tiles.mlp_chunk_length`); None: the whole MLP at once."""

    def fits(self, memory_bytes: int | None, headroom: float = 0.1) -> bool:
        """True when the estimate stays under `memory_bytes` less a `headroom` fraction (XLA's own
        buffers, fragmentation, the runtime). Unknown memory (None) counts as fitting."""
        if memory_bytes is None:
            return True
        if not 0 <= headroom < 1:
            raise ValueError(f"headroom={headroom!r} is not allowed: a fraction in [0, 1)")
        return self.total_bytes <= memory_bytes * (1 - headroom)

    def host_parts(self) -> list[str]:
        """The breakdown's parts in host memory that hold something (`HOST_KEYS`)."""
        return [k for k in HOST_KEYS if self.breakdown.get(k)]

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GiB

    def table(self) -> str:
        """The breakdown as aligned text, largest part first."""
        items = [(k, v) for k, v in self.breakdown.items() if v and k not in HOST_KEYS]
        rows = sorted(items, key=lambda kv: -kv[1])
        width = max((len(k) for k in self.breakdown if self.breakdown[k]), default=5)
        lines = [
            f"{k:<{width}}  {format_bytes(v):>10}  {100 * v / max(self.total_bytes, 1):5.1f}%"
            for k, v in rows
        ]
        lines.append(f"{'total':<{width}}  {format_bytes(self.total_bytes):>10}")
        lines += [f"{k:<{width}}  {format_bytes(self.breakdown[k]):>10}  host" for k in self.host_parts()]
        return "\n".join(lines)


def mesh_sizes(mesh: Any) -> dict[str, int]:
    """``{"data", "fsdp", "model"}`` sizes of a resolved `MeshSpec`, a torch_xla mesh or a mapping
    (axes it lacks count 1); None is one device."""
    if mesh is None:
        return {"data": 1, "fsdp": 1, "model": 1}
    sizes = axis_sizes_of(mesh)
    out = {axis: int(sizes.get(axis, 1)) for axis in ("data", "fsdp", "model")}
    for axis, size in out.items():
        if size < 1:
            raise ValueError(
                f"mesh {axis}={size} is not allowed here: resolve the mesh first "
                "(MeshSpec.resolve(num_devices)) so every axis has a size >= 1"
            )
    return out


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


def estimate(
    model_config: Any,
    *,
    batch_size: int,
    seq_len: int,
    optimizer: str = "adamw",
    precision: str = "bf16-mixed",
    gradient_checkpointing: bool = False,
    mesh: Any = None,
    grad_accum: int = 1,
    attention: str | None = None,
    lora_rank: int = 0,
    lora_targets: str | Sequence[str] = "auto",
    quantize: str | None = None,
    loss_chunk_tokens: int | str = "auto",
    memory_bytes: int | None = None,
    preference: str | None = None,
    rollout: RolloutPlan | None = None,
    offload_activations: str = "off",
    mlp_chunk_tokens: int | str | None = "model",
) -> MemoryEstimate:
    """Per-device peak memory of one training step (forward, backward, optimizer update).

    `model_config`: a `transformers` config or model (Llama, Qwen2, Mistral, Gemma, GPT-2) or a
    workbench `ModelConfig`. `batch_size`: the global micro-batch, split over the mesh's
    data x fsdp axes. `mesh`: a resolved `MeshSpec` (or a dict of axis sizes); None is one device.
    `attention` (`ATTENTIONS`): 'eager' saves every layer's scores; 'chunked' holds one query block's
    (`attention_transient_elements_per_token`); 'flash' and 'sdpa' none; default: what the config says
    (a `ModelConfig`'s ``attention`` when it names a kernel; under 'auto' the transformers config's
    own, eager unless set: resolve 'auto' for a device with `estimate_attention`).
    `lora_rank` > 0: LoRA fine-tuning (`workbench.train.lora`) of `lora_targets` (see
    `lora_adapter_shapes`): the frozen base weights have no gradients and no optimizer state;
    the adapters (fp32, as peft keeps them, replicated on every device) have weights, gradients
    and optimizer state. Activations are counted as for full fine-tuning: the backward pass still
    runs through every layer (the adapters' own rank-sized activations are left out).
    `quantize` ('int8' or 'int4', ``model.quantize``; needs `lora_rank`; default: a `ModelConfig`'s
    own ``quantize``, else 'none'): the frozen base's
    linears (`quantized_matrices`) are held as integers and scales (`quantized_weight_bytes`),
    with no autocast copies; int4 adds ``dequant``, the largest quantized weight dequantized to
    the compute precision (int8 scales the matmul's output and dequantizes nothing).
    `loss_chunk_tokens` (``train.loss_chunk_tokens``: tokens per chunk, 0 never, 'auto') sizes
    the logits term by `loss_chunk_length`; 'auto' plans for `memory_bytes`, the device's memory
    (None: `workbench.models.lm_head.REFERENCE_MEMORY`), as the trainer does.
    `preference` (a DPO run's reference, `PREFERENCE_REFERENCES`; `preference_reference` reads it
    from a config): `batch_size` counts pairs, each a chosen and a rejected row through the forward
    and backward passes; 'copy' adds the frozen reference's weights in the parameter precision. The
    reference's own forward runs without gradients before the policy's and keeps nothing for the
    backward pass, so it adds nothing at the step's peak.
    `rollout` (GRPO, `workbench.analysis.rollout_memory`): `batch_size` counts prompts and `seq_len` is the
    prompt's length; each prompt's G completions train as rows of prompt + completion budget (the
    estimate's ``seq_len``), after a rollout whose KV cache and sampler buffers the step's peak covers.
    `offload_activations` ('auto', 'on', 'off'; default off) and `mlp_chunk_tokens` (N, 'auto', None;
    default: a `ModelConfig`'s own, else None): the layers' checkpoints in host memory (``host_bytes``)
    and the MLP in tiles (`workbench.analysis.long_context`); a config's own through `config_settings`.
    """
    settings = dict(locals())  # every argument: 'auto' offload asks for the estimate without it
    if preference is not None and preference not in PREFERENCE_REFERENCES:
        raise ValueError(
            f"preference={preference!r} is not allowed: None (SFT) or one of {', '.join(map(repr, PREFERENCE_REFERENCES))}"
        )
    shape = model_shape(model_config)
    if attention is not None:
        if attention not in ATTENTIONS:
            raise ValueError(
                f"attention={attention!r} is not allowed: one of {', '.join(map(repr, ATTENTIONS))}"
            )
        shape = ModelShape(**{**shape.__dict__, "attention": attention})
    check_positive("batch_size", batch_size)
    check_positive("seq_len", seq_len)
    check_positive("grad_accum", grad_accum)
    nbytes = _bytes_for(precision)
    sizes = mesh_sizes(mesh)
    problem = batch_size_problem(batch_size, sizes)
    if problem is not None:
        raise ValueError(f"batch_size={batch_size} is not allowed: {problem}")
    dp = data_parallel_size(sizes)
    shard = sizes["fsdp"] * sizes["model"]  # parameter/state sharding
    mp = sizes["model"]
    per_device_batch = batch_size // dp
    rows = per_device_batch * (2 if preference is not None else 1)  # a pair is two rows
    prompt_length, rows = seq_len, rows * (rollout.num_generations if rollout is not None else 1)
    seq_len += rollout.completion_positions if rollout is not None else 0  # GRPO: prompt + completion rows
    tokens = rows * seq_len
    n = shape.num_parameters

    if quantize is None:
        quantize = model_config.quantize if isinstance(model_config, ModelConfig) else "none"
    if mlp_chunk_tokens == "model":
        mlp_chunk_tokens = model_config.mlp_chunk_tokens if isinstance(model_config, ModelConfig) else None
    if quantize not in QUANTIZE_MODES:
        raise ValueError(
            f"quantize={quantize!r} is not allowed: one of {', '.join(map(repr, QUANTIZE_MODES))}"
        )
    if quantize != "none" and not lora_rank:
        raise ValueError(
            f"quantize={quantize!r} needs lora_rank >= 1: a quantized base is frozen integers, only "
            "LoRA adapters can train on top of it (or quantize='none' for full fine-tuning)"
        )
    # The frozen base's quantized linears: integers and scales instead of parameter-precision weights.
    qmats = quantized_matrices(shape) if quantize != "none" else []
    q_elements = sum(o * i for _, o, i in qmats)
    q_bytes = sum(quantized_weight_bytes(o, i, quantize) for _, o, i in qmats)
    # embeddings, norms, biases (every weight when not quantized); counted from the shapes when
    # quantized, as a real model given here may hold its integers outside its parameters
    plain = n if not qmats else sum(math.prod(s) for _, s in shape.parameter_shapes()) - q_elements

    breakdown = dict.fromkeys(BREAKDOWN_KEYS, 0)
    breakdown["params"] = math.ceil((plain * nbytes.param + q_bytes) / shard)
    base_weight_bytes = breakdown["params"]
    if lora_rank:
        adapters = [s for _, s in lora_adapter_shapes(shape, lora_rank, lora_targets)]
        trainable = sum(math.prod(s) for s in adapters)
        breakdown["params"] += trainable * 4
        breakdown["grads"] = trainable * 4
        breakdown["optimizer"] = state_elements(adapters, optimizer) * 4
    else:
        trainable = n
        breakdown["grads"] = math.ceil(n * nbytes.grad / shard)
        breakdown["optimizer"] = math.ceil(optimizer_state_elements(shape, optimizer) * nbytes.state / shard)
    if sizes["fsdp"] > 1:
        # XLA hoists the all-gathers: the full weights (model-parallel shard) stay live through the
        # step; quantized matrices are gathered as the integers and scales they are stored as
        breakdown["gathered_params"] = math.ceil((plain * nbytes.compute + q_bytes) / mp)
    elif nbytes.compute < nbytes.param:
        # autocast's bf16 copies of the fp32 weights, kept for the backward matmuls (none of the
        # quantized matrices: they reach the matmul as integers)
        breakdown["param_casts"] = math.ceil(plain * nbytes.compute / shard)
    # positions per loss chunk (None: the whole batch's logits at once)
    chunk = loss_chunk_length(
        loss_chunk_tokens,
        rows=rows,
        # GRPO's objective takes the head at the completion's positions only, chunked by the same rule
        length=rollout.completion_positions if rollout is not None else seq_len,
        vocab=shape.vocab,
        memory_bytes=memory_bytes,
        model_parallel=mp,
    )
    if quantize == "int4" and qmats:
        # blockwise int4 is dequantized to the compute dtype right before its matmul, one layer's
        # weight at a time (again in the backward pass, never saved between them): the largest one.
        # A quantized head under a chunked loss is dequantized once for every chunk (the chunks'
        # copies are one expression, merged by XLA), once more for the backward pass (another
        # expression: `QuantizedMatmul`), and both stay live through the loss's backward pass
        head = sum(o * i for name, o, i in qmats if name == "lm_head.weight")
        largest = max(max(o * i for _, o, i in qmats), 2 * head if chunk else 0)
        breakdown["dequant"] = math.ceil(largest * nbytes.compute / mp)
    if grad_accum > 1:
        # the running sum persists while the next micro-batch's gradients are produced
        breakdown["grad_accum_buffer"] = breakdown["grads"]

    act = activation_elements_per_token(
        shape, seq_len, gradient_checkpointing=gradient_checkpointing, model_parallel=mp
    )
    scores = act["scores"]
    # HF computes the softmax in fp32 and casts back: fp32 probs (for softmax's backward) plus
    # the cast copy (for the value matmul) when compute is narrower than fp32
    score_bytes = 4 + (nbytes.compute if nbytes.compute < 4 else 0)
    # A layer's attention temporaries live inside its backward pass, after the loss's logits are
    # freed: the peak holds the larger of the two (measured on XLA:CPU at 2048 and 4096 tokens,
    # tests/xla/attention_estimate.py), so only their excess over the logits term is added
    if rollout is not None:
        logits = grpo_logits_bytes(rows, rollout, shape.vocab, mp, chunk, frozen_head=bool(lora_rank))
    else:
        logits = logits_bytes(rows=rows, positions=chunk or seq_len, vocab=shape.vocab, model_parallel=mp)
    transient = math.ceil(tokens * act["attention_transient"] * 4)
    scores_bytes = math.ceil(tokens * scores * score_bytes) + transient
    eager = ModelShape(**{**shape.__dict__, "attention": "eager"})
    eager_act = activation_elements_per_token(
        eager, seq_len, gradient_checkpointing=gradient_checkpointing, model_parallel=mp
    )
    eager_scores_bytes = math.ceil(
        tokens * (eager_act["scores"] * score_bytes + eager_act["attention_transient"] * 4)
    )
    long = long_context_terms(
        shape, act, rows=rows, seq_len=seq_len, compute_bytes=nbytes.compute, score_bytes=score_bytes,
        gradient_checkpointing=gradient_checkpointing, model_parallel=mp, quantize=quantize, logits=logits,
        dequant=breakdown["dequant"], memory_bytes=memory_bytes, mlp_chunk_tokens=mlp_chunk_tokens,
        offload_activations=offload_activations,
        fits_without=lambda: estimate(**{**settings, "offload_activations": "off"}).fits(memory_bytes),
    )  # fmt: skip
    breakdown.update(long.parts)
    # logits and log-softmax in fp32 plus their gradients (vocab-parallel under a model axis), for
    # the whole batch or, chunked, one chunk of positions of every row
    breakdown["logits"] = logits
    if preference == "copy":  # the frozen reference: the starting weights again, as the policy holds them
        breakdown["reference"] = math.ceil((plain * nbytes.param + q_bytes) / shard)
    breakdown["inputs"] = tokens * 2 * 8  # input_ids and labels, int64
    grpo = None
    if rollout is not None:
        transient = breakdown["activations"] + breakdown["logits"]
        grpo, parts = rollout_memory(
            model_config,
            shape,
            rollout,
            rows=rows,
            prompt_length=prompt_length,
            param_bytes=nbytes.param,
            compute_bytes=nbytes.compute,
            model_parallel=mp,
            training_transient_bytes=transient,
        )
        breakdown.update(parts, inputs=grpo_input_bytes(rows, prompt_length, rollout))

    return MemoryEstimate(
        total_bytes=int(sum(v for k, v in breakdown.items() if k not in HOST_KEYS)),
        breakdown=breakdown,
        batch_size=batch_size,
        seq_len=seq_len,
        per_device_batch=per_device_batch,
        precision=precision,
        optimizer=optimizer,
        gradient_checkpointing=gradient_checkpointing,
        mesh=sizes,
        attention=shape.attention,
        num_parameters=n,
        lora_rank=lora_rank,
        trainable_parameters=trainable,
        quantize=quantize,
        base_weight_bytes=base_weight_bytes,
        unquantized_weight_bytes=math.ceil(n * nbytes.param / shard),
        loss_chunk_positions=chunk,
        preference=preference,
        scores_bytes=scores_bytes,
        eager_scores_bytes=eager_scores_bytes,
        rollout=grpo,
        host_bytes=int(sum(breakdown[k] for k in HOST_KEYS)),
        offload_activations=long.offload,
        mlp_chunk_positions=long.tile_positions,
    )


def check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is not allowed: an int >= 1")
