"""1 vs 2 vs 4 CPU processes under torchrun: global tokens/s and each rank's peak memory, DDP and FSDP2.

Every row is one fresh run of the user's command, the same model, global batch and steps:

    torchrun --standalone --nproc_per_node=N -m workbench train train.device_type=cpu
        model.pretrained_path=CKPT data.tokenizer_path=CKPT data.max_length=32 train.batch_size=8
        train.precision=fp32 train.steps=6 train.log_every=1 train.warmup_steps=1 [mesh.fsdp=N]
        --metrics-out FILE

(started as ``python -m torch.distributed.run``, `workbench.launch.torchrun_command`, the line
``--nproc N`` runs). ``train.batch_size`` is the global batch: each rank trains on its N-th of
the rows, so every row of the table trains on the same batches (the final losses agree to float
rounding, which the table shows). Rows: N = 1; N = 2 and 4 with DDP (``mesh.data`` fills the
ranks, the default) and with FSDP2 (``mesh.fsdp=N``: each rank keeps 1/N of the parameters,
gradients and AdamW state).

The model is SmolLM2-135M's published shape (`bench/real_shapes.py`: 30 layers, hidden 576,
vocabulary 49152, tied; random weights, made once into bench/results/checkpoints), a full
fine-tune in fp32: 513 MiB of parameters, and as much again in gradients and twice as much in
AdamW's two moments, about 2 GiB of training state per whole copy, which is what DDP repeats on
every rank and FSDP2 divides. Rows are 32 tokens long (8 x 32 tokens a step) so that a step takes
about 2-3 s on one core and the whole bench about 9 minutes on 2 cores; the state's size does not
depend on the length. ``--quick``: a mid-size Llama from ``model.*`` overrides (hidden 640,
12 layers, MLP 1792, 53M parameters, the workbench's 512-token tokenizer), about 4 minutes.

The one-process baseline is torchrun with ``--nproc_per_node=1`` and ``OMP_NUM_THREADS=1``:
torchrun gives each rank one intra-op thread when N > 1 (and leaves the variable alone at
N = 1), so the baseline runs the same launch and process group (one rank, no wrapper) at the same
threads per process, and ``x 1 proc`` is the process scaling alone. Beside it, for reference,
plain ``python -m workbench train`` with PyTorch's own thread count (2 here): one process on
both cores, what a user without torchrun gets.

Measured per row:

- tokens/s: ``--metrics-out``'s ``result.tokens_per_s``, global real (non-padding) tokens per
  second from the end of the first step to the end of the run (rank 0 writes it; the tokens are
  the whole global batch's). ``step tok/s``: the median over steps 2.. of each step's tokens/s
  from the history (``train.log_every=1``), which a burst of load from another process on this
  shared machine moves less than the run's mean.
- Peak RSS per rank, measured from outside: while the command runs, this script polls every
  0.2 s the rank processes (torchrun's descendants whose environment carries ``RANK``; for the
  plain row, the process itself) and reads ``VmHWM`` from ``/proc/PID/status``, the kernel's
  high-water mark of the process's resident set, so a poll sees every peak before it, however
  short. Only growth in the last 0.2 s before a rank exits could be missed (nothing there
  allocates: the run is writing its summary). The torchrun agent's own RSS is not counted.
  Shown as max and mean over the ranks.
- Parameters held per rank: read from the run's ``ranks:`` report ("holds X of Y of parameters",
  `workbench.parallel.torch_parallel.rank_report`), and the training state that implies: params
  x 4 (the fp32 parameters, their gradients and AdamW's two moments have the same shapes). DDP
  also keeps its gradient buckets, one more gradient-sized copy, so its RSS sits above that.

Memory is measured twice, because under glibc's default allocator a rank's RSS is not what it
holds: each rank loads (or builds) the whole model before FSDP2 shards it, and glibc keeps much of
what is freed then and in the steps in its heap, resident (freeing large blocks raises its mmap
threshold, so later ones come from the heap, which fragments); an FSDP2 rank then shows about the
RSS of a DDP rank. The second runs below show the gap is memory freed and kept, not memory held.
So after the throughput runs, every torchrun row runs again for ``--memory-steps`` (2) steps under
``MALLOC_MMAP_THRESHOLD_=65536`` (each block of 64 KiB or more its own mapping, returned to the
kernel when freed): its peak RSS follows live memory (column "(mmap)"), and "rank 0 between steps"
is the largest RSS rank 0 itself logged at the end of a step (``history[].host_rss_bytes``, the
trainer's profiler, after the optimizer step has freed the gradients): weights, AdamW state, DDP's
buckets and the framework, where FSDP2's 1/N share shows plainly. The peak is above it: the step's
gradients and activations, and for FSDP2 the whole model each rank loads (the trainer builds it,
then `fully_shard` shards it in place). The fixed threshold slows steps (every large block is
mapped and zeroed afresh), so those runs' tokens/s are not reported.

This machine has 2 cores: 2 processes of one thread each use both, and 4 processes oversubscribe
them (two processes per core, plus gloo's communication threads), so tokens/s cannot scale to 4
here; on 2 cores DDP and FSDP2 add collectives (gloo over local TCP) to the same arithmetic. The
point of the bench is the measurement path and the memory per rank. RSS includes each process's
framework (Python, torch, torch_xla, transformers, datasets): about 1 GiB that no strategy
divides. Prints two tables (throughput, memory) and writes bench/results/distributed.json.

    .venv/bin/python bench/distributed.py            # SmolLM2-135M shape (about 9 minutes on 2 cores)
    .venv/bin/python bench/distributed.py --quick    # mid-size model (about 4 minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("PJRT_DEVICE", "CPU")

from workbench.launch import torchrun_command  # noqa: E402
from workbench.units import GiB, KiB, MiB  # noqa: E402

RESULTS = REPO / "bench" / "results" / "distributed.json"
CHECKPOINTS = REPO / "bench" / "results" / "checkpoints"  # shared with bench/compile.py --real
SHAPE = "smollm2-135m"
QUICK_MODEL = {
    "model.hidden_size": 640,
    "model.num_layers": 12,
    "model.num_heads": 10,
    "model.num_kv_heads": 2,
    "model.intermediate_size": 1792,
}
"""``--quick``'s mid-size Llama (53M parameters with the 512-token tokenizer)."""
POLL_S = 0.2
HELD = re.compile(
    r"^rank (\d+) of (\d+) \(.*\): holds ([\d.]+ (?:B|KiB|MiB|GiB)) of ([\d.]+ (?:B|KiB|MiB|GiB))"
)
UNITS = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB}
FIXED_MMAP = "MALLOC_MMAP_THRESHOLD_=65536"
"""glibc: every block of 64 KiB or more its own mapping, returned to the kernel when freed (and the
threshold no longer rises as large blocks are freed); the memory rows' RSS then follows what is live."""
STATE_COPIES = 4
"""fp32 parameters + gradients + AdamW's exp_avg and exp_avg_sq: four tensors of each parameter's shape."""


