"""Bucketing benchmark: padding plans on real length distributions, then training on XLA:CPU.

Part 1 (no XLA): for three real length distributions — the embedded corpus and the shipped
chat sample (tokenised with the workbench's own BPE), and every function and method in the
standard library's source (``ast`` over ``Lib/*.py``, tokenised too) — the efficiency (real /
padded tokens) and number of shapes of: pad-to-max, pow2, multiple-of-128, quantile-K,
optimal-K (K = 4, 8, 16) and packing. Then the time the "optimal" planner takes on 1,000,000
lengths resampled from the stdlib-function distribution.

Part 2 (XLA:CPU, one device): a tiny causal LM (the default `ModelConfig`, vocab 512) trained
on the embedded corpus for the same budget of real tokens four ways: no padding (each batch
padded to its own longest member: a new shape whenever that changes), pad-to-max, optimal
buckets (K=4) and packing. Same tokens per step (8 x 256) for all; buckets and packing use a
token budget so short buckets get more rows. Compiles, compile seconds, wall time and real
tokens/s, as ratios to pad-to-max, all measured in this one run (each mode in a fresh child
process, so no mode reuses another's compiled programs; modes interleaved over 3 rounds and
medians reported, "no padding" once). From the measured compile seconds and steady
per-token cost it prints the run length (real tokens) at which buckets overtake pad-to-max.

    .venv/bin/python bench/bucketing.py                 # both parts (a few minutes on 2 cores)
    .venv/bin/python bench/bucketing.py --plans-only    # part 1 only (seconds)
    .venv/bin/python bench/bucketing.py --tokens 30000  # a shorter training budget (default 60,000)
    .venv/bin/python bench/bucketing.py --auto          # part 3 only (about 10 minutes)

Part 3 (``--auto``, XLA:CPU, one device): does ``bucketing.max_buckets: auto`` choose well? For
runs of about 2k, 20k and 200k real tokens (same model, corpus and batch as part 2; batch 8 x
``max_length`` 256), the `Trainer` itself runs with a fixed number of buckets K in (1, 2, 3, 4,
6, 8) and with 'auto' (which measures compile seconds and per-token time on its first shape,
then plans with `choose_buckets`). Each run is a fresh child process (nothing compiled before
it) and its wall time is the Trainer's, from construction to the end of `fit`: build, the
measurement, warm-up compiles and every step. Reported: auto's wall time against the best fixed
K measured, and what auto predicted.

Writes bench/results/bucketing.json (part 3 alone: bench/results/bucketing-auto.json).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import sysconfig
import time
import warnings
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before anything imports torch_xla
os.environ.setdefault("CPU_NUM_DEVICES", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from workbench.data.buckets import plan_buckets  # noqa: E402
from workbench.data.collate import packing_efficiency  # noqa: E402

RESULTS = REPO / "bench" / "results" / "bucketing.json"
AUTO_BUDGETS = (2_000, 20_000, 200_000)
FIXED_BUCKETS = (1, 2, 3, 4, 6, 8)
AUTO_TOLERANCE = 0.10
"""Auto's wall time may exceed the best fixed K's by at most this fraction."""
_MARK = "__MODE_RESULT__"


# ---- length distributions ------------------------------------------------------------------------


def _tokenizer(cache_dir: str | None):
    from workbench.config import DataConfig
    from workbench.data.tokenizer import get_tokenizer

    return get_tokenizer(DataConfig(), cache_dir=cache_dir)


def corpus_lengths(tokenizer) -> np.ndarray:
    from workbench.config import DataConfig
    from workbench.data.records import load_records, tokenize_records

    cfg = DataConfig()
    return np.asarray(tokenize_records(load_records(cfg), tokenizer, cfg)["length"])


def chat_lengths(tokenizer) -> np.ndarray:
    from workbench.config import DataConfig
    from workbench.data.records import load_records, tokenize_records

    cfg = DataConfig(source="chat-sample")
    return np.asarray(tokenize_records(load_records(cfg), tokenizer, cfg)["length"])


def stdlib_function_lengths(tokenizer) -> np.ndarray:
    """Token lengths of every function/method body in the standard library's Python source."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    sources = []
    for path in sorted(lib.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts or "tests" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines(keepends=True)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                # Whole lines (ast.get_source_segment re-splits the file per call: quadratic).
                sources.append("".join(lines[node.lineno - 1 : node.end_lineno]))
    encoded = tokenizer(sources, add_special_tokens=False)["input_ids"]
    return np.asarray([len(e) + 2 for e in encoded])


# ---- part 1: plans -----------------------------------------------------------------------------


def plan_rows(lengths: np.ndarray, max_length: int) -> list[dict]:
    rows = []

    def add(name, plan_or_stats):
        if isinstance(plan_or_stats, dict):
            eff, shapes = plan_or_stats["efficiency"], plan_or_stats["num_shapes"]
        else:
            eff, shapes = plan_or_stats.efficiency, plan_or_stats.num_shapes
        rows.append({"plan": name, "efficiency": eff, "shapes": shapes})

    add("pad-to-max", plan_buckets(lengths, 1, max_length=max_length, strategy="max"))
    add("pow2", plan_buckets(lengths, None, max_length=max_length, strategy="pow2"))
    add(
        "multiple-of-128",
        plan_buckets(lengths, None, multiple_of=128, max_length=max_length, strategy="multiple"),
    )
    for k in (4, 8, 16):
        add(
            f"quantile-{k}",
            plan_buckets(lengths, k, multiple_of=8, max_length=max_length, strategy="quantile"),
        )
    for k in (4, 8, 16):
        add(f"optimal-{k}", plan_buckets(lengths, k, multiple_of=8, max_length=max_length))
    add("packing", packing_efficiency(lengths, max_length))
    return rows


def planner_timing(source: np.ndarray, max_length: int) -> list[dict]:
    rng = np.random.default_rng(0)
    million = rng.choice(source, size=1_000_000, replace=True)
    # The hard case for the planner: as many distinct lengths as possible (32,768, multiple_of 1).
    wide = rng.integers(1, 32_769, size=1_000_000)
    out = []
    for name, lengths, limit in (
        ("stdlib functions", million, max_length),
        ("uniform 1..32768", wide, 32_768),
    ):
        for multiple in (1, 8, 128):
            for k in (4, 16):
                start = time.perf_counter()
                plan = plan_buckets(lengths, k, multiple_of=multiple, max_length=limit)
                seconds = time.perf_counter() - start
                out.append(
                    {
                        "lengths": name,
                        "max_length": limit,
                        "multiple_of": multiple,
                        "k": k,
                        "seconds": seconds,
                        "efficiency": plan.efficiency,
                    }
                )
    return out


def part_one(cache_dir: str | None) -> dict:
    import datasets

    datasets.disable_progress_bars()
    tokenizer = _tokenizer(cache_dir)
    distributions = {
        "embedded corpus": (corpus_lengths(tokenizer), 512),
        "chat sample": (chat_lengths(tokenizer), 512),
        "stdlib functions": (stdlib_function_lengths(tokenizer), 2048),
    }
    result: dict = {"distributions": {}}
    for name, (lengths, max_length) in distributions.items():
        pct = np.percentile(lengths, [50, 90, 99])
        result["distributions"][name] = {
            "sequences": len(lengths),
            "max_length": max_length,
            "median": float(pct[0]),
            "p90": float(pct[1]),
            "p99": float(pct[2]),
            "max": int(lengths.max()),
            "rows": plan_rows(lengths, max_length),
        }
    result["planner_1M"] = planner_timing(distributions["stdlib functions"][0], 2048)
    return result


def print_part_one(result: dict) -> None:
    names = list(result["distributions"])
    print("\n## Padding plans: efficiency (real/padded tokens) and shapes\n")
    for name in names:
        d = result["distributions"][name]
        print(
            f"- {name}: {d['sequences']} sequences, max_length {d['max_length']}, tokens median {d['median']:.0f}, "
            f"p90 {d['p90']:.0f}, p99 {d['p99']:.0f}, max {d['max']}"
        )
    header = "| plan | " + " | ".join(f"{n} eff | shapes" for n in names) + " |"
    print("\n" + header)
    print("|" + "---|" * (1 + 2 * len(names)))
    for i, row in enumerate(result["distributions"][names[0]]["rows"]):
        cells = []
        for name in names:
            r = result["distributions"][name]["rows"][i]
            cells += [f"{r['efficiency']:.3f}", str(r["shapes"])]
        print(f"| {row['plan']} | " + " | ".join(cells) + " |")
    print("\n## 'optimal' planner on 1,000,000 lengths\n")
    print("| lengths | max_length | multiple_of | K | seconds | efficiency |\n|---|---|---|---|---|---|")
    for r in result["planner_1M"]:
        print(
            f"| {r['lengths']} | {r['max_length']} | {r['multiple_of']} | {r['k']} | {r['seconds']:.3f} | "
            f"{r['efficiency']:.3f} |"
        )


# ---- part 2: training on XLA:CPU ------------------------------------------------------------------


MODES = {
    # each batch padded to its own longest member, exactly (no rounding to a multiple)
    "no padding": ["bucketing.strategy=none", "bucketing.multiple_of=1"],
    "pad-to-max": ["bucketing.strategy=max"],
    "optimal-4 buckets": [
        "bucketing.strategy=optimal",
        "bucketing.max_buckets=4",
        "bucketing.tokens_per_batch=2048",
    ],
    "packing": ["bucketing.packing=true", "bucketing.tokens_per_batch=2048"],
}


def train_mode(name: str, overrides: list[str], train_ds, tokenizer, budget: int) -> dict:
    import torch

    from workbench.backend.xla import runtime
    from workbench.config import WorkbenchConfig
    from workbench.data.loader import make_loader
    from workbench.models.build import build_model

    cfg = WorkbenchConfig().with_overrides(["train.batch_size=8", "data.max_length=256", *overrides])
    dev = runtime.device()
    pad = tokenizer.pad_token_id
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the 4% over 256 tokens: truncated, counted below
        loader, sampler = make_loader(train_ds, cfg, pad_token_id=pad, seed=0)
    model = build_model(cfg.model, vocab_size=len(tokenizer), seed=0).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses: list[float] = []
    compiles0, compile_s0 = runtime.compile_count(), runtime.compile_time_s()
    real = padded = steps = 0
    shapes: set[tuple[int, int]] = set()
    start = time.perf_counter()
    epoch = 0
    while real < budget:
        sampler.set_epoch(epoch)
        for batch in loader:
            real += int((batch["input_ids"] != pad).sum())  # host tensors: no device sync
            padded += batch["input_ids"].numel()
            shapes.add(tuple(batch["input_ids"].shape))
            device_batch = {k: v.to(dev) for k, v in batch.items()}
            loss = model(**device_batch, use_cache=False).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            runtime.add_step_closure(lambda value: losses.append(float(value)), (loss.detach(),))
            runtime.sync()
            steps += 1
            if real >= budget:
                break
        epoch += 1
    runtime.wait_device_ops()
    wall = time.perf_counter() - start
    compile_s = runtime.compile_time_s() - compile_s0
    return {
        "mode": name,
        "steps": steps,
        "real_tokens": real,
        "efficiency": real / padded,
        "shapes": len(shapes),
        "compiles": runtime.compile_count() - compiles0,
        "compile_s": compile_s,
        "wall_s": wall,
        "tokens_per_s": real / wall,
        "steady_s_per_token": max(wall - compile_s, 1e-9) / real,
        "final_loss": float(np.mean(losses[-5:])) if losses else None,
    }


def run_one_mode(name: str, budget: int, cache_dir: str | None) -> dict:
    import datasets

    from workbench.config import WorkbenchConfig
    from workbench.data.records import build_datasets

    datasets.disable_progress_bars()
    cfg = WorkbenchConfig().with_overrides(["data.eval_fraction=0"])
    train_ds, _, tokenizer = build_datasets(cfg, cache_dir=cache_dir)
    return train_mode(name, MODES[name], train_ds, tokenizer, budget)


def _run_child(name: str, budget: int, cache_dir: str | None) -> dict:
    cmd = [sys.executable, __file__, "--mode", name, "--tokens", str(budget)]
    if cache_dir:
        cmd += ["--cache-dir", cache_dir]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    marked = [line for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if proc.returncode != 0 or not marked:
        raise RuntimeError(f"mode {name!r} failed:\n{proc.stderr[-3000:]}")
    return json.loads(marked[-1][len(_MARK) :])


def part_two(budget: int, cache_dir: str | None, modes: list[str] | None = None, repeats: int = 3) -> dict:
    """Every mode in a fresh process (XLA's in-memory program cache would otherwise let a later
    mode reuse an earlier one's programs: pad-to-max's (8, 256) is also a no-padding shape).

    The modes run interleaved, `repeats` rounds, and each timing is the median over rounds: on a
    shared machine the load drifts within minutes, and interleaving spreads the drift evenly.
    "no padding" runs once (its ~30 compiles dominate any drift, and it is the slow one).
    """
    names = modes or list(MODES)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for round_index in range(repeats):
        for name in names:
            if name == "no padding" and round_index > 0:
                continue
            runs[name].append(_run_child(name, budget, cache_dir))
            print(f"  round {round_index + 1}: {name}: {runs[name][-1]['wall_s']:.1f} s", flush=True)
    rows = []
    for name in names:
        row = dict(runs[name][0])
        for key in ("compile_s", "wall_s", "tokens_per_s", "steady_s_per_token"):
            row[key] = float(np.median([r[key] for r in runs[name]]))
        row["runs"] = len(runs[name])
        row["walls_s"] = [r["wall_s"] for r in runs[name]]
        rows.append(row)
    if not any(r["mode"] == "pad-to-max" for r in rows):
        raise ValueError("--modes must include pad-to-max (the baseline of every ratio)")
    base = next(r for r in rows if r["mode"] == "pad-to-max")
    for r in rows:
        r["compiles_vs_max"] = r["compiles"] / base["compiles"]
        r["wall_vs_max"] = r["wall_s"] / base["wall_s"]
        r["tokens_per_s_vs_max"] = r["tokens_per_s"] / base["tokens_per_s"]
    buckets = next((r for r in rows if r["mode"] == "optimal-4 buckets"), None)
    breakeven = None
    if buckets is not None:
        saving = base["steady_s_per_token"] - buckets["steady_s_per_token"]
        extra_compile = buckets["compile_s"] - base["compile_s"]
        breakeven = extra_compile / saving if saving > 0 else None
    return {
        "budget_real_tokens": budget,
        "repeats": repeats,
        "rows": rows,
        "buckets_beat_max_after_tokens": breakeven,
    }


def print_part_two(result: dict) -> None:
    print(
        f"\n## Training on XLA:CPU, {result['budget_real_tokens']} real tokens each "
        f"(medians over interleaved runs; ratios to pad-to-max)\n"
    )
    print(
        "| mode | runs | steps | shapes | efficiency | compiles | compile s | wall s | real tok/s "
        "| compiles x | wall x | tok/s x | final loss |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        print(
            f"| {r['mode']} | {r['runs']} | {r['steps']} | {r['shapes']} | {r['efficiency']:.3f} | {r['compiles']} | "
            f"{r['compile_s']:.1f} | {r['wall_s']:.1f} | {r['tokens_per_s']:.0f} | {r['compiles_vs_max']:.2f} | "
            f"{r['wall_vs_max']:.2f} | {r['tokens_per_s_vs_max']:.2f} | {r['final_loss']:.3f} |"
        )
    t = result["buckets_beat_max_after_tokens"]
    if not any(r["mode"] == "optimal-4 buckets" for r in result["rows"]):
        return
    if t is None:
        print("\nBuckets did not lower the steady per-token cost below pad-to-max here.")
    elif t <= 0:
        print("\nBuckets beat pad-to-max from the first step (no extra compile time).")
    else:
        print(
            f"\nBuckets overtake pad-to-max after about {t:,.0f} real tokens "
            f"(extra compile seconds / steady per-token saving, both measured above)."
        )


# ---- part 3: does 'auto' choose well? ---------------------------------------------------------


def auto_run(buckets: str, budget: int, cache_dir: str | None) -> dict:
    """One Trainer run (in this fresh process) with ``bucketing.max_buckets=buckets`` for about
    `budget` real tokens; wall time from building the Trainer to the end of `fit`."""
    import datasets

    from workbench.backend.xla import runtime
    from workbench.config import WorkbenchConfig
    from workbench.data.records import build_datasets
    from workbench.train import Trainer

    datasets.disable_progress_bars()
    cfg = WorkbenchConfig().with_overrides(
        [
            "data.eval_fraction=0",
            "data.max_length=256",
            "train.batch_size=8",
            "train.device_type=xla",
            "train.progress_bar=false",
            "bucketing.strategy=optimal",
            f"bucketing.max_buckets={buckets}",
        ]
    )
    train_ds, _, tokenizer = build_datasets(cfg, cache_dir=cache_dir)
    mean_length = float(np.minimum(np.asarray(train_ds["length"]), 256).mean())
    steps = max(2, round(budget / (8 * mean_length)))  # the same steps, so the same sequences, for every K
    cfg = cfg.with_overrides(
        {"train.steps": steps, "train.log_every": steps, "train.warmup_steps": min(5, steps)}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # truncation and the auto notice: reported below
        start = time.perf_counter()
        trainer = Trainer(cfg, train_dataset=train_ds, tokenizer=tokenizer)
        result = trainer.fit()
        runtime.wait_device_ops()
        wall = time.perf_counter() - start
    _, sampler = trainer.data.loader(trainer.data.train_dataset, trainer.loop.batch_size)
    choice = trainer.data.bucket_choice
    return {
        "buckets": buckets,
        "steps": result.steps,
        "real_tokens": trainer.loop.tokens_seen,
        "shapes": len(sampler.boundaries),
        "boundaries": sampler.boundaries,
        "compiles": runtime.compile_count(),
        "compile_s": runtime.compile_time_s(),
        "compiles_after_warmup": result.compiles_after_warmup,
        "wall_s": wall,
        "final_loss": result.final_loss,
        "choice": choice.summary() if choice is not None else None,
    }


def _run_auto_child(buckets: str, budget: int, cache_dir: str | None) -> dict:
    cmd = [sys.executable, __file__, "--auto-run", buckets, "--tokens", str(budget)]
    if cache_dir:
        cmd += ["--cache-dir", cache_dir]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    marked = [line for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if proc.returncode != 0 or not marked:
        raise RuntimeError(f"run buckets={buckets} tokens={budget} failed:\n{proc.stderr[-3000:]}")
    return json.loads(marked[-1][len(_MARK) :])


def part_three(cache_dir: str | None, budgets: tuple[int, ...] = AUTO_BUDGETS, repeats: int = 1) -> dict:
    """Every (budget, K or auto) in its own fresh process; `repeats` interleaved rounds, the fastest
    of each (on a shared machine other work only ever adds time, so the fastest round is the least
    disturbed measurement of the same run)."""
    names = [*(str(k) for k in FIXED_BUCKETS), "auto"]
    out = []
    for budget in budgets:
        runs: dict[str, list[dict]] = {name: [] for name in names}
        for round_index in range(repeats):
            for name in names:
                runs[name].append(_run_auto_child(name, budget, cache_dir))
                r = runs[name][-1]
                print(
                    f"  {budget} tokens, round {round_index + 1}: K={name}: {r['shapes']} shapes, "
                    f"{r['wall_s']:.1f} s",
                    flush=True,
                )
        rows = []
        for name in names:
            row = dict(runs[name][0])
            fastest = min(runs[name], key=lambda r: r["wall_s"])
            row["wall_s"] = float(fastest["wall_s"])
            row["compile_s"] = float(fastest["compile_s"])
            row["walls_s"] = [r["wall_s"] for r in runs[name]]
            rows.append(row)
        out.append(compare_auto(budget, rows))
    return {"repeats": repeats, "tolerance": AUTO_TOLERANCE, "budgets": out}


def compare_auto(budget: int, rows: list[dict]) -> dict:
    """Auto's wall time against the best fixed K's; and, apart from the run-to-run noise and the
    measurement's own cost, how the fixed run with auto's number of shapes did (same plan)."""
    best = min((r for r in rows if r["buckets"] != "auto"), key=lambda r: r["wall_s"])
    auto = next(r for r in rows if r["buckets"] == "auto")
    for r in rows:
        r["wall_vs_best_fixed"] = r["wall_s"] / best["wall_s"]
    same_k = next((r for r in rows if r["buckets"] == str(auto["shapes"])), None)
    return {
        "budget_real_tokens": budget,
        "rows": rows,
        "best_fixed_k": int(best["buckets"]),
        "auto_shapes": auto["shapes"],
        "auto_vs_best_fixed": auto["wall_s"] / best["wall_s"],
        "auto_within_tolerance": auto["wall_s"] <= (1 + AUTO_TOLERANCE) * best["wall_s"],
        "auto_k_fixed_run_vs_best": same_k["wall_s"] / best["wall_s"] if same_k is not None else None,
        "auto_predicted_s": auto["choice"]["predicted_total_s"] if auto["choice"] else None,
    }


def print_part_three(result: dict) -> None:
    print(
        f"\n## 'auto' against fixed bucket counts: Trainer wall time on XLA:CPU "
        f"(fresh process per run, compiles included; fastest of {result['repeats']})\n"
    )
    print("| real tokens | K | shapes | steps | compiles | compile s | wall s | wall / best fixed |")
    print("|---|---|---|---|---|---|---|---|")
    for b in result["budgets"]:
        for r in b["rows"]:
            print(
                f"| {r['real_tokens']:,} | {r['buckets']} | {r['shapes']} | {r['steps']} | {r['compiles']} | "
                f"{r['compile_s']:.1f} | {r['wall_s']:.1f} | {r['wall_vs_best_fixed']:.2f} |"
            )
    print(
        "\n| budget | best fixed K | auto's shapes | auto / best fixed | fixed run at auto's K / best "
        "| auto predicted s | within 10% | measured s/shape | measured µs/padded token | epochs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b in result["budgets"]:
        choice = next(r for r in b["rows"] if r["buckets"] == "auto")["choice"] or {}
        same_k = b.get("auto_k_fixed_run_vs_best")
        cells = [
            f"{b['budget_real_tokens']:,}",
            str(b["best_fixed_k"]),
            str(b["auto_shapes"]),
            f"{b['auto_vs_best_fixed']:.3f}",
            f"{same_k:.3f}" if same_k is not None else "-",
            f"{b['auto_predicted_s']:.1f}" if b["auto_predicted_s"] is not None else "-",
            "yes" if b["auto_within_tolerance"] else "NO",
            f"{choice['compile_seconds']:.2f}" if choice else "-",
            f"{1e6 * choice['seconds_per_padded_token']:.1f}" if choice else "-",
            f"{choice['epochs']:.3f}" if choice else "-",
        ]
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--plans-only", action="store_true", help="skip the XLA training part")
    parser.add_argument("--tokens", type=int, default=60_000, help="real-token budget per training mode")
    parser.add_argument("--cache-dir", default=None, help="tokenizer cache (default: the workbench cache)")
    parser.add_argument(
        "--modes",
        default=None,
        help=f"comma-separated subset of: {', '.join(MODES)} (pad-to-max is required)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="interleaved rounds per mode (medians reported)"
    )
    parser.add_argument("--auto", action="store_true", help="part 3 only: 'auto' against fixed bucket counts")
    parser.add_argument(
        "--auto-budgets",
        default=",".join(str(b) for b in AUTO_BUDGETS),
        help="comma-separated real-token budgets for part 3",
    )
    parser.add_argument("--auto-repeats", type=int, default=1, help="interleaved rounds per part-3 run")
    parser.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)  # one mode, in a child process
    parser.add_argument("--auto-run", help=argparse.SUPPRESS)  # one part-3 run, in a child process
    args = parser.parse_args()
    if args.mode:
        print(_MARK + json.dumps(run_one_mode(args.mode, args.tokens, args.cache_dir)), flush=True)
        return
    if args.auto_run:
        print(_MARK + json.dumps(auto_run(args.auto_run, args.tokens, args.cache_dir)), flush=True)
        return
    if args.auto:
        budgets = tuple(int(b) for b in args.auto_budgets.split(","))
        result = {"auto": part_three(args.cache_dir, budgets, args.auto_repeats)}
        print_part_three(result["auto"])
        out = RESULTS.with_name("bucketing-auto.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        print(f"\nwrote {out.relative_to(REPO)}")
        return
    modes = [m.strip() for m in args.modes.split(",")] if args.modes else None
    unknown = [m for m in modes or [] if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {list(MODES)}")
    result = {"plans": part_one(args.cache_dir)}
    print_part_one(result["plans"])
    if not args.plans_only:
        result["training"] = part_two(args.tokens, args.cache_dir, modes, args.repeats)
        print_part_two(result["training"])
    if args.plans_only:
        out = RESULTS.with_name("bucketing-plans.json")
    elif modes is None:
        out = RESULTS
    else:
        out = RESULTS.with_name(f"bucketing-{args.tokens}-subset.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
