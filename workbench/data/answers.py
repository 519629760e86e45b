"""Final answers in text: GSM8K's ``#### N`` and LaTeX's ``\\boxed{N}``, and numbers normalised to compare.

`extract_answer` finds the final answer a text writes (after its last ``####``, GSM8K's mark, up to
the line's end; or inside its last ``\\boxed{...}``, braces balanced; whichever comes later).
`normalize_answer` makes answers comparable: a number in its shortest form (``$1,234.50`` ->
``1234.5``, ``7.0`` -> ``7``, ``-0`` -> ``0``; ``$``, ``%``, ``\\text{...}`` units and a trailing period
dropped; ``12 apples`` -> ``12``), anything else without spaces. `final_answer` is both, for a
reference answer that may be a whole solution. The prompt data (`workbench.data.prompts`) parses
its ``answer`` column with them, and the ``math_answer`` reward (`workbench.rl.rewards`) the
completions.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any

_GSM8K_MARK = "####"
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER = re.compile(r"[-+]?\s*\$?\s*(?:[0-9][0-9,]*(?:\.[0-9]*)?|\.[0-9]+)")
_UNITS = re.compile(r"\\(?:text|mathrm|mbox)\{[^{}]*\}|\\[,;!: ]|\\?%|\\?\$")


def _boxed_contents(text: str) -> list[tuple[int, str]]:
    """(position, contents) of every ``\\boxed{...}`` in `text`, braces balanced (``\\boxed{\\frac{1}{2}}``)."""
    found = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for end in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                found.append((match.start(), text[start:end]))
                break
    return found


def extract_answer(text: str) -> str | None:
    """The final answer written in `text`: after its last ``####`` (GSM8K: up to the line's end) or
    inside its last ``\\boxed{}``, whichever comes later; None when it has neither (or they are empty)."""
    candidates: list[tuple[int, str]] = []
    mark = text.rfind(_GSM8K_MARK)
    if mark >= 0:
        rest = text[mark + len(_GSM8K_MARK) :].strip()
        candidates.append((mark, rest.splitlines()[0] if rest else ""))
    boxed = _boxed_contents(text)
    if boxed:
        candidates.append(boxed[-1])
    if not candidates:
        return None
    answer = max(candidates)[1].strip()
    return answer or None


def normalize_answer(value: Any) -> str | None:
    """An answer as comparable text: a number in its shortest form (``$1,234.50`` -> ``1234.5``,
    ``7.0`` -> ``7``, ``-0`` -> ``0``; ``$``, ``%``, ``\\text{...}`` units and a trailing period
    dropped), anything else without spaces; None for None or empty text. A number written with
    words after it (``12 apples``) is the number."""
    if value is None or isinstance(value, bool) or (isinstance(value, float) and math.isnan(value)):
        return None  # nan: a CSV's empty number cell
    if isinstance(value, (int, float)):
        value = repr(value) if isinstance(value, float) else str(value)
    text = _UNITS.sub("", str(value)).strip().rstrip(".").strip()
    if not text:
        return None
    number = _NUMBER.match(text)
    if number is not None:
        rest = text[number.end() :].strip()
        if not rest or re.fullmatch(r"[A-Za-z][A-Za-z .]*", rest):  # "12", "12 apples"
            digits = re.sub(r"[\s$,]", "", number.group(0))
            try:
                parsed = Decimal(digits)
            except InvalidOperation:
                parsed = None
            if parsed is not None and parsed.is_finite():
                normal = parsed.normalize()
                shown = format(normal, "f")
                return "0" if normal.is_zero() else shown
    return re.sub(r"\s+", "", text)


def final_answer(text: Any) -> str | None:
    """A reference answer as `math_answer` compares it: the part after ``####`` or in ``\\boxed{}``
    when `text` has one (a whole GSM8K solution), else all of it; normalised (`normalize_answer`)."""
    if isinstance(text, str):
        text = extract_answer(text) or text
    return normalize_answer(text)
