"""The collectives of a training step predicted from shapes alone, for meshes that are not here.

`predict_communication` lists, per micro-batch and per optimizer step, the collectives GSPMD
inserts for the workbench's training step on a ``data x fsdp x model`` mesh, from the model's
shape (`workbench.analysis.shape.model_shape`) and its sharding plan
(`workbench.parallel.plan.plan_sharding` with the family's rules, `rules_for_mesh` applied as
`workbench.parallel.apply.shard_model` applies them). It returns a `CommunicationReport`
(source 'model') that prices like one read from HLO. The terms, as the compiled step shows them
on 8 XLA:CPU devices (bench/communication.py compares every mesh):

- **fsdp-sharded weights** are all-gathered over ``fsdp`` twice a micro-batch, for the forward
  pass and again for the backward pass (a frozen LoRA base too: its input gradient needs it),
  except the attention's output projection (below);
- **gradients** of trainable weights: a reduce-scatter over ``fsdp`` and an all-reduce of the
  shard over ``data`` (as TPU's XLA runs it), or an all-reduce over the batch axes for a weight
  not split over ``fsdp`` (norms, LoRA adapters too small to split, every weight with fsdp = 1);
  a tied embedding without fsdp is reduced once per use (embedding and LM head);
- **the model axis**: per layer two all-reduces of the ``[tokens, hidden]`` activations in the
  forward pass (after the row-parallel attention output and MLP down projection) and two in the
  backward pass (the input gradients of the column-parallel projections), and three more around the
  attention's heads; the vocabulary-parallel embedding and LM head add one each way (the lookup's
  partial sums, the LM head's input gradient);
- **the embedding and LM head split over fsdp by vocabulary** (no data axis, no model axis) run
  vocabulary-parallel: their activations move (`_VOCAB_PARALLEL_*`) and their gradient stays local;
- **the attention's output projection split over fsdp on its output dimension** runs
  weight-stationary in the forward pass (`_attention_output_terms`): its input is gathered over the
  batch axes instead of its weight, its output ``[all tokens, hidden / fsdp]`` (all-reduced over
  model when there is one) resharded to the batch's row split;
- **the embedding split by vocabulary over model and by hidden over fsdp** (fsdp > 1 and
  model > 1) gives its lookup as ``[tokens, hidden / fsdp]`` rows, resharded to the batch's row
  split (`_rows_to_batch_split`) and back for its gradient (`_batch_split_to_rows`).

Scalars (the loss, token counts, the clipping norm) and the token ids' and masks' reshuffles
(collective-permutes of a few hundred bytes) are left out. Not modelled: a model axis larger than
the key/value heads, where the partitioner splits heads across devices and reshuffles them with
irregular groups (the report says so in its notes). Bytes are in
the parameter precision for weights and gradients and in fp32 for activations (XLA:CPU computes
bf16 programs in fp32; on TPU a bf16 step's activation all-reduces are half).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from workbench.analysis.communication import CommunicationReport
from workbench.analysis.flops import training_flops_per_token
from workbench.analysis.hlo_collectives import Collective
from workbench.analysis.shape import ModelShape, model_shape
from workbench.parallel.plan import plan_sharding
from workbench.parallel.rules import rules_for

_AXES = ("data", "fsdp", "model")
_VOCAB_PARALLEL_GATHERS = 3
"""All-gathers of ``[tokens of the fsdp group, hidden]`` a vocabulary-parallel (over fsdp)
embedding + LM head costs a micro-batch, as the compiled step shows: the LM head's input in the
forward pass and for each of its backward matmuls."""
_VOCAB_PARALLEL_REDUCES = 2
"""Reduce-scatters of the same size back to the batch's rows: the embedding lookup's partial sums
and the LM head's input gradient (all-reduce + slice as XLA:CPU compiles them)."""

