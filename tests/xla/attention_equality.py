"""Chunked attention against eager, model by model (tests/test_attention.py).

Each case builds one tiny model (fp32, seeded) twice: transformers' eager attention and the
workbench's chunked attention (`workbench.models.attention_choice.use_attention`), with the same weights.
Both run a forward and backward of the model's own loss on the same batch through the workbench's
inputs (`model_inputs`), with query blocks of `chunk` rows so a 32-token row spans several blocks.
Reported per case: the largest relative difference of the logits (at the real tokens), of the loss
and of every parameter's gradient, and the mask the chunked model was given (its shape and dtype).

The cases: grouped-query attention (Llama), padded rows with a 2-D mask (left and right padding),
packed rows (position ids restarting, through `model_inputs`: segment ids), a sliding window
shorter than the row (Mistral; Qwen2 with ``use_sliding_window`` and packing), Gemma 2's logit
softcap with its alternating sliding layers, and GPT-2. On one XLA:CPU device, or with ``mesh``
on data=2 x fsdp=2 x model=2 of the 8 virtual devices (`workbench.parallel`: `shard_model`,
`shard_batch`). With ``generation`` (one device): greedy tokens from `workbench.generate` (its
static cache) for the eager and chunked models.

The case builders are plain torch: the CPU tests import them (this module starts no XLA runtime).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from tests.tiny import tiny
from tests.xla import run

BATCH, LENGTH, CHUNK = 8, 24, 8
MESH = {"data": 2, "fsdp": 2, "model": 2}


@dataclass(frozen=True)
class Case:
    family: str
    layout: str
    """'plain' (no padding), 'padded' (2-D mask, left and right padding) or 'packed' (position ids)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """transformers config fields set at construction (sliding windows, softcap)."""


CASES: dict[str, Case] = {
    "llama_gqa": Case("llama", "plain"),
    "qwen2_padding": Case("qwen2", "padded"),
    "llama_packed": Case("llama", "packed"),
    "mistral_window": Case("mistral", "padded", {"sliding_window": 8}),
    "qwen2_window_packed": Case(
        "qwen2", "packed", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0}
    ),
    "gemma2_softcap": Case(
        "gemma2", "padded", {"attn_logit_softcapping": 2.0, "sliding_window": 8, "query_pre_attn_scalar": 16}
    ),
    "gpt2": Case("gpt2", "plain"),
}