def checkpoint() -> Path:
    """The cached SmolLM2-135M-shaped checkpoint (made in a subprocess the first time)."""
    from bench.real_shapes import REAL_SHAPES

    layers = int(REAL_SHAPES[SHAPE]["num_hidden_layers"])
    out = CHECKPOINTS / f"{SHAPE}-{layers}l-bfloat16"  # bench/compile_real.py's name for the same one
    if not (out / "config.json").is_file():
        print(f"making {out} ...", file=sys.stderr, flush=True)
        make = [sys.executable, str(REPO / "bench" / "real_shapes.py"), SHAPE, str(out)]
        subprocess.run(make, check=True, cwd=REPO)
    return out


def train_arguments(
    args: argparse.Namespace, model: list[str], fsdp: int, steps: int, metrics_out: Path
) -> list[str]:
    """``train ...``: the command line after ``python -m workbench`` (the same on every rank)."""
    return [
        "train",
        "train.device_type=cpu",
        *model,
        f"data.max_length={args.max_length}",
        f"train.batch_size={args.batch_size}",
        "train.precision=fp32",
        f"train.steps={steps}",
        "train.log_every=1",
        "train.warmup_steps=1",
        "train.progress_bar=false",
        *([f"mesh.fsdp={fsdp}"] if fsdp > 1 else []),
        "--metrics-out",
        str(metrics_out),
    ]


