"""Command line: ``python -m workbench {info,smoke,demo}``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="show the detected hardware")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.add_argument("--device-type", default="auto", choices=["auto", "tpu", "cuda", "xla", "cpu"])
    smoke = sub.add_parser("smoke", help="train a tiny causal LM for a few steps; non-zero exit on failure")
    smoke.add_argument("--device-type", default="auto", choices=["auto", "tpu", "cuda", "xla", "cpu"])
    smoke.add_argument("--steps", type=int, default=8)
    demo = sub.add_parser("demo", help="run the quickstart end to end and write reports/")
    demo.add_argument("--out", default="reports")
    args = parser.parse_args(argv)

    from workbench.backend.hardware import HardwareError, detect

    try:
        if args.command == "info":
            hw = detect(args.device_type)
            print(hw.to_json() if args.json else hw.table())
            return 0
        if args.command == "smoke":
            from workbench.smoke import run_smoke

            return 0 if run_smoke(args.device_type, steps=args.steps).ok else 1
        if args.command == "demo":
            from workbench.demo import run_demo

            return run_demo(args.out)
    except HardwareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
