"""The compiler's memory analysis of the trainer's LoRA step at Llama 3.1 8B's full width, beside the estimate.

Llama-3.1-8B's published shape (`bench/real_shapes.py`: hidden 4096, MLP 14336, vocabulary 128256,
32 heads / 8 KV heads, untied head, rope_theta 500000) cut to `--layers` layers (default 2),
random weights built on the host in bf16, then the real `Trainer`: ``model.quantize`` (int8 by
default), LoRA rank 16 on every projection, the loss in chunks (``train.loss_chunk_tokens``),
AdamW over the adapters, bf16, gradient checkpointing. One training step is traced and compiled,
never run (`tests/xla/memory_quantized.trainer_step_memory`, `runtime.compile_only`): XLA:CPU
gives its memory analysis of a step this machine could not execute in reasonable time.

Each scheduler runs in its own process: XLA:CPU's memory-minimising one
(``--xla_cpu_enable_concurrency_optimized_scheduler=false``, the closer to TPU's memory-aware
scheduler) and its default one (concurrency first, which computes every weight-only value at the
start of the program). The memory-minimising run also dumps the optimized program, whose buffer
assignment names what is live at the peak: grouped here into the program's arguments, f32
copies of the quantized weights (XLA:CPU's dot takes no converted operand and runs bf16 in f32),
vocabulary-wide buffers (the loss chunk's logits) and the rest (activations, scratch).

    .venv/bin/python bench/memory_real.py [--batch 2 --seq 2048 --layers 2 --quantize int8 --chunk-tokens 256]
    .venv/bin/python bench/memory_real.py --precision fp32 --schedulers memory-minimising

About 5 minutes on 2 cores (building the model on the host takes a minute, compiling one or two).
Prints the table and writes bench/results/memory_real.json (memory_real_fp32.json for fp32).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workbench.backend.xla.runtime import XLA_CPU_MEMORY_SCHEDULER

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "bench" / "results" / "memory_real.json"
_MARK = "__MEMORY_REAL__"
GiB = 1024**3


def build_llama_8b(layers: int, precision: str = "bf16", seed: int = 0):
    """Llama-3.1-8B's published config cut to `layers` layers, random weights on the host in bf16
    (or fp32 for `precision` 'fp32': the trainer casts to bf16 but never up)."""
    import torch
    import transformers as tf

    from bench.real_shapes import real_config
    from workbench.models.build import no_kv_cache

    config = real_config("llama-3.1-8b", layers=layers)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        dtype = torch.float32 if precision == "fp32" else torch.bfloat16
        model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype)
    return no_kv_cache(model), config


def shape_of(config) -> dict:
    """The `ModelConfig` fields of a transformers Llama config."""
    return {
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_layers": config.num_hidden_layers,
        "num_heads": config.num_attention_heads,
        "num_kv_heads": config.num_key_value_heads,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": config.tie_word_embeddings,
    }


def peak_buffers(dump_dir: str | Path, vocab: int) -> dict[str, int]:
    """Bytes live at the peak of the largest dumped program, by kind: ``arguments``,
    ``weight_copies`` (values computed from weights alone, no batch tensor (int64 ids, mask,
    labels) among their inputs: the converted or dequantized weights), ``vocab_wide`` (last dimension the vocabulary: logits and their gradients) and
    ``other`` (activations, scratch). From XLA's buffer assignment dump ("Live ranges at N (peak)")
    and the optimized HLO (each buffer's shape and operands)."""
    assignments = glob.glob(f"{dump_dir}/*after_optimizations-buffer-assignment.txt")
    if not assignments:
        return {}
    path = max(assignments, key=os.path.getsize)
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    operands: dict[str, list[str]] = {}
    caller: dict[str, str] = {}  # a called computation -> the instruction calling it
    roots: dict[str, str] = {}  # a computation's root instruction -> the computation
    computation = ""
    instruction = re.compile(r"\s*(ROOT )?%([\w.\-]+) = \(?(\w+)\[([\d,]*)\][^ ]* [\w\-]+\(([^)]*)\)(.*)")
    with open(path.replace("-buffer-assignment.txt", ".txt")) as hlo:
        for line in hlo:
            head = re.match(r"(?:ENTRY )?%([\w.\-]+) ", line)
            if head and not line.startswith(" "):
                computation = head[1]
                continue
            m = instruction.match(line)
            if not m:
                continue
            name = m[2]
            dtypes[name], shapes[name] = m[3], tuple(int(x) for x in m[4].split(",") if x)
            operands[name] = re.findall(r"%([\w.\-]+)", m[5])
            for called in re.findall(r"(?:to_apply|calls)=%([\w.\-]+)", m[6]):
                caller[called] = name
            if m[1]:
                roots[name] = computation

    known: dict[str, bool | None] = {}

    def from_weights(name: str) -> bool | None:
        """True: computed from weight arguments (and constants) only; None: from constants only."""
        if name not in known:
            known[name] = False  # while this one is being worked out
            if re.match(r"p\d+\.", name):
                known[name] = not (
                    dtypes.get(name) == "s64" and shapes.get(name)
                )  # the batch: ids, mask, labels
            elif name in roots and roots[name] in caller:  # a called computation's root: its caller's
                known[name] = from_weights(caller[roots[name]])
            else:
                kinds = [from_weights(a) for a in operands.get(name, [])]
                known[name] = False if False in kinds else (True if True in kinds else None)
        return known[name]

    text = Path(path).read_text()
    if "(peak):" not in text:
        return {}
    section = text[text.index("(peak):") :].split("Stack trace")[0]
    groups: collections.Counter[str] = collections.Counter()
    for name, size in re.findall(r"^\s+([\w.\-]+)\{[^}]*\}: (\d+) bytes", section, re.M):
        shape = shapes.get(name, ())
        if re.match(r"p\d+\.", name):
            kind = "arguments"
        elif from_weights(name) is True:
            kind = "weight_copies"
        elif shape and shape[-1] == vocab:
            kind = "vocab_wide"
        else:
            kind = "other"
        groups[kind] += int(size)
    return dict(groups)


def measure(args: argparse.Namespace, dump_dir: str | None) -> dict:
    """In this process (XLA_FLAGS and the compile log already set): build, quantize, compile, measure."""
    from tests.xla.memory_quantized import trainer_step_memory

    t0 = time.perf_counter()
    model, config = build_llama_8b(args.layers, args.precision)
    built = time.perf_counter() - t0
    row = trainer_step_memory(
        shape_of(config),
        quantize=args.quantize,
        rows=args.batch,
        length=args.seq,
        loss_chunk_tokens=args.chunk_tokens,
        gradient_checkpointing=not args.no_checkpointing,
        precision=args.precision,
        model=model,
    )
    row["seconds"] = round(time.perf_counter() - t0, 1)
    row["build_seconds"] = round(built, 1)
    if dump_dir:
        row["peak_buffers"] = peak_buffers(dump_dir, config.vocab_size)
    return row


def in_fresh_process(args: argparse.Namespace, scheduler: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        dump = (args.dump_dir or str(Path(tmp) / "dump")) if scheduler == "memory-minimising" else ""
        flags = []
        if scheduler == "memory-minimising":
            flags = [XLA_CPU_MEMORY_SCHEDULER, f"--xla_dump_to={dump}", "--xla_dump_hlo_as_text",
                     "--xla_dump_hlo_module_re=SyncTensorsGraph.*"]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("PT_XLA_DEBUG")}
        env.update(
            PJRT_DEVICE="CPU",
            CPU_NUM_DEVICES="1",
            TF_CPP_MIN_LOG_LEVEL="2",
            PT_XLA_DEBUG_LEVEL="1",
            PT_XLA_DEBUG_FILE=str(Path(tmp) / "compile.log"),
            PYTHONPATH=str(REPO),
            XLA_FLAGS=" ".join(flags),
        )
        argv = [sys.executable, __file__, "--worker", dump, *args.passthrough]
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    lines = [line[len(_MARK) :] for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if proc.returncode or not lines:
        raise SystemExit(f"{scheduler} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return dict(json.loads(lines[-1]), scheduler=scheduler)


def report(args: argparse.Namespace, rows: list[dict]) -> str:
    gib = lambda b: f"{b / GiB:.2f}"  # noqa: E731
    lines = [
        f"Llama-3.1-8B width, {args.layers} layers; {args.quantize} base + LoRA r16 (all projections), "
        f"{args.precision}, "
        f"{'no ' if args.no_checkpointing else ''}gradient checkpointing, AdamW; batch {args.batch} x "
        f"{args.seq} tokens, loss in chunks of {args.chunk_tokens} tokens; one XLA:CPU device, compiled only",
        "",
        f"{'scheduler':<18} {'compiler GiB':>12} {'args':>6} {'temps':>6} {'estimate GiB':>12} {'est/comp':>8} "
        f"{'within 15%':>10} {'seconds':>9}",
    ]
    for r in rows:
        ratio = r["estimate"] / r["compiler"]
        lines.append(
            f"{r['scheduler']:<18} {gib(r['compiler']):>12} {gib(r['arguments']):>6} {gib(r['temporaries']):>6} "
            f"{gib(r['estimate']):>12} {ratio:>8.3f} {abs(ratio - 1) <= 0.15!s:>10} {r['seconds']:>9}"
        )
    r = rows[0]
    lines += [
        "",
        "estimate breakdown (GiB): " + ", ".join(f"{k} {gib(v)}" for k, v in r["breakdown"].items() if v),
    ]
    if r.get("peak_buffers"):
        lines.append(
            "compiler, live at the peak (memory-minimising; GiB): "
            + ", ".join(f"{k} {gib(v)}" for k, v in sorted(r["peak_buffers"].items(), key=lambda kv: -kv[1]))
        )
        b, peak = r["breakdown"], r["peak_buffers"]
        lines.append(
            "term by term (GiB, compiler vs estimate): arguments "
            f"{gib(peak.get('arguments', 0))} vs params+grads+optimizer+inputs "
            f"{gib(b['params'] + b['grads'] + b['optimizer'] + b['inputs'])}; vocab-wide {gib(peak.get('vocab_wide', 0))}"
            f" vs logits {gib(b['logits'])}; other {gib(peak.get('other', 0))} vs activations {gib(b['activations'])}"
            + (" (XLA:CPU holds bf16 intermediates in fp32)" if args.precision == "bf16" else "")
            + f"; weight copies {gib(peak.get('weight_copies', 0))} vs "
            f"dequant {gib(b['dequant'])} (XLA:CPU converts each quantized weight to fp32 outside its matmul)"
        )
        copies = r["peak_buffers"].get("weight_copies", 0)
        rest = r["compiler"] - copies
        lines.append(
            f"compiler less XLA:CPU's fp32 copies of the quantized weights: {gib(rest)} GiB; estimate / that = "
            f"{r['estimate'] / rest:.3f} (within 15%: {abs(r['estimate'] / rest - 1) <= 0.15})"
        )
    q_per_param = r["quantized_bytes"] / r["quantized_parameters"]
    adapters_and_state = 3 * 4 * r["trainable_parameters"]  # fp32 weights + two AdamW moments
    inputs = r["breakdown"]["inputs"]
    from_args = r["arguments"] - (r["base_bytes"] - r["quantized_bytes"]) - adapters_and_state - inputs
    lines += [
        "",
        f"quantized base: {r['quantized_parameters'] / 1e9:.3f}B parameters in {r['quantized_bytes'] / GiB:.3f} GiB "
        f"= {q_per_param:.4f} bytes/param (the parameters: integers + fp32 scales); "
        f"{from_args / r['quantized_parameters']:.4f} bytes/param from the program's argument bytes "
        "(less the embedding and norms, the fp32 adapters and their AdamW moments, the batch)",
        f"whole frozen base ({args.precision} embedding and norms included): {r['base_bytes'] / GiB:.3f} GiB for "
        f"{r['base_parameters'] / 1e9:.3f}B parameters = {r['base_bytes'] / r['base_parameters']:.3f} bytes/param "
        f"(estimate: {r['base_estimate_bytes'] / GiB:.3f} GiB)",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--quantize", default="int8", choices=["int8", "int4"])
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--schedulers", default="memory-minimising,default")
    parser.add_argument("--dump-dir", default=None, help="keep the memory-minimising run's XLA dump here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.passthrough = [
        f"--batch={args.batch}", f"--seq={args.seq}", f"--layers={args.layers}",
        f"--quantize={args.quantize}", f"--chunk-tokens={args.chunk_tokens}", f"--precision={args.precision}",
        *(["--no-checkpointing"] if args.no_checkpointing else []),
    ]  # fmt: skip
    if args.worker is not None:
        print(_MARK + json.dumps(measure(args, args.worker or None)), flush=True)
        return
    rows = []
    for scheduler in args.schedulers.split(","):
        rows.append(in_fresh_process(args, scheduler))
        print(f"  {scheduler}: built and compiled in {rows[-1]['seconds']} s", flush=True)
    print()
    print(report(args, rows))
    results = RESULTS if args.precision == "bf16" else RESULTS.with_name(f"memory_real_{args.precision}.json")
    results.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("passthrough", "worker", "dump_dir")}
    results.write_text(json.dumps({"args": settings, "rows": rows}, indent=1))
    print(f"\nwrote {results.relative_to(REPO)}")


if __name__ == "__main__":
    main()
