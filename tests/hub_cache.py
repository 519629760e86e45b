"""A Hugging Face Hub cache built by hand: what ``HF_HUB_CACHE`` holds after downloads, without a network.

``models--org--tiny`` (a tiny Llama with the workbench's tokenizer and its chat template) and three
dataset repos: ``org/data`` declares two subsets in its README (``chat``: a jsonl train split and a
parquet test split; ``plain``: parquet text), ``org/layout`` declares none (``train.jsonl`` and
``data/test.csv``, splits told by their names), ``org/bad`` has a record that is not JSON on line 3.
Each repo is ``refs/main`` (a 40-hex commit, no newline) and ``snapshots/<commit>/`` (plain files), as
``huggingface_hub`` reads a cache offline (RECIPES: "The Hub without a network").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MODEL_COMMIT = "1" * 40
DATA_COMMIT = "2" * 40
CHAT_ROWS = 40

DATA_CARD = """---
configs:
- config_name: chat
  data_files:
  - split: train
    path: chat/train-*.jsonl
  - split: test
    path: chat/test-*.parquet
- config_name: plain
  data_files: plain/*.parquet
---
# org/data

A dataset card whose header declares its subsets.
"""


def _repo(cache: Path, kind: str, repo: str, commit: str) -> Path:
    root = cache / f"{kind}--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    return snapshot


def chat_rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "messages": [
                {"role": "user", "content": f"What is {i} plus {i}?"},
                {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."},
            ]
        }
        for i in range(start, start + n)
    ]


def build_hub_cache(cache: Path, tokenizer: Any) -> Path:
    """Write the cache under `cache` (see the module's docstring); returns it."""
    import datasets

    from workbench.config import ModelConfig
    from workbench.models.build import build_model

    model = _repo(cache, "models", "org/tiny", MODEL_COMMIT)
    tiny = ModelConfig(
        family="llama",
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    build_model(tiny, vocab_size=len(tokenizer)).save_pretrained(model)
    tokenizer.save_pretrained(model)
    (model / "notes.bin").write_bytes(b"not a file a model download fetches")
    # what `plan` leaves of a Hub id it priced: the JSON files alone
    planned = _repo(cache, "models", "org/planned", MODEL_COMMIT)
    (planned / "config.json").write_text((model / "config.json").read_text())

    data = _repo(cache, "datasets", "org/data", DATA_COMMIT)
    (data / "README.md").write_text(DATA_CARD)
    (data / "chat").mkdir()
    (data / "chat" / "train-00000.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in chat_rows(CHAT_ROWS))
    )
    datasets.Dataset.from_list(chat_rows(8, start=100)).to_parquet(str(data / "chat" / "test-00000.parquet"))
    (data / "plain").mkdir()
    datasets.Dataset.from_dict({"text": [f"plain text number {i}" for i in range(12)]}).to_parquet(
        str(data / "plain" / "part-0.parquet")
    )

    layout = _repo(cache, "datasets", "org/layout", DATA_COMMIT)
    (layout / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat_rows(6)))
    (layout / "data").mkdir()
    (layout / "data" / "test.csv").write_text("prompt,response\nhi,hello\nbye,goodbye\n")

    bad = _repo(cache, "datasets", "org/bad", DATA_COMMIT)
    rows = [json.dumps(r) for r in chat_rows(4)]
    rows[2] = '{"messages": [ this is not JSON'
    (bad / "train.jsonl").write_text("\n".join(rows) + "\n")
    return cache
