"""Will it fit? Per-device memory of one training step, estimated before anything compiles.

`estimate` adds up, per device, what a training step holds at its peak: parameters,
gradients, optimizer state, the activations saved for the backward pass (a per-layer
formula for the family's attention and MLP, with and without materialised attention
scores, with and without activation checkpointing), the logits and loss temporaries, and
the batch itself. A mesh (`MeshSpec` sizes; nothing is built) divides parameters, gradients
and optimizer state over ``fsdp x model`` and the batch over ``data x fsdp``.

The activations are a per-layer formula of the tensors autograd saves in the `transformers`
implementations (`workbench.analysis.activations`), beside which one layer's backward pass holds its
attention temporaries, which only add where they exceed the loss's logits (freed before the layers'
backward passes); the loss keeps 4 vocab-sized fp32 tensors per token (logits, log-softmax and the two
gradients: HF upcasts logits to fp32 for the loss). The bytes of each tensor come from the precision,
the optimizer's state from the optimizer (`workbench.analysis.state_bytes`). What the objective adds
(a pair's two rows and a DPO reference copy, GRPO's rollout) is its term's
(`workbench.analysis.objective_memory`): the estimate asks it and names no objective.

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
(``objective=`` a `workbench.analysis.rollout_memory.RolloutPlan`) trains rows of prompt + completion
after a rollout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# `estimate`'s arguments from a run's config: their own module's, importable from here as before
from workbench.analysis.activations import ATTENTIONS, activation_elements_per_token
from workbench.analysis.activations import estimate_attention as estimate_attention

# `estimate`'s arguments from a run's config: their own module's, importable from here as before
from workbench.analysis.config_estimate import config_settings as config_settings
from workbench.analysis.long_context import HOST_KEYS, LONG_CONTEXT_MEANINGS, long_context_terms
from workbench.analysis.objective_memory import NEXT_TOKEN, StepContext, StepRows
from workbench.analysis.preference_memory import REFERENCE_MEANINGS
from workbench.analysis.rollout_memory import ROLLOUT_MEANINGS
from workbench.analysis.shape import ModelShape, model_shape, quantized_matrices
from workbench.analysis.shape import lora_adapter_shapes as lora_adapter_shapes
from workbench.analysis.state_bytes import bytes_for, optimizer_state_elements, state_elements
from workbench.config import ModelConfig
from workbench.models.lm_head import loss_chunk_length
from workbench.models.quantize import QUANTIZE_MODES, quantized_weight_bytes

# The mesh sizes and the batch divisibility rule are the mesh's own, so the estimate refuses
# exactly the batches `workbench.parallel.apply.shard_batch` would.
from workbench.parallel.mesh import axis_sizes_of, batch_size_problem, data_parallel_size
from workbench.units import GiB, format_bytes

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
    *REFERENCE_MEANINGS,
    *ROLLOUT_MEANINGS,
    *HOST_KEYS,
)
"""Every key of `MemoryEstimate.breakdown`, in display order (`HOST_KEYS`, in host memory, last)."""


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
    **REFERENCE_MEANINGS,
    **ROLLOUT_MEANINGS,
    **LONG_CONTEXT_MEANINGS,
}
"""What each breakdown part holds, for legends and tables."""


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
    objective: StepRows = NEXT_TOKEN
    """The objective's term (`workbench.analysis.objective_memory`): what an example is in the rows."""
    scores_bytes: int = 0
    """Of the activations, the attention scores: every layer's under 'eager' (one layer's when
    checkpointed), one query block's under 'chunked', none under 'flash'/'sdpa'."""
    eager_scores_bytes: int = 0
    """What the scores would hold under 'eager', for comparison."""
    objective_report: Any = None
    """The objective's own figures beside the breakdown (GRPO's rollout, whole:
    `workbench.analysis.rollout_memory.RolloutMemory`); None: none."""
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
    objective: StepRows = NEXT_TOKEN,
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
    `objective` (`workbench.analysis.objective_memory.StepRows`; a config's through `config_settings`)
    says what an example of `batch_size` is: by default a row of `seq_len` tokens with the next-token
    loss at every position; a preference pair (`workbench.analysis.preference_memory.PairRows`) a chosen and a rejected row, with a 'copy'
    reference's weights; a GRPO prompt (`workbench.analysis.rollout_memory.RolloutPlan`, `seq_len` the
    prompt's length) its G completions' rows of prompt + completion budget, after a rollout whose KV
    cache and sampler buffers the step's peak covers.
    `offload_activations` ('auto', 'on', 'off'; default off) and `mlp_chunk_tokens` (N, 'auto', None;
    default: a `ModelConfig`'s own, else None): the layers' checkpoints in host memory (``host_bytes``)
    and the MLP in tiles (`workbench.analysis.long_context`); a config's own through `config_settings`.
    """
    settings = dict(locals())  # every argument: 'auto' offload asks for the estimate without it
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
    nbytes = bytes_for(precision)
    sizes = mesh_sizes(mesh)
    problem = batch_size_problem(batch_size, sizes)
    if problem is not None:
        raise ValueError(f"batch_size={batch_size} is not allowed: {problem}")
    dp = data_parallel_size(sizes)
    shard = sizes["fsdp"] * sizes["model"]  # parameter/state sharding
    mp = sizes["model"]
    per_device_batch = batch_size // dp
    rows = per_device_batch * objective.rows_per_example  # a pair is two rows, a GRPO prompt G
    prompt_length, seq_len = seq_len, objective.positions(seq_len)  # GRPO: prompt + completion rows
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
        # where the head runs (GRPO: the completion's positions only), chunked by the same rule
        length=objective.head_positions(seq_len),
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
    logits = objective.logits_bytes(
        rows=rows,
        positions=seq_len,
        chunk=chunk,
        vocab=shape.vocab,
        model_parallel=mp,
        frozen_head=bool(lora_rank),
    )
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
    breakdown["inputs"] = objective.input_bytes(rows=rows, positions=seq_len, prompt_length=prompt_length)
    step = StepContext(
        model_config=model_config,
        shape=shape,
        rows=rows,
        prompt_length=prompt_length,
        param_bytes=nbytes.param,
        compute_bytes=nbytes.compute,
        model_parallel=mp,
        weight_bytes=base_weight_bytes,
        training_transient_bytes=breakdown["activations"] + breakdown["logits"],
    )
    parts, report = objective.extra_parts(step)  # a DPO copy's weights, GRPO's rollout beyond the step's
    breakdown.update(parts)

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
        objective=objective,
        scores_bytes=scores_bytes,
        eager_scores_bytes=eager_scores_bytes,
        objective_report=report,
        host_bytes=int(sum(breakdown[k] for k in HOST_KEYS)),
        offload_activations=long.offload,
        mlp_chunk_positions=long.tile_positions,
    )


def check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is not allowed: an int >= 1")
