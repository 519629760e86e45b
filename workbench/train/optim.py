"""Optimizers and the learning-rate schedule for the training loop, chosen to be XLA-friendly.

- `build_optimizer`: AdamW (torch), `Adafactor` (below: transformers' algorithm with a fixed
  external learning rate; its relative-step/parameter-scale modes compare a device tensor on
  the host each step, a sync per parameter on XLA) or SGD with momentum. Biases and norm
  weights get no weight decay.
- Fused AdamW on CUDA (`use_fused`): torch's one-kernel update, whose step counters live on the
  parameters' device; CPU and XLA keep the host counters and the per-parameter loop. Checkpoints stay
  portable across the two: a save copies every state tensor to the host (the counter is a host float32
  scalar either way) and a load copies each *into* the live tensor, on whatever device it lives.
- `init_optimizer_state`: creates the optimizer's state tensors before the first step.
  Lazily created state makes the first optimizer step a different XLA program from every
  later one (zeros built inside the graph versus buffers passed in); creating it up front
  means one program per batch shape, which is what prewarming compiles.
- `warmup_cosine`: linear warm-up then cosine decay to ``min_lr_ratio`` of the peak, never
  exactly 0 at a step that runs: torch_xla bakes the "special" scalars 0 and 1 into the
  program as constants, so an lr of exactly 0 would compile a program of its own.
- `load_optimizer_state` / `restore_optimizer_scalars`: put saved optimizer state back *into*
  the live state tensors, keeping their device, dtype and sharding.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from workbench.config import TrainConfig
from workbench.models.layer_stack import stacked_parameter_names

_NOT_RESTORED = ("params", "foreach", "fused", "capturable", "differentiable")
"""Group keys a resume keeps as this process built them: how the update runs on this hardware
(`use_foreach`), not the training's state."""
_NO_DECAY_MARKERS = ("bias", "norm", "ln_", "layernorm", "embed_positions")


def parameter_groups(
    model: torch.nn.Module, weight_decay: float, extra: Iterable[torch.nn.Parameter] = ()
) -> list[dict]:
    """Two groups: matrices with weight decay, biases/norm weights without (tied weights once).
    A stacked layer weight (``model.scan_layers``) is judged by one layer's shape."""
    decay, no_decay, seen = [], [], set()
    named = list(model.named_parameters()) + [(f"extra.{i}", p) for i, p in enumerate(extra)]
    stacked = stacked_parameter_names(model)
    for name, param in named:
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        lowered = name.lower()
        layer_ndim = param.ndim - (name in stacked)
        if layer_ndim < 2 or any(marker in lowered for marker in _NO_DECAY_MARKERS):
            no_decay.append(param)
        else:
            decay.append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def use_foreach(groups: Iterable[dict[str, Any]]) -> bool:
    """Whether the optimizer updates its tensors a list at a time (torch's foreach kernels): on CUDA only.

    On CUDA a per-parameter loop is a few small kernels per parameter, launched from the host: foreach
    ran a Qwen2.5-0.5B full fine-tune 7-12% faster on an H100 at the same peak (`bench/cuda.py`), at the
    cost of one fp32 temporary the size of the parameters during the update (AdamW's square root),
    beneath the step's peak unless the activations are smaller. XLA has no foreach kernels (the loop
    is traced into one program either way) and on the CPU the loop is what the tests compare bitwise."""
    params = [p for group in groups for p in group["params"]]
    return bool(params) and all(p.device.type == "cuda" for p in params)


def use_fused(groups: Iterable[dict[str, Any]]) -> bool:
    """Whether AdamW runs as torch's fused kernel: on CUDA only. One kernel launch for every parameter's
    update in place of a few per parameter (issue #38: the eager step's unfused AdamW was part of what
    kept it behind `transformers.Trainer` on an H100). Its step counters live on the device
    (`init_optimizer_state`). XLA traces the update into the step's program whatever it is, and the
    CPU keeps the loop the bitwise tests compare."""
    return use_foreach(groups)


