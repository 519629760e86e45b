"""Which attention kernel a run uses: ``model.attention`` resolved for a device, and applied to a model.

``model.attention`` is 'auto' or a kernel of `workbench.models.attention`: 'eager' (transformers'
reference, the whole ``T x T`` scores saved for backward), 'sdpa' (torch's fused kernels, for CUDA),
'flash' (TPU: torch_xla's Pallas kernels) or 'chunked' (any XLA device: query blocks, never the
whole scores). `resolve_attention` is the rule, with its reason:

- 'auto' picks flash on a TPU, chunked on other XLA devices for rows of at least
  `AUTO_CHUNKED_MIN_LENGTH` tokens (eager below, where the whole scores are small and one
  program computes them faster: bench/attention.py), sdpa on CUDA and eager on a plain CPU.
- A model that soft-caps its attention logits (Gemma 2) gets chunked on a TPU (no Pallas softcap
  path is wired) and never sdpa; one with attention dropout (GPT-2 checkpoints keep
  ``attn_pdrop=0.1``) gets eager or sdpa, the kernels that drop attention weights.
- An explicit kernel that cannot run there is an error naming the field, the value and what is
  allowed there.

`choose_attention` resolves for a `HardwareInfo` (and says 'auto''s choice through a notice);
`use_attention` switches a built model, or a peft model around one, to a kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workbench.backend.selection import backend_for
from workbench.models.attention import CHUNKED, FLASH, QUERY_CHUNK, query_chunk, register_attention
from workbench.models.build import transformers_config_of

ATTENTION_KERNELS = ("auto", "eager", "sdpa", "flash", "chunked")
"""The values of ``model.attention``."""
AUTO_CHUNKED_MIN_LENGTH = 1024
"""'auto' picks chunked on a non-TPU XLA device for rows at least this long (eager below)."""

_NAMES = {"eager": "eager", "sdpa": "sdpa", "chunked": CHUNKED, "flash": FLASH}


def resolve_attention(
    setting: str,
    *,
    device_type: str,
    is_tpu: bool,
    seq_len: int | None,
    softcap: bool = False,
    dropout: bool = False,
    field: str = "model.attention",
) -> tuple[str, str]:
    """(kernel, reason) for ``model.attention=setting`` on a device: `device_type` 'xla', 'cuda',
    'cpu' (or 'tpu'), `is_tpu`, rows of `seq_len` tokens (None: unknown); `softcap`: the model
    soft-caps its attention logits (Gemma 2); `dropout`: it drops attention weights in training.
    An explicit kernel that cannot run there raises ValueError naming `field`, the value and what
    is allowed there."""
    if setting not in ATTENTION_KERNELS:
        raise ValueError(
            f"{field}={setting!r} is not allowed: expected one of "
            + ", ".join(repr(k) for k in ATTENTION_KERNELS)
        )
    xla = is_tpu or device_type in ("xla", "tpu")
    where = "TPU" if is_tpu else "XLA device" if xla else "CUDA" if device_type == "cuda" else "CPU"
    rows = f"{seq_len}-token rows" if seq_len else "row length unknown"
    blocks = f"scores in {query_chunk(seq_len or QUERY_CHUNK)}-query blocks"
    blocks += f", never {seq_len}×{seq_len}" if seq_len else ""
    allowed = _allowed_here(is_tpu=is_tpu, softcap=softcap, dropout=dropout)
    if setting == "auto":
        if dropout:
            kernel = "sdpa" if device_type == "cuda" and not softcap else "eager"
            why = f"{where}, attention dropout: only {kernel} drops attention weights here"
        elif is_tpu:
            kernel, why = "flash", "TPU: Pallas flash attention"
            if softcap:
                kernel, why = "chunked", f"TPU, logit softcap (no Pallas path for it): {blocks}"
        elif xla and (seq_len is None or seq_len >= AUTO_CHUNKED_MIN_LENGTH):
            kernel, why = "chunked", f"{where}, {rows}: {blocks}"
        elif xla:
            kernel, why = "eager", f"{where}, {rows} < {AUTO_CHUNKED_MIN_LENGTH}: the whole scores are small"
        elif device_type == "cuda" and not softcap:
            kernel, why = "sdpa", "CUDA: torch's fused kernels"
        else:
            kernel, why = (
                "eager",
                f"{where}: transformers' reference" + (", logit softcap" if softcap else ""),
            )
        return kernel, f"{field}=auto → {kernel} ({why})"
    if setting not in allowed:
        if setting == "flash" and not is_tpu:
            why = "needs a TPU (its Pallas kernels lower to a TPU custom call)"
        elif dropout and setting in ("flash", "chunked"):
            why = "does not drop attention weights (this model's attention dropout is on: set it to 0)"
        else:
            why = "cannot soft-cap attention logits (this model's attention does)"
        raise ValueError(
            f"{field}={setting!r} is not allowed on this {where}: {setting} {why}. "
            f"Allowed here: {', '.join(repr(k) for k in allowed)}"
        )
    reasons = {
        "eager": "transformers' reference: the whole scores, saved for backward",
        "sdpa": "torch's scaled_dot_product_attention",
        "chunked": blocks,
        "flash": "Pallas flash attention" + (" (softcap layers fall back to chunked)" if softcap else ""),
    }
    return setting, f"{field}={setting} ({where}, {rows}: {reasons[setting]})"


def _allowed_here(*, is_tpu: bool, softcap: bool, dropout: bool = False) -> tuple[str, ...]:
    return tuple(
        k
        for k in ATTENTION_KERNELS
        if not (k == "flash" and not is_tpu)
        and not (k == "sdpa" and softcap)
        and not (k in ("flash", "chunked") and dropout)
    )


def choose_attention(
    setting: str,
    hw: Any,
    *,
    seq_len: int | None,
    notice: Callable[[str], None] | None = None,
    model: Any = None,
    field: str = "model.attention",
) -> str:
    """The kernel `resolve_attention` picks on `hw` (a `HardwareInfo`) for `model` (its softcap and
    attention dropout); `notice` hears 'auto''s reason."""
    config = readable_config(model)  # read once for both questions
    kernel, reason = resolve_attention(
        setting,
        device_type=hw.device_string,
        # the Pallas flash kernels are torch_xla's on a TPU (not TorchTPU's): the backend lists them
        is_tpu="flash" in backend_for(hw).attention_kernels(),
        seq_len=seq_len,
        softcap=has_softcap(config),
        dropout=has_attention_dropout(config),
        field=field,
    )
    if setting == "auto" and notice is not None:
        notice(reason)
    return kernel


