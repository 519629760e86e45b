# %% [markdown]
# # Sequence-length bucketing
#
# XLA compiles one program per input shape. Padding every batch to its own longest sequence
# compiles a program for nearly every batch; padding everything to the maximum wastes compute on
# padding. A few planned buckets keep both small: compare the strategies, then train with them.

# %% shared="install"

# %% tags=["parameters"]
cpu_xla_devices = 1  # no TPU/GPU: virtual XLA:CPU devices (0: plain PyTorch on the CPU)
max_buckets = 4
multiple_of = 8
max_length = 256
max_examples = None
steps = 12
batch_size = 8

# %% shared="doctor"

# %% shared="xla_on_cpu"

# %%
from workbench import WorkbenchConfig, detect
from workbench.data import build_datasets

hw = detect()
cfg = WorkbenchConfig().with_overrides(
    {"data.max_length": max_length, "data.max_examples": max_examples, "bucketing.max_buckets": max_buckets,
     "bucketing.multiple_of": multiple_of, "train.batch_size": batch_size, "train.steps": steps,
     "train.log_every": max(1, steps // 3), "train.progress_bar": False}
)
train_ds, eval_ds, tokenizer = build_datasets(cfg)
lengths = train_ds["length"]
print(f"{len(lengths)} sequences, lengths {min(lengths)}..{max(lengths)}")

# %% [markdown]
# ## Plans compared: padding efficiency against compiled shapes

# %%
from workbench.data import plan_buckets

rows = []
for strategy in ("max", "pow2", "multiple", "quantile", "optimal"):
    plan = plan_buckets(lengths, max_buckets, multiple_of=multiple_of, max_length=max_length, strategy=strategy)
    rows.append((strategy, plan.num_shapes, f"{100 * plan.efficiency:.1f}%", plan.boundaries))
print(f"{'strategy':<10} {'shapes':>6} {'efficiency':>10}  boundaries")
for strategy, shapes, eff, bounds in rows:
    print(f"{strategy:<10} {shapes:>6} {eff:>10}  {bounds}")

# %% [markdown]
# The panel shows the same plan live: move *Buckets* and watch the boundaries and the efficiency.

# %%
from widgets import ConfigPanel

panel = ConfigPanel(cfg, target=hw, lengths=lengths)
panel

# %% [markdown]
# ## Train with buckets, then padded to the maximum: compiles and throughput
#
# Compiled programs are cached per process, so the second run reuses the (batch, max_length)
# program the first one compiled.

# %%
from workbench.train import Trainer

results = {}
for strategy in ("optimal", "max"):
    run_cfg = cfg.with_overrides({"bucketing.strategy": strategy})
    trainer = Trainer(run_cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, hardware=hw)
    results[strategy] = trainer.fit()
for strategy, r in results.items():
    print(f"{strategy:<8} loss {r.final_loss:.4f}  {r.tokens_per_s or 0:>10,.0f} tokens/s  "
          f"warm-up compiles {r.warmup_compiles}  after warm-up {r.compiles_after_warmup}")
