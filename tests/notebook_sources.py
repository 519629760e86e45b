"""The source of the six notebooks in notebooks/, kept as Python so they stay reviewable and in sync.

Regenerate the committed notebooks (no outputs) with::

    python -m tests.notebook_sources

`tests/test_notebooks.py` checks that the committed files equal what this module generates,
then executes each one with papermill at small parameters.

Every notebook has the same shape: a title, a first code cell that installs the workbench on
Colab or Kaggle when it is missing (and changes nothing elsewhere), a cell tagged
``parameters`` of flat literals, then thin cells that call `workbench` and `widgets`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"

INSTALL = """\
# Colab / Kaggle: install the workbench when it is missing. Anywhere else this cell changes nothing.
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

# Where pip gets the project on a hosted runtime; set WORKBENCH_PIP_SPEC to use a fork or a wheel.
# No `xla-cpu` extra: Colab and Kaggle TPU images ship a matched torch / torch_xla pair. `widgets`, not
# `notebook`: the running kernel needs the UI libraries only, not a second Jupyter over the runtime's own.
PIP_SPEC = os.environ.get("WORKBENCH_PIP_SPEC", "xla-workbench[widgets] @ git+https://github.com/xla-workbench/xla-workbench")

if importlib.util.find_spec("workbench") is None:
    checkout = next((p for p in (Path.cwd(), *Path.cwd().parents) if (p / "workbench" / "__init__.py").exists()), None)
    if checkout is not None:  # a clone of the repository: use it as it is
        sys.path.insert(0, str(checkout))
    elif any(k.startswith(("COLAB_", "KAGGLE_")) for k in os.environ):
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", PIP_SPEC])
    else:
        raise ModuleNotFoundError("workbench is not installed here: run `pip install -e '.[notebook]'` in the repository")
if any(k.startswith("COLAB_") for k in os.environ):
    from google.colab import output  # Colab draws third-party widgets (plotly's FigureWidget) only when asked

    output.enable_custom_widget_manager()"""

# No TPU or GPU: XLA on the CPU still shows the XLA story (compiles, shapes, SPMD meshes).
XLA_ON_CPU = """\
# Without a TPU or GPU, run XLA on the CPU (set before torch_xla starts; a TPU or GPU is used as it is).
from workbench.backend import runtime

if cpu_xla_devices and not runtime.tpu_present() and "PJRT_DEVICE" not in os.environ and not runtime.runtime_started():
    os.environ["PJRT_DEVICE"] = "CPU"
    os.environ["CPU_NUM_DEVICES"] = str(cpu_xla_devices)"""


def md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text)


def code(text: str, *tags: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(text)
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def params(text: str) -> nbformat.NotebookNode:
    return code(text, "parameters")


QUICKSTART = [
    md(
        "# XLA Workbench — quickstart\n\n"
        "Detect the hardware, tune a config with the live panel, train a tiny causal LM with the "
        "dashboard watching, and write a self-contained HTML report. Runs on a TPU (Colab: one v5e chip, "
        "Kaggle: v5e-8), a GPU, or a plain CPU (through XLA:CPU by default)."
    ),
    code(INSTALL),
    params(
        """\