_HIDDEN_SPLIT_GATHERS = 1
"""All-gathers over data x fsdp of the LM head's ``[tokens, hidden]`` input a micro-batch costs when the
embedding is split by hidden (a data x fsdp mesh: `rules_for_mesh`): its forward matmul (the backward
ones reuse it)."""
_MODEL_REDUCES_PER_LAYER = 7
"""All-reduces of a layer's ``[tokens, hidden]`` activations over the model axis per micro-batch, as
compiled: the attention and MLP outputs forward, their input gradients backward, and three the
partitioner adds around the attention's heads (measured on 1- and 2-layer steps)."""
_MODEL_GATHERS_PER_LAYER = 4
"""All-gathers of a layer's query/key/value heads over the model axis per micro-batch, as compiled."""
_ATTENTION_OUTPUT = ("o_proj", "c_proj")
"""Short names of the attention's output projection (`ModelShape`: Llama-style, GPT-2 under ``attn.``)."""

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "q_norm", "k_norm")
_MLP = ("gate_proj", "up_proj", "down_proj", "gate_up_proj")


def hf_parameter_name(name: str, shape: ModelShape) -> str:
    """A `ModelShape.parameter_shapes` name as the family's `transformers` model names it, so the
    family's sharding rules match it (``layers.0.q_proj.weight`` -> ``model.layers.0.self_attn.q_proj.weight``)."""
    if shape.gpt2_style:
        head = {"embed_tokens": "transformer.wte.weight", "position_embeddings": "transformer.wpe.weight"}
        if name in head:
            return head[name]
        return "transformer." + name.replace("layers.", "h.").replace("final_norm.", "ln_f.")
    if name == "embed_tokens":
        return "model.embed_tokens.weight"
    if name.startswith("final_norm."):
        return "model.norm." + name.split(".", 1)[1]
    if name == "lm_head.weight":
        return name
    parts = name.split(".")  # layers, i, module, weight|bias
    module = parts[2]
    group = "self_attn." if module in _ATTENTION else "mlp." if module in _MLP else ""
    return f"model.layers.{parts[1]}.{group}{'.'.join(parts[2:])}"