def build_optimizer(
    model: torch.nn.Module,
    train: TrainConfig,
    extra_params: Iterable[torch.nn.Parameter] = (),
    *,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """The optimizer `train.optimizer` names, over `model`'s trainable parameters (+ `extra_params`).
    `fused`: AdamW as torch's fused kernel; None: where it pays (`use_fused`: CUDA).

    Build it after the model is on its device (and sharded): optimizers hold references to the
    parameters they were given.
    """
    groups = parameter_groups(model, train.weight_decay, extra_params)
    if train.optimizer == "adamw":
        fused = use_fused(groups) if fused is None else fused
        return torch.optim.AdamW(
            groups,
            lr=train.learning_rate,
            betas=(0.9, 0.95),
            eps=1e-8,
            foreach=False if fused else use_foreach(groups),
            fused=fused,
        )
    if train.optimizer == "adafactor":
        stacked = stacked_parameter_names(model)
        layer_stacked = [p for name, p in model.named_parameters() if name in stacked]
        return Adafactor(groups, lr=train.learning_rate, layer_stacked=layer_stacked)
    if train.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=train.learning_rate, momentum=0.9, foreach=use_foreach(groups))
    raise ValueError(
        f"train.optimizer={train.optimizer!r} is not allowed: expected 'adamw', 'adafactor' or 'sgd'"
    )


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the per-parameter state with the values the optimizer's own first step would create.

    Idempotent: parameters that already have state are left alone.
    """
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if state:
                continue
            if isinstance(optimizer, torch.optim.AdamW):
                # fused and capturable updates read the counter on the parameter's device; the loop, on the host
                on_device = bool(group.get("fused") or group.get("capturable"))
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu")
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group.get("amsgrad"):
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif isinstance(optimizer, Adafactor):
                optimizer.init_state(p)
            elif isinstance(optimizer, torch.optim.SGD) and group["momentum"] and not group["dampening"]:
                # Zeros give the same first update as SGD's clone(grad) when dampening is 0.
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            # other optimizers keep their lazy initialisation (one extra program on XLA)


class Adafactor(torch.optim.Optimizer):
    """Adafactor (Shazeer & Stern, 2018) with an external learning rate, as transformers runs it with
    ``relative_step=False, scale_parameter=False, warmup_init=False, beta1=None``.

    Matrices keep factored second moments (a row and a column vector instead of a full matrix),
    the update is RMS-clipped at `clip_threshold`, and there is no first moment: optimizer state
    is a small fraction of AdamW's. Written here rather than imported because importing
    `transformers.optimization` imports torch_xla (through transformers' trainer utilities), which
    a plain-CPU process must not do. Everything stays on the device: no host reads per step.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        eps: tuple[float, float] = (1e-30, 1e-3),
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        weight_decay: float = 0.0,
        layer_stacked: Iterable[torch.Tensor] = (),
    ) -> None:
        defaults = dict(
            lr=lr, eps=eps, clip_threshold=clip_threshold, decay_rate=decay_rate, weight_decay=weight_decay
        )
        super().__init__(params, defaults)
        self._layer_stacked = {id(p) for p in layer_stacked}

    def _lead(self, p: torch.Tensor) -> int:
        """1 for a stacked layer weight (its leading axis counts layers, each factored and clipped on its own), else 0."""
        return int(id(p) in self._layer_stacked)

    def init_state(self, p: torch.Tensor) -> None:
        state = self.state[p]
        if state:
            return
        dtype = torch.float32
        state["step"] = torch.tensor(0.0)  # on the host, like AdamW's: the schedule below is plain Python
        if p.dim() - self._lead(p) >= 2:
            state["exp_avg_sq_row"] = torch.zeros(p.shape[:-1], dtype=dtype, device=p.device)
            state["exp_avg_sq_col"] = torch.zeros(p.shape[:-2] + p.shape[-1:], dtype=dtype, device=p.device)
        else:
            state["exp_avg_sq"] = torch.zeros(p.shape, dtype=dtype, device=p.device)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        # The decay 1 - step^decay_rate is exactly 0 at step 1, a value torch_xla would bake into
        # the program as a constant (a different program from every later step): it enters as a
        # device tensor instead, one per (step, device).
        decay_tensors: dict[tuple[float, float, str], torch.Tensor] = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.float()
                self.init_state(p)
                state = self.state[p]
                state["step"] += 1
                step = float(state["step"])
                key = (step, group["decay_rate"], str(p.device))
                if key not in decay_tensors:
                    # shape [1] on the host, then copied: torch_xla turns a 0-dim 0.0 into a constant
                    decay_tensors[key] = (
                        torch.tensor([1.0 - step ** group["decay_rate"]]).to(p.device).reshape(())
                    )
                beta2t = decay_tensors[key]
                update = grad * grad + group["eps"][0]
                lead = self._lead(p)
                if p.dim() - lead >= 2:
                    row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
                    row.mul_(beta2t).add_(update.mean(dim=-1) * (1.0 - beta2t))
                    col.mul_(beta2t).add_(update.mean(dim=-2) * (1.0 - beta2t))
                    r_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
                    c_factor = col.unsqueeze(-2).rsqrt()
                    update = r_factor * c_factor * grad
                else:
                    sq = state["exp_avg_sq"]
                    sq.mul_(beta2t).add_(update * (1.0 - beta2t))
                    update = sq.rsqrt() * grad
                if lead:  # each layer's own RMS
                    rms = update.square().mean(dim=tuple(range(1, update.dim())), keepdim=True).sqrt()
                else:
                    rms = update.norm(2) / (update.numel() ** 0.5)
                update = update / (rms / group["clip_threshold"]).clamp(min=1.0)
                target = p.float() if p.dtype in (torch.float16, torch.bfloat16) else p
                if group["weight_decay"]:
                    target.mul_(1.0 - group["weight_decay"] * group["lr"])
                target.add_(update, alpha=-group["lr"])
                if target is not p:
                    p.copy_(target)
        return loss


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def lr_multiplier(step: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based).

    Warm-up: (step+1)/warmup_steps, so the first step already moves (and lr is never 0).
    Then cosine from 1 down to `min_lr_ratio` at `total_steps` (reached only after the last step).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_cosine(
    optimizer: torch.optim.Optimizer, train: TrainConfig, total_steps: int | None = None
) -> Any:
    """`LambdaLR` with `lr_multiplier`; its state_dict is plain numbers (checkpointable as JSON)."""
    total = int(total_steps if total_steps is not None else train.steps)

    def schedule(step: int) -> float:
        return lr_multiplier(
            step, warmup_steps=train.warmup_steps, total_steps=total, min_lr_ratio=train.min_lr_ratio
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def restore_optimizer_scalars(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Put back non-tensor per-parameter state (e.g. a Python-number step) after in-place tensor copies."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for index, state in saved.get("state", {}).items():
        live = optimizer.state[params[int(index)]]
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                live[key] = value


def _check_state_layout(index: int, saved: dict, live: dict) -> None:
    """Raise ValueError unless parameter `index`'s saved state has the live state's tensors, of the
    same shapes. Copied in place without this, another optimizer's state (Adafactor's factored
    rows and columns into AdamW's moments) or another layout would load silently: unknown keys
    added beside the live ones, shapes broadcast by ``copy_``. Live state not created yet
    (an optimizer without `init_optimizer_state`) takes what comes."""
    live_tensors = {k: v for k, v in live.items() if isinstance(v, torch.Tensor)}
    if not live_tensors:
        return
    saved_tensors = {k: v for k, v in saved.items() if isinstance(v, torch.Tensor)}
    problem = None
    if sorted(saved_tensors) != sorted(live_tensors):
        problem = f"holds {sorted(saved_tensors)}, this optimizer's holds {sorted(live_tensors)}"
    else:
        for key, value in saved_tensors.items():
            if tuple(value.shape) != tuple(live_tensors[key].shape):
                problem = (
                    f"{key!r} has shape {list(value.shape)}, this optimizer's {list(live_tensors[key].shape)}"
                )
                break
    if problem is not None:
        raise ValueError(
            f"the checkpoint's optimizer state for parameter {index} {problem}: resume with the "
            "optimizer (train.optimizer), model and LoRA settings the checkpoint was written with"
        )


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Load optimizer state *into* the live state tensors (created by `init_optimizer_state`).

    Copying in place keeps each tensor's device, dtype and SPMD sharding, so the step program
    after a resume is the one compiled before (`optimizer.load_state_dict` would replace them
    with fresh, unsharded tensors). Non-tensor state and group hyper-parameters are set directly.
    A state of another layout (another optimizer's, other shapes) raises ValueError before
    anything is copied.
    """
    params = [p for g in optimizer.param_groups for p in g["params"]]
    saved_state = saved.get("state", {})
    saved_params = sum(len(g["params"]) for g in saved["param_groups"])
    if len(params) != saved_params or len(optimizer.param_groups) != len(saved["param_groups"]):
        raise ValueError(
            f"the checkpoint's optimizer holds {saved_params} parameters in {len(saved['param_groups'])} "
            f"groups; this model's holds {len(params)} in {len(optimizer.param_groups)}: "
            "resume with the model and optimizer settings the checkpoint was written with"
        )
    for index, state in saved_state.items():
        _check_state_layout(int(index), state, optimizer.state[params[int(index)]])
    with torch.no_grad():
        for index, state in saved_state.items():
            live = optimizer.state[params[int(index)]]
            for key, value in state.items():
                current = live.get(key)
                if isinstance(value, torch.Tensor) and isinstance(current, torch.Tensor):
                    if value is not current:
                        current.copy_(value.to(current.dtype))
                else:
                    live[key] = value
    for group, saved_group in zip(optimizer.param_groups, saved["param_groups"]):
        for key, value in saved_group.items():
            if key not in _NOT_RESTORED:
                group[key] = tuple(value) if isinstance(group.get(key), tuple) else value
