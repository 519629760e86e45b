"""``python -m workbench doctor``: its arguments, the report printed, the exit status.

Exit 0 when no check failed (warnings allowed), 1 when one did, 2 when the config given
(``--config FILE`` and ``KEY=VALUE`` overrides) cannot be read. Without a config nothing is
sized and torch is not imported, so the command answers in a fraction of a second.
"""

from __future__ import annotations

import argparse
import sys

DOCTOR_READY, DOCTOR_FAILED, DOCTOR_BAD_CONFIG = 0, 1, 2
"""The exit statuses: no check failed (warnings allowed), a check failed, the config cannot be read."""


def add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``doctor`` sub-command's arguments (`workbench.__main__` owns the parser)."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--config", metavar="FILE", help="YAML config of the run: its model is sized against disk and RAM"
    )
    parser.add_argument(
        "--runtime",
        action="store_true",
        help="also start the XLA runtime and report its devices (only when no other check failed)",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted config overrides, e.g. model.pretrained_path=/content/model train.checkpoint_dir=ckpt",
    )


def run_doctor_command(args: argparse.Namespace) -> int:
    """Run the doctor for parsed `args`, print its report, return the exit status."""
    from workbench.config import ConfigError, load_config
    from workbench.doctor import doctor

    cfg = None
    if args.config or args.overrides:
        try:
            cfg = load_config(args.config, args.overrides)
        except (ConfigError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            return DOCTOR_BAD_CONFIG
    report = doctor(cfg, start_runtime=args.runtime)
    print(report.to_json() if args.json else report.table())
    return DOCTOR_READY if report.ok else DOCTOR_FAILED