def readable_config(model_or_config: Any) -> Any:
    """`transformers_config_of` a model or config, or None where a checkpoint's config cannot be read
    (nothing is then known about its attention)."""
    try:
        return transformers_config_of(model_or_config)
    except (OSError, ValueError):
        return None


def has_softcap(model_or_config: Any) -> bool:
    """Whether a model (or its config, a workbench `ModelConfig` included) soft-caps attention logits
    (``attn_logit_softcapping``, Gemma 2)."""
    return bool(getattr(readable_config(model_or_config), "attn_logit_softcapping", None))


def has_attention_dropout(model_or_config: Any) -> bool:
    """Whether a model (or its config) drops attention weights in training (``attention_dropout``,
    GPT-2's ``attn_pdrop``)."""
    config = readable_config(model_or_config)
    return any(float(getattr(config, name, 0) or 0) > 0 for name in ("attention_dropout", "attn_pdrop"))


def attn_implementation(kernel: str) -> str:
    """The ``attn_implementation`` string for a resolved kernel ('eager', 'sdpa', 'chunked', 'flash'),
    registering the workbench's implementations first."""
    if kernel not in _NAMES:
        raise ValueError(f"attention kernel {kernel!r} is not allowed: expected one of {', '.join(_NAMES)}")
    register_attention()
    return _NAMES[kernel]


def kernel_of(implementation: str | None) -> str:
    """The kernel name ('eager', 'sdpa', 'chunked', 'flash') of a config's ``_attn_implementation``."""
    name = str(implementation or "eager")
    if name == CHUNKED:
        return "chunked"
    if name == FLASH or "flash" in name or "splash" in name:
        return "flash"
    return "sdpa" if name == "sdpa" else "eager"


def use_attention(model: Any, kernel: str) -> Any:
    """Switch a built model (or a peft model around one) to `kernel`; returns the model.
    'sdpa' on a model that soft-caps its logits raises ValueError naming ``model.attention``."""
    if kernel == "sdpa" and has_softcap(model):
        raise ValueError(
            "model.attention='sdpa' is not allowed for this model: sdpa cannot soft-cap attention logits. "
            f"Allowed: {', '.join(repr(k) for k in _allowed_here(is_tpu=True, softcap=True))}"
        )
    name = attn_implementation(kernel)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "set_attn_implementation"):
        base.set_attn_implementation(name)
    else:
        base.config._attn_implementation = name
    return model


__all__ = [
    "ATTENTION_KERNELS",
    "AUTO_CHUNKED_MIN_LENGTH",
    "attn_implementation",
    "choose_attention",
    "has_attention_dropout",
    "has_softcap",
    "kernel_of",
    "readable_config",
    "resolve_attention",
    "use_attention",
]