device_type = "auto"  # auto | tpu | cuda | xla | cpu
cpu_xla_devices = 1  # no TPU/GPU: virtual XLA:CPU devices (0: plain PyTorch on the CPU)
target = "auto"  # memory target for the panel: auto (this machine) or v5e-1, v5e-8, v6e-1, v4-8, T4, A100-40GB, H100
steps = 30
batch_size = 8
log_every = 5
max_examples = None  # cap the corpus (None: all of it)
report_html = "reports/quickstart.html\""""
    ),
    code(XLA_ON_CPU),
    md("## 1. What will this run on?"),
    code(
        """\
from workbench import WorkbenchConfig, detect

hw = detect(device_type)
print(hw.table())"""
    ),
    md(
        "## 2. Data and config\n\nThe default corpus is real text shipped with Python itself; the tokenizer is trained on it and cached."
    ),
    code(
        """\
from workbench.data.records import build_datasets

cfg = WorkbenchConfig().with_overrides(
    {
        "train.device_type": device_type,
        "train.steps": steps,
        "train.batch_size": batch_size,
        "train.log_every": log_every,
        "train.progress_bar": False,
        "data.max_examples": max_examples,
    }
)
train_ds, eval_ds, tokenizer = build_datasets(cfg)
print(f"{len(train_ds)} training sequences, {len(eval_ds)} held out, vocabulary {len(tokenizer)}")"""
    ),
    md(
        "## 3. Tune it\n\nMove the sliders: the per-device memory estimate, the largest batch that fits and the "
        "bucket plan redraw live. The next cells train with whatever the panel shows."
    ),
    code(
        """\
from widgets import ConfigPanel

panel = ConfigPanel(cfg, target=hw if target == "auto" else target, lengths=train_ds)
panel"""
    ),
    md("## 4. Train with the dashboard"),
    code(
        """\
from widgets import Dashboard

# What the panel shows, on this machine's devices (the panel may have planned for other hardware);
# an error here means the panel's settings are not valid: fix them above and rerun this cell.
cfg = panel.config_for(hw)
dash = Dashboard(total_steps=cfg.train.steps, title="Quickstart — tiny causal LM")
dash"""
    ),
    code(
        """\
from workbench.train.trainer import Trainer

trainer = Trainer(cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, callbacks=[dash], hardware=hw)
result = trainer.fit()
dash.flush()
print(f"final loss {result.final_loss:.4f} | {result.tokens_per_s or 0:,.0f} tokens/s | "
      f"warm-up compiles {result.warmup_compiles} | compiles after warm-up {result.compiles_after_warmup}")
for notice in result.notices:
    print("notice:", notice)"""
    ),
    md(
        "## 5. Report\n\nOne HTML file with plotly.js embedded: it opens offline, on a TPU VM or anywhere else."
    ),
    code(
        """\
eval_loss = trainer.evaluate()
path = dash.export_html(report_html, title=f"Quickstart on {hw.device_kind}{' (XLA)' if hw.via_xla else ''}, {hw.num_devices} device(s)", appendix=cfg.to_yaml())
print(f"eval loss {eval_loss:.4f}; report written to {path}")
assert result.final_loss == result.final_loss, "the loss is NaN\""""
    ),
]

SHARDING = [
    md(
        "# Sharding a model over a device mesh\n\n"
        "Name the mesh axes (`data × fsdp × model`), see where every parameter goes before anything runs, "
        "shard a real model with SPMD and train it a few steps. Without a TPU this runs on 8 virtual XLA:CPU devices."
    ),
    code(INSTALL),
    params(
        """\
cpu_xla_devices = 8  # no TPU/GPU: virtual XLA:CPU devices to build the mesh on
data = 2
fsdp = 2
model_parallel = 2
hidden_size = 64
num_layers = 2
steps = 6
max_examples = None  # cap the corpus (None: all of it)
max_buckets = 4"""
    ),
    code(XLA_ON_CPU),
    code(
        """\
from workbench import WorkbenchConfig, detect
from workbench.parallel.mesh import MeshSpec, mesh_preset

hw = detect("xla") if runtime.xla_installed() else detect()
requested = MeshSpec(data=data, fsdp=fsdp, model=model_parallel)
# The requested mesh when it matches the devices; otherwise the preset for this hardware. None
# without torch_xla driving the devices: only XLA's SPMD applies a mesh.
matches = hw.via_xla and requested.num_devices == hw.num_devices
spec = mesh_preset(hw, requested if matches else None)
print(hw.device_kind, hw.num_devices, "device(s); mesh:", spec)"""
    ),
    md(
        "## The plan, before anything runs\n\nPure Python, shapes only: it works for any mesh size, even one this machine does not have."
    ),
    code(
        """\
from workbench.models.build import build_model
from workbench.parallel.plan import plan_sharding
from workbench.parallel.rules import rules_for

cfg = WorkbenchConfig().with_overrides({"model.hidden_size": hidden_size, "model.num_layers": num_layers})
model = build_model(cfg.model)
params = [(name, tuple(p.shape), p.dtype) for name, p in model.named_parameters()]
plan = plan_sharding(params, requested.axis_sizes, rules_for(model))
print(plan.table())"""
    ),
    code(
        """\
from widgets import mesh_view

mesh_view(plan)"""
    ),
    md("## Shard the real model with SPMD and train a few steps"),
    code(
        """\
from workbench.train.trainer import Trainer

if spec is not None:
    run_cfg = cfg.with_overrides(
        {
            "mesh.enabled": True,
            "mesh.data": spec.data,
            "mesh.fsdp": spec.fsdp,
            "mesh.model": spec.model,
            "train.device_type": hw.device_string,  # "xla": a mesh exists only under XLA
            "train.steps": steps,
            "train.log_every": max(1, steps // 2),
            "train.batch_size": 2 * spec.dp_size,  # two sequences per data-parallel shard
            "train.progress_bar": False,
            "data.max_examples": max_examples,
            "bucketing.max_buckets": max_buckets,
        }
    )
    trainer = Trainer(run_cfg, hardware=hw)
    print(trainer.sharding_report.table(max_rows=12))
    result = trainer.fit()
    print(f"loss {result.final_loss:.4f}; compiles after warm-up: {result.compiles_after_warmup}")
else:
    print("one device: nothing to shard; the plan above shows what a mesh would do")"""
    ),
    code(
        """\
if spec is not None:
    display(mesh_view(trainer.sharding_report))
    assert trainer.sharding_report.bytes_per_device <= trainer.sharding_report.total_bytes"""
    ),
]

