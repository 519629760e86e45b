"""Generation with a fixed set of programs on XLA:CPU (tests/test_generate.py): a second call whose
prompts fall in the same buckets compiles nothing whatever the number of prompts per bucket; a
prewarm compiles every program up front (a sliding-window Mistral whose window fills, turns full
and slides within a call); stop strings and the repetition penalty equal CPU ``model.generate``
with ``stop_strings``/``repetition_penalty`` (the stop strings after ``prewarm=True``), with no
per-token host transfer.

The helpers (tokenizer, prompts, the stop string, the CPU reference) are shared with the plain-CPU
tests, which import this module without starting torch_xla.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.xla import run
from tests.xla.generation import prompts, reference, tiny_model

BUCKETS = [8, 32]
COUNTS_FIRST = (3, 20)  # one prompt per bucket: a real row and a filler row
COUNTS_SECOND = (4, 6, 5, 30, 25)  # other lengths, 3 and 2 prompts per bucket: full and part-filled batches
FIRST = (3, 7, 13, 20)  # the stop string and penalty prompts
ROWS = 2  # max_batch_size: small rows keep XLA:CPU quick
NEW = 16
PENALTY = 1.3
CORPUS = ["the cat sat on the mat", "a dog sat on a log", "the cat and the dog"] * 20


def small_tokenizer() -> Any:
    """A byte-level BPE of under 300 ids (the tiny models have 512): decodes most generated ids."""
    from workbench.data.tokenizer import train_tokenizer

    return train_tokenizer(CORPUS, vocab_size=300)


def text_prompts(lengths: tuple[int, ...]) -> list[list[int]]:
    """`prompts(lengths)` inside the tokenizer's vocabulary."""
    return [[t % 280 + 3 for t in p] for p in prompts(lengths)]


def stop_case(model: Any, tokenizer: Any, batch: list[list[int]], new: int = NEW) -> str:
    """A stop string the greedy continuation of `batch` completes mid-way: the text of two adjacent
    generated tokens (a match across a token boundary), from the fourth token on."""
    from workbench.generate import generate

    def clean(text: str) -> bool:
        return bool(text.strip()) and "\ufffd" not in text and text.isprintable()

    free = generate(model, batch, max_new_tokens=new, buckets=[32], eos_token_id=None).token_ids
    for row in free:
        for i in range(3, len(row) - 1):
            if clean(tokenizer.decode(row[i - 1 : i])) and clean(tokenizer.decode(row[i : i + 1])):
                return tokenizer.decode(row[i - 1 : i + 1])
    raise AssertionError("no printable pair of tokens in the continuation: pick other prompts")


def reference_with(model: Any, batch: list[list[int]], new: int = NEW, **kwargs: Any) -> list[list[int]]:
    """CPU ``model.generate`` (greedy) one prompt at a time with `kwargs` (stop_strings, tokenizer,
    repetition_penalty), cut after an end-of-sequence token."""
    eos = model.generation_config.eos_token_id
    out = []
    for p in batch:
        ids = model.generate(input_ids=torch.tensor([p]), max_new_tokens=new, do_sample=False, **kwargs)
        row = ids[0, len(p) :].tolist()
        out.append(row[: row.index(eos) + 1] if eos in row else row)
    return out


def _prompt_counts(generate: Any, device: Any) -> dict[str, Any]:
    model = tiny_model("llama")
    first, second = prompts(COUNTS_FIRST), prompts(COUNTS_SECOND, offset=11)
    expected = [reference(model, first), reference(model, second)]
    model.to(device)
    kwargs = {"max_new_tokens": 20, "buckets": BUCKETS, "max_batch_size": ROWS}
    one, two = generate(model, first, **kwargs), generate(model, second, **kwargs)
    return {
        "expected": expected,
        "got": [one.token_ids, two.token_ids],
        "compiles": [one.compiles, two.compiles],
    }


def _prewarm(generate: Any, prewarm_generation: Any, device: Any) -> dict[str, Any]:
    model = tiny_model("mistral", sliding_window=8)
    batch = prompts((3, 4, 9, 14, 16))  # buckets 4 (window fills in decoding) and 16 (past it)
    expected = reference(model, batch, 20)
    model.to(device)
    compiled = prewarm_generation(model, buckets=[4, 16], max_new_tokens=20, max_batch_size=ROWS)
    got = generate(model, batch, max_new_tokens=20, buckets=[4, 16], max_batch_size=ROWS)
    return {
        "prewarm_compiles": compiled,
        "compiles": got.compiles,
        "expected": expected,
        "got": got.token_ids,
    }


def _controls(generate: Any, device: Any) -> dict[str, Any]:
    from workbench.backend.xla import runtime

    tok = small_tokenizer()
    batch = text_prompts(FIRST)
    llama, qwen2 = tiny_model("llama"), tiny_model("qwen2")
    stop = stop_case(llama, tok, batch)
    expected = {
        "stop": reference_with(llama, batch, stop_strings=[stop], tokenizer=tok),
        "stop_again": reference_with(llama, batch[:1], stop_strings=[stop], tokenizer=tok),
        "penalty": reference_with(qwen2, batch, repetition_penalty=PENALTY),
    }
    llama.to(device)
    qwen2.to(device)
    kwargs = {"max_new_tokens": NEW, "buckets": [32], "max_batch_size": 4}
    got = {"stop": generate(llama, batch, stop=[stop], tokenizer=tok, prewarm=True, **kwargs)}
    transfers = runtime.transfer_count()
    got["stop_again"] = generate(llama, batch[:1], stop=[stop], tokenizer=tok, **kwargs)  # one prompt now
    transfers = runtime.transfer_count() - transfers
    got["penalty"] = generate(qwen2, batch, repetition_penalty=PENALTY, **kwargs)
    return {
        "stop": stop,
        "expected": expected,
        "got": {name: result.token_ids for name, result in got.items()},
        "finished": got["stop"].finished,
        "compiles": {name: result.compiles for name, result in got.items()},
        "transfers_again": transfers,  # the tokens, once: no stop check within 16 tokens
    }


def main() -> dict[str, Any]:
    from workbench.backend.xla import runtime
    from workbench.generate import generate, prewarm_generation

    device = runtime.device()
    return {
        "prompt_counts": _prompt_counts(generate, device),
        "prewarm": _prewarm(generate, prewarm_generation, device),
        "controls": _controls(generate, device),
    }


if __name__ == "__main__":
    run(main)
