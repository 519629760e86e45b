# %% [markdown]
# # Memory and profiling
#
# Will it fit? The estimator adds up parameters, gradients, optimizer state, activations and
# logits per device, before anything compiles. Then a short run with the step profiler: tokens/s,
# MFU where the chip's peak is known, compiles, and advice.

# %% shared="install"

# %% tags=["parameters"]
cpu_xla_devices = 1  # no TPU/GPU: virtual XLA:CPU devices (0: plain PyTorch on the CPU)
seq_len = 1024
batch_sizes = [1, 8, 32]
seq_lens = [256, 1024, 4096]
steps = 20
log_every = 5
max_examples = None  # cap the corpus (None: all of it)

# %% shared="doctor"

# %% shared="xla_on_cpu"

# %% [markdown]
# ## A 1B-parameter Llama shape on the common targets

# %%
from workbench import WorkbenchConfig, detect
from workbench.analysis import estimate, estimate_table, fit_across_targets, format_table
from workbench.backend.targets import TARGETS
from workbench.models.presets import MODEL_PRESETS

# The presets leave the vocabulary to the tokenizer a run trains with; the real model's is 128256.
shape = {**MODEL_PRESETS["Llama-3.2-1B shape"], "vocab_size": 128256}
big = WorkbenchConfig().with_overrides({f"model.{k}": v for k, v in shape.items()}).model
est = estimate(big, batch_size=8, seq_len=seq_len, precision="bf16-mixed")
print(est.table())
print()
targets = {name: TARGETS[name] for name in ("v5e-1", "v5e-8", "v6e-1", "v4-8", "T4", "A100-40GB", "H100")}
rows = fit_across_targets(big, targets, batch_size=8, seq_len=seq_len, precision="bf16-mixed")
print(format_table(rows))

# %%
rows = estimate_table(big, batch_sizes, seq_lens, memory_bytes=TARGETS["v5e-1"].memory_per_device_bytes,
                      precision="bf16-mixed", gradient_checkpointing=True)
print(format_table(rows))

# %% [markdown]
# ## Profile a loop that recompiles
#
# A hand-written loop that feeds each sequence at its own length: every new length is a new XLA
# program. The step profiler sees it (host-side counters only, no extra syncs) and says what to
# change.

# %%
import torch

from widgets import Dashboard
from workbench.analysis import StepProfiler
from workbench.analysis.flops import training_flops_per_token
from workbench.backend.compile_cache import enable_compile_cache
from workbench.backend.xla import compile_log
from workbench.data import build_datasets
from workbench.models import build_model

hw = detect()
cfg = WorkbenchConfig().with_overrides(
    {"train.steps": steps, "train.log_every": log_every, "train.progress_bar": False, "data.max_examples": max_examples}
)
# Before any XLA compile: torch_xla's own analysis of each compile (why the loop below recompiles, and
# where), and the persistent compilation cache (on a TPU, compiles kept for the next session).
compile_log.start_run_log(hw.via_xla)
enable_compile_cache(cfg.train.compile_cache_dir, hw)
train_ds, eval_ds, tokenizer = build_datasets(cfg)
naive = Dashboard(total_steps=steps, title="Unbucketed loop: a new program for every length")
naive

# %%
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
    metrics = profiler.step(ids.numel(), loss=loss, inputs={"input_ids": ids})  # loss read at log steps only
    if metrics is not None:
        naive(metrics)
naive.flush()  # draw the points that arrived inside the last throttle interval
for advice in profiler.advice():
    print("-", advice)

# %% [markdown]
# ## The same model with the workbench's loop: bucketed, pre-compiled, no recompilation

# %%
from workbench.train import Trainer

dash = Dashboard(total_steps=steps, title="Workbench loop: bucketed and pre-compiled")
dash

# %%
result = Trainer(cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, callbacks=[dash], hardware=hw).fit()
print(f"{flops / 1e6:.2f} MFLOP per token; {result.tokens_per_s or 0:,.0f} tokens/s; "
      f"compiles after warm-up {result.compiles_after_warmup}")
est = estimate(cfg.model, batch_size=cfg.train.batch_size, seq_len=cfg.data.max_length,
               precision=cfg.train.precision, optimizer=cfg.train.optimizer, quantize=cfg.model.quantize,
               loss_chunk_tokens=cfg.train.loss_chunk_tokens, memory_bytes=hw.memory_per_device_bytes)
print(f"estimated {est.total_bytes / 2**20:.1f} MiB per device for this run")