BUCKETING = [
    md(
        "# Sequence-length bucketing\n\n"
        "XLA compiles one program per input shape. Padding every batch to its own longest sequence compiles "
        "a program for nearly every batch; padding everything to the maximum wastes compute on padding. "
        "A few planned buckets keep both small: compare the strategies, then train with them."
    ),
    code(INSTALL),
    params(
        """\
cpu_xla_devices = 1  # no TPU/GPU: virtual XLA:CPU devices (0: plain PyTorch on the CPU)
max_buckets = 4
multiple_of = 8
max_length = 256
max_examples = None
steps = 12
batch_size = 8"""
    ),
    code(XLA_ON_CPU),
    code(
        """\
from workbench import WorkbenchConfig, detect
from workbench.data.records import build_datasets

hw = detect()
cfg = WorkbenchConfig().with_overrides(
    {"data.max_length": max_length, "data.max_examples": max_examples, "bucketing.max_buckets": max_buckets,
     "bucketing.multiple_of": multiple_of, "train.batch_size": batch_size, "train.steps": steps,
     "train.log_every": max(1, steps // 3), "train.progress_bar": False}
)
train_ds, eval_ds, tokenizer = build_datasets(cfg)
lengths = train_ds["length"]
print(f"{len(lengths)} sequences, lengths {min(lengths)}..{max(lengths)}")"""
    ),
    md("## Plans compared: padding efficiency against compiled shapes"),
    code(
        """\
from workbench.data.buckets import plan_buckets

rows = []
for strategy in ("max", "pow2", "multiple", "quantile", "optimal"):
    plan = plan_buckets(lengths, max_buckets, multiple_of=multiple_of, max_length=max_length, strategy=strategy)
    rows.append((strategy, plan.num_shapes, f"{100 * plan.efficiency:.1f}%", plan.boundaries))
print(f"{'strategy':<10} {'shapes':>6} {'efficiency':>10}  boundaries")
for strategy, shapes, eff, bounds in rows:
    print(f"{strategy:<10} {shapes:>6} {eff:>10}  {bounds}")"""
    ),
    md("The panel shows the same plan live: move *Buckets* and watch the boundaries and the efficiency."),
    code(
        """\
from widgets import ConfigPanel

panel = ConfigPanel(cfg, target=hw, lengths=lengths)
panel"""
    ),
    md(
        "## Train with buckets, then padded to the maximum: compiles and throughput\n\n"
        "Compiled programs are cached per process, so the second run reuses the (batch, max_length) "
        "program the first one compiled."
    ),
    code(
        """\
from workbench.train.trainer import Trainer

results = {}
for strategy in ("optimal", "max"):
    run_cfg = cfg.with_overrides({"bucketing.strategy": strategy})
    trainer = Trainer(run_cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, hardware=hw)
    results[strategy] = trainer.fit()
for strategy, r in results.items():
    print(f"{strategy:<8} loss {r.final_loss:.4f}  {r.tokens_per_s or 0:>10,.0f} tokens/s  "
          f"warm-up compiles {r.warmup_compiles}  after warm-up {r.compiles_after_warmup}")"""
    ),
]

