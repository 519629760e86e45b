"""DPO against SFT on the same tokens: step time and the compiler's peak memory on XLA:CPU, and TRL beside us on CPU.

One Llama-shaped model (a vocabulary large enough that the logits matter), the shipped
`preference-sample` pairs (a seeded split into train and held-out pairs, written to a temp
directory), bf16 with gradient checkpointing and the plain loss (``train.loss_chunk_tokens=0``),
every sequence padded to ``--seq`` (``bucketing.strategy=max``), so each variant compiles one
step program of a fixed shape. Five variants of the real `Trainer`, each in a fresh process on
XLA:CPU (XLA keeps a process's compiled programs, and the compile log must be on before the
first compile):

1. ``sft-lora``: SFT with LoRA r16 on 2 x batch rows: every pair's chosen and rejected sequences
   as plain SFT examples (labels on the answers, as DPO has them): the rows a DPO step sees.
2. ``dpo-lora adapters_off``: DPO with LoRA r16, the reference the same weights with the adapters
   off (one more forward without gradients in the step: expect ~1.3x the SFT step).
3. ``dpo-lora precompute``: the reference's log-probs computed once before training (the step is
   the SFT step plus the DPO loss: expect ~1x).
4. ``dpo-full copy``: a full fine-tune (``lora.rank=0``) against a frozen bf16 copy of the model
   (the step holds the copy's weights; one more forward).
5. ``sft-full``: the full fine-tune's SFT baseline, for the copy row.

Per variant: real tokens/s and the step time over the timed steps (the first step apart, as the
trainer's own clock does), the compiler's memory analysis of the step program (the largest
program the run compiled: `workbench.backend.xla.compile_log`) beside `estimate`'s figure (DPO rows
with ``objective=PairRows(reference)``: rows doubled, 'copy' adds the copy), compiles after
warm-up, the final training loss, and for DPO the reward accuracy of the last logged step and of
the held-out pairs (an eval at the last step). ``x`` columns: DPO rows against their SFT baseline
(LoRA rows against ``sft-lora``, ``dpo-full copy`` against ``sft-full``).

6. What users would otherwise pick: TRL's ``DPOTrainer`` (LoRA through ``peft_config``) against
   the workbench `Trainer` on plain CPU (``train.device_type=cpu``), each in a fresh process: the
   same model (`build_model`, eager attention), the same train pairs (for TRL as plain strings:
   the prompt rendered with the tokenizer's chat template, each answer its text and the eos, so
   TRL's tokens are the workbench's less the newline the template puts after each turn's end),
   the same batch of pairs, LoRA rank, alpha and targets, ``--cpu-steps`` steps (more than the
   XLA runs': the cores are shared and eager steps are noisy), learning rate with one warm-up
   step and a cosine decay, fp32, no gradient checkpointing, each batch padded to its longest
   pair, the reference the adapters switched off (TRL's own under peft), TRL's default optimizer
   (fused AdamW), ``--cpu-threads`` torch threads each (default 1: on shared cores a multi-threaded
   eager step waits on its slowest thread, and step times then vary tenfold). TRL's process runs with ``USE_TORCH_XLA=0``: with torch_xla installed,
   accelerate and transformers otherwise put the model on the XLA device even with
   ``use_cpu=True``. Steps/s and pairs/s from the median step (the wall clock at each step's
   end, the first step apart; min and mean beside it); the final loss is the last step's on
   each side (a sanity check: the data order differs).

XLA:CPU runs with its memory-minimising scheduler as `bench/quantize.py` explains
(``--default-scheduler`` turns it off).

    .venv/bin/python bench/preference.py [--hidden 256 --layers 4 --vocab 8192 --batch 4 --seq 128 --steps 6 --cpu-steps 12 --cpu-threads 1]

``--no-trl`` skips part 6, ``--only-trl`` runs only it. Prints a table and writes
bench/results/preference.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before anything imports torch_xla
os.environ.setdefault("CPU_NUM_DEVICES", "1")
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
from workbench.backend.xla.runtime import XLA_CPU_MEMORY_SCHEDULER  # noqa: E402

RESULTS = REPO / "bench" / "results" / "preference.json"
# name -> (objective, LoRA, DPO reference, the SFT baseline its ratios are against)
VARIANTS = {
    "sft-lora": ("sft", True, None, None),
    "dpo-lora adapters_off": ("dpo", True, "adapters_off", "sft-lora"),
    "dpo-lora precompute": ("dpo", True, "precompute", "sft-lora"),
    "dpo-full copy": ("dpo", False, "copy", "sft-full"),
    "sft-full": ("sft", False, None, None),
}
SIDE_BY_SIDE = ("trl DPOTrainer", "workbench Trainer")
LORA_RANK = 16


# ---- the data -------------------------------------------------------------------------------------


def write_pairs(args: argparse.Namespace, work: Path) -> dict[str, str]:
    """A seeded split of the shipped sample: ``batch x (steps + 2)`` train pairs and ``2 x batch``
    held-out pairs, as JSON Lines in `work` (their records as shipped)."""
    from workbench.data.corpus import PREFERENCE_SAMPLE

    with open(PREFERENCE_SAMPLE, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    random.Random(0).shuffle(records)
    n_train, n_eval = args.batch * (max(args.steps, args.cpu_steps) + 2), 2 * args.batch
    if n_train + n_eval > len(records):
        raise SystemExit(
            f"--batch {args.batch} x --steps {args.steps} / --cpu-steps {args.cpu_steps} needs "
            f"{n_train + n_eval} pairs; the sample has {len(records)}"
        )
    paths = {}
    for split, part in (("train", records[:n_train]), ("eval", records[n_train : n_train + n_eval])):
        path = work / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
        paths[split] = str(path)
    return paths


def config(args: argparse.Namespace, name: str, *, cpu: bool = False):
    from workbench.config import WorkbenchConfig

    objective, lora, reference, _ = VARIANTS[name]
    overrides = {
        "model.family": "llama",
        "model.hidden_size": args.hidden,
        "model.num_layers": args.layers,
        "model.num_heads": args.hidden // 64,
        "model.num_kv_heads": max(1, args.hidden // 256),
        "model.intermediate_size": args.hidden * 4,
        "model.tie_word_embeddings": False,
        "model.max_position_embeddings": args.seq,
        "data.source": args.pairs["train"],
        "data.eval_fraction": 0,
        "data.max_length": args.seq,
        "bucketing.strategy": "max",
        "lora.rank": LORA_RANK if lora else 0,
        "train.objective": objective,
        "train.dpo_reference": reference or "auto",
        "train.device_type": "xla",
        "train.precision": "bf16",
        "train.gradient_checkpointing": True,
        "train.steps": args.steps,
        "train.batch_size": args.batch if objective == "dpo" else 2 * args.batch,  # pairs / rows
        "train.log_every": args.steps,
        "train.eval_every": args.steps,
        "train.loss_chunk_tokens": 0,
        "train.learning_rate": args.lr,
        "train.warmup_steps": 1,
        "train.progress_bar": False,
        "train.compile_cache_dir": None,
    }
    if cpu:  # the side-by-side with TRL: plain PyTorch, fp32, each batch padded to its longest pair
        overrides.update(
            {
                "bucketing.strategy": "none",
                "train.device_type": "cpu",
                "train.steps": args.cpu_steps,
                "train.precision": "fp32",
                "train.gradient_checkpointing": False,
                "train.log_every": 1,
                "train.eval_every": 0,
            }
        )
    return WorkbenchConfig().with_overrides(overrides)


def pair_datasets(args: argparse.Namespace, cfg):
    """(train pairs, held-out pairs, tokenizer) of the written split, tokenised as DPO tokenises them."""
    from workbench.data.records import build_datasets

    dpo = cfg.with_overrides({"train.objective": "dpo"})
    train, _, tokenizer = build_datasets(dpo)
    held_out, _, _ = build_datasets(
        dpo.with_overrides({"data.source": args.pairs["eval"]}), tokenizer=tokenizer
    )
    return train, held_out, tokenizer


def as_rows(pairs):
    """Each pair's chosen and rejected sequences as two SFT examples (adjacent rows), labels as DPO has them."""
    import datasets

    rows: dict[str, list] = {"input_ids": [], "labels": [], "length": []}
    for pair in pairs:
        for ids, labels in (
            (pair["input_ids"], pair["labels"]),
            (pair["rejected_input_ids"], pair["rejected_labels"]),
        ):
            rows["input_ids"].append(ids)
            rows["labels"].append(labels)
            rows["length"].append(len(ids))
    return datasets.Dataset.from_dict(rows)


