# %% [markdown]
# # Fine-tune a pretrained checkpoint with LoRA
#
# The job: take a pretrained checkpoint, fine-tune it with LoRA on your own chat records (prompt
# tokens masked out of the loss), watch it train, sample from it, save it. By default the
# checkpoint is the one `00_quickstart` saves (`checkpoints/quickstart`): there is no model hub
# here, so the quickstart's model stands in for a pretrained one. For real use point `model_dir`
# at a local Hugging Face model directory (e.g. Qwen2.5-0.5B-Instruct) and `dataset` at a local
# JSONL/Parquet file (e.g. HelpSteer2).
#
# `quantize="int8"` (or `"int4"`) keeps the frozen base as integers under the adapters (the QLoRA
# recipe, on TPUs too): that is how an 8B checkpoint fine-tunes on one 16 GB chip. The estimate
# below says what it saves before anything is placed on the device.

# %% shared="install"

# %% tags=["parameters"]
model_dir = "checkpoints/quickstart"  # a checkpoint (config.json, weights, tokenizer); None: a tiny model from scratch
dataset = "chat-sample"  # "chat-sample" (shipped) or a local .jsonl / .json / .parquet / .csv path
cpu_xla_devices = 1  # no TPU/GPU: virtual XLA:CPU devices (0: plain PyTorch on the CPU)
family = "qwen2"  # the model built from scratch when model_dir is None (ignored otherwise)
hidden_size = 64
num_layers = 2
max_length = 256
lora_rank = 8  # rank of the LoRA adapters (0: train every weight)
lora_alpha = 16.0  # adapter scale: the update is multiplied by lora_alpha / lora_rank
quantize = "none"  # the frozen base: "none" (training precision), "int8" or "int4" (needs lora_rank >= 1)
steps = 20
batch_size = 4
learning_rate = 0.01  # LoRA adapters take a larger rate than full fine-tuning
log_every = 5
max_new_tokens = 32
adapter_dir = "checkpoints/finetune-adapter"  # the LoRA adapter (None: not saved)
merged_dir = "checkpoints/finetune-merged"  # the base with the adapters merged in: a full checkpoint (None: not saved)

# %% shared="doctor"

# %% shared="xla_on_cpu"

# %%
from pathlib import Path

if model_dir and not Path(model_dir, "config.json").is_file():
    raise FileNotFoundError(
        f"model_dir={model_dir!r} is not a checkpoint directory (no config.json in {Path(model_dir).resolve()}): "
        "run 00_quickstart first (it saves its trained model there), point model_dir at a local model "
        "directory, or set model_dir=None to fine-tune a tiny model built from scratch"
    )

# %%
from workbench import WorkbenchConfig, detect
from workbench.data import build_datasets

hw = detect()
cfg = WorkbenchConfig().with_overrides(
    {"model.family": family, "model.hidden_size": hidden_size, "model.num_layers": num_layers,
     "model.pretrained_path": model_dir, "data.tokenizer_path": model_dir, "data.source": dataset,
     "data.chat": True, "data.max_length": max_length, "lora.rank": lora_rank, "lora.alpha": lora_alpha,
     "model.quantize": quantize, "train.steps": steps, "train.batch_size": batch_size, "train.learning_rate": learning_rate,
     "train.log_every": log_every, "train.progress_bar": False}
)
train_ds, eval_ds, tokenizer = build_datasets(cfg)
example = train_ds[0]
answer = [t for t, label in zip(example["input_ids"], example["labels"]) if label != -100]
print(f"{len(train_ds)} conversations; the first has {example['length']} tokens, {len(answer)} of them trained on:")
print(repr(tokenizer.decode(answer)[:300]))

# %%
from workbench.analysis import estimate

def memory(mode: str) -> float:
    est = estimate(cfg.model, batch_size=batch_size, seq_len=max_length, precision=cfg.train.precision,
                   lora_rank=lora_rank, quantize=mode, memory_bytes=hw.memory_per_device_bytes)
    return est.total_bytes / 2**20

print("estimated MiB per device for one step:",
      ", ".join(f"{mode} base {memory(mode):,.1f}" for mode in ("none", "int8", "int4") if lora_rank or mode == "none"))

# %%
from widgets import Dashboard
from workbench.train import Trainer

dash = Dashboard(total_steps=steps, title=f"LoRA fine-tuning (rank {lora_rank})")  # displayed below
trainer = Trainer(cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, callbacks=[dash], hardware=hw)
trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
total = sum(p.numel() for p in trainer.model.parameters())
print(f"{model_dir or 'a tiny ' + family + ' from scratch'}: training {trainable:,} of {total:,} parameters "
      f"(LoRA rank {lora_rank}, base {quantize}) on {hw.device_kind}")
print("\n".join(n for n in trainer.notices if n.startswith("model.quantize")))  # what was quantized

# %% [markdown]
# ## Before: ask it something
#
# `generate` samples on the device the model trains on, with a static KV cache and prompts padded
# to buckets: a fixed set of compiled programs, reused after training.

# %%
from workbench.data import chat_token_ids
from workbench.generate import generate

questions = ["How do I reverse a list in Python?", "What does os.path.join do?"]
prompts = [chat_token_ids(tokenizer, [{"role": "user", "content": q}], add_generation_prompt=True) for q in questions]
sample = generate(trainer.model, prompts, max_new_tokens=max_new_tokens, tokenizer=tokenizer)
before = trainer.evaluate()
for q, reply in zip(questions, sample.texts):
    print(f"{q}\n  -> {reply!r}")
print(f"eval loss {before:.4f}, perplexity {before.perplexity:.1f} | sampled {sample.new_tokens} tokens "
      f"at {sample.tokens_per_s:,.0f} tokens/s, {sample.compiles} compiles")

# %% [markdown]
# ## Fine-tune, with the dashboard watching

# %%
dash

# %%
result = trainer.fit()
dash.flush()
after = trainer.evaluate()
print(f"eval loss on held-out conversations: {before:.4f} -> {after:.4f} | "
      f"perplexity {before.perplexity:.1f} -> {after.perplexity:.1f}")

# %% [markdown]
# ## After: the same questions

# %%
sample = generate(trainer.model, prompts, max_new_tokens=max_new_tokens, tokenizer=tokenizer)
for q, reply in zip(questions, sample.texts):
    print(f"{q}\n  -> {reply!r}")  # a tiny model trained for seconds: expect noise
print(f"{sample.compiles} new compiles (the same programs as before training)")

# %% [markdown]
# ## Save: the adapter, and a merged checkpoint
#
# The adapter directory is small (`adapter_config.json` + the adapters' weights; peft's
# `PeftModel.from_pretrained(base, adapter_dir)` puts it back on its base). The merged directory is
# a whole transformers checkpoint with `W + (alpha / r) B A` in each weight and the tokenizer beside
# it: it loads with `from_pretrained` alone, as the last cell does.

# %%
if adapter_dir:
    print("adapter saved to", trainer.save_pretrained(adapter_dir))  # with lora_rank=0: the whole model
if merged_dir:
    print("merged model saved to", trainer.save_pretrained(merged_dir, merged=True))

# %%
from transformers import AutoModelForCausalLM, AutoTokenizer

if merged_dir:
    reloaded = AutoModelForCausalLM.from_pretrained(merged_dir, attn_implementation="eager").to(trainer.device)
    again = generate(reloaded, prompts, max_new_tokens=max_new_tokens, tokenizer=AutoTokenizer.from_pretrained(merged_dir))
    print(f"reloaded from {merged_dir}: {again.texts[0]!r}")
    print("the same replies as the fine-tuned model:", again.texts == sample.texts)
