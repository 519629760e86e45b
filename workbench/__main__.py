"""Command line: ``python -m workbench {info,doctor,config,plan,smoke,demo,generate,eval,train,export,push}``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from workbench.interrupt import interrupted_line


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; `parse_args` applies it."""
    from workbench.config_command import add_config_arguments
    from workbench.doctor.command import add_doctor_arguments
    from workbench.eval_command import add_eval_arguments
    from workbench.plan_command import add_plan_arguments
    from workbench.run import add_train_arguments

    parser = argparse.ArgumentParser(prog="python -m workbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="show the detected hardware")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.add_argument("--device-type", default="auto", choices=["auto", "tpu", "cuda", "xla", "cpu"])
    add_doctor_arguments(
        sub.add_parser(
            "doctor",
            help="preflight: versions, a TPU held by another process, storage and memory; exit 1 on a fail",
            description="Check this session before training; exit 0 ready (warnings allowed), 1 a check "
            "failed, 2 the config cannot be read.",
        )
    )
    add_config_arguments(
        sub.add_parser(
            "config",
            help="the resolved config, each value with its source (default, file, override), or one key explained",
            description="Print the config --config FILE with KEY=VALUE overrides resolves to, each value with "
            "where it came from, or with --explain KEY one key's type, default, allowed values and meaning; "
            "exit 0 done, 2 bad config, override or key.",
        )
    )
    add_plan_arguments(
        sub.add_parser(
            "plan",
            help="will the config fit: the memory estimate per device, the largest batch, warm-up's programs",
            description="Plan --config FILE with KEY=VALUE overrides for each --chip: the estimate's breakdown "
            "per device (GRPO: the rollout's and the step's peaks), whether it fits, the largest batch that "
            "fits and the programs warm-up compiles; exit 0 fits, 1 does not fit, 2 bad config or chip.",
        )
    )
    smoke = sub.add_parser("smoke", help="train a tiny causal LM for a few steps; non-zero exit on failure")
    smoke.add_argument("--device-type", default="auto", choices=["auto", "tpu", "cuda", "xla", "cpu"])
    smoke.add_argument("--steps", type=int, default=8)
    demo = sub.add_parser("demo", help="run the quickstart end to end and write reports/")
    demo.add_argument("--out", default="reports")
    gen = sub.add_parser(
        "generate",
        help="sample from a model directory: a transformers checkpoint, a LoRA adapter or a training checkpoint",
    )
    gen.add_argument(
        "--model",
        required=True,
        help="what train writes: --save-pretrained DIR (adapter or model) or a checkpoint",
    )
    gen.add_argument("--base", metavar="DIR", help="an adapter's base model (default: the one it records)")
    gen.add_argument("prompts", nargs="+", metavar="PROMPT")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument(
        "--top-p", type=float, default=1.0, help="the nucleus kept when sampling, in (0, 1] (1: off)"
    )
    gen.add_argument("--repetition-penalty", type=float, default=1.0, help="as model.generate's (1: off)")
    gen.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="TEXT",
        help="stop a prompt at this text (repeatable)",
    )
    gen.add_argument(
        "--chat", action="store_true", help="wrap each prompt as a user turn (the chat template)"
    )
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument(
        "--attention",
        default="auto",
        choices=["auto", "eager", "sdpa", "flash", "chunked"],
        help="attention kernel, as model.attention ('auto': for the device and the longest row)",
    )
    gen.add_argument("--device-type", default="auto", choices=["auto", "tpu", "cuda", "xla", "cpu"])
    add_eval_arguments(
        sub.add_parser(
            "eval",
            help="loss and perplexity of a model directory on a data file, or with --rewards its rewards and accuracy",
            description="Evaluate --model on every record of --data; exit 0 done, 1 failed while evaluating, "
            "2 could not start.",
        )
    )
    add_train_arguments(
        sub.add_parser(
            "train",
            help="train from a YAML config with dotted overrides (the command a pod launch runs)",
            description="Train from --config FILE with KEY=VALUE overrides; exit 0 done, 1 failed while "
            "training, 2 could not start (bad config, missing file, hardware), 130 interrupted.",
        )
    )
    from workbench.export_command import add_export_arguments
    from workbench.publish import add_push_command

    add_export_arguments(
        sub.add_parser(
            "export",
            help="write a model directory as a merged transformers model or a GGUF file (llama.cpp, Ollama)",
            description="Export --model (a transformers checkpoint, a LoRA adapter, merged first, or a training "
            "checkpoint; a Hub id too) --to merged|gguf OUT; exit 0 written (and pushed), 1 failed while "
            "writing or pushing, 2 could not start (a family GGUF cannot hold, a missing package, a bad OUT).",
        )
    )
    add_push_command(sub)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse `argv`; ``train``, ``eval``, ``doctor``, ``config`` and ``plan`` take KEY=VALUE overrides before, between or after their options."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    commands = ("train", "doctor", "eval", "config", "plan")
    if args.command in commands and not any(a.startswith("-") for a in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        return _command(argv)
    except KeyboardInterrupt:
        # Ctrl-C before a command took it in hand (`train` says where it stopped itself), e.g. while torch or
        # torch_xla imports: one line and 130, and nothing asked of a runtime a half-done import left behind
        return interrupted_line()


def _command(argv: list[str] | None) -> int:
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `train --nproc` hands each rank

    from workbench.backend.hardware import HardwareError, detect

    try:
        if args.command == "doctor":
            from workbench.doctor.command import run_doctor_command

            return run_doctor_command(args)
        if args.command == "config":
            from workbench.config_command import run_config_command

            return run_config_command(args)
        if args.command == "plan":
            from workbench.plan_command import run_plan_command

            return run_plan_command(args)
        if args.command == "info":
            print(_info(detect(args.device_type), as_json=args.json, device_type=args.device_type))
            return 0
        if args.command == "smoke":
            from workbench.smoke import run_smoke

            return 0 if run_smoke(args.device_type, steps=args.steps).ok else 1
        if args.command == "demo":
            from workbench.demo import run_demo

            return run_demo(args.out)
        if args.command == "generate":
            return _generate(args)
        if args.command == "eval":
            from workbench.eval_command import run_eval_command

            return run_eval_command(args)
        if args.command == "train":
            from workbench.run import run_train_command

            return run_train_command(args)
        if args.command == "export":
            from workbench.export_command import run_export_command

            return run_export_command(args)
        if args.command == "push":
            from workbench.publish import run_push_command

            return run_push_command(args)
    except HardwareError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 1


def _print_notice(message: str) -> None:
    """A notice of a command that only reads (a damaged checkpoint skipped): one ``notice:`` line on stderr."""
    print(f"notice: {message}", file=sys.stderr)


def _info(hw: Any, *, as_json: bool, device_type: str = "auto", facts: Any = None) -> str:
    """The detected hardware, where the default config's compilation cache goes on it, and which
    execution backend a run uses and the rule that picked it (`facts`: the machine's, by default)."""
    import json

    from workbench.backend import routing
    from workbench.backend.compile_cache import describe_compile_cache
    from workbench.backend.hardware import machine_facts
    from workbench.config import TrainConfig

    route = routing.choose(device_type, facts or machine_facts())
    execution = "; ".join([routing.describe_run(hw, route), *route.notices])
    rows = {
        **hw.to_dict(),
        "execution": execution,
        "compile_cache": describe_compile_cache(TrainConfig().compile_cache_dir, hw),
    }
    if as_json:
        return json.dumps(rows, indent=2)
    width = max(len(key) for key in rows)
    return "\n".join(
        [hw.table(), *(f"{key:<{width}}  {rows[key]}" for key in ("execution", "compile_cache"))]
    )


def _generate(args: argparse.Namespace) -> int:
    """Load the model directory, sample on the detected device, print each prompt's text."""
    import functools

    from workbench.backend.hardware import detect
    from workbench.backend.selection import backend_for
    from workbench.data.chat import chat_token_ids
    from workbench.generate import generate
    from workbench.models.attention_choice import choose_attention, use_attention
    from workbench.run import notices_as_lines
    from workbench.train.start import load_for_inference

    try:
        with notices_as_lines():
            model, tokenizer = load_for_inference(args.model, base=args.base, notice=_print_notice)
        hw = detect(args.device_type)
        prompts: list[Any] = list(args.prompts)
        if args.chat:  # as the model saw chat records in training: a user turn, then the assistant's prompt
            prompts = [
                chat_token_ids(
                    tokenizer,
                    [{"role": "user", "content": p}],
                    add_generation_prompt=True,
                    named_by=f"found for --model {args.model}",
                    other_way="or leave out --chat to send the prompts as plain text",
                )
                for p in prompts
            ]
        longest = max(
            (len(p) if isinstance(p, list) else len(tokenizer(p)["input_ids"]) for p in prompts), default=0
        )
        to_stderr = functools.partial(print, file=sys.stderr)
        kernel = choose_attention(
            args.attention,
            hw,
            seq_len=longest + args.max_new_tokens,
            notice=to_stderr,
            model=model,
            field="--attention",
        )
        use_attention(model, kernel)
        backend = backend_for(hw)
        model.to(backend.device())
        result = generate(
            model,
            prompts,
            backend=backend,
            tokenizer=tokenizer,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            repetition_penalty=args.repetition_penalty,
            stop=args.stop,
            seed=args.seed,
        )
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n\n".join(prompt + text for prompt, text in zip(args.prompts, result.texts or [])))
    print(
        f"{result.new_tokens} tokens in {result.seconds:.2f} s ({result.tokens_per_s:.1f} tokens/s) on "
        f"{hw.device_string} ({hw.device_kind}), {result.compiles} programs compiled",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
