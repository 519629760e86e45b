# %% [markdown]
# # Preference tuning with DPO
#
# The job: teach a model which of two answers people prefer. Each record is a prompt with a
# `chosen` and a `rejected` answer; direct preference optimisation (DPO) raises the chosen
# answer's log-probability and lowers the rejected one's, measured against a reference model (the
# model the run starts from), with no reward model and no sampling in the loop. The shipped
# `preference-sample` holds 120 pairs about Python's standard library: chosen answers polite and
# on topic, rejected ones curt or off topic.
#
# By default a tiny model is built from scratch with fresh LoRA adapters: the reference is the
# same weights with the adapters switched off (`train.dpo_reference: auto` picks `adapters_off`).
# Point `adapter_dir` at an SFT adapter, such as the one `04_finetune` saves
# (`checkpoints/finetune-adapter`), to tune that adapter further: the reference is then the
# adapter's model, its log-probs computed once before training (`precompute`). The dashboard adds
# reward accuracy (the share of pairs whose chosen answer gets the higher reward), reward margin and
# the chosen and rejected log-probs to its panels.

# %% shared="install"

# %% tags=["parameters"]
adapter_dir = None  # an SFT LoRA adapter to tune further (e.g. "checkpoints/finetune-adapter"); None: a tiny model from scratch
dataset = "preference-sample"  # shipped pairs, or a local .jsonl / .json / .parquet / .csv of prompt/chosen/rejected
cpu_xla_devices = 1  # no TPU/GPU: virtual XLA:CPU devices (0: plain PyTorch on the CPU)
family = "qwen2"  # the model built from scratch when adapter_dir is None (ignored otherwise)
hidden_size = 64
num_layers = 2
max_length = 256
lora_rank = 8  # with adapter_dir: the adapter's own rank (04_finetune trains rank 8)
lora_alpha = 16.0  # with adapter_dir: the adapter's own alpha (04_finetune: 16.0)
beta = 0.1  # the pull towards the reference (train.dpo_beta)
dpo_loss = "sigmoid"  # "sigmoid" (DPO) or "ipo"
reference = "auto"  # "auto", "adapters_off", "copy" or "precompute" (train.dpo_reference)
steps = 20
batch_size = 4  # pairs per step: each pair is two rows, chosen and rejected
learning_rate = 0.005
log_every = 5
eval_every = 10  # held-out reward accuracy and margin on the dashboard every this many steps (0: none)
max_new_tokens = 32
out_dir = "checkpoints/preference-adapter"  # the tuned LoRA adapter (None: not saved)

# %% shared="doctor"

# %% shared="xla_on_cpu"

# %%
from pathlib import Path

if adapter_dir and not Path(adapter_dir, "adapter_config.json").is_file():
    raise FileNotFoundError(
        f"adapter_dir={adapter_dir!r} is not a LoRA adapter directory (no adapter_config.json in "
        f"{Path(adapter_dir).resolve()}): run 04_finetune first (it saves its adapter there), point "
        "adapter_dir at your own, or set adapter_dir=None to tune a tiny model built from scratch"
    )

# %% [markdown]
# ## The pairs
#
# Each pair becomes two sequences, prompt + chosen answer and prompt + rejected answer, trained on
# the answer's tokens only. They travel on adjacent rows of one batch, padded to the bucket of the
# longer one, so the compiled shapes are the bucket plan's, as for SFT.

# %%
from workbench import WorkbenchConfig, detect
from workbench.data import build_datasets

