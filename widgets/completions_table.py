"""A GRPO run's latest completions as an HTML table: what the dashboard shows under its figure.

A GRPO run with ``grpo.log_completions`` hands each log step's kept completions to its callbacks
(the metrics' ``completions``: `workbench.analysis.metrics.RunMetrics`). `completions_html` turns the
latest ones into a table: a row per completion with its group (completions of one prompt share it, and
the prompt is shown once per group), the completion's text, each reward function's value, the total,
the advantage, and a mark where the completion was cut at the budget. A value a function skipped, or a
total nothing scored, reads "n/a". The texts are escaped and kept whole (pre-wrapped, the table
scrolls), so what the reward functions saw is what the page shows. It is a core ``ipywidgets.HTML``
value, so it reaches every page a widget reaches (no figure, no plotly).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

_STYLE = (
    "<style>.wb-completions{border-collapse:collapse;font-size:12px;width:100%}"
    ".wb-completions th,.wb-completions td{border:1px solid #ddd;padding:3px 6px;vertical-align:top;"
    "text-align:left}.wb-completions td.text{white-space:pre-wrap;font-family:monospace;max-width:520px}"
    ".wb-completions td.num{text-align:right;white-space:nowrap}.wb-completions tr.cut td.text{"
    "background:#fff4e5}</style>"
)


def prompt_text(prompt: Any) -> str:
    """A prompt as the table shows it: the text, or a chat prompt's last turn's content."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and prompt and isinstance(prompt[-1], Mapping):
        return str(prompt[-1].get("content") or "")
    return "" if prompt is None else str(prompt)


def _number(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.3f}"


def completions_html(rows: Sequence[Mapping[str, Any]], *, title: str | None = None) -> str:
    """The table of `rows` (the metrics' ``completions``); '' for none."""
    if not rows:
        return ""
    names = list(dict.fromkeys(name for row in rows for name in (row.get("rewards") or {})))
    step = rows[0].get("step")
    heading = title or (
        f"Completions at step {step} ({len(rows)} of the latest rollout; grpo.log_completions)"
        if step is not None
        else f"Completions ({len(rows)})"
    )
    head = "".join(
        f"<th>{html.escape(label)}</th>"
        for label in ("group", "prompt", "completion", *names, "reward", "advantage")
    )
    body = []
    shown_group = None
    for row in rows:
        group = row.get("group")
        prompt = "" if group == shown_group and group is not None else prompt_text(row.get("prompt"))
        shown_group = group
        rewards = row.get("rewards") or {}
        cut = " <span title='cut at grpo.max_completion_length'>✂</span>" if row.get("clipped") else ""
        cells = [
            f"<td class='num'>{html.escape(str(group))}</td>",
            f"<td class='text'>{html.escape(prompt)}</td>",
            f"<td class='text'>{html.escape(str(row.get('completion', '')))}{cut}</td>",
            *(f"<td class='num'>{_number(rewards.get(name))}</td>" for name in names),
            f"<td class='num'><b>{_number(row.get('reward'))}</b></td>",
            f"<td class='num'>{_number(row.get('advantage'))}</td>",
        ]
        body.append(f"<tr class='{'cut' if row.get('clipped') else ''}'>{''.join(cells)}</tr>")
    return (
        f"{_STYLE}<div class='wb-completions-box' style='max-height:420px;overflow:auto'>"
        f"<b>{html.escape(heading)}</b><table class='wb-completions'><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )
