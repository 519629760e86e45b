"""`python -m workbench train`: one headless training run from a YAML config and dotted overrides.

Its one job: turn ``--config FILE key=value ...`` into a finished `Trainer` run and report it the
way a terminal, a TPU VM and a pod launch (`multihost.pod_launch_command` writes this command)
can use: the hardware and a progress bar while it runs, then a short summary on the main process
(steps, final loss, tokens/s, compiles after warm-up, checkpoint, notices), the metrics history
as JSON (``--metrics-out``), the trained model (``--save-pretrained``, with a model card; uploaded to the
Hub with ``--push-to-hub ORG/NAME``: `workbench.publish`) and an exit code.

Exit codes: 0 trained (or nothing left to train after a resume); 1 training failed while running
(the traceback, then one ``error:`` line, on stderr; a loss or gradient norm that is not finite, or a
time limit whose first step showed no step and its save fit, is the one line alone); 2 the run could
not start (a bad config or override, a missing file, hardware that is not there, data or a mesh that
does not work out, a ``train.time_limit`` that leaves no room for the first step, a checkpoint
directory where no checkpoint verifies: one ``error:`` line on stderr, no traceback); 130 interrupted.
Never 0 for a run that did nothing.

With ``train.checkpoint_dir`` set, a second run with the same directory resumes from its latest
checkpoint (``train.resume``, on by default) and continues to ``train.steps``.

Under torchrun (or ``--nproc N``, which starts it: `workbench.launch`) every rank runs this command;
only rank 0 prints the header, progress, summary and notices, writes ``--metrics-out`` and the
model; an error line names the rank it comes from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workbench.backend import multihost
from workbench.backend.hardware import HardwareError
from workbench.backend.protocol import OneProcess
from workbench.config import WorkbenchConfig, load_config
from workbench.interrupt import EXIT_INTERRUPTED

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_START = 0, 1, 2

# What stops a run before its first step and is the user's to fix: the messages name the field,
# value or path (ConfigError, MultiHostError, MeshError, ShardingError are ValueErrors).
_CANNOT_START = (ValueError, OSError, HardwareError)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``train`` sub-command's arguments (`workbench.__main__` owns the parser)."""
    parser.add_argument("--config", metavar="FILE", help="YAML config (omitted: the defaults)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted config overrides applied after the file, e.g. train.steps=50 mesh.fsdp=8",
    )
    parser.add_argument("--metrics-out", metavar="FILE", help="write the metrics history and summary as JSON")
    parser.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="start N ranks under torchrun (one per GPU; CPU processes with train.device_type=cpu)",
    )
    parser.add_argument(
        "--save-pretrained",
        metavar="DIR",
        help="save the trained model with its tokenizer to DIR at the end (Trainer.save_pretrained): a new "
        "or empty directory, or an earlier --save-pretrained output",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="let --save-pretrained replace a non-empty DIR the workbench did not write (never the run's "
        "base model or checkpoints)",
    )
    from workbench.publish import add_push_arguments

    add_push_arguments(
        parser, what="the --save-pretrained directory (the adapter or model and its tokenizer)"
    )


def run_train_command(args: argparse.Namespace) -> int:
    """Run ``python -m workbench train`` for parsed `args`; returns the exit code."""
    if getattr(args, "nproc", None) is not None:  # what every rank would refuse is refused here, once
        from workbench.launch import launch

        try:
            cfg = _config(args)
        except _CANNOT_START as err:
            return _fail(" ".join(str(err).split()) or type(err).__name__, EXIT_CANNOT_START)
        return launch(args.nproc, _command_line(args), cfg)
    try:
        trainer, resume_step = _set_up(args)
    except KeyboardInterrupt:
        return _fail("interrupted before training started", EXIT_INTERRUPTED)
    except _CANNOT_START as err:
        return _fail(" ".join(str(err).split()) or type(err).__name__, EXIT_CANNOT_START)
    except Exception as err:
        traceback.print_exc()
        return _fail(f"setting up the run failed: {_one_line(err)}", EXIT_FAILED)
    code = EXIT_FAILED
    try:
        code = _train(args, trainer, resume_step)
        return code
    finally:
        trainer.close(failed=code != EXIT_OK)  # under torchrun: the others stop waiting, or stop too


def _train(args: argparse.Namespace, trainer: Any, resume_step: int | None) -> int:
    """Fit, save and report a set-up run; returns the exit code."""
    from workbench.train.export_dir import ExportDirError

    with notices_as_lines():
        try:
            result = trainer.fit()
        except KeyboardInterrupt:
            _write_metrics(args.metrics_out, trainer, None, "interrupted")
            return _fail(f"interrupted at step {trainer.loop.step}", EXIT_INTERRUPTED)
        except _run_verdicts() as err:  # inf/nan, or a time limit no step fits: the line says it all
            _write_metrics(args.metrics_out, trainer, None, "failed")
            return _fail(
                " ".join(str(err).split()), EXIT_CANNOT_START if isinstance(err, ValueError) else EXIT_FAILED
            )
        except Exception as err:
            traceback.print_exc()
            _write_metrics(args.metrics_out, trainer, None, "failed")
            return _fail(f"training failed at step {trainer.loop.step}: {_one_line(err)}", EXIT_FAILED)
    saved = None
    if args.save_pretrained:
        try:
            # every process takes part: gathering a sharded model to the host is collective on a pod
            saved = trainer.save_pretrained(args.save_pretrained, overwrite=getattr(args, "overwrite", False))
        except ExportDirError as err:  # files appeared in the directory while it trained
            return _fail(f"--save-pretrained: {err}", EXIT_CANNOT_START)
        except Exception as err:
            traceback.print_exc()
            return _fail(f"--save-pretrained {args.save_pretrained}: {_one_line(err)}", EXIT_FAILED)
    multihost.print_on_main(run_summary(trainer, result, resume_step, saved))
    _write_metrics(args.metrics_out, trainer, result, "ok")
    if saved is not None and trainer.is_main and multihost.is_main():  # the card, and the push asked for
        from workbench.hub.ids import HubError
        from workbench.publish import publish_run

        try:
            publish_run(trainer, result, Path(saved), args)
        except HubError as err:  # the upload failed: the saved model stands, the line says how to retry
            return _fail(str(err), EXIT_FAILED)
    return EXIT_OK


def _set_up(args: argparse.Namespace) -> tuple[Any, int | None]:
    """Config, hardware, datasets and the `Trainer`; raises one of `_CANNOT_START` for the user to fix."""
    from workbench.backend.hardware import detect
    from workbench.data.records import build_datasets
    from workbench.train import Trainer

    if args.save_pretrained and not hasattr(Trainer, "save_pretrained"):
        raise ValueError(
            "--save-pretrained needs Trainer.save_pretrained, which this workbench version lacks"
        )
    cfg = _config(args)
    with notices_as_lines():
        hw = detect(cfg.train.device_type)  # on XLA this starts the runtime: datasets see their host share
    if not multihost.is_main():  # one progress bar per pod, not one per worker
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, progress_bar=False))
        _quiet_datasets()
    multihost.print_on_main(_header(args, cfg, hw))
    if hw.backend == "cuda":
        from workbench.launch import gpu_notice

        notice = gpu_notice(hw.local_devices, _command_line(args))
        if notice is not None:
            multihost.print_on_main(f"notice: {notice}", file=sys.stderr)
    completions = completions_log(cfg, args.metrics_out)  # grpo.log_completions: a JSONL beside
    with notices_as_lines():  # data loading's notices (the format found, records left out) too
        train_ds, eval_ds, tokenizer = build_datasets(cfg)
        trainer = Trainer(
            cfg,
            tokenizer=tokenizer,
            train_dataset=train_ds,
            eval_dataset=eval_ds,
            hardware=hw,
            callbacks=[completions] if completions is not None else (),
        )
    if not isinstance(trainer.replicas, OneProcess):  # torchrun's ranks: what each holds of the model
        multihost.print_on_main(
            f"ranks: {trainer.replicas.describe()}\n" + "\n".join(trainer.sharding_report)
        )
    with notices_as_lines():  # a damaged newest checkpoint is moved aside with a notice
        latest = (
            trainer.checkpoints.latest() if trainer.checkpoints is not None and cfg.train.resume else None
        )
    resume_step = trainer.checkpoints.manager.step_of(latest) if latest is not None else None
    if completions is not None:  # a resumed run keeps its earlier steps' completions
        completions.start_step = resume_step or 0
    return trainer, resume_step


def completions_log(cfg: WorkbenchConfig, metrics_out: str | None) -> Any:
    """The `CompletionsLog` of a GRPO run with ``grpo.log_completions`` (beside ``--metrics-out``, else
    in ``train.checkpoint_dir``), said in a notice; None otherwise (a notice says where they are not)."""
    if cfg.train.objective != "grpo" or not cfg.grpo.log_completions:
        return None
    from workbench.rl.completions import CompletionsLog, completions_path

    path = completions_path(metrics_out, cfg.train.checkpoint_dir)
    if path is None:
        multihost.print_on_main(
            "notice: grpo.log_completions: give --metrics-out FILE (or train.checkpoint_dir) to keep the "
            "completions in a JSONL file; without either they reach only the metrics' callbacks",
            file=sys.stderr,
        )
        return None
    multihost.print_on_main(f"notice: grpo.log_completions: completions go to {path}", file=sys.stderr)
    return CompletionsLog(path)


def _config(args: argparse.Namespace) -> WorkbenchConfig:
    """The run's config from ``--config`` and the overrides, its ``train.time_limit`` against a save, its
    GRPO reward functions imported, and its ``--save-pretrained`` directory and ``--metrics-out`` file checked
    as the writes at the end will need them (so a refusal comes before training, or before ``--nproc``
    launches any rank, not after)."""
    from workbench.train.clock import check_time_limit

    if args.config is not None and not Path(args.config).is_file():
        raise FileNotFoundError(f"config file {args.config!r} does not exist")
    if getattr(args, "metrics_out", None):
        _check_metrics_out(args.metrics_out)
    cfg = load_config(args.config, args.overrides)
    check_time_limit(cfg.train.time_limit, cfg.train.checkpoint_dir)  # before anything loads (or launches)
    if cfg.train.objective == "grpo":  # 'module:function' rewards imported before data and model load
        from workbench.rl.rewards import check_reward_specs

        check_reward_specs(cfg.grpo)
    from workbench.trackers import check_installed

    check_installed(cfg)  # a tracker train.report_to names that is not installed: its pip line, now
    from workbench.publish import check_push

    check_push(args, local_flag="--save-pretrained")  # a push that cannot happen: refused before training
    if args.save_pretrained:
        from workbench.train.export_dir import check_export_dir, run_protected_dirs

        check_export_dir(
            args.save_pretrained,
            overwrite=getattr(args, "overwrite", False),
            protected=run_protected_dirs(cfg),
        )
    return cfg


def _check_metrics_out(path: str) -> None:
    """`ValueError` naming ``--metrics-out`` and `path` when the JSON could not be written there at the end:
    a directory, a file in the way of its directories, or a place without write permission."""
    out = Path(path)
    if out.is_dir():
        raise ValueError(
            f"--metrics-out {path!r} is a directory: give the file to write the JSON to, e.g. "
            f"--metrics-out {str(out / 'metrics.json')!r}"
        )
    existing = next(p for p in (out, *out.parents) if p.exists() or p == Path(p.anchor))
    if existing != out and not existing.is_dir():
        raise ValueError(
            f"--metrics-out {path!r} cannot be written: {str(existing)!r} is a file, not a directory"
        )
    if not os.access(existing, os.W_OK | (0 if existing == out else os.X_OK)):
        raise ValueError(
            f"--metrics-out {path!r} cannot be written: no write permission on {str(existing)!r}"
        )


def _header(args: argparse.Namespace, cfg: WorkbenchConfig, hw: Any) -> str:
    source = args.config or "the default config"
    if args.overrides:
        source += f" + {len(args.overrides)} override{'s' if len(args.overrides) > 1 else ''}"
    via = ", via XLA" if hw.via_xla else ""
    where = f"{hw.chip} ({hw.backend}{via}, {hw.num_devices} device{'s' if hw.num_devices > 1 else ''})"
    if hw.num_processes > 1:
        where += f", {hw.num_processes} processes"
    checkpoints = f", checkpoints in {cfg.train.checkpoint_dir}" if cfg.train.checkpoint_dir else ""
    return f"train: {source} on {where}: {cfg.train.steps} steps{checkpoints}"


def _command_line(args: argparse.Namespace) -> list[str]:
    """The arguments after ``python -m workbench`` (what each rank of a launch runs again)."""
    return getattr(args, "argv", None) or sys.argv[1:]


def _quiet_datasets() -> None:
    """No `datasets` progress bars on the ranks that are not the main one (each would draw its own)."""
    try:
        import datasets
    except ImportError:
        return
    datasets.disable_progress_bars()