# ---- peak RSS of the rank processes, from /proc ---------------------------------------------------


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now running."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        out[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return out


def _descendants(root: int) -> list[int]:
    parents = _parents()
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        children = [p for p, parent in parents.items() if parent == pid]
        found += children
        frontier += children
    return found


def _rank_of(pid: int) -> int | None:
    """The ``RANK`` in `pid`'s environment (torchrun sets it for each rank), or None."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def _high_water_bytes(pid: int) -> int | None:
    """``VmHWM`` of `pid` (peak resident set so far) in bytes; None once it has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def run_and_poll(command: list[str], env: dict[str, str], nproc: int, log: Path, timeout_s: float) -> dict:
    """Run `command` (torchrun, or one plain process when `nproc` is 0) with output to `log`,
    polling its ranks' VmHWM; returns the exit code, wall seconds and the peak bytes per rank."""
    peaks: dict[int, int] = {}
    ranks: dict[int, int] = {}  # pid -> rank
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            while proc.poll() is None:
                if time.perf_counter() - start > timeout_s:
                    _stop(proc)
                    break
                if nproc == 0:
                    ranks = {proc.pid: 0}
                elif len(ranks) < nproc:
                    for pid in _descendants(proc.pid):
                        rank = _rank_of(pid)
                        if rank is not None:
                            ranks[pid] = rank
                for pid, rank in ranks.items():
                    hwm = _high_water_bytes(pid)
                    if hwm is not None:
                        peaks[rank] = max(peaks.get(rank, 0), hwm)
                time.sleep(POLL_S)
        except BaseException:
            _stop(proc)
            raise
    return {
        "exit_code": proc.returncode,
        "wall_s": round(time.perf_counter() - start, 1),
        "peak_rss_bytes": [peaks.get(r) for r in range(max(nproc, 1))],
    }


def _stop(proc: subprocess.Popen) -> None:
    """Stop the run `proc` started: SIGTERM to torchrun (it stops its ranks), then SIGKILL to
    whatever of it is left after 15 s (torchrun starts each rank in a session of its own, so the
    ranks are named one by one, as found before the signal)."""
    family = [proc.pid, *_descendants(proc.pid)]
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=15)
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


# ---- one row --------------------------------------------------------------------------------------


def held_per_rank(output: str) -> tuple[list[int], int | None]:
    """Bytes of parameters each rank holds, and the whole model's, from the ``ranks:`` report."""
    held: dict[int, int] = {}
    whole = None
    for line in output.splitlines():
        m = HELD.match(line.strip())
        if m:
            held[int(m.group(1))] = _bytes(m.group(3))
            whole = _bytes(m.group(4))
    return [held[r] for r in sorted(held)], whole


def _bytes(text: str) -> int:
    number, unit = text.split()
    return round(float(number) * UNITS[unit])