MEMORY = [
    md(
        "# Memory and profiling\n\n"
        "Will it fit? The estimator adds up parameters, gradients, optimizer state, activations and logits per "
        "device, before anything compiles. Then a short run with the step profiler: tokens/s, MFU where the "
        "chip's peak is known, compiles, and advice."
    ),
    code(INSTALL),
    params(
        """\
cpu_xla_devices = 1  # no TPU/GPU: virtual XLA:CPU devices (0: plain PyTorch on the CPU)
seq_len = 1024
batch_sizes = [1, 8, 32]
seq_lens = [256, 1024, 4096]
steps = 20
log_every = 5
max_examples = None  # cap the corpus (None: all of it)"""
    ),
    code(XLA_ON_CPU),
    md("## A 1B-parameter Llama shape on the common targets"),
    code(
        """\
from widgets.config_panel import MODEL_PRESETS, TARGETS
from workbench import WorkbenchConfig, detect

# The presets leave the vocabulary to the tokenizer a run trains with; the real model's is 128256.
shape = {**MODEL_PRESETS["Llama-3.2-1B shape"], "vocab_size": 128256}
big = WorkbenchConfig().with_overrides({f"model.{k}": v for k, v in shape.items()}).model
est = estimate(big, batch_size=8, seq_len=seq_len, precision="bf16-mixed")
print(est.table())
print()
targets = {name: TARGETS[name] for name in ("v5e-1", "v5e-8", "v6e-1", "v4-8", "T4", "A100-40GB", "H100")}
rows = fit_across_targets(big, targets, batch_size=8, seq_len=seq_len, precision="bf16-mixed")
print(format_table(rows))"""
    ),
    code(
        """\
rows = estimate_table(big, batch_sizes, seq_lens, memory_bytes=TARGETS["v5e-1"].memory_per_device_bytes,
                             precision="bf16-mixed", gradient_checkpointing=True)
print(format_table(rows))"""
    ),
    md(
        "## Profile a loop that recompiles\n\n"
        "A hand-written loop that feeds each sequence at its own length: every new length is a new XLA "
        "program. The step profiler sees it (host-side counters only, no extra syncs) and says what to change."
    ),
    code(
        """\
import torch

from widgets import Dashboard
from workbench.data.records import build_datasets
from workbench.models.build import build_model
from workbench.analysis.profiler import StepProfiler
from workbench.analysis.flops import training_flops_per_token

hw = detect()
cfg = WorkbenchConfig().with_overrides(
    {"train.steps": steps, "train.log_every": log_every, "train.progress_bar": False, "data.max_examples": max_examples}
)
train_ds, eval_ds, tokenizer = build_datasets(cfg)
naive = Dashboard(total_steps=steps, title="Unbucketed loop: a new program for every length")
naive"""
    ),
    code(
        """\
device = runtime.device() if hw.via_xla else torch.device(hw.backend)
model = build_model(cfg.model, vocab_size=len(tokenizer)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.learning_rate)
flops = training_flops_per_token(model.config, cfg.data.max_length)
profiler = StepProfiler(hw, flops_per_token=flops, log_every=log_every, warmup_steps=2)
for example in train_ds.select(range(steps)):
    ids = torch.tensor([example["input_ids"][: cfg.data.max_length]], device=device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if hw.via_xla:
        runtime.sync()
    metrics = profiler.step(ids.numel(), loss=loss)  # reads the loss only at log steps
    if metrics is not None:
        naive(metrics)
naive.flush()  # draw the points that arrived inside the last throttle interval
for advice in profiler.advice():
    print("-", advice)"""
    ),
    md("## The same model with the workbench's loop: bucketed, pre-compiled, no recompilation"),
    code(
        """\
from workbench.train.trainer import Trainer

dash = Dashboard(total_steps=steps, title="Workbench loop: bucketed and pre-compiled")
dash"""
    ),
    code(
        """\
result = Trainer(cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, callbacks=[dash], hardware=hw).fit()
print(f"{flops / 1e6:.2f} MFLOP per token; {result.tokens_per_s or 0:,.0f} tokens/s; "
      f"compiles after warm-up {result.compiles_after_warmup}")
est = estimate(cfg.model, batch_size=cfg.train.batch_size, seq_len=cfg.data.max_length,
                      precision=cfg.train.precision, optimizer=cfg.train.optimizer)
print(f"estimated {est.total_bytes / 2**20:.1f} MiB per device for this run")"""
    ),
]