def run_summary(trainer: Any, result: Any, resume_step: int | None = None, saved: Any = None) -> str:
    """The lines printed at the end of a run: steps, final loss, tokens/s, compiles, checkpoint, notices."""
    steps = trainer.cfg.train.steps
    rows = []
    if resume_step is not None and resume_step >= steps:
        head = f"nothing to train: the checkpoint is at step {resume_step}, train.steps={steps} (raise it to go on)"
    elif resume_step is not None:
        head = f"trained steps {resume_step + 1}-{result.steps} of {steps} (resumed from step {resume_step})"
    else:
        head = f"trained {result.steps}/{steps} steps"
    if result.time_limited:
        head += ": stopped before train.time_limit (re-run the same command to continue)"
    rows += [
        ("final loss", _number(result.final_loss, ".4f")),
        ("tokens/s", _number(result.tokens_per_s, ",.0f")),
        ("compiles", f"{result.compiles_after_warmup} after warm-up ({result.warmup_compiles} in warm-up)"),
    ]
    last = result.history[-1] if result.history else {}
    if last.get("reward_accuracy") is not None:  # preference tuning: the log step's rewards
        rows.append(("rewards", _rewards(last["reward_accuracy"], last["reward_margin"])))
    if last.get("reward_mean") is not None:  # GRPO: the log step's sampled rewards
        rows.append(("rewards", f"mean {last['reward_mean']:.3f} over the last interval's completions"))
    stats = getattr(result.eval_loss, "stats", None)
    if stats and "reward_mean" in stats:  # GRPO: greedy completions of the eval prompts, scored
        mean = stats["reward_mean"]
        shown = f"{mean:.3f}" if math.isfinite(mean) else "n/a (no completion scored)"
        rows.append(("eval reward", f"{shown} (greedy completions of the eval prompts)"))
    elif stats:
        rows.append(
            (
                "eval loss",
                f"{result.eval_loss:.4f} ({_rewards(stats['reward_accuracy'], stats['reward_margin'])})",
            )
        )
    elif result.eval_loss is not None:
        rows.append(("eval loss", f"{result.eval_loss:.4f} (perplexity {result.eval_perplexity:.2f})"))
    rows.append(("checkpoint", result.checkpoint_path or "none (set train.checkpoint_dir)"))
    if saved is not None:
        rows.append(("saved model", str(saved)))
    rows += [("notice", notice) for notice in result.notices]
    return "\n".join([head] + [f"  {name:<12}{value}" for name, value in rows])


def _rewards(accuracy: float, margin: float) -> str:
    return f"reward accuracy {accuracy:.1%}, margin {margin:.3f}"


def _number(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _write_metrics(path: str | None, trainer: Any, result: Any, status: str) -> None:
    """``--metrics-out``: the status, config, summary and every logged interval, on the main process."""
    if not path or not multihost.is_main():
        return
    done = {} if result is None else dataclasses.asdict(result)
    history = done.pop("history", None) or trainer.history
    # GRPO's logged completions go to their own JSONL beside this file (`workbench.rl.completions`)
    history = [{k: v for k, v in m.items() if k != "completions"} for m in history]
    report = {
        "status": status,
        "step": trainer.loop.step,
        "config": trainer.cfg.to_dict(),
        "hardware": trainer.hw.to_dict(),
        "result": (
            done
            | {
                "eval_perplexity": result.eval_perplexity,
                "eval_stats": getattr(result.eval_loss, "stats", None),
            }
            if result is not None
            else None
        ),
        "history": history,
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_plain(report), indent=1) + "\n")


def _plain(value: Any) -> Any:
    """JSON-ready: non-finite floats become null (strict JSON has no NaN), tensors and arrays numbers."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if hasattr(value, "item"):  # a 0-d tensor or numpy scalar
        return _plain(value.item())
    return str(value)


@contextmanager
def notices_as_lines(reword: Callable[[str], str] = str) -> Iterator[None]:
    """The workbench's own RuntimeWarnings (its notices) as ``notice: ...`` lines, on the main process
    (every command that loads data or models: ``train``, ``eval``, ``generate``); `reword` puts a
    notice in the command's own terms (``eval``'s flags)."""
    package = str(Path(__file__).resolve().parent)
    with warnings.catch_warnings():
        default = warnings.showwarning

        def show(message: Any, category: Any, filename: str, *rest: Any, **kwargs: Any) -> None:
            if issubclass(category, RuntimeWarning) and str(filename).startswith(package):
                multihost.print_on_main(f"notice: {reword(str(message))}", file=sys.stderr)
            else:
                default(message, category, filename, *rest, **kwargs)

        warnings.showwarning = show
        yield


def _run_verdicts() -> tuple[type[BaseException], ...]:
    """What stops a run on purpose once it started, with a message that is the whole story (no traceback):
    a loss that is not finite (exit 1), a time limit that holds no step (exit 2 before the first, 1 after)."""
    from workbench.rl.rewards import RewardError
    from workbench.rl.traps import NothingScoredError
    from workbench.train.clock import TimeLimitError, TimeLimitExceededError
    from workbench.train.finite import NonFiniteLossError

    # a reward function that failed (its line names it, the user's file:line and the prompt), rewards
    # that scored nothing for a whole interval
    return (NonFiniteLossError, TimeLimitError, TimeLimitExceededError, RewardError, NothingScoredError)


def _one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


def _fail(message: str, code: int) -> int:
    # after an interrupt torch_xla may be half imported: importing it again would fail, so ask no runtime
    asks = code != EXIT_INTERRUPTED
    count = multihost.process_count(start_runtime=asks)
    if code == EXIT_CANNOT_START:
        from workbench.launch import report_rank_error

        # `train --nproc N` prints it once for every rank that found it (N = 1 too: one line, not two)
        if report_rank_error(message):
            return code
    rank = f"rank {multihost.process_index(start_runtime=asks)} of {count}: " if count > 1 else ""
    print(f"error: {rank}{message}", file=sys.stderr, flush=True)
    return code