def predict_communication(
    model_config: Any,
    mesh: Mapping[str, int],
    *,
    batch_size: int,
    seq_len: int,
    lora_rank: int = 0,
    grad_accum: int = 1,
    precision: str = "fp32",
    scan: bool = False,
) -> CommunicationReport:
    """The collectives of one optimizer step of `model_config` on `mesh` (``{"data", "fsdp", "model"}``
    sizes), `batch_size` sequences of `seq_len` tokens per micro-batch, `grad_accum` micro-batches.

    `lora_rank` > 0: LoRA on every projection of the blocks (frozen base: gathered, never reduced).
    `precision`: 'fp32', 'bf16-mixed' (fp32 weights and gradients) or 'bf16' (bf16 weights and
    gradients). `scan`: the layers as one scanned layer; the bytes are the same (the compiled step
    runs the layer's collectives once per layer inside its loop), recorded in the notes.
    """
    sizes = {axis: int(mesh.get(axis, 1)) for axis in _AXES}
    for axis, size in sizes.items():
        if size < 1:
            raise ValueError(f"mesh {axis}={size} is not allowed: every axis needs a size >= 1")
    for field, value in (("batch_size", batch_size), ("seq_len", seq_len), ("grad_accum", grad_accum)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}={value!r} is not allowed: an int >= 1")
    if precision not in ("fp32", "bf16-mixed", "bf16"):
        raise ValueError(f"precision={precision!r} is not allowed: one of 'fp32', 'bf16-mixed', 'bf16'")
    dp = sizes["data"] * sizes["fsdp"]
    if batch_size % dp:
        raise ValueError(f"batch_size={batch_size} is not allowed: not divisible by data x fsdp = {dp}")
    shape = model_shape(model_config)
    param_bytes = 2 if precision == "bf16" else 4
    out: list[Collective] = []

    def add(kind: str, axes: tuple[str, ...], size: float, count: int, what: str, dtype: str = "f32") -> None:
        axes = tuple(a for a in axes if sizes[a] > 1)
        group = math.prod(sizes[a] for a in axes)
        if group <= 1 or size <= 0 or count <= 0:
            return
        out.append(
            Collective(
                what,
                kind,
                "model",
                dtype,
                (),
                round(size),
                group,
                math.prod(sizes.values()) // group,
                axes,
                count,
            )
        )

    layer_params = [
        (n, s)
        for n, s in shape.parameter_shapes()
        if not n.startswith("layers.") or n.startswith("layers.0.")
    ]
    names = {hf_parameter_name(n, shape): (n, s) for n, s in layer_params}
    report = plan_sharding(
        [(hf, s, "float32") for hf, (_n, s) in names.items()],
        sizes,
        rules_for(shape.family),  # plan_sharding applies `rules_for_mesh` where the mesh asks for it
        warn_fallback=False,
    )
    tokens_all = batch_size * seq_len
    tokens_local = tokens_all // dp  # rows of activations one device holds
    hidden_act = tokens_local * shape.hidden * 4
    micro = grad_accum
    # an attention output projection split over fsdp on its output dimension runs weight-stationary
    # forward (`_attention_output_terms`): its weight is gathered for the backward pass only
    stationary = any(_weight_stationary(names[e.name][0], e.spec) for e in report.entries)
    for entry in report.entries:
        short, _ = names[entry.name]
        per_layer = short.startswith("layers.")
        times = shape.layers if per_layer else 1
        axes_used = {a for e in entry.spec for a in ((e,) if isinstance(e, str) else (e or ()))}
        model_split = sizes["model"] if "model" in axes_used else 1
        whole = entry.numel * param_bytes / model_split  # the tensor over one model group
        embedding = short in ("embed_tokens", "lm_head.weight")
        vocab_parallel_fsdp = (
            embedding and "fsdp" in axes_used and entry.spec[0] == "fsdp" and sizes["model"] == 1
        )
        trainable = not lora_rank
        if vocab_parallel_fsdp:
            group_tokens = batch_size * seq_len // sizes["data"]
            act = group_tokens * shape.hidden * 4
            add("all-gather", ("fsdp",), act, _VOCAB_PARALLEL_GATHERS * micro, "vocab-parallel LM head input")
            add(
                "reduce-scatter",
                ("fsdp",),
                act,
                _VOCAB_PARALLEL_REDUCES * micro,
                "vocab-parallel embedding/LM head",
            )
            if trainable:  # each device's vocabulary rows have their whole gradient: only data reduces it
                add("all-reduce", ("data",), whole / sizes["fsdp"], micro, f"{short} gradient")
            continue
        if "fsdp" in axes_used:
            if _weight_stationary(short, entry.spec):
                add("all-gather", ("fsdp",), whole, times * micro, f"{short} gathered (backward)")
            else:
                add(
                    "all-gather", ("fsdp",), whole, 2 * times * micro, f"{short} gathered (forward, backward)"
                )
            uses = 2 if embedding and shape.tied else 1  # a tied embedding's shard is reduced once per use
            if trainable:
                add("reduce-scatter", ("fsdp",), whole, times * micro, f"{short} gradient")
                add(
                    "all-reduce",
                    ("data",),
                    whole / sizes["fsdp"],
                    uses * times * micro,
                    f"{short} gradient shard",
                )
            if embedding and entry.spec[-1] == "fsdp" and sizes["data"] > 1 and sizes["model"] == 1:
                # split by hidden over fsdp (`rules_for_mesh`): the LM head's input is gathered from every
                # batch shard, forward and for its two backward matmuls
                rows = batch_size * seq_len * shape.hidden * 4 / sizes["model"]
                add("all-gather", ("data", "fsdp"), rows, _HIDDEN_SPLIT_GATHERS * micro, "LM head input")
                add("all-gather", ("data",), rows / sizes["fsdp"], micro, "LM head input shard")
                if short == "embed_tokens":  # the lookup's [tokens of the data group, hidden / fsdp] to rows
                    _rows_to_batch_split(
                        add,
                        sizes,
                        tokens_all // sizes["data"],
                        tokens_all,
                        shape.hidden,
                        micro,
                        "embedding lookup",
                    )
        elif trainable:
            uses = 2 if embedding and shape.tied else 1
            add("all-reduce", ("data", "fsdp"), whole, uses * times * micro, f"{short} gradient")
        if embedding and entry.spec and entry.spec[0] == "model":
            # vocabulary-parallel over model: each device looks up the rows of its vocabulary shard for
            # the ids of its data group (ids are gathered: they are small), then the partial sums are
            # all-reduced; a hidden dimension split over fsdp stays split in that result
            split = sizes["fsdp"] if entry.spec[-1] == "fsdp" else 1
            lookup = tokens_all // sizes["data"] * shape.hidden // split * 4
            if short == "embed_tokens":
                add("all-reduce", ("model",), lookup, micro, "embedding lookup partial sums (model)")
                if split > 1:
                    _rows_to_batch_split(
                        add,
                        sizes,
                        tokens_all // sizes["data"],
                        tokens_all,
                        shape.hidden,
                        micro,
                        "embedding lookup",
                    )
                    _batch_split_to_rows(add, sizes, tokens_all, shape.hidden, micro, "embedding gradient")
            if short == "lm_head.weight" or (short == "embed_tokens" and shape.tied):
                # the LM head's input gradient: partial sums over the vocabulary shards
                add("all-reduce", ("model",), hidden_act, micro, "LM head input gradient (model)")
    if lora_rank:
        _lora_collectives(add, shape, sizes, lora_rank, micro)
    # per layer, as compiled: the row-parallel outputs (attention, MLP) and the column-parallel input
    # gradients, plus the attention's own reshards of the heads (`_MODEL_*`)
    head_act = tokens_local * shape.heads * shape.head_dim * 4
    if stationary:
        _attention_output_terms(add, sizes, shape, tokens_all, micro)
    add(
        "all-reduce",
        ("model",),
        hidden_act,
        (_MODEL_REDUCES_PER_LAYER - (stationary and sizes["model"] > 1)) * shape.layers * micro,
        "tensor-parallel activations",
    )
    add(
        "all-gather",
        ("model",),
        head_act,
        _MODEL_GATHERS_PER_LAYER * shape.layers * micro,
        "attention heads gathered",
    )
    flops = training_flops_per_token(model_config, seq_len) * batch_size * seq_len * grad_accum
    report_out = CommunicationReport(out, sizes, "model", program=f"{shape.family} predicted from shapes")
    report_out.micro_steps = grad_accum
    report_out.flops_per_step = flops * (2 / 3 if lora_rank else 1)
    if scan:
        report_out.notes.append("scanned layers: the same collectives, once per layer inside the loop")
    if sizes["model"] > shape.kv_heads:
        report_out.notes.append(
            f"model={sizes['model']} exceeds the {shape.kv_heads} key/value heads: the partitioner splits heads "
            "across devices and reshuffles them with irregular groups, which these figures leave out"
        )
    return report_out