def run_row(
    args: argparse.Namespace,
    model: list[str],
    nproc: int,
    strategy: str,
    threads: int,
    *,
    steps: int,
    fixed_mmap: bool = False,
) -> dict:
    """One run: ``nproc`` ranks under torchrun (0: plain ``python -m workbench``) with `strategy`;
    `fixed_mmap`: under ``MALLOC_MMAP_THRESHOLD_`` (`FIXED_MMAP`)."""
    fsdp = nproc if strategy == "fsdp2" else 1
    label = f"{max(nproc, 1)} x {strategy}" + (" (plain python)" if nproc == 0 else "")
    label += f", {threads} thread(s) per process, {steps} steps" + (f", {FIXED_MMAP}" if fixed_mmap else "")
    print(f"{label} ...", file=sys.stderr, flush=True)
    malloc = dict([FIXED_MMAP.split("=")]) if fixed_mmap else {}
    with tempfile.TemporaryDirectory() as tmp:
        metrics_out, log = Path(tmp) / "metrics.json", Path(tmp) / "output.log"
        argv = train_arguments(args, model, fsdp, steps, metrics_out)
        if nproc == 0:
            command = [sys.executable, "-m", "workbench", *argv]
            shown = shlex.join(["python", "-m", "workbench", *argv[:-2]])
        else:
            command = torchrun_command(nproc, argv, executable=sys.executable)
            shown = shlex.join(torchrun_command(nproc, argv[:-2]))
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "PJRT_DEVICE": "CPU"} | malloc
        run = run_and_poll(command, env, nproc, log, args.timeout)
        output = log.read_text(errors="replace")
        report = json.loads(metrics_out.read_text()) if metrics_out.is_file() else {}
    row: dict[str, Any] = {
        "processes": max(nproc, 1),
        "strategy": strategy,
        "launch": "python" if nproc == 0 else "torchrun",
        "threads_per_process": threads,
        "allocator": FIXED_MMAP if fixed_mmap else "glibc default",
        "command": " ".join([*(f"{k}={v}" for k, v in malloc.items()), f"OMP_NUM_THREADS={threads}", shown]),
        **run,
        "status": report.get("status", "no metrics"),
    }
    if run["exit_code"] != 0 or report.get("status") != "ok":
        print(output[-3000:], file=sys.stderr)
        return row | {"output_tail": output.splitlines()[-30:]}
    result, history = report["result"], report["history"]
    step_rates = [h["tokens_per_s"] for h in history[1:] if h.get("tokens_per_s")]
    held, whole = held_per_rank(output)
    peaks = [p for p in run["peak_rss_bytes"] if p is not None]
    return row | {
        "tokens_per_s": result["tokens_per_s"],
        "median_step_tokens_per_s": statistics.median(step_rates) if step_rates else None,
        "step_times_s": [round(h["step_time_s"], 3) for h in history],
        "tokens_seen": history[-1]["tokens_seen"] if history else None,
        "final_loss": result["final_loss"],
        "peak_rss_max_bytes": max(peaks) if peaks else None,
        "peak_rss_mean_bytes": statistics.fmean(peaks) if peaks else None,
        "ranks_seen": len(peaks),
        "rank0_rss_between_steps_bytes": max((h.get("host_rss_bytes") or 0) for h in history) or None,
        "params_held_per_rank_bytes": held or None,
        "params_whole_bytes": whole,
        "state_per_rank_bytes": STATE_COPIES * max(held) if held else None,
    }


def memory_shortfall(rows: list[dict], nproc: int, strategy: str) -> str | None:
    """Why a DDP row would not fit in the memory free now (each rank a whole copy, as the 1-process
    row measured, plus 15% for DDP's gradient buckets), or None: the machine is shared, and an
    out-of-memory kill could hit another user's process."""
    base = next((r for r in rows if r.get("peak_rss_max_bytes") and r["processes"] == 1), None)
    if strategy != "ddp" or base is None:
        return None
    need = nproc * base["peak_rss_max_bytes"] * 1.15
    free = _available_bytes()
    if free is None or free >= need:
        return None
    return f"needs about {need / GiB:.1f} GiB ({nproc} whole copies), {free / GiB:.1f} GiB available"


