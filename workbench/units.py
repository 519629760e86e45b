"""Units and message helpers shared by every layer: byte units, the one byte formatter, durations,
nearby multiples.

`format_bytes` makes every report and estimate print sizes alike; `parse_duration` and
`format_duration` read and write times the way configs give them (``"8h30m"``); `nearby_multiples`
makes every "use a multiple of N" error suggest the same sizes. Plain Python that imports nothing from the
workbench, so the bottom layer (`workbench.backend`) can use it too.
"""

from __future__ import annotations

import re

KiB = 1024
MiB = 1024**2
GiB = 1024**3
GB = 1000**3
"""Decimal gigabyte: the unit chip vendors quote memory in."""


def format_bytes(n: float) -> str:
    """``1.50 GiB``, ``12.00 MiB``, ``512 B``: binary units, two decimals above a KiB."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def nearby_multiples(value: int, divisor: int) -> str:
    """The multiples of `divisor` either side of `value` ("28 or 32"); only the upper one when
    the lower would be 0, which is no batch at all ("4", not "4 or 4")."""
    lower = value - value % divisor
    return f"{lower} or {lower + divisor}" if lower else str(divisor)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])")
_SECONDS_PER = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(value: int | float | str) -> float:
    """Seconds from a number of seconds or a text like ``"8h30m"``, ``"20m"``, ``"90s"``, ``"1.5h"``
    (units d, h, m, s, largest first); ValueError naming the text and the form otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration: give seconds or a text like '8h30m', '20m', '90s'")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION.findall(text)
            units = [unit for _, unit in parts]
            in_order = units == sorted(set(units), key="dhms".index) and len(units) == len(set(units))
            if not parts or "".join(n + u for n, u in parts) != text or not in_order:
                raise ValueError(
                    f"{value!r} is not a duration: give seconds or a text like '8h30m', '20m', '90s' "
                    "(units d, h, m, s, largest first)"
                ) from None
            seconds = sum(float(number) * _SECONDS_PER[unit] for number, unit in parts)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError(f"{value!r} is not a duration: it must be a finite number of seconds")
    return seconds


def duration_or_none(value: object) -> float | None:
    """`parse_duration`'s seconds, or None for a value that is no duration."""
    try:
        return parse_duration(value)  # type: ignore[arg-type]
    except ValueError:
        return None


def duration_with_unit(value: object) -> float | None:
    """Seconds > 0 of a text with a unit ('20m', '1h30m'); None for a number, a bare number in quotes
    (ambiguous where a plain number means something else, such as steps) or no duration."""
    if not isinstance(value, str) or value.strip().replace(".", "", 1).isdigit():
        return None
    seconds = duration_or_none(value)
    return seconds if seconds is not None and seconds > 0 else None


def format_step_time(seconds: float) -> str:
    """``12.5 µs``, ``3.250 ms``, ``1.25 s``: a step's (or a collective's) time in the unit that reads best."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.3f} ms" if seconds < 1 else f"{seconds:.2f} s"


def format_duration(seconds: float) -> str:
    """``2h05m``, ``4m10s``, ``12.3s``: the largest two units, to the second."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"
