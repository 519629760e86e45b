"""A verifiable task a tiny randomly initialised model learns first by SFT, then by GRPO's rewards alone.

A prompt is plain text ``"<letter(s)> <digit>"`` (e.g. ``"k 7"``, ``"kk 7"``) and the right completion is the digit
again (``"7"``, then end-of-sequence), which `digit_reward` (TRL's reward signature) checks against
the record's ``answer``. The answer follows the prompt's last token, so a 2-layer model learns
the rule in a few dozen steps. The SFT texts (`sft_texts`) teach the format, but answer right only
`right_share` of the time and otherwise give the next digit (``"k 78"``): a model fine-tuned on them
samples the right digit about that often and, greedy, answers the next digit (a held-out reward
near 0). GRPO rewards the right digit among each prompt's samples; the greedy answer flips once the
right digit is the likelier one, and the held-out reward climbs towards 1.

Training and held-out prompts come from disjoint (letter, digit) combinations, each digit in both,
so held-out prompts are new while the rule stays the same.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

LETTERS = string.ascii_lowercase


def _held_out(letter: int, digit: int) -> bool:
    return (letter + digit) % 5 == 0  # one combination in five, every digit in both parts


def _combos(held_out: bool) -> list[tuple[str, int]]:
    # a letter once or twice: prompts of more than one length, so a run plans more than one bucket
    return [
        (c * width, d)
        for i, c in enumerate(LETTERS)
        for d in range(10)
        for width in (1, 2)
        if _held_out(i, d) == held_out
    ]


def digit_prompts(*, held_out: bool = False, bos: str = "<|bos|>") -> list[dict]:
    """Every prompt record ``{"prompt": "<bos><letter(s)> <digit>", "answer": "<digit>"}`` of the training
    (416) or held-out (104) combinations. A plain prompt is tokenised as it is, while an SFT text gets
    the tokenizer's `bos` in front: the prompt carries it too, so both start alike."""
    return [{"prompt": f"{bos}{c} {d}", "answer": str(d)} for c, d in _combos(held_out)]


def sft_texts(n: int, *, right_share: float, seed: int = 0) -> list[dict]:
    """`n` SFT records ``{"text": "<letter(s)> <digit><said>"}`` over the training combinations: `said` is
    the digit with probability `right_share`, else the next one (mod 10)."""
    rng = random.Random(seed)
    combos = _combos(False)
    records = []
    for _ in range(n):
        c, d = rng.choice(combos)
        said = d if rng.random() < right_share else (d + 1) % 10
        records.append({"text": f"{c} {d}{said}"})
    return records


def digit_reward(prompts: list, completions: list, answer: list, **columns: object) -> list[float]:
    """1.0 where the completion is exactly the record's answer (spaces aside), else 0.0."""
    return [1.0 if str(c).strip() == str(a) else 0.0 for c, a in zip(completions, answer)]


def sft_model(directory: str | Path, *, steps: int = 120, right_share: float = 0.3) -> str:
    """Fine-tune the default tiny model on `sft_texts` (plain CPU, `steps` steps of 32 texts) and save it
    under `directory`; returns the model directory (a transformers checkpoint with its tokenizer)."""
    from workbench.config import WorkbenchConfig
    from workbench.train import Trainer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    texts = write_jsonl(sft_texts(3000, right_share=right_share), directory / "sft.jsonl")
    cfg = WorkbenchConfig().with_overrides(
        {
            "data.source": str(texts),
            "data.max_length": 16,
            "model.max_position_embeddings": 64,
            "data.eval_fraction": 0,
            "bucketing.max_buckets": 1,
            "train.device_type": "cpu",
            "train.steps": steps,
            "train.batch_size": 32,
            "train.learning_rate": 5e-3,
            "train.warmup_steps": 5,
            "train.log_every": steps,
            "train.progress_bar": False,
        }
    )
    trainer = Trainer(cfg)
    trainer.fit()
    return str(trainer.save_pretrained(directory / "model"))


def write_jsonl(records: list[dict], path: str | Path) -> Path:
    """`records` as JSON Lines at `path`; returns the path."""
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path