def _available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def run_plan(
    args: argparse.Namespace, model: list[str], plan: list[tuple[int, str, int]], **kwargs: Any
) -> list[dict]:
    rows: list[dict] = []
    for nproc, strategy, threads in plan:
        short = memory_shortfall(rows, nproc, strategy)
        if short:
            print(f"skipping {nproc} x {strategy}: {short}", file=sys.stderr, flush=True)
            rows.append(
                {"processes": nproc, "strategy": strategy, "launch": "torchrun", "status": "skipped"}
                | {"threads_per_process": threads, "wall_s": 0.0, "reason": short}
            )
            continue
        rows.append(run_row(args, model, nproc, strategy, threads, **kwargs))
    return rows


# ---- the tables -----------------------------------------------------------------------------------


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / MiB:.0f}"


def _rate(n: float | None) -> str:
    return "-" if n is None else f"{n:.1f}"


def _ratio(n: float | None, base: float | None) -> str:
    return f"{n / base:.2f}" if n and base else "-"


def _key(row: dict) -> tuple[int, str, str]:
    return row["processes"], row["strategy"], row["launch"]


def _name(row: dict) -> str:
    return row["strategy"] + (" (python)" if row["launch"] == "python" else "")


def speed_table(rows: list[dict]) -> str:
    from workbench.analysis.tables import format_table

    base = next((r for r in rows if _key(r) == (1, "single", "torchrun")), {})
    shown = [
        {
            "procs": r["processes"],
            "strategy": _name(r),
            "threads": r["threads_per_process"],
            "tok/s": _rate(r.get("tokens_per_s")) if r["status"] == "ok" else r["status"],
            "x 1 proc": _ratio(r.get("tokens_per_s"), base.get("tokens_per_s")),
            "step tok/s": _rate(r.get("median_step_tokens_per_s")),
            "step x 1 proc": _ratio(r.get("median_step_tokens_per_s"), base.get("median_step_tokens_per_s")),
            "final loss": f"{r['final_loss']:.5f}" if r.get("final_loss") is not None else "-",
            "wall s": f"{r['wall_s']:.0f}",
        }
        for r in rows
    ]
    return format_table(shown)


def memory_table(rows: list[dict], fixed: list[dict]) -> str:
    from workbench.analysis.tables import format_table

    by_key = {_key(r): r for r in fixed}
    shown = []
    for r in rows:
        f = by_key.get(_key(r), {})
        held = r.get("params_held_per_rank_bytes") or f.get("params_held_per_rank_bytes")
        state = r.get("state_per_rank_bytes") or f.get("state_per_rank_bytes")
        shown.append(
            {
                "procs": r["processes"],
                "strategy": _name(r),
                "params/rank MiB": _mib(max(held)) if held else "-",
                "state/rank GiB": _gib(state),
                "RSS max": _gib(r.get("peak_rss_max_bytes")),
                "RSS mean": _gib(r.get("peak_rss_mean_bytes")),
                "RSS max (mmap)": _gib(f.get("peak_rss_max_bytes")),
                "RSS mean (mmap)": _gib(f.get("peak_rss_mean_bytes")),
                "rank 0 between steps (mmap)": _gib(f.get("rank0_rss_between_steps_bytes")),
            }
        )
    return format_table(shown)


