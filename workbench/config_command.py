"""``python -m workbench config``: the resolved config with where each value came from, or one key explained.

``config [--config FILE] [KEY=VALUE ...]`` prints every key of the config a ``train`` with the same
arguments would run, one line each: the key, its value and its source (``default``, ``file`` or
``override``). ``--explain KEY`` prints one key's type, default, allowed values and what it does
(`workbench.config_reference`), and its value here when a file or overrides are given. A bad
file, override or key is a one-line error (with a did-you-mean for a misspelt key) and exit 2.
Nothing here starts a runtime.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from workbench.config import ConfigError, WorkbenchConfig, load_config
from workbench.config_parse import split_override
from workbench.config_reference import KeyReference, config_reference, lookup

SOURCES = ("default", "file", "override")
"""Where a resolved value can come from, weakest first: an override beats the file, the file the default."""


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``config`` subcommand's arguments (overrides may also come between or after the options)."""
    parser.add_argument("--config", metavar="FILE", help="a YAML config (default: the built-in defaults)")
    parser.add_argument(
        "--explain",
        metavar="KEY",
        help="explain one key (e.g. train.steps): its type, default, allowed values and what it does",
    )
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, as train takes")


def format_value(value: Any) -> str:
    """A value as it would be written in a YAML config or an override (``null``, ``true``, ``[a, b]``)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def resolve_with_sources(
    path: str | Path | None, overrides: list[str]
) -> tuple[WorkbenchConfig, dict[str, str]]:
    """The config `load_config(path, overrides)` gives and ``{dotted key: source}`` for every key.

    A key is ``override`` when an override sets it, else ``file`` when the file sets it (or the
    file moved a value onto it, as an old ``data.format: jsonl`` does onto ``data.file_type``),
    else ``default``. Raises `ConfigError` for a bad file, override or value."""
    cfg = load_config(path, overrides)
    in_file: set[str] = set()
    if path is not None:
        data = yaml.safe_load(Path(path).read_text()) or {}  # load_config has read and checked it
        in_file = {f"{s}.{k}" for s, fields in data.items() if isinstance(fields, dict) for k in fields}
    overridden = {split_override(o)[0] for o in overrides}
    defaults, resolved = _flat(WorkbenchConfig()), _flat(cfg)
    sources = {}
    for key, value in resolved.items():
        if key in overridden:
            sources[key] = "override"
        elif key in in_file or (path is not None and value != defaults[key]):
            sources[key] = "file"
        else:
            sources[key] = "default"
    return cfg, sources


def _flat(cfg: WorkbenchConfig) -> dict[str, Any]:
    return {
        f"{section}.{key}": value
        for section, fields in cfg.to_dict().items()
        for key, value in fields.items()
    }


def resolved_table(cfg: WorkbenchConfig, sources: dict[str, str]) -> str:
    """One line per key: the key, its value, its source, aligned in columns."""
    values = {key: format_value(value) for key, value in _flat(cfg).items()}
    key_width = max(len(key) for key in values)
    value_width = min(max(len(v) for v in values.values()), 40)
    return "\n".join(
        f"{key:<{key_width}}  {value:<{value_width}}  {sources[key]}" for key, value in values.items()
    )


def explanation(ref: KeyReference, value: Any = None, source: str | None = None) -> str:
    """One key in a few labelled lines: type, default, allowed values, (its value here,) what it does."""
    lines = [ref.key, f"  type:     {ref.type}", f"  default:  {format_value(ref.default)}"]
    if ref.choices:
        lines.append(f"  choices:  {', '.join(format_value(c) for c in ref.choices)}")
    lines += [f"  rule:     {rule}" for rule in ref.rules]
    if source is not None:
        lines.append(f"  value:    {format_value(value)} ({source})")
    lines.append(f"  what:     {ref.doc}")
    return "\n".join(lines)


def run_config_command(args: argparse.Namespace) -> int:
    """Print the resolved config, or the explained key; 0 on success, 2 for bad input."""
    try:
        if args.config is not None and not Path(args.config).is_file():
            raise ConfigError(f"--config {args.config!r} is not allowed: no such file (a YAML config is)")
        cfg, sources = resolve_with_sources(args.config, list(args.overrides))
        if args.explain:
            ref = lookup(args.explain, config_reference())
            given = args.config is not None or bool(args.overrides)
            value = _flat(cfg)[ref.key]
            print(explanation(ref, value, sources[ref.key]) if given else explanation(ref))
            return 0
    except (ConfigError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    where = f"{args.config}" if args.config else "the defaults"
    extra = f" with {len(args.overrides)} override(s)" if args.overrides else ""
    print(f"# the config from {where}{extra}: key, value, source ({', '.join(SOURCES)})")
    print(resolved_table(cfg, sources))
    return 0


__all__ = [
    "SOURCES",
    "add_config_arguments",
    "explanation",
    "format_value",
    "resolve_with_sources",
    "resolved_table",
    "run_config_command",
]
