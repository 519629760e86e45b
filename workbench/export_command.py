"""``python -m workbench export --model DIR --to merged|gguf OUT``: a model directory as a merged
transformers model or a GGUF file, with a model card, optionally pushed (``--push-to-hub ORG/NAME``).

``--model`` is any model directory the workbench reads (`workbench.model_dirs`: a transformers
checkpoint, a LoRA adapter, a training checkpoint; a Hub id too); an adapter is merged into its base
first. ``--to merged`` writes a transformers directory with the tokenizer (`workbench.train.adapter_files.save_model`,
the same atomic, never-destructive export as ``train --save-pretrained``); ``--to gguf`` writes one GGUF
file (`workbench.gguf`, ``--outtype f32|f16|bf16|q8_0``) into OUT (a directory, beside the card), or
to OUT itself when it ends in ``.gguf``.

Before any weight is read: the push is checked (`workbench.publish.check_push`), OUT is checked, and
for GGUF the family, the tokenizer and the ``gguf`` package (a family GGUF cannot hold is refused by
name). Exit codes: 0 written (and pushed), 1 failed while writing or pushing, 2 could not start.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Any

from workbench.run import EXIT_CANNOT_START, EXIT_FAILED, EXIT_OK


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    from workbench.gguf.writer import OUTTYPES
    from workbench.publish import add_push_arguments

    parser.add_argument(
        "--model",
        required=True,
        help="what to export: a transformers checkpoint, a LoRA adapter (merged first), a training checkpoint, or a Hub id",
    )
    parser.add_argument("--base", metavar="DIR", help="an adapter's base model (default: the one it records)")
    parser.add_argument(
        "--to", required=True, choices=["merged", "gguf"], help="a transformers directory or a GGUF file"
    )
    parser.add_argument("out", metavar="OUT", help="the directory to write (for GGUF also a FILE.gguf)")
    parser.add_argument(
        "--outtype",
        default="f16",
        choices=list(OUTTYPES),
        help="GGUF: the matrices' type (norms and biases stay f32; q8_0 keeps matrices whose rows are not a "
        "multiple of 32 in f16)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a non-empty OUT the workbench did not write"
    )
    add_push_arguments(parser, what="OUT (the merged model and tokenizer, or the GGUF file)")


def run_export_command(args: argparse.Namespace) -> int:
    """Run ``python -m workbench export`` for parsed `args`; returns the exit code."""
    from workbench.run import notices_as_lines

    try:
        with notices_as_lines():
            plan = _plan(args)
    except (ValueError, OSError, ImportError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return EXIT_CANNOT_START
    try:
        with notices_as_lines():
            written = _write(args, plan)
    except Exception as err:
        traceback.print_exc()
        print(f"error: export --to {args.to} {args.out}: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_FAILED
    print(f"exported {plan['model_dir'].describe()} to {written}")
    if args.push_to_hub:
        from workbench.hub.ids import HubError
        from workbench.publish import push_with_card

        folder = written if written.is_dir() else written.parent
        try:
            push_with_card(folder, plan["card"](folder), args)
        except HubError as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_FAILED
    return EXIT_OK


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    """Everything checked before a weight is read: the model directory, OUT, the push, GGUF's family."""
    from workbench.model_dirs import resolve_model_dir
    from workbench.publish import check_push, export_card
    from workbench.train.export_dir import check_export_dir

    check_push(args, local_flag=None)
    model_dir = resolve_model_dir(args.model, base=args.base, field="--model")
    protected = _chain(model_dir)
    out = Path(args.out).expanduser()
    file_out = args.to == "gguf" and out.suffix == ".gguf"
    if file_out and args.push_to_hub:
        raise ValueError("--push-to-hub uploads a directory: give OUT as a directory, not a .gguf file")
    if file_out:
        if out.exists() and not args.overwrite:
            raise ValueError(f"OUT={str(out)!r} exists: give a new file, or --overwrite to replace it")
        check_export_dir(out.parent, overwrite=True, protected=protected)
    else:
        check_export_dir(out, overwrite=args.overwrite, protected=protected)
    if args.to == "gguf":
        from transformers import AutoConfig

        from workbench.gguf.writer import check_writable
        from workbench.train.start import load_tokenizer

        tokenizer, root = load_tokenizer(model_dir), model_dir.transformers_root
        if root is not None:
            config = AutoConfig.from_pretrained(str(root))
        else:  # a checkpoint of a run that built its model from the config: the same config again
            from workbench.config import WorkbenchConfig
            from workbench.models.build import hf_config
            from workbench.train.start import run_config_of

            config = hf_config(
                WorkbenchConfig.from_dict(run_config_of(model_dir) or {}).model, len(tokenizer)
            )
        check_writable(config, tokenizer, args.outtype)
    name = args.push_to_hub.split("/")[-1] if args.push_to_hub else (out.stem if file_out else out.name)
    return {
        "model_dir": model_dir,
        "out": out,
        "file_out": file_out,
        "protected": protected,
        "name": name,
        "card": lambda folder: export_card(model_dir, folder, args.push_to_hub or name),
    }


def _chain(model_dir: Any) -> dict[Path, str]:
    """The directories of `model_dir` and its bases: an export never replaces them."""
    protected, node = {}, model_dir
    while node is not None:
        protected[node.path] = f"the {node.kind} --model reads"
        node = node.base
    return protected


def _write(args: argparse.Namespace, plan: dict[str, Any]) -> Path:
    from workbench.publish import write_card
    from workbench.train.adapter_files import save_model
    from workbench.train.export_dir import staged_export
    from workbench.train.lora import is_lora
    from workbench.train.start import load_for_inference

    model, tokenizer = load_for_inference(args.model, base=args.base)
    if is_lora(model):  # the adapters merged into the base: what either format holds
        model = model.merge_and_unload()
    out: Path = plan["out"]
    if args.to == "merged":
        written = save_model(
            model, out, tokenizer=tokenizer, overwrite=args.overwrite, protected=plan["protected"]
        )
        write_card(written, plan["card"](written))
        return written
    from workbench.gguf.writer import write_gguf

    def notice(message: str) -> None:
        print(f"notice: {message}", file=sys.stderr)

    filename = f"{plan['name']}-{args.outtype}.gguf"
    if plan["file_out"]:
        return write_gguf(model, tokenizer, out, outtype=args.outtype, name=plan["name"], notice=notice)
    with staged_export(out, kind="gguf") as staging:
        write_gguf(
            model, tokenizer, staging / filename, outtype=args.outtype, name=plan["name"], notice=notice
        )
        write_card(staging, plan["card"](staging))
    return out
