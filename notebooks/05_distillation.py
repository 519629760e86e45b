# %% [markdown]
# # Knowledge distillation
#
# A small student learns from a larger teacher's softened next-token distribution (KL at
# temperature T) mixed with the ordinary cross-entropy. Here the teacher is trained first for a
# few steps; point `teacher_dir` at a local model directory to distil a real one (same tokenizer).

# %% shared="install"

# %% tags=["parameters"]
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
max_buckets = 4

# %% shared="doctor"

# %% shared="xla_on_cpu"

# %%
from workbench import WorkbenchConfig, detect
from workbench.data import build_datasets
from workbench.train import Trainer

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
print(f"teacher eval loss {teacher_loss:.4f}")

# %%
from widgets import Dashboard

dash = Dashboard(total_steps=steps, title="Distillation: student learning from the teacher")
dash

# %%
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
      f"compiles after warm-up {result.compiles_after_warmup}")