hw = detect()
cfg = WorkbenchConfig().with_overrides(
    {"model.family": family, "model.hidden_size": hidden_size, "model.num_layers": num_layers,
     "model.pretrained_path": adapter_dir, "data.tokenizer_path": adapter_dir, "data.source": dataset,
     "data.chat": True, "data.max_length": max_length, "lora.rank": lora_rank, "lora.alpha": lora_alpha,
     "train.objective": "dpo", "train.dpo_beta": beta, "train.dpo_loss": dpo_loss, "train.dpo_reference": reference,
     "train.steps": steps, "train.batch_size": batch_size, "train.learning_rate": learning_rate,
     "train.log_every": log_every, "train.eval_every": eval_every, "train.progress_bar": False}
)
train_ds, eval_ds, tokenizer = build_datasets(cfg)
pair = train_ds[0]
chosen = [t for t, label in zip(pair["input_ids"], pair["labels"]) if label != -100]
rejected = [t for t, label in zip(pair["rejected_input_ids"], pair["rejected_labels"]) if label != -100]
print(f"{len(train_ds)} pairs to train on, {len(eval_ds)} held out; the first pair's answers:")
print(f"  chosen:   {tokenizer.decode(chosen)[:200]!r}\n  rejected: {tokenizer.decode(rejected)[:200]!r}")

# %%
from widgets import Dashboard
from workbench.train import Trainer

dash = Dashboard(total_steps=steps, title=f"DPO with LoRA (rank {lora_rank}, beta {beta})", preference=True)
trainer = Trainer(cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, callbacks=[dash], hardware=hw)
trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
total = sum(p.numel() for p in trainer.model.parameters())
print(f"{adapter_dir or 'a tiny ' + family + ' from scratch'}: training {trainable:,} of {total:,} parameters "
      f"(LoRA rank {lora_rank}) on {hw.device_kind}")
print("\n".join(n for n in trainer.notices if n.startswith("DPO reference")))  # which reference, and why

# %% [markdown]
# ## Before: ask it something
#
# At the start the policy is the reference, so every reward (beta x the policy's log-prob minus the
# reference's) is 0 or nearly: the DPO loss is log 2 = 0.693 and no pair is won yet.

# %%
from workbench.data import chat_token_ids
from workbench.generate import generate

questions = ["What does `os.path.join` do?", "Briefly, how does `heapq.heappush` behave?"]
prompts = [chat_token_ids(tokenizer, [{"role": "user", "content": q}], add_generation_prompt=True) for q in questions]
sample = generate(trainer.model, prompts, max_new_tokens=max_new_tokens, tokenizer=tokenizer)
before = trainer.evaluate()
for q, reply in zip(questions, sample.texts):
    print(f"{q}\n  -> {reply!r}")
print(f"held-out pairs: DPO loss {before:.4f}, reward accuracy {before.stats['reward_accuracy']:.0%}, "
      f"margin {before.stats['reward_margin']:.4f}")

# %% [markdown]
# ## Tune, with the dashboard watching
#
# The loss panel shows the DPO loss; below it, reward accuracy and margin (train line, held-out
# diamonds) and the policy's log-probs of the chosen and rejected answers, which should part.

# %%
dash

# %%
result = trainer.fit()
dash.flush()
after = trainer.evaluate()
print(f"held-out pairs after {result.steps} steps:")
for name in ("reward_accuracy", "reward_margin", "chosen_logp", "rejected_logp"):
    print(f"  {name:<16} {before.stats[name]:10.4f} -> {after.stats[name]:10.4f}")
print(f"  {'DPO loss':<16} {before:10.4f} -> {after:10.4f}")
print(f"compiles after warm-up: {result.compiles_after_warmup}")

# %% [markdown]
# ## After: the same questions

# %%
sample = generate(trainer.model, prompts, max_new_tokens=max_new_tokens, tokenizer=tokenizer)
for q, reply in zip(questions, sample.texts):
    print(f"{q}\n  -> {reply!r}")  # a tiny model trained for seconds: expect noise

# %% [markdown]
# ## Save the adapter
#
# An adapter directory like the one `04_finetune` writes (`adapter_config.json` + the adapters'
# weights, the tokenizer beside them): `python -m workbench generate --model <out_dir>` samples
# from it, and a later run continues it with `model.pretrained_path=<out_dir>`.

# %%
if out_dir:
    print("adapter saved to", trainer.save_pretrained(out_dir))