# ---- one XLA:CPU variant --------------------------------------------------------------------------


def run_variant(args: argparse.Namespace, name: str) -> dict:
    """One variant in this process: the real Trainer, then the compiler's analysis of its step."""
    from workbench.analysis.estimate import estimate
    from workbench.analysis.objective_memory import NEXT_TOKEN
    from workbench.analysis.preference_memory import PairRows
    from workbench.backend.xla import compile_log
    from workbench.models.build import build_model
    from workbench.train import Trainer

    objective, lora, reference, _ = VARIANTS[name]
    cfg = config(args, name)
    train, held_out, tokenizer = pair_datasets(args, cfg)
    if objective == "sft":
        train, held_out = as_rows(train), as_rows(held_out)
    model = build_model(cfg.model, vocab_size=args.vocab, seed=0)  # the tokenizer's ids are a subset
    trainer = Trainer(cfg, model=model, tokenizer=tokenizer, train_dataset=train, eval_dataset=held_out)
    tokens, times = record_steps(trainer)
    result = trainer.fit()
    memory = compile_log.compiled_memory_records()
    step = max(memory, key=lambda r: r.peak_bytes)  # the training step: the largest program
    est = estimate(
        trainer.model,
        batch_size=cfg.train.batch_size,
        seq_len=args.seq,
        precision="bf16",
        gradient_checkpointing=True,
        lora_rank=LORA_RANK if lora else 0,
        loss_chunk_tokens=0,
        objective=PairRows(reference) if reference else NEXT_TOKEN,
    )
    timed_tokens = sum(tokens[1:])
    step_s = timed_tokens / result.tokens_per_s / (len(tokens) - 1) if result.tokens_per_s else None
    last = result.history[-1] if result.history else {}
    stats = getattr(result.eval_loss, "stats", None) or {}
    return {
        "variant": name,
        "objective": objective,
        "lora_rank": cfg.lora.rank,
        "reference": reference,
        "reference_notice": next((n for n in result.notices if n.startswith("DPO reference:")), None),
        "baseline": VARIANTS[name][3],
        "rows_per_step": 2 * args.batch,
        "tokens_per_s": result.tokens_per_s,
        "step_s": step_s,
        "median_step_s": _rate(times, args.batch)["step_s"],  # the loop's clock per step (XLA runs async)
        "compiler_peak_bytes": step.peak_bytes,
        "compiler_argument_bytes": step.argument_bytes,
        "compiler_temp_bytes": step.temp_bytes,
        "programs_compiled": len(memory),
        "estimate_bytes": est.total_bytes,
        "estimate_breakdown": dict(est.breakdown),
        "warmup_compiles": result.warmup_compiles,
        "compiles_after_warmup": result.compiles_after_warmup,
        "final_loss": result.final_loss,
        "eval_loss": float(result.eval_loss) if result.eval_loss is not None else None,
        "train_reward_accuracy": last.get("reward_accuracy") if objective == "dpo" else None,
        "eval_reward_accuracy": stats.get("reward_accuracy") if objective == "dpo" else None,
        "eval_reward_margin": stats.get("reward_margin") if objective == "dpo" else None,
    }


