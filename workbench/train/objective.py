"""[from distill] Knowledge distillation: a student learns from a frozen teacher of another size, same tokenizer.

Per real (non-padding) next-token position the loss is

    α · T² · KL(softmax(teacher/T) ‖ softmax(student/T))  +  (1 − α) · CE(student, labels)
      + β · ‖W·h_student − h_teacher‖² / d_teacher          (optional, β = `hidden_weight`)

The T² keeps the soft-target gradients on the same scale as the hard-label ones when the
temperature changes (Hinton et al., 2015). The hidden-state term compares the last hidden
layers through a learned linear projection (student width → teacher width), which is
trained with the student and saved in its checkpoints.

`DistillationObjective` plugs into the training loop in place of the plain LM loss: it
returns per-token *sums* plus the token count, so the loop normalises over all the real
tokens of an optimizer step exactly as it does for ordinary training. The teacher is
put in eval mode with ``requires_grad=False`` and kept out of the objective's registered
submodules (its weights are never in the optimizer or the student's checkpoints); with a
mesh it is sharded like the student.


[from train] The training loop: one loop, correct on XLA (TPU, XLA:CPU) and plain on CUDA and CPU.

How a step runs (and why):

- **Loss normalisation.** Each micro-batch contributes the *sum* of its token losses and its
  count of real (label != -100) next-token positions. Gradients of the sums accumulate, and
  before the optimizer step they are scaled by 1 / (real tokens in the whole optimizer step).
  That is the mean over every real token of the effective batch: the same gradient as one
  batch `grad_accum` times larger, however the tokens are spread over the micro-batches
  (averaging per-micro-batch means instead would over-weight short micro-batches). The
  count stays on the device, so nothing waits for the host.
- **Syncs.** With one micro-batch per step, forward, backward and the optimizer update are
  one XLA program per batch shape and one `runtime.sync()`. With accumulation each micro-batch
  is its own program (per shape) and the update a separate one: unrolling the micro-batches
  into one program would compile one program per *combination* of bucket shapes. Gradients
  and the running sums then live in persistent buffers, zeroed inside the update program,
  so every micro-step has the same inputs and compiles once per shape.
- **No hidden syncs.** Loss, token counts and grad norm stay device tensors. Real-token counts
  for throughput are taken on the host from the CPU batch as the loader produces it. At log
  steps, after the step's `sync`, `StepProfiler` reads the loss and the loop the grad norm (two
  device->host transfers per interval, none between). Gradient clipping is `clip_grad_norm_`
  on the device. The progress bar and callbacks move only at log steps.
- **Prewarm.** On XLA, before the first step, every (batch, length) shape the sampler can
  emit (at every batch size dynamic growth will reach, and the eval split's shapes when
  ``eval_every`` is set) goes through the real step on synthetic tokens; the model, optimizer,
  scheduler and RNG are snapshotted to the host first and copied back *into* the live tensors
  after (keeping their sharding), so training continues exactly as it would have without
  prewarm. `TrainResult.compiles_after_warmup` counts what compiled after that (0 on a
  bucketed run). Optimizer state is created up front and, under SPMD, sharded like its
  parameter, so it cannot drift to another layout after a step or a checkpoint load.
- **Precision.** 'bf16-mixed': fp32 weights, bf16 autocast (``torch.autocast("xla")`` on XLA,
  CUDA autocast where the GPU has bf16, CPU autocast on plain CPU, which is correct but on
  CPUs without native bf16 usually slower than fp32). On XLA:CPU bf16 is emulated. Losses and
  the softmax of the loss are computed in fp32. 'bf16': bf16 weights, no autocast.
- **Out of memory.** An OOM during warm-up (or any step on CUDA/CPU, where a failed step leaves
  the weights intact) restores the pre-step state and splits every loaded batch into two
  micro-batches (twice the accumulation): same effective batch, same data order, same math.
- **Dynamic batch.** With ``dynamic_batch_every=N`` the loader's batch grows by
  ``dynamic_batch_factor`` every N steps, up to the smallest of ``dynamic_batch_max``, the memory
  estimate for the device, and the sizes prewarmed at the start (the ladder is planned and
  compiled up front, so growth never compiles mid-run). After a growth the rest of the epoch
  is re-drawn at the new size, skipping as many batches as cover the sequences already seen.
- **Checkpoints.** `CheckpointManager` (atomic, verified): model, optimizer, scheduler, data
  position (epoch, batch index; resuming skips consumed index lists without collating them),
  batch size and split, RNG states and step. Under SPMD, sharded parts go through
  torch.distributed.checkpoint and load in place. Resume is bitwise on plain CPU.
- **Hardware.** ``device_type="auto"`` tries TPU, then CUDA, then XLA:CPU (when PJRT_DEVICE=CPU),
  then CPU; a backend that is present but fails to start is reported in `Trainer.notices`
  (and warned about) before the next one is tried.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.data.records import IGNORE_INDEX


def shift_for_next_token(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits at positions 0..L-2 paired with labels 1..L-1 (what a causal LM predicts)."""
    return logits[:, :-1, :], labels[:, 1:]


def token_ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Σ of next-token cross-entropy over positions whose label is not -100, in fp32 (already shifted)."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids")


# ---- objectives ----------------------------------------------------------------------------------


class CausalLMObjective(torch.nn.Module):
    """Next-token cross-entropy: returns the sum over real positions and their count (fp32)."""

    def forward(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        inputs = {k: v for k, v in batch.items() if k in MODEL_INPUT_KEYS}
        logits = model(**inputs, use_cache=False).logits
        s, y = shift_for_next_token(logits, batch["labels"])
        return {"loss_sum": token_ce_sum(s, y), "tokens": (y != IGNORE_INDEX).sum().to(torch.float32)}
