"""The chain the README and docs/how-to/exporting.md show, as a user types it, on XLA:CPU: train (LoRA) -> eval -> generate -> train again
from the adapter, each a real ``python -m workbench`` process whose exit code and output are checked.

The base is a tiny llama saved with its tokenizer beside it (what a user downloads): no command
names a tokenizer, each finds it beside the model directory it is given.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, xla_env
from workbench.config import WorkbenchConfig
from workbench.data.tokenizer import get_tokenizer
from workbench.models.build import build_model

pytest.importorskip("peft")

RUN = [
    "data.max_length=64",
    "data.max_examples=32",
    "train.steps=3",
    "train.batch_size=4",
    "train.log_every=1",
]


def workbench(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "workbench", *args],
        cwd=REPO,
        env=xla_env(1),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{args[0]} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.xla
def test_train_eval_generate_and_train_again_from_the_adapter(tmp_path: Path) -> None:
    base = tmp_path / "base"
    sizes = WorkbenchConfig().with_overrides(
        ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.num_kv_heads=1"]
    )
    tokenizer = get_tokenizer(sizes.data)
    build_model(sizes.model, vocab_size=len(tokenizer), seed=1).save_pretrained(base)
    tokenizer.save_pretrained(base)
    held_out = tmp_path / "held_out.json"  # Alpaca records, as people download them
    pairs = [("Open a file.", "path.txt", "Use open(path)."), ("Sort a list.", "", "Use sorted(items).")] * 3
    held_out.write_text(json.dumps([{"instruction": i, "input": x, "output": o} for i, x, o in pairs]))

    trained = workbench(
        "train",
        f"model.pretrained_path={base}",
        "lora.rank=4",
        *RUN,
        "--save-pretrained",
        str(tmp_path / "adapter"),
    )
    assert "trained 3/3 steps" in trained.stdout and "0 after warm-up" in trained.stdout
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()

    evaluated = workbench("eval", "--model", str(tmp_path / "adapter"), "--data", str(held_out))
    loss, ppl = map(
        float, re.search(r"eval loss (\S+) \(perplexity (\S+)\) on 6 examples", evaluated.stdout).groups()
    )
    assert 0 < loss < 10 and ppl == pytest.approx(math.exp(loss), rel=1e-3)
    assert "LoRA adapter" in evaluated.stdout and str(base) in evaluated.stdout

    generated = workbench(
        "generate", "--model", str(tmp_path / "adapter"), "--max-new-tokens", "6", "How do I open a file?"
    )
    assert generated.stdout.startswith("How do I open a file?")
    assert re.search(r"\d+ tokens in .* on xla \(CPU\), \d+ programs compiled", generated.stderr)

    again = workbench(
        "train",
        f"model.pretrained_path={tmp_path / 'adapter'}",
        "lora.rank=4",
        *RUN,
        "--save-pretrained",
        str(tmp_path / "adapter-2"),
    )
    assert "trained 3/3 steps" in again.stdout
    record = json.loads((tmp_path / "adapter-2" / "workbench_base_model.json").read_text())
    assert record["name_or_path"] == str(base.resolve())  # still an adapter on the same base
