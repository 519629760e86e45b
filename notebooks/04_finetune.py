# %% [markdown]
# # Supervised fine-tuning on chat records
#
# Fine-tune a causal LM on chat-style records (prompt → response) with the prompt tokens masked
# out of the loss. By default a tiny Qwen2-shaped model learns the chat records shipped with the
# project; point `model_dir` at a local Hugging Face model directory (e.g. Qwen2.5-0.5B-Instruct)
# and `dataset` at a local JSONL/Parquet file (e.g. HelpSteer2) for real use.

# %% shared="install"

# %% tags=["parameters"]
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
save_dir = None  # where to save the fine-tuned model and tokenizer (None: do not save)

# %% shared="xla_on_cpu"

# %%
from workbench import WorkbenchConfig, detect
from workbench.data import build_datasets

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
print(repr(tokenizer.decode(answer)[:300]))

# %%
from widgets import Dashboard
from workbench.train import Trainer

dash = Dashboard(total_steps=steps, title="Supervised fine-tuning")
dash

# %%
trainer = Trainer(cfg, tokenizer=tokenizer, train_dataset=train_ds, eval_dataset=eval_ds, callbacks=[dash], hardware=hw)
before = trainer.evaluate()
result = trainer.fit()
after = trainer.evaluate()
print(f"eval loss on held-out conversations: {before:.4f} -> {after:.4f}")

# %% [markdown]
# ## Ask it something

# %%
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
    print("saved to", save_dir)