# ---- TRL against the workbench on plain CPU --------------------------------------------------------


def _rate(times: list[float], batch: int) -> dict:
    """Steps/s and pairs/s from the median step (`step_rate`), its min and mean beside it."""
    rate = step_rate(times)
    per_step = rate["step_s"]
    if per_step is None:
        return {"steps_per_s": None, "pairs_per_s": None, **rate}
    return {"steps_per_s": 1 / per_step, "pairs_per_s": batch / per_step, **rate}


def run_workbench_cpu(args: argparse.Namespace) -> dict:
    import torch

    from workbench.models.build import build_model
    from workbench.train import Trainer

    cfg = config(args, "dpo-lora adapters_off", cpu=True)
    train, _, tokenizer = pair_datasets(args, cfg)
    model = build_model(cfg.model, vocab_size=args.vocab, seed=0)
    trainer = Trainer(cfg, model=model, tokenizer=tokenizer, train_dataset=train)
    _, times = record_steps(trainer)
    result = trainer.fit()
    return {
        "variant": SIDE_BY_SIDE[1],
        "device": "cpu (plain PyTorch)",
        "torch_threads": torch.get_num_threads(),
        **_rate(times, args.batch),
        "steps": len(times),
        "final_loss": result.final_loss,
        "train_reward_accuracy": result.history[-1].get("reward_accuracy") if result.history else None,
        "reference_notice": next((n for n in result.notices if n.startswith("DPO reference:")), None),
    }


def trl_records(args: argparse.Namespace, tokenizer) -> list[dict[str, str]]:
    """The train pairs as plain strings: the prompt (system turn included) rendered with the chat
    template up to the answer, each answer its text and the eos (the template's end of turn)."""
    from workbench.data import preference
    from workbench.data.chat import chat_token_ids

    cfg = config(args, "dpo-lora adapters_off", cpu=True)
    pairs = preference.load_pairs(cfg.data)
    records = []
    for pair in pairs:
        prompt = tokenizer.decode(chat_token_ids(tokenizer, pair["prompt"], add_generation_prompt=True))
        answer = {
            k: "\n".join(t["content"] for t in pair[k]) + tokenizer.eos_token for k in ("chosen", "rejected")
        }
        records.append({"prompt": prompt, **answer})
    return records


