"""``data.source: math-sample``: arithmetic word problems with answers, made deterministically, for GRPO.

`math_sample_records` writes GSM8K-shaped records, ``question`` and ``answer`` (a one-line
solution, then ``#### N``), e.g.::

    {"question": "Tom has 3 files. He gets 4 more. How many files does he have?",
     "answer": "3 + 4 = 7\\n#### 7"}

so the parser that reads GSM8K (`workbench.data.prompts`, `workbench.data.answers.final_answer`)
reads these too. Each is one addition or subtraction of small numbers (operands up to `max_number`,
9 by default: sums 3 to 18, differences 1 to 8, each as likely), told in one of a few short templates with a
name and an object, every question distinct, seeded (`seed`): the same records on every machine.
The questions are short (37 to 48 tokens with the workbench's own 512-token tokenizer, its
chat template's 7 tokens included), so a tiny model's rollouts are cheap; the answers are few and
small, so a tiny model can learn them: after a short fine-tune on the solutions' format it answers
some by chance and the rest is what reinforcement learning has to find.

How the workbench reads them (`MATH_SAMPLE`):

- ``train.objective: grpo`` (`workbench.data.prompts`): the question is the prompt, the answer
  after ``####`` the ``answer`` column (the solution kept as ``solution``). With a tokenizer that
  has a chat template the question is one user turn rendered by it (as the fine-tune below saw it).
- ``train.objective: sft`` (`workbench.data.records.load_records`): chat records, the question as
  the user's turn and the solution as the assistant's: the fine-tune that teaches the format.
"""

from __future__ import annotations

import random
from typing import Any

MATH_SAMPLE = "math-sample"
"""The ``data.source`` value that reads these records."""
DEFAULT_COUNT = 400
"""Records made by default: a few hundred (the number of distinct questions allows thousands)."""

_NAMES = (("Tom", "He", "he"), ("Sam", "He", "he"), ("Ben", "He", "he"), ("Dan", "He", "he"),
          ("Sue", "She", "she"), ("Ann", "She", "she"), ("Amy", "She", "she"), ("Ivy", "She", "she"))  # fmt: skip
_OBJECTS = ("files", "names", "lists", "keys", "pens", "cats", "toys", "lines")
_ADD = (
    "{name} has {a} {things}. {He} gets {b} more. How many {things} does {he} have?",
    "There are {a} {things} in a box. {name} adds {b}. How many are in the box?",
    "{name} has {a} {things} and {other} has {b}. How many {things} in all?",
)
_SUBTRACT = (
    "{name} has {a} {things}. {He} loses {b}. How many {things} are left?",
    "There are {a} {things} in a box. {name} takes {b} out. How many are left?",
)


def _problem(rng: random.Random, max_number: int) -> tuple[str, int, str, int]:
    """(template, a, operator, b) of one problem: a sum of 2..`max_number` and 1..`max_number`, or a
    difference of such numbers whose result (1 to `max_number` - 1) is drawn first, so small
    results are no likelier than large ones."""
    if rng.random() < 0.5:
        return rng.choice(_ADD), rng.randint(2, max_number), "+", rng.randint(1, max_number)
    result = rng.randint(1, max_number - 1)
    b = rng.randint(1, max_number - result)
    return rng.choice(_SUBTRACT), result + b, "-", b


def math_sample_records(
    count: int = DEFAULT_COUNT, *, seed: int = 0, max_number: int = 9
) -> list[dict[str, Any]]:
    """`count` distinct GSM8K-shaped records (``question``, ``answer`` = ``"a + b = c\\n#### c"``),
    the same for the same arguments. `max_number` (>= 2) bounds the operands."""
    if max_number < 2:
        raise ValueError(f"max_number={max_number!r} is not allowed: must be >= 2 (a difference needs 2 - 1)")
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    attempts = 0
    while len(records) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise ValueError(
                f"count={count} is not allowed with max_number={max_number}: fewer distinct problems exist"
            )
        template, a, op, b = _problem(rng, max_number)
        (name, he_cap, he), (other, _, _) = rng.sample(_NAMES, 2)
        question = template.format(
            name=name, He=he_cap, he=he, other=other, things=rng.choice(_OBJECTS), a=a, b=b
        )
        if question in seen:
            continue
        seen.add(question)
        result = a + b if op == "+" else a - b
        records.append({"question": question, "answer": f"{a} {op} {b} = {result}\n#### {result}"})
    return records


def sft_messages(records: list[dict[str, Any]]) -> list[list[dict[str, str]]]:
    """The records as chat turns for supervised fine-tuning: the question, then the solution."""
    return [
        [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}]
        for r in records
    ]
