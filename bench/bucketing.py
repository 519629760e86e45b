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

Writes bench/results/bucketing.json.
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

    from workbench.backend import runtime
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
    parser.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)  # one mode, in a child process
    args = parser.parse_args()
    if args.mode:
        print(_MARK + json.dumps(run_one_mode(args.mode, args.tokens, args.cache_dir)), flush=True)
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