def run_trl(args: argparse.Namespace) -> dict:
    import datasets
    import peft
    import torch
    import trl
    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from workbench.models.build import build_model
    from workbench.train.lora import resolve_target_modules

    cfg = config(args, "dpo-lora adapters_off", cpu=True)
    _, _, tokenizer = pair_datasets(args, cfg)
    train = datasets.Dataset.from_list(trl_records(args, tokenizer))
    model = build_model(cfg.model, vocab_size=args.vocab, seed=0)
    targets = resolve_target_modules(model, cfg.lora.target_modules)  # the workbench's 'auto' targets
    lora = peft.LoraConfig(
        r=LORA_RANK,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=0.0,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    times: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            times.append(time.perf_counter())

    with tempfile.TemporaryDirectory(prefix="trl-") as out:
        dpo_args = DPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.batch,
            max_steps=args.cpu_steps,
            learning_rate=args.lr,
            lr_scheduler_type="cosine",
            warmup_steps=1,
            max_grad_norm=1.0,
            beta=cfg.train.dpo_beta,
            loss_type=["sigmoid"],
            max_length=args.seq,
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
            seed=0,
        )
        trainer = DPOTrainer(
            model=model,
            args=dpo_args,
            train_dataset=train,
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=[StepClock()],
        )
        trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    tokens = trainer.train_dataset[0]
    return {
        "variant": SIDE_BY_SIDE[0],
        "device": "cpu (plain PyTorch)",
        "trl_version": trl.__version__,
        "optimizer": str(dpo_args.optim),
        "torch_threads": torch.get_num_threads(),
        **_rate(times, args.batch),
        "steps": len(times),
        "final_loss": logs[-1]["loss"] if logs else None,
        "train_reward_accuracy": logs[-1].get("rewards/accuracies") if logs else None,
        "first_pair_tokens": len(tokens["prompt_ids"]) + len(tokens["chosen_ids"]),
    }


# ---- processes, table, main -------------------------------------------------------------------------


def in_fresh_process(args: argparse.Namespace, name: str) -> dict:
    env = bench_environment(plain_torch=name in SIDE_BY_SIDE, cpu_threads=args.cpu_threads)
    if name not in SIDE_BY_SIDE and not args.default_scheduler:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {XLA_CPU_MEMORY_SCHEDULER}".strip()
    passthrough = ["--pairs", json.dumps(args.pairs), *args.passthrough]
    return run_in_fresh_process(__file__, name, passthrough, env, cwd=REPO, timeout=1800)


def _mib(value: float | None) -> str:
    return f"{value / 2**20:.1f}" if value is not None else "-"


