"""Synthetic preference records a tiny randomly initialised model learns within a few dozen DPO steps.

Each prompt offers two words, one from `GOOD` and one from `BAD`, in either order ("pick one: mud
or rose"); the chosen answer is always the good word, the rejected one the bad word. The rule is
token identity (which set a word is from), which a small byte-level model separates quickly, and
the prompt alone does not give the answer away (both words are in it, in random order).

Training and held-out prompts come from disjoint (good, bad) combinations (`held_out=True`), each
set holding every word, so held-out prompts are new while the rule stays the same.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

GOOD = ("rose", "gold", "sun", "cake", "song", "star", "tea", "milk", "silk", "pearl", "honey", "bloom")
"""Words the chosen answers are drawn from."""
BAD = ("mud", "rust", "dust", "rot", "ash", "smog", "slime", "mold", "soot", "grime", "tar", "muck")
"""Words the rejected answers are drawn from."""
_ASKS = ("pick one: {a} or {b}", "which is better, {a} or {b}?", "choose: {a} or {b}")


def _held_out(good: int, bad: int) -> bool:
    # one combination in four, spread so every word is in both parts
    return (good + bad) % 4 == 0


def learnable_pairs(n: int, seed: int = 0, *, held_out: bool = False) -> list[dict[str, str]]:
    """`n` records ``{"prompt", "chosen", "rejected"}`` (strings), chosen always from `GOOD`.

    `held_out` draws the prompts from combinations training never sees. Prompts repeat only past
    the number of distinct ones (3 phrasings x 2 orders x 108 training / 36 held-out combinations).
    """
    combos = [
        (good, bad, ask, swap)
        for (gi, good), (bi, bad) in itertools.product(enumerate(GOOD), enumerate(BAD))
        if _held_out(gi, bi) == held_out
        for ask in _ASKS
        for swap in (False, True)
    ]
    rng = random.Random(seed)
    rng.shuffle(combos)
    records = []
    for good, bad, ask, swap in itertools.islice(itertools.cycle(combos), n):
        a, b = (bad, good) if swap else (good, bad)
        records.append({"prompt": ask.format(a=a, b=b), "chosen": good, "rejected": bad})
    return records


def write_jsonl(records: list[dict], path: str | Path) -> Path:
    """`records` as JSON Lines at `path` (one record a line); returns the path."""
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path
