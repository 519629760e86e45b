"""The doctor's report types: one `Check` per thing looked at, gathered in a `DoctorReport`.

A check says what it looked at (`name`), how it stands (`status`: ``ok``, ``warn`` or
``fail``), what it saw, and, when it is not ok, the exact fix: a shell or pip command, or the
config change to make. The report is plain data: a text table for terminals, a dict/JSON for
scripts, and `raise_on_fail` for a notebook cell that must stop before training starts.
`widgets.doctor_view` draws it as a table in a notebook.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["ok", "warn", "fail"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail")


class DoctorError(RuntimeError):
    """At least one preflight check failed; the message lists each failure with its fix."""


@dataclass(frozen=True)
class Check:
    """One preflight check: what it looked at, how it stands, what it saw, how to fix it."""

    name: str
    status: Status
    saw: str
    """What the check found, in words and numbers."""
    fix: str | None = None
    """The exact command or config change that fixes it; None when the check is ok."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} is not allowed: one of {', '.join(STATUSES)}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "saw": self.saw, "fix": self.fix}


def worst(statuses: list[Status]) -> Status:
    """The most serious of `statuses` (``ok`` for none)."""
    return max(statuses, key=STATUSES.index, default="ok")


@dataclass(frozen=True, repr=False)
class DoctorReport:
    """Every check the doctor ran, in the order it ran them."""

    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings allowed)."""
        return not self.failures

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "warn"]

    def counts(self) -> dict[str, int]:
        """How many checks stand at each status."""
        return {status: sum(c.status == status for c in self.checks) for status in STATUSES}

    def summary(self) -> str:
        counts = self.counts()
        verdict = "ready" if self.ok else "not ready: apply the fixes of the failed checks"
        return f"doctor: {counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail: {verdict}"

    def check(self, name: str) -> Check:
        """The check called `name` (KeyError naming those there are when none is)."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check named {name!r}: the report has {', '.join(c.name for c in self.checks)}")

    def table(self) -> str:
        """A plain-text table: status, check, what it saw, and the fix under it when not ok."""
        name_width = max((len(c.name) for c in self.checks), default=5)
        indent = " " * (7 + name_width + 2)
        lines = [f"{'STATUS':<7}{'CHECK':<{name_width + 2}}SAW"]
        for c in self.checks:
            status = c.status.upper() if c.status != "ok" else "ok"
            lines.append(f"{status:<7}{c.name:<{name_width + 2}}{c.saw}")
            if c.fix:
                lines.append(f"{indent}fix: {c.fix}")
        lines.append(self.summary())
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "counts": self.counts(), "checks": [c.to_dict() for c in self.checks]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def raise_on_fail(self) -> None:
        """Raise `DoctorError` listing every failed check and its fix; nothing when none failed."""
        if self.ok:
            return
        lines = [
            f"{len(self.failures)} preflight check(s) failed; apply their fixes, then run the doctor again:"
        ]
        for c in self.failures:
            lines.append(f"- {c.name}: {c.saw}")
            if c.fix:
                lines.append(f"  fix: {c.fix}")
        raise DoctorError("\n".join(lines))

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        counts = self.counts()
        return f"DoctorReport({counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail)"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython shows the table, not the repr
        printer.text(self.table())