FINETUNE = [
    md(
        "# Supervised fine-tuning on chat records\n\n"
        "Fine-tune a causal LM on chat-style records (prompt → response) with the prompt tokens masked out of "
        "the loss. By default a tiny Qwen2-shaped model learns the chat records shipped with the project; "
        "point `model_dir` at a local Hugging Face model directory (e.g. Qwen2.5-0.5B-Instruct) and `dataset` "
        "at a local JSONL/Parquet file (e.g. HelpSteer2) for real use."
    ),
    code(INSTALL),
    params(
        """\
model_dir = None  # local directory with config.json + weights (and tokenizer); None: a tiny model from scratch
dataset = "chat-sample"  # "chat-sample" (shipped) or a local .jsonl / .json / .parquet / .csv path
cpu_xla_devices = 1  # no TPU/GPU: virtual XLA:CPU devices (0: plain PyTorch on the CPU)
family = "qwen2"
hidden_size = 64
num_layers = 2
max_length = 256
steps = 20
batch_size = 4
learning_rate = 0.003
log_every = 5
save_dir = None  # where to save the fine-tuned model and tokenizer (None: do not save)"""
    ),
    code(XLA_ON_CPU),
    code(
        """\
from workbench import WorkbenchConfig, detect
from workbench.data.records import build_datasets

hw = detect()
cfg = WorkbenchConfig().with_overrides(
    {"model.family": family, "model.hidden_size": hidden_size, "model.num_layers": num_layers,
     "model.pretrained_path": model_dir, "data.tokenizer_path": model_dir, "data.source": dataset,
     "data.chat": True, "data.max_length": max_length, "train.steps": steps, "train.batch_size": batch_size,
     "train.learning_rate": learning_rate, "train.log_every": log_every, "train.progress_bar": False}
)
train_ds, eval_ds, tokenizer = build_datasets(cfg)
example = train_ds[0]
answer = [t for t, label in zip(example["input_ids"], example["labels"]) if label != -100]
print(f"{len(train_ds)} conversations; the first has {example['length']} tokens, {len(answer)} of them trained on:")
print(repr(tokenizer.decode(answer)[:300]))"""
    ),
    code(
        """\
from widgets import Dashboard
from workbench.train.trainer import Trainer

dash = Dashboard(total_steps=steps, title="Supervised fine-tuning")
dash"""
    ),
    code(
        """\
trainer = Trainer(cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, callbacks=[dash], hardware=hw)
before = trainer.evaluate()
result = trainer.fit()
after = trainer.evaluate()
print(f"eval loss on held-out conversations: {before:.4f} -> {after:.4f}")"""
    ),
    md("## Ask it something"),
    code(
        """\
import torch

model = trainer.model.to("cpu").eval()
messages = [{"role": "user", "content": "How do I reverse a list in Python?"}]
prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
with torch.no_grad():
    out = model.generate(prompt, max_new_tokens=32, do_sample=False, pad_token_id=tokenizer.pad_token_id)
reply = tokenizer.decode(out[0, prompt.shape[1]:], skip_special_tokens=True)
print(f"reply after {steps} steps: {reply!r}")  # a tiny model trained for seconds: expect noise
if save_dir:
    model.save_pretrained(save_dir)
    tokenizer.save_pretrained(save_dir)
    print("saved to", save_dir)"""
    ),
]

