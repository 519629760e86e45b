"""GRPO against TRL's ``GRPOTrainer`` on plain CPU, and the workbench's rollout/training split on XLA:CPU.

One Llama-shaped model built from a seed (`build_model`) and fine-tuned first for ``--sft-steps``
steps on math-sample's worked solutions (plain CPU, in a process of its own; the same starting weights
for every trainer), so its completions end on their own, mostly well before ``--completion`` tokens:
both trainers stop sampling once every row has ended (TRL's ``generate`` at once; the workbench at the
next block of 16 decode steps) and train the completions' columns only. ``--sft-steps 0`` keeps the
random weights, whose completions run to the budget. The shipped ``math-sample`` prompts
(chat prompts, rendered with the workbench tokenizer's chat template and the generation prompt),
LoRA r16 on the workbench's 'auto' targets, fp32, ``--generations`` G completions per prompt,
``--batch`` prompts per step (TRL's ``per_device_train_batch_size`` counts completions:
``batch x G``), ``--completion`` new tokens at temperature 1.0, β = 0, ``loss_type`` dapo, μ = 1,
learning rate with one warm-up step and a cosine decay. The rewards are the same two functions on
both sides, called with TRL's signature: the workbench's built-in ``math_answer`` (here always 0: the
weights are random) and `math_chars` below (the share of a completion's characters that are digits,
spaces or ``+-=#``), which varies within a group so every step has a gradient.

1. Plain CPU, each trainer in a fresh process with ``--cpu-threads`` torch threads (default 1: on
   shared cores a multi-threaded eager step waits on its slowest thread):
   - ``trl GRPOTrainer`` (TRL 1.16, ``use_vllm=False``: transformers' ``generate`` with its dynamic
     cache, stopping when every row has ended), ``use_cpu=True``, ``report_to=[]``, the process run
     with ``USE_TORCH_XLA=0`` (with torch_xla installed, accelerate and transformers otherwise put the
     model on the XLA device). Its rollout is `GRPOTrainer._generate_and_score_completions` (sampling,
     rewards, advantages), timed by wrapping it on the instance; its sampling alone is
     ``_generate_single_turn``; its completion tokens are those that method returns (each up to and
     including its end of sequence).
   - ``workbench Trainer`` (``train.device_type=cpu``): the same model, prompts and rewards
     (``Trainer(cfg, rewards=[...])``), its own ``rollout_s``, ``train_s`` and rollout tokens/s from
     the metrics at every step (``train.log_every=1``).
   Per trainer: the median step (the wall clock at each step's end, the first step apart; min and
   mean beside it), the rollout's and the training's share of it, completion tokens per second of
   rollout, and the mean completion length.

2. XLA:CPU (a fresh process, ``PJRT_DEVICE=CPU``, ``--devices`` virtual devices; above 1 the rows
   split over ``mesh.data``): the workbench `Trainer` with the prompts in one bucket
   (``bucketing.strategy=max``), ``--steps`` steps: programs compiled in warm-up and after it, the
   median step, ``rollout_s`` and ``train_s`` per step, rollout tokens/s, and the process's wall time.

    .venv/bin/python bench/grpo.py [--hidden 128 --layers 2 --batch 4 --generations 8 --completion 128 --sft-steps 60 --cpu-steps 8 --steps 6 --devices 1 --cpu-threads 1]

``--no-trl`` skips TRL, ``--no-xla`` part 2. Prints the tables and writes bench/results/grpo.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.side_by_side import (  # noqa: E402
    bench_environment,
    error_line,
    num,
    print_row,
    record_steps,
    step_rate,
)
from bench.side_by_side import in_fresh_process as run_in_fresh_process  # noqa: E402

RESULTS = REPO / "bench" / "results" / "grpo.json"
SIDE_BY_SIDE = ("trl GRPOTrainer", "workbench Trainer")
XLA_VARIANT = "workbench Trainer, XLA:CPU"
LORA_RANK = 16
PROMPT_LENGTH = 64  # data.max_length: every math-sample prompt fits (37 to 48 tokens)


MATH_CHARS = frozenset("0123456789 +-=#")


def math_chars(prompts: list, completions: list, **columns: object) -> list[float]:
    """The share of each completion's characters that are digits, spaces or ``+-=#`` (TRL's reward
    signature): a signal that differs within a group even for a random model."""
    texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
    return [sum(ch in MATH_CHARS for ch in t) / max(1, len(t)) for t in texts]


def config(args: argparse.Namespace, *, xla: bool):
    from workbench.config import WorkbenchConfig

    overrides = {
        "model.family": "llama",
        "model.hidden_size": args.hidden,
        "model.num_layers": args.layers,
        "model.num_heads": max(1, args.hidden // 32),
        "model.num_kv_heads": max(1, args.hidden // 64),
        "model.intermediate_size": args.hidden * 4,
        "model.tie_word_embeddings": False,
        "model.attention": "eager",  # the same kernel on both sides (TRL runs the model as it is given)
        "data.source": "math-sample",
        "data.eval_fraction": 0,
        "data.max_length": PROMPT_LENGTH,
        "bucketing.strategy": "max" if xla else "none",
        "lora.rank": LORA_RANK,
        "lora.alpha": 2.0 * LORA_RANK,
        "train.objective": "grpo",
        "train.device_type": "xla" if xla else "cpu",
        "train.steps": args.steps if xla else args.cpu_steps,
        "train.batch_size": args.batch,
        "train.learning_rate": args.lr,
        "train.warmup_steps": 1,
        "train.log_every": 1,
        "train.eval_every": 0,
        "train.progress_bar": False,
        "train.compile_cache_dir": None,
        "grpo.num_generations": args.generations,
        "grpo.max_completion_length": args.completion,
        "grpo.reward_funcs": ["math_answer"],
    }
    if xla and args.devices > 1:
        overrides.update({"mesh.enabled": True, "mesh.data": args.devices})
    return WorkbenchConfig().with_overrides(overrides)


def prompts_and_model(args: argparse.Namespace, cfg):
    """(prompt dataset, tokenizer, model): math-sample's prompts as GRPO reads them, and the model the
    SFT variant saved (``--start``), else the seeded model."""
    from workbench.data.records import build_datasets
    from workbench.models.build import build_model

    train, _, tokenizer = build_datasets(cfg)
    if args.start:
        import transformers as tf

        model = tf.AutoModelForCausalLM.from_pretrained(
            args.start, dtype="float32", attn_implementation="eager"
        )
        return train, tokenizer, model
    return train, tokenizer, build_model(cfg.model, vocab_size=len(tokenizer), seed=0)


def run_sft(args: argparse.Namespace) -> dict:
    """The starting model: the seeded model fine-tuned on math-sample's worked solutions (chat records),
    saved with its tokenizer to ``--start``."""
    from workbench.data.records import build_datasets
    from workbench.models.build import build_model
    from workbench.train import Trainer

    grpo = config(args, xla=False)
    cfg = grpo.with_overrides(
        {
            "train.objective": "sft",
            "lora.rank": 0,
            "data.chat": True,
            "data.max_length": PROMPT_LENGTH + 32,
            "bucketing.strategy": "max",
            "train.steps": args.sft_steps,
            "train.batch_size": 16,
            "train.learning_rate": 1e-2,
            "train.warmup_steps": 5,
            "train.log_every": args.sft_steps,
        }
    )
    start = time.perf_counter()
    _, _, tokenizer = build_datasets(cfg)
    model = build_model(
        cfg.model, vocab_size=len(tokenizer), seed=0
    )  # the seeded model GRPO would start from
    trainer = Trainer(cfg, model=model, tokenizer=tokenizer)
    result = trainer.fit()
    trainer.save_pretrained(args.start)
    return {"variant": "sft", "final_loss": result.final_loss, "seconds": time.perf_counter() - start}


def _workbench_split(history: list[dict]) -> dict:
    """Median rollout and training seconds per step, rollout tokens/s and completion length over the
    logged steps after the first (``train.log_every=1``: one entry per step)."""
    later = history[1:] or history

    def median(key: str) -> float | None:
        values = [h[key] for h in later if h.get(key) is not None]
        return statistics.median(values) if values else None

    return {
        "rollout_s": median("rollout_s"),
        "train_s": median("train_s"),
        "rollout_tokens_per_s": median("rollout_tokens_per_s"),
        "completion_length": median("completion_length"),
        "reward_mean": later[-1].get("reward_mean") if later else None,
    }


# ---- the two trainers on plain CPU ---------------------------------------------------------------


def run_workbench(args: argparse.Namespace, *, xla: bool) -> dict:
    import torch

    from workbench.backend.xla import runtime
    from workbench.train import Trainer

    cfg = config(args, xla=xla)
    train, tokenizer, model = prompts_and_model(args, cfg)
    trainer = Trainer(
        cfg, model=model, tokenizer=tokenizer, train_dataset=train, rewards=["math_answer", math_chars]
    )
    _, times = record_steps(trainer)
    start = time.perf_counter()
    result = trainer.fit()
    row = {
        "variant": XLA_VARIANT if xla else SIDE_BY_SIDE[1],
        "device": f"XLA:CPU, {args.devices} device(s)" if xla else "cpu (plain PyTorch)",
        "torch_threads": torch.get_num_threads(),
        **step_rate(times),
        **_workbench_split(result.history),
        "steps": len(times),
        "fit_s": time.perf_counter() - start,
        "final_loss": result.final_loss,
    }
    if xla:
        row.update(
            warmup_compiles=result.warmup_compiles,
            compiles_after_warmup=result.compiles_after_warmup,
            total_compiles=runtime.compile_count(),
        )
    return row


def run_trl(args: argparse.Namespace) -> dict:
    import datasets
    import peft
    import torch
    import trl
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from workbench.rl.rewards import math_answer
    from workbench.train.lora import resolve_target_modules

    cfg = config(args, xla=False)
    prompts, tokenizer, model = prompts_and_model(args, cfg)
    train = datasets.Dataset.from_dict({"prompt": list(prompts["prompt"]), "answer": list(prompts["answer"])})
    lora = peft.LoraConfig(
        r=LORA_RANK,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=0.0,
        target_modules=resolve_target_modules(model, cfg.lora.target_modules),
        task_type="CAUSAL_LM",
    )
    step_ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            step_ends.append(time.perf_counter())

    with tempfile.TemporaryDirectory(prefix="trl-") as out:
        grpo_args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.batch * args.generations,  # completions, not prompts
            num_generations=args.generations,
            max_completion_length=args.completion,
            temperature=1.0,
            beta=0.0,
            loss_type="dapo",
            num_iterations=1,
            use_vllm=False,
            max_steps=args.cpu_steps,
            learning_rate=args.lr,
            lr_scheduler_type="cosine",
            warmup_steps=1,
            max_grad_norm=1.0,
            bf16=False,
            fp16=False,
            gradient_checkpointing=False,
            use_cpu=True,
            report_to=[],
            logging_steps=1,
            save_strategy="no",
            eval_strategy="no",
            dataloader_num_workers=0,
            disable_tqdm=True,
            log_completions=False,
            seed=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[math_answer, math_chars],
            args=grpo_args,
            train_dataset=train,
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=[StepClock()],
        )
        rollouts: list[float] = []
        sampling: list[tuple[float, int]] = []
        rollout, sample = trainer._generate_and_score_completions, trainer._generate_single_turn

        def timed_rollout(*a, **k):
            begin = time.perf_counter()
            batch = rollout(*a, **k)
            rollouts.append(time.perf_counter() - begin)
            return batch

        def timed_sample(*a, **k):
            begin = time.perf_counter()
            completions = sample(*a, **k)
            sampling.append((time.perf_counter() - begin, sum(len(c) for c in completions[0])))
            return completions

        trainer._generate_and_score_completions = timed_rollout
        trainer._generate_single_turn = timed_sample
        trainer.train()
    rate = step_rate(step_ends)
    later_rollouts, later_sampling = rollouts[1:], sampling[1:]  # the first step apart, as the steps
    tokens = sum(n for _, n in later_sampling)
    rollout_s = statistics.median(later_rollouts) if later_rollouts else None
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    return {
        "variant": SIDE_BY_SIDE[0],
        "device": "cpu (plain PyTorch)",
        "trl_version": trl.__version__,
        "optimizer": str(grpo_args.optim),
        "torch_threads": torch.get_num_threads(),
        **rate,
        "rollout_s": rollout_s,
        "train_s": rate["step_s"] - rollout_s if rate["step_s"] and rollout_s else None,
        "rollout_tokens_per_s": tokens / sum(later_rollouts) if later_rollouts else None,
        "sampling_tokens_per_s": tokens / sum(s for s, _ in later_sampling) if later_sampling else None,
        "completion_length": tokens / (len(later_sampling) * args.batch * args.generations)
        if later_sampling
        else None,
        "reward_mean": logs[-1].get("reward") if logs else None,
        "steps": len(step_ends),
        "final_loss": logs[-1]["loss"] if logs else None,
    }


# ---- processes, tables, main --------------------------------------------------------------------


def in_fresh_process(args: argparse.Namespace, name: str) -> dict:
    env = bench_environment(plain_torch=name in SIDE_BY_SIDE, cpu_threads=args.cpu_threads)
    if name not in SIDE_BY_SIDE:
        env.update(PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(args.devices))
    return run_in_fresh_process(__file__, name, args.passthrough, env, cwd=REPO, timeout=3600)


def side_table(rows: list[dict]) -> str:
    head = (
        f"{'trainer':<18} {'step s':>7} {'x':>5} {'min s':>6} {'mean s':>6} {'rollout s':>9} "
        f"{'train s':>7} {'rollout tok/s':>13} {'compl. len':>10} {'final loss':>10}"
    )
    lines = [head, "-" * len(head)]
    ours = next((r for r in rows if r["variant"] == SIDE_BY_SIDE[1] and r.get("step_s")), None)
    for r in rows:
        if "error" in r:
            lines.append(f"{r['variant']:<18} failed: {r['error']}")
            continue
        speed = r["step_s"] / ours["step_s"] if ours and r.get("step_s") else None
        lines.append(
            f"{r['variant']:<18} {num(r['step_s'], '.3f'):>7} {num(speed, '.2f'):>5} "
            f"{num(r['min_step_s'], '.2f'):>6} {num(r['mean_step_s'], '.2f'):>6} "
            f"{num(r['rollout_s'], '.3f'):>9} {num(r['train_s'], '.3f'):>7} "
            f"{num(r['rollout_tokens_per_s'], ',.0f'):>13} {num(r['completion_length'], '.1f'):>10} "
            f"{num(r['final_loss'], '.4f'):>10}"
        )
    return "\n".join(lines)


def xla_table(row: dict) -> str:
    if "error" in row:
        return f"{row['variant']}: failed: {row['error']}"
    step = row["step_s"]
    share = (
        row["rollout_s"] / (row["rollout_s"] + row["train_s"])
        if row["rollout_s"] and row["train_s"]
        else None
    )
    return "\n".join(
        [
            f"{'step s':>7} {'rollout s':>9} {'train s':>7} {'rollout %':>9} {'rollout tok/s':>13} "
            f"{'warm-up compiles':>16} {'after warm-up':>13} {'process s':>9}",
            f"{num(step, '.3f'):>7} {num(row['rollout_s'], '.3f'):>9} {num(row['train_s'], '.3f'):>7} "
            f"{num(share and 100 * share, '.0f'):>9} {num(row['rollout_tokens_per_s'], ',.0f'):>13} "
            f"{row['warmup_compiles']:>16} {row['compiles_after_warmup']:>13} {row['process_wall_s']:>9.0f}",
        ]
    )


def _run(args: argparse.Namespace, name: str) -> dict:
    try:
        row = in_fresh_process(args, name)
        print(f"  {name} done ({row['process_wall_s']:.0f} s)", flush=True)
    except RuntimeError as err:
        row = {"variant": name, "error": error_line(err), "stderr_tail": str(err)[-3000:]}
        print(f"  {name} failed: {row['error']}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4, help="prompts per step (each brings G completions)")
    parser.add_argument("--generations", type=int, default=8, help="G: completions per prompt")
    parser.add_argument("--completion", type=int, default=128, help="max_completion_length")
    parser.add_argument(
        "--sft-steps",
        type=int,
        default=60,
        help="SFT steps on the worked solutions first (0: random weights)",
    )
    parser.add_argument("--cpu-steps", type=int, default=8, help="steps of each trainer on plain CPU")
    parser.add_argument("--steps", type=int, default=6, help="steps of the XLA:CPU run")
    parser.add_argument("--devices", type=int, default=1, help="virtual XLA:CPU devices (above 1: mesh.data)")
    parser.add_argument(
        "--cpu-threads", type=int, default=1, help="torch threads of each CPU trainer (0: torch's default)"
    )
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--no-trl", action="store_true", help="skip TRL (part 1 runs the workbench alone)")
    parser.add_argument("--no-xla", action="store_true", help="skip the XLA:CPU run (part 2)")
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--start", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    keys = (
        "hidden",
        "layers",
        "batch",
        "generations",
        "completion",
        "cpu_steps",
        "steps",
        "devices",
        "cpu_threads",
        "lr",
        "sft_steps",
    )
    args.passthrough = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in keys]
    if args.variant:
        if args.variant in SIDE_BY_SIDE and args.cpu_threads:
            import torch

            torch.set_num_threads(args.cpu_threads)
        try:
            if args.variant == "sft":
                row = run_sft(args)
            elif args.variant == SIDE_BY_SIDE[0]:
                row = run_trl(args)
            else:
                row = run_workbench(args, xla=args.variant == XLA_VARIANT)
        except Exception:
            traceback.print_exc()
            raise SystemExit(1) from None
        print_row(row)
        return
    start = time.perf_counter()
    work = tempfile.mkdtemp(prefix="grpo-bench-")
    sft = None
    if args.sft_steps:
        args.start = str(Path(work) / "sft")
        args.passthrough.append(f"--start={args.start}")
        sft = _run(args, "sft")
    side = [_run(args, name) for name in SIDE_BY_SIDE[1 if args.no_trl else 0 :]]
    xla = None if args.no_xla else _run(args, XLA_VARIANT)
    start_from = f"after {args.sft_steps} SFT steps" if args.sft_steps else "random weights"
    shape = (
        f"llama hidden {args.hidden} x {args.layers} layers ({start_from}), LoRA r{LORA_RANK}, fp32; "
        f"math-sample prompts, {args.batch} prompts x G={args.generations} completions of at most "
        f"{args.completion} tokens a step"
    )
    print(
        f"\nplain CPU, {args.cpu_threads or 'default'} torch thread(s), {args.cpu_steps} steps, {shape}; each trainer "
        "in a fresh process; step s: the median step after the first (min and mean beside it); x: this row's step "
        "time over the workbench's (above 1: slower than ours); rollout s and train s: the median step's parts\n"
    )
    print(side_table(side))
    if xla is not None:
        print(
            f"\nXLA:CPU, {args.devices} device(s), {args.steps} steps, prompts in one bucket of {PROMPT_LENGTH}, "
            f"{shape}\n"
        )
        print(xla_table(xla))
    wall = time.perf_counter() - start
    print(f"\nwall time {wall:.0f} s")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    kept = {k: v for k, v in vars(args).items() if k not in ("passthrough", "variant", "start")}
    RESULTS.write_text(
        json.dumps({"args": kept, "wall_s": wall, "sft": sft, "side_by_side": side, "xla": xla}, indent=1)
    )
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
