"""Sampling on XLA:CPU (tests/test_generate.py): `workbench.generate.generate` against CPU
``model.generate`` for Llama, Qwen2 and a sliding-window Mistral, compiles and host transfers of a
second call in the same buckets, also from a model whose layers are scanned over stacked weights; and the training-path memory probes on a sliding-window Mistral
(``compiled_step_memory`` and the batch finder), which failed while the probe's model kept its KV
cache on. Needs the compile memory log (PT_XLA_DEBUG_LEVEL=1, PT_XLA_DEBUG_FILE) in the environment.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.tiny import tiny
from tests.xla import run
from workbench.config import ModelConfig

BUCKETS = [8, 16, 32]
FIRST = (3, 7, 13, 20)  # buckets 8, 8, 16, 32: three batches
SECOND = (4, 6, 15, 30)  # other lengths, the same buckets
NEW_TOKENS = 20
WINDOW = 8  # the sliding window the Mistral generation runs with: shorter than most prompts

MISTRAL = ModelConfig(
    family="mistral",
    hidden_size=192,
    num_layers=3,
    num_heads=6,
    num_kv_heads=2,
    intermediate_size=512,
    vocab_size=2048,
    max_position_embeddings=512,
)


def tiny_model(family: str, *, sliding_window: int | None = None, seed: int = 0) -> Any:
    """A tiny random causal LM whose greedy choices are far apart (weights scaled up from the
    initialiser's, whose near-uniform logits make ties), in eval mode on the CPU."""
    from workbench.models.build import build_model

    cfg = tiny(family, max_position_embeddings=256)
    model = build_model(cfg, seed=seed)
    if sliding_window is not None:
        model.config.sliding_window = sliding_window
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
    return model.eval()


def prompts(lengths: tuple[int, ...], offset: int = 5) -> list[list[int]]:
    return [[(offset + 7 * i + n) % 500 + 3 for i in range(n)] for n in lengths]


def reference(model: Any, batch: list[list[int]], new: int = NEW_TOKENS) -> list[list[int]]:
    """CPU ``model.generate`` (greedy, dynamic cache), one prompt at a time, cut after an end-of-sequence token."""
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    out = []
    for p in batch:
        ids = model.generate(input_ids=torch.tensor([p]), max_new_tokens=new, do_sample=False, use_cache=True)
        row = ids[0, len(p) :].tolist()
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        out.append(row[:cut])
    return out


def _generation(
    family: str, sliding_window: int | None, sample: bool, scanned: bool = False
) -> dict[str, Any]:
    from workbench.backend.xla import runtime
    from workbench.generate import generate, static_cache
    from workbench.models.scan import install_scan

    model = tiny_model(family, sliding_window=sliding_window)
    first, second = prompts(FIRST), prompts(SECOND, offset=11)
    expected = [reference(model, first), reference(model, second)]
    if scanned:  # stacked weights: decoding (a KV cache) runs the layers one by one on their slices
        install_scan(model)
    model.to(runtime.device())
    one = generate(model, first, max_new_tokens=NEW_TOKENS, buckets=BUCKETS)
    transfers = runtime.transfer_count()
    two = generate(model, second, max_new_tokens=NEW_TOKENS, buckets=BUCKETS)
    out: dict[str, Any] = {
        "expected": expected,
        "got": [one.token_ids, two.token_ids],
        "buckets": [one.buckets, two.buckets],
        "compiles": [one.compiles, two.compiles],
        "sliding_layers": static_cache(model, 64).is_sliding,
        "transfers_second": runtime.transfer_count() - transfers,
        # one read of the tokens per batch, and one stop check every 16 tokens when there is an EOS id
        "expected_transfers_second": len(set(two.buckets))
        * (1 + ((NEW_TOKENS - 1) // 16 if model.generation_config.eos_token_id is not None else 0)),
    }
    if sample:
        kwargs = {"max_new_tokens": NEW_TOKENS, "buckets": BUCKETS, "temperature": 0.8, "top_k": 20}
        a = generate(model, first, seed=3, **kwargs)
        b = generate(model, first, seed=3, **kwargs)
        c = generate(model, first, seed=4, **kwargs)
        out["sampled"] = {
            "same_seed_same_tokens": a.token_ids == b.token_ids,
            "other_seed_differs": a.token_ids != c.token_ids,
            "differs_from_greedy": a.token_ids != one.token_ids,
            "compiles": [a.compiles, b.compiles, c.compiles],
        }
    return out


def _sliding_window_probes() -> dict[str, Any]:
    from workbench.analysis.batch import find_batch_size
    from workbench.analysis.probe import compiled_step_memory, compiled_step_probe

    memory = compiled_step_memory(MISTRAL, batch_size=8, seq_len=128)
    plan = find_batch_size(
        MISTRAL,
        seq_len=128,
        memory_bytes=8 * 1024**3,
        candidates=[4, 8],
        compiled_bytes=compiled_step_probe(MISTRAL, seq_len=128),
        precision="fp32",
    )
    return {
        "peak_bytes": memory.peak_bytes,
        "programs": memory.programs,
        "batch": plan.batch_size,
        "batch_compiled_bytes": plan.compiled_bytes,
    }


def main() -> dict[str, Any]:
    return {
        "probes": _sliding_window_probes(),
        "llama": _generation("llama", None, sample=True),
        "llama, scanned": _generation("llama", None, sample=False, scanned=True),
        "qwen2": _generation("qwen2", None, sample=False),
        "mistral": _generation("mistral", WINDOW, sample=False),
    }


if __name__ == "__main__":
    run(main)