DISTILLATION = [
    md(
        "# Knowledge distillation\n\n"
        "A small student learns from a larger teacher's softened next-token distribution (KL at temperature T) "
        "mixed with the ordinary cross-entropy. Here the teacher is trained first for a few steps; point "
        "`teacher_dir` at a local model directory to distil a real one (same tokenizer)."
    ),
    code(INSTALL),
    params(
        """\
teacher_dir = None  # local model directory for the teacher; None: train a small teacher here first
cpu_xla_devices = 1  # no TPU/GPU: virtual XLA:CPU devices (0: plain PyTorch on the CPU)
teacher_hidden = 128
teacher_layers = 4
student_hidden = 64
student_layers = 2
teacher_steps = 30
steps = 20
alpha = 0.5
temperature = 2.0
log_every = 5
max_examples = None  # cap the corpus (None: all of it)
max_buckets = 4"""
    ),
    code(XLA_ON_CPU),
    code(
        """\
from workbench import WorkbenchConfig, detect
from workbench.data.records import build_datasets
from workbench.train.trainer import Trainer

hw = detect()
base = WorkbenchConfig().with_overrides(
    {"train.log_every": log_every, "train.progress_bar": False, "data.max_examples": max_examples,
     "bucketing.max_buckets": max_buckets}
)
train_ds, eval_ds, tokenizer = build_datasets(base)
teacher_cfg = base.with_overrides(
    {"model.hidden_size": teacher_hidden, "model.num_layers": teacher_layers, "model.intermediate_size": 4 * teacher_hidden,
     "model.pretrained_path": teacher_dir, "train.steps": teacher_steps}
)
teacher_trainer = Trainer(teacher_cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, hardware=hw)
if teacher_dir is None:
    teacher_trainer.fit()
teacher_loss = teacher_trainer.evaluate()
print(f"teacher eval loss {teacher_loss:.4f}")"""
    ),
    code(
        """\
from widgets import Dashboard

dash = Dashboard(total_steps=steps, title="Distillation: student learning from the teacher")
dash"""
    ),
    code(
        """\
student_cfg = base.with_overrides(
    {"model.hidden_size": student_hidden, "model.num_layers": student_layers, "model.intermediate_size": 2 * student_hidden,
     "train.steps": steps, "train.distill_alpha": alpha, "train.distill_temperature": temperature}
)
teacher = teacher_trainer.model
student = Trainer(student_cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds,
                  callbacks=[dash], hardware=hw, teacher=teacher)
result = student.fit()
student_loss = student.evaluate()
print(f"student eval loss {student_loss:.4f} (teacher {teacher_loss:.4f}); "
      f"compiles after warm-up {result.compiles_after_warmup}")"""
    ),
]

NOTEBOOKS: dict[str, list[nbformat.NotebookNode]] = {
    "00_quickstart": QUICKSTART,
    "01_sharding": SHARDING,
    "02_bucketing": BUCKETING,
    "03_memory_and_profiling": MEMORY,
    "04_finetune": FINETUNE,
    "05_distillation": DISTILLATION,
}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook `name` as committed: no outputs, no execution counts, a python3 kernel."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.from_dict(dict(cell)) for cell in NOTEBOOKS[name]]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{name[:2]}-{i:02d}"  # stable ids: regenerating changes nothing
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "accelerator": "TPU",
    }
    return nb


def render(name: str) -> str:
    return nbformat.writes(build(name)) + "\n"


def main() -> int:
    NOTEBOOK_DIR.mkdir(exist_ok=True)
    for name in NOTEBOOKS:
        path = NOTEBOOK_DIR / f"{name}.ipynb"
        path.write_text(render(name))
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
