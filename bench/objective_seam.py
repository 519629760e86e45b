"""Old and new code side by side: SFT, distillation, DPO and GRPO trained a few steps on XLA:CPU and on
the plain CPU, every figure that says whether two versions of the training code behave the same.

For each objective and device, in a process of its own (so no program compiled by one run serves the
next): the loss and gradient norm of every step (logged every step), the eval figure, the sha256 of
every trainable tensor after the last step, the programs warm-up compiled and those compiled after it,
and on XLA the compile log's graph hashes of every program, in order. Bitwise: floats are compared by
their bytes (``float.hex``).

    python bench/objective_seam.py --out before.json            # on one checkout
    python bench/objective_seam.py --out after.json             # on another
    python bench/objective_seam.py --compare before.json after.json

``--tree DIR`` runs the runs against another checkout's package (a ``git worktree`` of an earlier
commit) from this script, so one file measures both. Exits 1 when ``--compare`` finds a difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OBJECTIVES = ("sft", "distill", "dpo", "grpo")
DEVICES = ("cpu", "xla")
TINY = {
    "model.family": "llama",
    "model.hidden_size": 64,
    "model.num_layers": 2,
    "model.num_heads": 4,
    "model.num_kv_heads": 2,
    "model.intermediate_size": 128,
    "model.max_position_embeddings": 256,
    "data.tokenizer_vocab_size": 512,
    "data.max_length": 64,
    "data.max_examples": 64,
    "data.eval_fraction": 0.1,
    "bucketing.max_buckets": 2,
    "bucketing.multiple_of": 16,
    "train.steps": 4,
    "train.batch_size": 4,
    "train.grad_accum": 2,
    "train.log_every": 1,
    "train.eval_every": 2,
    "train.learning_rate": 0.003,
    "train.precision": "fp32",
    "train.progress_bar": False,
    "train.seed": 3,
}
RUNS: dict[str, dict[str, Any]] = {
    "sft": {"data.source": "embedded"},
    "distill": {
        "data.source": "embedded",
        "train.distill_alpha": 0.7,
        "train.distill_temperature": 2.0,
        "train.distill_hidden_weight": 0.1,
    },
    "dpo": {"train.objective": "dpo", "data.source": "preference-sample", "lora.rank": 4},
    "grpo": {
        "train.objective": "grpo",
        "data.source": "math-sample",
        "data.max_length": 48,
        "train.batch_size": 2,
        "grpo.num_generations": 4,
        "grpo.max_completion_length": 16,
        "grpo.beta": 0.1,
        "grpo.reward_funcs": ["length"],  # a reward the untrained model's completions differ on: advantages
        "grpo.length_target": 8,
        "lora.rank": 4,
        "train.learning_rate": 0.01,
    },
}


def run_one(objective: str, device: str) -> dict[str, Any]:
    """Train `objective` on `device` in this process; every figure `compare` reads."""
    import torch

    from workbench.config import WorkbenchConfig
    from workbench.train import Trainer

    settings = {**TINY, **RUNS[objective], "train.device_type": device}
    cfg = WorkbenchConfig().with_overrides(settings)
    kwargs: dict[str, Any] = {}
    if objective == "distill":  # a teacher of another shape, its weights from another seed
        teacher_cfg = WorkbenchConfig().with_overrides(
            {**settings, "model.hidden_size": 96, "model.intermediate_size": 192, "train.seed": 11}
        )
        kwargs["teacher"] = Trainer(teacher_cfg).model.cpu()
    trainer = Trainer(cfg, **kwargs)
    result = trainer.fit()
    weights = hashlib.sha256()
    for name, tensor in sorted(trainer.model.named_parameters()):
        if tensor.requires_grad:
            weights.update(name.encode())
            weights.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    for name, tensor in sorted(trainer.objective.state_dict().items()):
        weights.update(name.encode())
        weights.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())

    def exact(value: Any) -> Any:
        return float(value).hex() if isinstance(value, float) else value

    keys = ("loss", "grad_norm", "eval_loss", "eval_reward_mean", "reward_mean", "kl", "reward_accuracy")
    return {
        "steps": [{k: exact(m.get(k)) for k in keys} for m in result.history],
        "eval": exact(result.eval_loss if result.eval_loss is None else float(result.eval_loss)),
        "weights": weights.hexdigest(),
        "warmup_compiles": result.warmup_compiles,
        "compiles_after_warmup": result.compiles_after_warmup,
    }


def programs(log: Path) -> list[str]:
    """The graph hash of every program the compile log recorded, in order."""
    if not log.exists():
        return []
    return [line.split(":", 1)[1].strip() for line in log.read_text().splitlines() if "Graph Hash:" in line]


def run_all(tree: Path, out: Path, only: list[str]) -> None:
    """Every objective (or those `only` names) on every device, each in a child process running `tree`'s
    package; the figures of runs already in `out` and not run again are kept."""
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    for objective in only or OBJECTIVES:
        for device in DEVICES:
            with tempfile.TemporaryDirectory() as tmp:
                log = Path(tmp) / "compile.log"
                env = {
                    **os.environ,
                    "PYTHONPATH": str(tree),
                    "PJRT_DEVICE": "CPU",
                    "CPU_NUM_DEVICES": "1",
                    "XLA_FLAGS": "--xla_backend_optimization_level=0",
                    "PT_XLA_DEBUG_LEVEL": "1",
                    "PT_XLA_DEBUG_FILE": str(log),
                    "TOKENIZERS_PARALLELISM": "false",
                    "XLA_WORKBENCH_CACHE": str(Path(tmp) / "cache"),
                }
                code = (
                    f"import json, sys; sys.path.insert(0, {str(REPO / 'bench')!r}); import objective_seam; "
                    f"print('RESULT ' + json.dumps(objective_seam.run_one({objective!r}, {device!r})))"
                )
                done = subprocess.run(
                    [sys.executable, "-c", code], cwd=tmp, env=env, capture_output=True, text=True
                )
                lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
                if done.returncode or not lines:
                    raise SystemExit(f"{objective} on {device} failed:\n{done.stderr[-4000:]}")
                result = json.loads(lines[-1][len("RESULT ") :])
                result["programs"] = programs(log) if device == "xla" else []
                results[f"{objective}/{device}"] = result
                print(f"{objective:8s} {device:4s} loss {result['steps'][-1]['loss']} "
                      f"programs {len(result['programs'])} weights {result['weights'][:12]}")  # fmt: skip
    out.write_text(json.dumps(results, indent=1))


def compare(before: Path, after: Path) -> int:
    """A table of the two files' runs; 1 when any figure differs."""
    old, new = json.loads(before.read_text()), json.loads(after.read_text())
    differ = 0
    print(
        f"{'run':14s} {'losses':>7s} {'grad norms':>10s} {'eval':>5s} {'weights':>8s} {'compiles':>9s} {'programs':>9s}"
    )
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a is None or b is None:
            print(f"{key:14s} only in {'after' if a is None else 'before'}")
            differ += 1
            continue
        same = {
            "losses": [s["loss"] for s in a["steps"]] == [s["loss"] for s in b["steps"]],
            "grad norms": [s["grad_norm"] for s in a["steps"]] == [s["grad_norm"] for s in b["steps"]],
            "eval": a["eval"] == b["eval"] and a["steps"] == b["steps"],
            "weights": a["weights"] == b["weights"],
            "compiles": (a["warmup_compiles"], a["compiles_after_warmup"])
            == (b["warmup_compiles"], b["compiles_after_warmup"]),
            "programs": a["programs"] == b["programs"],
        }
        differ += not all(same.values())
        cells = ["equal" if ok else "DIFFER" for ok in same.values()]
        print(f"{key:14s} " + " ".join(f"{c:>{w}s}" for c, w in zip(cells, (7, 10, 5, 8, 9, 9))))
        print(f"{'':14s} steps {len(a['steps'])}, warm-up {a['warmup_compiles']}/{b['warmup_compiles']} programs, "
              f"after {a['compiles_after_warmup']}/{b['compiles_after_warmup']}, logged programs "
              f"{len(a['programs'])}/{len(b['programs'])}")  # fmt: skip
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="run every objective and write the figures here")
    parser.add_argument("--tree", type=Path, default=REPO, help="the checkout whose package runs")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument(
        "--only", nargs="*", choices=OBJECTIVES, default=[], help="run these objectives alone"
    )
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("give --out FILE or --compare BEFORE AFTER")
    run_all(args.tree.resolve(), args.out, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
