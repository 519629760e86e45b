# %% [markdown]
# # XLA Workbench — quickstart
#
# Detect the hardware, tune a config with the live panel, train a tiny causal LM with the
# dashboard watching, write a self-contained HTML report, and save the model as a checkpoint that
# `04_finetune` fine-tunes. Runs on a TPU (Colab: one v5e chip, Kaggle: v5e-8), a GPU, or a plain
# CPU (through XLA:CPU by default).

# %% shared="install"

# %% tags=["parameters"]
device_type = "auto"  # auto | tpu | cuda | xla | cpu
cpu_xla_devices = 1  # no TPU/GPU: virtual XLA:CPU devices (0: plain PyTorch on the CPU)
target = "auto"  # memory target for the panel: auto (this machine) or v5e-1, v5e-8, v6e-1, v4-8, T4, A100-40GB, H100
steps = 30
batch_size = 8
log_every = 5
max_examples = None  # cap the corpus (None: all of it)
report_html = "reports/quickstart.html"
save_dir = "checkpoints/quickstart"  # where the trained model + tokenizer are saved (None: not saved)

# %% shared="doctor"

# %% shared="xla_on_cpu"

# %% [markdown]
# ## 1. What will this run on?

# %%
from workbench import WorkbenchConfig, detect

hw = detect(device_type)
print(hw.table())

# %% [markdown]
# ## 2. Data and config
#
# The default corpus is real text shipped with Python itself; the tokenizer is trained on it and
# cached.

# %%
from workbench.data import build_datasets

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
print(f"{len(train_ds)} training sequences, {len(eval_ds)} held out, vocabulary {len(tokenizer)}")

# %% [markdown]
# ## 3. Tune it
#
# Move the sliders: the per-device memory estimate, the largest batch that fits and the bucket
# plan redraw live. The next cells train with whatever the panel shows.

# %%
from widgets import ConfigPanel

panel = ConfigPanel(cfg, target=hw if target == "auto" else target, lengths=train_ds)
panel

# %% [markdown]
# ## 4. Train with the dashboard

# %%
from widgets import Dashboard

# What the panel shows, on this machine's devices (the panel may have planned for other hardware);
# an error here means the panel's settings are not valid: fix them above and rerun this cell.
cfg = panel.config_for(hw)
dash = Dashboard(total_steps=cfg.train.steps, title="Quickstart — tiny causal LM")
dash

# %%
from workbench.train import Trainer

trainer = Trainer(cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, callbacks=[dash], hardware=hw)
result = trainer.fit()
dash.flush()
print(f"final loss {result.final_loss:.4f} | {result.tokens_per_s or 0:,.0f} tokens/s | "
      f"warm-up compiles {result.warmup_compiles} | compiles after warm-up {result.compiles_after_warmup}")
for notice in result.notices:
    print("notice:", notice)

# %% [markdown]
# ## 5. Report
#
# One HTML file with plotly.js embedded: it opens offline, on a TPU VM or anywhere else.

# %%
eval_loss = trainer.evaluate()
path = dash.export_html(report_html, title=f"Quickstart on {hw.device_kind}{' (XLA)' if hw.via_xla else ''}, {hw.num_devices} device(s)", appendix=cfg.to_yaml())
print(f"eval loss {eval_loss:.4f} (perplexity {eval_loss.perplexity:.1f}); report written to {path}")
assert result.final_loss == result.final_loss, "the loss is NaN"

# %% [markdown]
# ## 6. Save it as a pretrained checkpoint
#
# A transformers model directory (`config.json`, weights) with the tokenizer beside it: what
# `from_pretrained` loads. `04_finetune` fine-tunes it with LoRA, as it would any pretrained model.

# %%
if save_dir:
    print("checkpoint saved to", trainer.save_pretrained(save_dir))