def table(rows: list[dict]) -> str:
    by_name = {r["variant"]: r for r in rows}
    head = (
        f"{'variant':<22} {'tok/s':>7} {'step s':>7} {'x':>5} {'compiler peak MiB':>17} {'x':>5} "
        f"{'temp MiB':>8} {'estimate MiB':>12} {'est/comp':>8} {'recompiles':>10} {'loss':>7} "
        f"{'acc train':>9} {'acc eval':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        base = by_name.get(r["baseline"]) if r["baseline"] else None
        step_x = r["step_s"] / base["step_s"] if base and base["step_s"] and r["step_s"] else None
        peak_x = r["compiler_peak_bytes"] / base["compiler_peak_bytes"] if base else None
        accuracy = [num(r[k], ".0%") for k in ("train_reward_accuracy", "eval_reward_accuracy")]
        lines.append(
            f"{r['variant']:<22} {num(r['tokens_per_s'], '.0f'):>7} {num(r['step_s'], '.3f'):>7} "
            f"{num(step_x, '.2f'):>5} {_mib(r['compiler_peak_bytes']):>17} {num(peak_x, '.2f'):>5} "
            f"{_mib(r['compiler_temp_bytes']):>8} {_mib(r['estimate_bytes']):>12} "
            f"{r['estimate_bytes'] / r['compiler_peak_bytes']:>8.2f} {r['compiles_after_warmup']:>10} "
            f"{num(r['final_loss'], '.4f'):>7} {accuracy[0]:>9} {accuracy[1]:>8}"
        )
    return "\n".join(lines)


def side_table(rows: list[dict]) -> str:
    head = (
        f"{'trainer':<18} {'steps/s':>8} {'pairs/s':>8} {'step s':>7} {'x':>5} {'min s':>6} {'mean s':>6} "
        f"{'final loss':>10} {'acc train':>9}"
    )
    lines = [head, "-" * len(head)]
    ours = next((r for r in rows if r["variant"] == SIDE_BY_SIDE[1] and r.get("step_s")), None)
    for r in rows:
        if "error" in r:
            lines.append(f"{r['variant']:<18} failed: {r['error']}")
            continue
        speed = ours["step_s"] / r["step_s"] if ours and r.get("step_s") else None
        lines.append(
            f"{r['variant']:<18} {num(r['steps_per_s'], '.3f'):>8} {num(r['pairs_per_s'], '.2f'):>8} "
            f"{num(r['step_s'], '.3f'):>7} {num(speed, '.2f'):>5} {num(min(r['step_times_s'], default=None), '.2f'):>6} "
            f"{num(r.get('mean_step_s'), '.2f'):>6} {num(r['final_loss'], '.4f'):>10} "
            f"{num(r['train_reward_accuracy'], '.0%'):>9}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument(
        "--batch", type=int, default=4, help="pairs per step (SFT baselines: twice as many rows)"
    )
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--cpu-steps", type=int, default=12, help="steps of each trainer in the CPU side-by-side"
    )
    parser.add_argument(
        "--cpu-threads", type=int, default=1, help="torch threads of each CPU trainer (0: torch's default)"
    )
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--default-scheduler", action="store_true", help="XLA:CPU's default scheduler")
    parser.add_argument("--no-trl", action="store_true", help="skip the TRL side-by-side (part 6)")
    parser.add_argument("--only-trl", action="store_true", help="only the TRL side-by-side (part 6)")
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--pairs", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.passthrough = [
        f"--{k.replace('_', '-')}={getattr(args, k)}"
        for k in ("hidden", "layers", "vocab", "batch", "seq", "steps", "cpu_steps", "cpu_threads", "lr")
    ]
    if args.variant:
        args.pairs = json.loads(args.pairs)
        runners = {SIDE_BY_SIDE[0]: run_trl, SIDE_BY_SIDE[1]: run_workbench_cpu}
        if args.variant in runners and args.cpu_threads:
            import torch

            torch.set_num_threads(args.cpu_threads)
        try:
            row = runners[args.variant](args) if args.variant in runners else run_variant(args, args.variant)
        except Exception:
            traceback.print_exc()
            raise SystemExit(1) from None
        print_row(row)
        return
    start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-preference-"))
    args.pairs = write_pairs(args, work)
    rows, side = [], []
    for name in [] if args.only_trl else VARIANTS:
        rows.append(in_fresh_process(args, name))
        print(f"  {name} done ({rows[-1]['process_wall_s']:.0f} s)", flush=True)
    for name in [] if args.no_trl else SIDE_BY_SIDE:
        try:
            side.append(in_fresh_process(args, name))
            print(f"  {name} done ({side[-1]['process_wall_s']:.0f} s)", flush=True)
        except RuntimeError as err:
            side.append({"variant": name, "error": error_line(err), "stderr_tail": str(err)[-3000:]})
            print(f"  {name} failed: {side[-1]['error']}", flush=True)
    scheduler = "default" if args.default_scheduler else "memory-minimising"
    shape = (
        f"llama hidden {args.hidden} x {args.layers} layers, vocab {args.vocab}, {args.batch} pairs "
        f"(SFT: {2 * args.batch} rows) x {args.seq} tokens"
    )
    if rows:
        print(
            f"\nbf16, gradient checkpointing, plain loss; {shape}, {args.steps} steps; XLA:CPU ({scheduler} scheduler); x: against "
            "the variant's SFT baseline (sft-lora, or sft-full for the copy); acc: DPO reward accuracy, the last "
            f"step's pairs / {2 * args.batch} held-out pairs\n"
        )
        print(table(rows))
    if side:
        print(
            f"\nplain CPU, {args.cpu_threads or 'default'} torch thread(s), fp32, LoRA r{LORA_RANK}, no gradient checkpointing, each batch padded to its longest pair; "
            f"{shape} at most, {args.cpu_steps} steps; each trainer in a fresh process; step s: the median step after "
            "the first (min and mean beside it); x: the workbench's step time over this row's (above 1: faster "
            "than ours)\n"
        )
        print(side_table(side))
    wall = time.perf_counter() - start
    print(f"\nwall time {wall:.0f} s")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    kept = {k: v for k, v in vars(args).items() if k not in ("passthrough", "pairs", "variant")}
    RESULTS.write_text(
        json.dumps({"args": kept, "wall_s": wall, "rows": rows, "side_by_side": side}, indent=1)
    )
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