def build(case: Case, *, seed: int = 0, num_layers: int = 2, init: float | None = None) -> torch.nn.Module:
    """The case's eager model: the tiny config of its family with the case's overrides, seeded."""
    import transformers as tf

    from workbench.families import FAMILIES

    family = FAMILIES[case.family]
    kwargs = family.config_kwargs(tiny(case.family, num_layers=num_layers), None)
    kwargs.update(case.overrides)
    if init is not None:
        kwargs["initializer_range"] = init
    config = getattr(tf, family.config_class)(**kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.config.use_cache = False
    return model.train()


def batch_for(
    case: Case, *, rows: int = BATCH, length: int = LENGTH
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(a batch of the case's layout, the ``[rows, length]`` bool mask of real tokens)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 500, (rows, length), generator=gen)
    real = torch.ones(rows, length, dtype=torch.bool)
    batch: dict[str, torch.Tensor] = {"input_ids": ids}
    if case.layout == "padded":
        for r in range(rows):
            pads = (3 * r) % 11
            if r % 2:
                real[r, length - pads :] = False  # right padding
            else:
                real[r, :pads] = False  # left padding
        batch["attention_mask"] = real.long()
    elif case.layout == "packed":
        positions = torch.zeros(rows, length, dtype=torch.long)
        for r in range(rows):
            cuts = sorted({3 + r % 7, 11 + (2 * r) % 9, 21})
            start = 0
            for end in [*cuts, length]:
                positions[r, start:end] = torch.arange(end - start)
                start = end
        batch["position_ids"] = positions
    # a label counts where its predicting position is real too: a left-padded row's first real token is
    # predicted by a padding query, whose output eager and chunked define differently (it sees no key)
    predicted_by_real = torch.cat([torch.zeros_like(real[:, :1]), real[:, :-1]], dim=1)
    batch["labels"] = torch.where(real & predicted_by_real, ids, -100)
    return batch, real


def chunked_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` (same weights) running chunked attention."""
    from workbench.models.attention_choice import use_attention

    return use_attention(copy.deepcopy(model), "chunked")


def step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[Any, Any, dict[str, Any], Any]:
    """(logits, loss, gradients by name, the attention mask the forward got): one forward and backward."""
    from workbench.models.inputs import model_inputs

    model.zero_grad(set_to_none=True)
    inputs = model_inputs(batch, model)
    out = model(**inputs, labels=batch["labels"])
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads, inputs.get("attention_mask")


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |a| (0 when both are 0)."""
    a, b = a.double().cpu(), b.double().cpu()
    scale = a.abs().max().item()
    return (a - b).abs().max().item() / scale if scale else (a - b).abs().max().item()


def compare(
    eager: torch.nn.Module,
    chunked: torch.nn.Module,
    batch: dict[str, Any],
    real: torch.Tensor,
    sync: Any = None,
) -> dict[str, Any]:
    """The largest relative differences between the two models' logits (real tokens), loss and gradients."""
    logits_e, loss_e, grads_e, _ = step(eager, batch)
    logits_c, loss_c, grads_c, mask = step(chunked, batch)
    if sync is not None:
        sync()
    keep = real.to(logits_e.device)
    return {
        "logits": relative(logits_e[keep], logits_c[keep]),
        "loss": relative(loss_e, loss_c),
        "grads": max(relative(grads_e[n], grads_c[n]) for n in grads_e),
        "same_grad_names": sorted(grads_e) == sorted(grads_c),
        "mask": None if mask is None else [list(mask.shape), str(mask.dtype)],
    }


def greedy_tokens(model: torch.nn.Module, *, prompts: int = 3, new: int = 10) -> list[list[int]]:
    """Greedy tokens of `workbench.generate` (static cache) for a few seeded prompts, left-padded to one bucket."""
    from workbench.generate import generate

    gen = torch.Generator().manual_seed(2)
    ids = [
        torch.randint(3, 500, (n,), generator=gen).tolist() for n in (5, 9, 14)[:prompts]
    ]  # one bucket: 16
    return generate(model.eval(), ids, max_new_tokens=new, eos_token_id=None).token_ids


def main(
    cases: list[str] | None = None, mesh: bool = False, chunk: int = CHUNK, generation: list[str] = ()
) -> dict[str, Any]:
    from workbench.backend.xla import runtime
    from workbench.models import attention

    attention.QUERY_CHUNK = chunk
    xla_mesh = None
    if mesh:
        from workbench.parallel.mesh import MeshSpec

        xla_mesh = MeshSpec(**MESH).build()  # SPMD on before the first XLA tensor
    dev = runtime.device()
    results: dict[str, Any] = {"cases": {}, "generation": {}}
    for name in cases or list(CASES):
        case = CASES[name]
        eager = build(case)
        chunked = chunked_copy(eager)
        batch, real = batch_for(case)
        if xla_mesh is not None:
            from workbench.parallel.apply import shard_batch, shard_model

            shard_model(eager, xla_mesh)
            shard_model(chunked, xla_mesh)
            batch = shard_batch(batch, xla_mesh)
        else:
            eager.to(dev)
            chunked.to(dev)
            batch = {k: v.to(dev) for k, v in batch.items()}
        started = time.perf_counter()
        results["cases"][name] = compare(eager, chunked, batch, real, sync=runtime.sync)
        results["cases"][name]["seconds"] = round(time.perf_counter() - started, 1)
    for name in generation:
        eager = build(CASES[name], init=0.3).to(dev)
        chunked = chunked_copy(eager).to(dev)
        results["generation"][name] = {"eager": greedy_tokens(eager), "chunked": greedy_tokens(chunked)}
    return results


if __name__ == "__main__":
    run(main)