def footer(model_text: str, rows: list[dict], fixed: list[dict]) -> list[str]:
    cores = os.cpu_count()
    notes = [
        f"model: {model_text}; the same global batches in every row (see the final loss).",
        f"this machine has {cores} cores: 2 processes x 1 thread fill them, 4 oversubscribe them "
        "(2 per core), so tokens/s cannot scale to 4 here; the point is the path and the memory per rank. "
        "Other processes shared the machine: the timings are noisy.",
        "x 1 proc: against the 1-process torchrun row (1 thread, as each rank has); 'step tok/s' is the "
        "median over steps 2.. (less moved by bursts of other load than the run's mean).",
        "memory, GiB per rank: peak RSS (VmHWM polled from /proc), each process's framework included "
        "(about 1 GiB); state/rank = parameters held x 4 (fp32 weights, gradients, AdamW's 2 moments); "
        "DDP keeps gradient buckets besides (one more gradient copy).",
        "(mmap): the same run under "
        f"{FIXED_MMAP}, so freed blocks go back to the kernel at once; under glibc's default "
        "a rank keeps memory it freed (the whole model each rank loads before FSDP2 shards it, "
        "then per-step buffers), and its RSS is not what it holds. 'rank 0 between steps': the largest "
        "RSS rank 0 logged at the end of a step (gradients freed by then: weights, AdamW, DDP buckets).",
    ]
    losses = [r["final_loss"] for r in rows if r.get("final_loss") is not None]
    if losses:
        spread = max(losses) - min(losses)
        notes.append(f"final losses agree to {spread:.1e} across rows (same global batches, float rounding).")
    failed = [
        f"{r['processes']} x {_name(r)} ({r['allocator']}): {r['status']}"
        for r in rows + fixed
        if r["status"] != "ok"
    ]
    if failed:
        notes.append("did not finish: " + "; ".join(failed))
    return notes


def _terminated(*_: Any) -> None:
    """SIGTERM: say so, and stop the run under way with this process (`run_and_poll` sees the exit)."""
    print("bench/distributed.py: stopped by SIGTERM", file=sys.stderr, flush=True)
    sys.exit(143)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="See the module docstring for what is measured and how.",
    )
    parser.add_argument("--quick", action="store_true", help="mid-size model (53M), no plain-python row")
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 4], help="process counts beside 1")
    parser.add_argument("--steps", type=int, default=6, help="steps of each throughput run")
    parser.add_argument(
        "--memory-steps", type=int, default=2, help=f"steps of each {FIXED_MMAP} run (0: none)"
    )
    parser.add_argument("--batch-size", type=int, default=8, help="global batch (a multiple of every count)")
    parser.add_argument("--max-length", type=int, default=32, help="tokens per row at most")
    parser.add_argument("--timeout", type=float, default=400.0, help="seconds per run before it is stopped")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _terminated)

    if args.quick:
        model = [f"{k}={v}" for k, v in QUICK_MODEL.items()]
        model_text = (
            "mid-size Llama (hidden 640, 12 layers, MLP 1792, 512-token vocabulary), full fine-tune, fp32"
        )
    else:
        ckpt = checkpoint()
        model = [f"model.pretrained_path={ckpt}", f"data.tokenizer_path={ckpt}"]
        model_text = "SmolLM2-135M shape (random weights), full fine-tune, fp32"
    model_text += f", {args.batch_size} x <= {args.max_length} tokens per step, {args.steps} steps"

    start = time.perf_counter()
    multi = [(n, strategy, 1) for n in args.procs for strategy in ("ddp", "fsdp2")]
    plain = [] if args.quick else [(0, "single", os.cpu_count() or 1)]  # PyTorch's own thread count
    rows = run_plan(args, model, [(1, "single", 1), *plain, *multi], steps=args.steps)
    fixed = []
    if args.memory_steps:
        fixed = run_plan(args, model, [(1, "single", 1), *multi], steps=args.memory_steps, fixed_mmap=True)

    print("\nthroughput (glibc's default allocator)")
    print(speed_table(rows))
    print("\nmemory per rank, GiB")
    print(memory_table(rows, fixed))
    notes = footer(model_text, rows, fixed)
    for note in notes:
        print(f"  {note}")
    result = {
        "model": model_text,
        "model_arguments": model,
        "machine": {
            "cpus": os.cpu_count(),
            "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        },
        "global_batch": args.batch_size,
        "max_length": args.max_length,
        "steps": args.steps,
        "memory_steps": args.memory_steps,
        "poll_s": POLL_S,
        "bench_wall_s": round(time.perf_counter() - start, 1),
        "rows": rows,
        "fixed_mmap_rows": fixed,
        "notes": notes,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out} ({result['bench_wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