def _spec_axes(spec: Any) -> set[str]:
    return {a for e in spec for a in ((e,) if isinstance(e, str) else (e or ()))}


def _weight_stationary(short: str, spec: Any) -> bool:
    """Whether `short` is an attention output projection (``[hidden, heads x head_dim]``) split over
    fsdp on its output dimension: the weight the partitioner keeps in place in the forward pass
    (`_attention_output_terms`). Its fsdp lands there when the model axis takes its input dimension,
    or, without one, when hidden >= heads x head_dim (FSDP's largest dimension, the first on a tie)."""
    parts = short.split(".")
    attention_output = (
        parts[0] == "layers"
        and parts[-1] == "weight"
        and parts[-2] in _ATTENTION_OUTPUT
        and (parts[-2] != "c_proj" or "attn" in parts)
    )
    return attention_output and bool(spec) and "fsdp" in _spec_axes(spec[:1])


def _rows_to_batch_split(
    add: Any, sizes: Mapping[str, int], rows: int, tokens_all: int, hidden: int, count: int, what: str
) -> None:
    """``[rows, hidden / fsdp]`` (rows: every token, or those of one data group; replicated over the
    other axes) resharded to the batch's split ``[tokens / (data x fsdp), hidden]``, as the
    partitioner does it: each device keeps its data group's rows (a local slice) and one all-to-all
    over fsdp moves the hidden columns; with both a data and a model axis it gathers the tensor
    whole instead (over data to every token, over fsdp to every column) and slices it."""
    if sizes["data"] == 1 or sizes["model"] == 1:
        group_rows = tokens_all // sizes["data"]
        size = group_rows * hidden // sizes["fsdp"] * 4
        add("all-to-all", ("fsdp",), size, count, f"{what}: to the batch's rows")
        return
    if rows < tokens_all:
        add("all-gather", ("data",), tokens_all * hidden // sizes["fsdp"] * 4, count, f"{what}: every token")
    add("all-gather", ("fsdp",), tokens_all * hidden * 4, count, f"{what}: every hidden column")


def _batch_split_to_rows(
    add: Any, sizes: Mapping[str, int], tokens_all: int, hidden: int, count: int, what: str
) -> None:
    """The way back, for the embedding's gradient: ``[tokens / (data x fsdp), hidden]`` to
    ``[tokens, hidden / fsdp]``: one all-to-all over fsdp without a data axis, else gathered whole
    over data x fsdp and sliced (as compiled)."""
    if sizes["data"] == 1:
        size = tokens_all * hidden // sizes["fsdp"] * 4
        add("all-to-all", ("fsdp",), size, count, f"{what}: to hidden columns")
    else:
        add("all-gather", ("data", "fsdp"), tokens_all * hidden * 4, count, f"{what}: every token")


def _attention_output_terms(
    add: Any, sizes: Mapping[str, int], shape: ModelShape, tokens_all: int, micro: int
) -> None:
    """The attention's output projection split over fsdp on its output dimension, per layer, forward.

    Its output dimension split over fsdp collides with the batch rows' split over fsdp, and for
    this one matmul (its input comes from the attention's reshaped heads) the partitioner keeps the
    weight where it is and moves the activations instead, on every fsdp mesh compiled here: its
    input ``[tokens, heads x head_dim / model]`` is gathered over the batch axes (every token of the
    batch), the matmul gives ``[all tokens, hidden / fsdp]`` (partial over model when there is one:
    all-reduced, one of `_MODEL_REDUCES_PER_LAYER` at this size), resharded to the batch's rows
    (`_rows_to_batch_split`). The weight's forward gather is left out (`predict_communication`);
    the backward pass is the usual one (weight gathered, gradient reduce-scattered).
    """
    layers = shape.layers * micro
    width = shape.heads * shape.head_dim // sizes["model"]
    add("all-gather", ("data", "fsdp"), tokens_all * width * 4, layers, "attention output: every token")
    block = tokens_all * shape.hidden // sizes["fsdp"] * 4
    add("all-reduce", ("model",), block, layers, "attention output projection (model)")
    _rows_to_batch_split(add, sizes, tokens_all, tokens_all, shape.hidden, layers, "attention output")


def _lora_collectives(add: Any, shape: ModelShape, sizes: Mapping[str, int], rank: int, micro: int) -> None:
    """The adapters of every block projection: fp32, gathered like weights where fsdp splits them,
    their gradients reduced over the batch axes."""
    from workbench.analysis.estimate import lora_adapter_shapes

    for name, (rows, cols) in lora_adapter_shapes(shape, rank):
        if not name.startswith("layers.0."):
            continue
        nbytes = rows * cols * 4
        split = sizes["fsdp"] > 1 and max(rows, cols) % sizes["fsdp"] == 0
        if split:
            add("all-gather", ("fsdp",), nbytes, 2 * shape.layers * micro, f"{name} gathered")
            add("reduce-scatter", ("fsdp",), nbytes, shape.layers * micro, f"{name} gradient")
            add(
                "all-reduce",
                ("data",),
                nbytes / sizes["fsdp"],
                shape.layers * micro,
                f"{name} gradient shard",
            )
        else:
            add("all-reduce", ("data", "fsdp"), nbytes, shape.layers * micro, f"{name} gradient")


__all__ = ["hf_parameter_name", "predict_communication"]
