"""The doctor's report (`workbench.doctor.DoctorReport`) drawn as an HTML table in a notebook.

One row per check: its status in colour (ok green, warn orange, fail red), its name, what it
saw, and the exact fix where it is not ok, in a monospace cell that copies cleanly into a
terminal or a cell. A summary line on top says whether the session is ready. `doctor_html`
returns the markup (for a page or a file); `doctor_view` wraps it in an ``ipywidgets.HTML``.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as ipw

STATUS_COLORS = {"ok": "#2ca02c", "warn": "#ff7f0e", "fail": "#d62728"}
"""Each check status's colour (the palette the panel's fits/does-not-fit readouts use)."""

_CELL = "padding:3px 8px;border-bottom:1px solid #e0e0e0;text-align:left;vertical-align:top"


def _row(check: Any) -> str:
    color = STATUS_COLORS.get(check.status, "#7f7f7f")
    badge = (
        f"<span style='color:white;background:{color};border-radius:3px;padding:1px 6px;"
        f"font-weight:bold'>{html.escape(check.status)}</span>"
    )
    fix = f"<code style='white-space:pre-wrap'>{html.escape(check.fix)}</code>" if check.fix else ""
    return (
        f"<tr class='wb-doctor-{html.escape(check.status)}'><td style='{_CELL}'>{badge}</td>"
        f"<td style='{_CELL};white-space:nowrap'>{html.escape(check.name)}</td>"
        f"<td style='{_CELL}'>{html.escape(check.saw)}</td><td style='{_CELL}'>{fix}</td></tr>"
    )


def doctor_html(report: Any) -> str:
    """The report as an HTML table with a summary line above it."""
    color = STATUS_COLORS["ok" if report.ok else "fail"]
    if report.warnings and report.ok:
        color = STATUS_COLORS["warn"]
    head = "".join(f"<th style='{_CELL}'>{title}</th>" for title in ("status", "check", "saw", "fix"))
    rows = "".join(_row(check) for check in report.checks)
    return (
        f"<div style='font-size:13px'><div style='color:{color};font-weight:bold;margin:0 0 4px 0'>"
        f"{html.escape(report.summary())}</div>"
        f"<table style='border-collapse:collapse'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>"
    )


def doctor_view(report: Any) -> ipw.HTML:
    """The report as a widget: display it in a notebook cell."""
    return ipw.HTML(value=doctor_html(report)).add_class("wb-doctor")
