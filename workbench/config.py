"""[from config] Typed configuration for a workbench run.

One `WorkbenchConfig` holds six sections (model, data, bucketing, mesh, train, lora), each a
dataclass whose fields carry a docstring-comment below them. Configs come from YAML
(safe loader only), are overridden with dotted ``key=value`` strings (the form a CLI flag
or a papermill parameter takes), round-trip through ``to_dict`` / ``from_dict`` and save
back to YAML.

Every bad value raises `ConfigError` naming the field, the value and what is allowed;
unknown keys get a did-you-mean suggestion. Strings are coerced with explicit parsers,
never ``eval``.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml

from workbench.models.families import FAMILY_NAMES
from workbench.units import duration_or_none, duration_with_unit


class ConfigError(ValueError):
    """A config value or key is not allowed; the message says which and why."""


ModelFamily = Literal[FAMILY_NAMES]  # type: ignore[valid-type]
"""The allowed values of ``ModelConfig.family``: the names in `workbench.models.families.FAMILIES`
(``typing.get_args(ModelFamily) == FAMILY_NAMES``)."""


@dataclass
class ModelConfig:
    family: ModelFamily = "llama"
    """Architecture family in `transformers` used to build the model from this config (see `workbench.models.families`)."""
    pretrained_path: str | None = None
    """Local directory for `from_pretrained(dir)`; when set, the size fields below are ignored."""
    hidden_size: int = 64
    """Width of the residual stream."""
    num_layers: int = 2
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads; must divide `hidden_size`."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide `num_heads`. GPT-2 ignores it."""
    intermediate_size: int = 128
    """Hidden width of the MLP."""
    vocab_size: int = 512
    """Vocabulary size; replaced by the tokenizer's size when a tokenizer is trained or loaded."""
    max_position_embeddings: int = 512
    """Longest sequence the position embedding supports."""
    tie_word_embeddings: bool = True
    """Share the input embedding and the output projection."""
    scan_layers: bool | Literal["auto"] = "auto"
    """On XLA, compile the decoder stack as one scanned layer over stacked weights (compile time flat in depth): 'auto' scans when the family allows it and the stack is deep enough to pay off (one notice says which and why); true insists (an error when the layers cannot be scanned); false keeps it unrolled."""
    quantize: Literal["none", "int8", "int4"] = "none"
    """Frozen base weights as integers under LoRA: 'int8' (per output channel) or 'int4' (blockwise, two per byte); 'none' keeps them in the training precision."""


@dataclass
class DataConfig:
    source: str = "embedded"
    """'embedded' (text shipped with Python itself), 'chat-sample' (the shipped SFT records) or a local file/dir."""
    format: Literal["auto", "jsonl", "json", "csv", "parquet", "text"] = "auto"
    """File format for a local `source`; 'auto' uses the file extension."""
    text_field: str = "text"
    """Column holding raw text for language-model training."""
    chat: bool = False
    """Treat records as chat SFT data (prompt/response or messages); prompt labels are masked."""
    tokenizer_path: str | None = None
    """Local tokenizer directory for `AutoTokenizer.from_pretrained`; None trains one on the corpus."""
    tokenizer_vocab_size: int = 512
    """Vocabulary size of the locally trained tokenizer."""
    max_length: int = 256
    """Longest sequence kept after tokenisation (longer ones go through `bucketing.overflow`)."""
    max_examples: int | None = None
    """Cap on the number of examples loaded (None loads everything)."""
    eval_fraction: float = 0.05
    """Fraction of examples held out for evaluation, in [0, 0.5]."""


@dataclass
class BucketConfig:
    strategy: Literal["optimal", "pow2", "multiple", "quantile", "none", "max"] = "optimal"
    """How sequence-length boundaries are planned; 'none' pads each batch to its longest member, 'max' pads to max_length."""
    max_buckets: int | Literal["auto"] = 4
    """Most distinct padded lengths (compiled shapes) allowed; 'auto' picks the number that minimises padding time plus compile time."""
    compile_seconds: float | None = None
    """With max_buckets 'auto': seconds one more shape costs to compile (None measures it on the run's first shape)."""
    seconds_per_padded_token: float | None = None
    """With max_buckets 'auto': training seconds per padded token (None measures it on the run's first shape)."""
    multiple_of: int = 8
    """Every boundary is a multiple of this (TPU likes 128 for large models; 8 is fine for tiny ones)."""
    packing: bool = False
    """Pack several sequences into fixed rows of `max_length` instead of bucketing."""
    overflow: Literal["truncate", "drop"] = "truncate"
    """What happens to sequences longer than the last boundary; always counted and reported."""
    tokens_per_batch: int | None = None
    """Token budget per batch; when set, each bucket gets its own batch size instead of `train.batch_size`."""


@dataclass
class MeshConfig:
    data: int = -1
    """Data-parallel degree; -1 fills in whatever the other axes leave of the device count."""
    fsdp: int = 1
    """Fully-sharded data-parallel degree (parameters sharded, batch split)."""
    model: int = 1
    """Tensor-parallel degree."""
    enabled: bool = False
    """Use SPMD sharding at all; False runs on one device (or plain data parallel off-XLA)."""
    num_slices: int = 1
    """TPU slices joined over the data-centre network (multi-slice); the data axis spans them."""


@dataclass
class TrainConfig:
    device_type: Literal["auto", "tpu", "cuda", "xla", "cpu"] = "auto"
    """Backend to run on; 'auto' tries TPU, then CUDA, then XLA on the CPU, then plain CPU."""
    steps: int = 30
    """Optimizer steps to run."""
    batch_size: int = 8
    """Global micro-batch size (sequences per forward pass, all devices together)."""
    grad_accum: int = 1
    """Micro-batches accumulated per optimizer step."""
    learning_rate: float = 3e-3
    """Peak learning rate after warm-up."""
    min_lr_ratio: float = 0.1
    """Cosine schedule floor as a fraction of the peak learning rate."""
    warmup_steps: int = 5
    """Linear warm-up steps."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    optimizer: Literal["adamw", "adafactor", "sgd"] = "adamw"
    """Optimizer."""
    precision: Literal["bf16-mixed", "bf16", "fp32"] = "fp32"
    """'bf16-mixed': fp32 weights with bf16 autocast; 'bf16': bf16 weights; 'fp32': no reduced precision."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this (None disables clipping)."""
    log_every: int = 5
    """Metrics reach the host (and callbacks) once every this many steps."""
    eval_every: int = 0
    """Run the eval loop every this many steps (0 disables)."""
    seed: int = 0
    """Seed for model init, data order and dropout."""
    checkpoint_dir: str | None = None
    """Where checkpoints go (None disables checkpointing)."""
    checkpoint_every: int | str = 0
    """Save every this many steps, or every this long ('20m', '1h': a cadence in time for slow targets such as a Drive mount); 0 saves only at the end when `checkpoint_dir` is set."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep."""
    async_checkpoint: bool = True
    """Write checkpoints on a background thread: the step waits only for the copy to the host (at most one write in flight, atomic either way)."""
    time_limit: float | str | None = None
    """Wall-clock budget from the Trainer's start, in seconds or as '8h30m': the run stops cleanly before it, its last checkpoint complete (re-run to resume); None: no limit."""
    dynamic_batch_every: int = 0
    """Grow the batch every this many steps (0 disables dynamic batch size)."""
    dynamic_batch_factor: float = 2.0
    """Factor the batch grows by each time."""
    dynamic_batch_max: int | None = None
    """Largest batch dynamic growth may reach; None: as large as the memory estimate allows (no cap where memory is unknown)."""
    compile_cache_dir: str | None = "auto"
    """Persistent XLA compilation cache, kept across sessions; 'auto' uses one on a TPU (Drive, /kaggle/working or ./.xla_cache), None turns it off."""
    prewarm: bool = True
    """On XLA, compile every batch shape the run can meet before the first step (no compiles mid-run)."""
    resume: bool = True
    """Resume from the latest complete checkpoint in `checkpoint_dir` when there is one."""
    progress_bar: bool = True
    """Show a tqdm progress bar (updated only at log intervals; it never forces a device sync)."""
    loss_chunk_tokens: int | Literal["auto"] = "auto"
    """Tokens per chunk of the LM head + cross-entropy, recomputed in backward, so the [tokens x vocab] logits never exist whole; 'auto' chunks when they would exceed a share of device memory, 0 never chunks."""
    distill_alpha: float = 0.5
    """Distillation: weight of the KL(teacher || student) term; 1 - alpha weighs the label cross-entropy."""
    distill_temperature: float = 2.0
    """Distillation: softmax temperature of the KL term (the term is scaled by temperature squared)."""
    distill_hidden_weight: float = 0.0
    """Distillation: weight of the last-hidden-state MSE through a learned projection (0 disables it)."""


@dataclass
class LoraConfig:
    rank: int = 0
    """LoRA rank r: 0 trains every weight (full fine-tuning); r >= 1 freezes the base model and trains rank-r adapters."""
    alpha: float = 16.0
    """Adapter scale numerator: the adapter's update is multiplied by alpha / rank."""
    dropout: float = 0.0
    """Dropout on each adapter's input, in [0, 1) (0 keeps runs comparable across devices)."""
    target_modules: str | list[str] = "auto"
    """'auto': the attention and MLP projections (the family's tensor-parallel plan or sharding rules); else module names, matched as suffixes (e.g. [q_proj, v_proj] or 'q_proj,v_proj')."""

    def __post_init__(self) -> None:
        # "q_proj,v_proj" or "[q_proj, v_proj]" (an override or a papermill string) is a list of names
        if isinstance(self.target_modules, str) and self.target_modules.strip() != "auto":
            text = self.target_modules.strip().removeprefix("[").removesuffix("]")
            self.target_modules = [name.strip().strip("'\"") for name in text.split(",") if name.strip()]
        elif isinstance(self.target_modules, str) or self.target_modules == ["auto"]:
            self.target_modules = "auto"


@dataclass
class WorkbenchConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model to build or load."""
    data: DataConfig = field(default_factory=DataConfig)
    """Where text comes from and how it is tokenised."""
    bucketing: BucketConfig = field(default_factory=BucketConfig)
    """Sequence-length planning: buckets or packing."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    """Device mesh for SPMD sharding."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimisation and the training loop."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA fine-tuning (off while `lora.rank` is 0)."""

    # ---- construction -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkbenchConfig:
        return _build(cls, data or {}, prefix="")

    def to_yaml(self, path: str | Path | None = None) -> str:
        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_yaml(cls, path_or_text: str | Path, overrides: typing.Iterable[str] = ()) -> WorkbenchConfig:
        """Load a YAML file (or YAML text) and apply dotted overrides."""
        candidate = Path(path_or_text) if not isinstance(path_or_text, Path) else path_or_text
        is_file = isinstance(path_or_text, Path) or ("\n" not in str(path_or_text) and candidate.exists())
        if not is_file and str(path_or_text).endswith((".yaml", ".yml")):
            raise ConfigError(f"config file {str(path_or_text)!r} does not exist")
        text = candidate.read_text() if is_file else str(path_or_text)
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"config is not valid YAML: {err}") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"config must be a mapping of sections, got {type(data).__name__}")
        return cls.from_dict(data).with_overrides(overrides)

    def with_overrides(self, overrides: typing.Iterable[str] | dict[str, Any]) -> WorkbenchConfig:
        """Return a copy with dotted overrides applied: ``["train.steps=10", "mesh.fsdp=8"]``.

        A dict maps dotted keys to values (strings are parsed, other values checked as they are).
        """
        data = self.to_dict()
        items = overrides.items() if isinstance(overrides, dict) else (_split_override(o) for o in overrides)
        for key, value in items:
            _set_dotted(data, type(self), key, value)
        return type(self).from_dict(data)


# ---- validation ----------------------------------------------------------------------


def _split_override(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.field=value (e.g. train.steps=10)")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _unknown_key(key: str, cls: type, prefix: str) -> ConfigError:
    names = _field_names(cls)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f"; did you mean {prefix + close[0]!r}?" if close else ""
    where = f"section {prefix.rstrip('.')!r}" if prefix else "the top level"
    return ConfigError(f"unknown key {prefix + key!r} in {where}{hint} (allowed: {', '.join(names)})")


def _set_dotted(data: dict[str, Any], cls: type, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node, node_cls, prefix = data, cls, ""
    for i, part in enumerate(parts):
        if part not in _field_names(node_cls):
            raise _unknown_key(part, node_cls, prefix)
        hint = get_type_hints(node_cls)[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(hint):
                raise ConfigError(
                    f"{prefix + part!r} is a section; set one of its fields, e.g. {prefix}{part}.{_field_names(hint)[0]}=..."
                )
            node[part] = _parse_string(value, hint, f"{prefix}{part}") if isinstance(value, str) else value
        else:
            if not dataclasses.is_dataclass(hint):
                raise ConfigError(f"{prefix + part!r} is a value, not a section; cannot set {dotted!r}")
            node, node_cls, prefix = node[part], hint, f"{prefix}{part}."


def _build(cls: type, data: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "config"
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {data!r}")
    hints = get_type_hints(cls)
    for key in data:
        if key not in hints:
            raise _unknown_key(str(key), cls, prefix)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        hint = hints[f.name]
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            kwargs[f.name] = _build(hint, data[f.name] or {}, f"{name}.")
        else:
            kwargs[f.name] = _check_value(data[f.name], hint, name)
    obj = cls(**kwargs)
    _validate(obj, prefix)
    return obj


_TRUE = {"true", "yes", "on", "1"}
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")
_FALSE = {"false", "no", "off", "0"}


def _parse_string(text: str, hint: Any, name: str) -> Any:
    """Turn a CLI/papermill string into the field's type (no eval)."""
    options = _options(hint)
    if text.lower() in {"none", "null", "~"} and type(None) in options:
        return None
    for option in options:
        if option is bool and text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        if option is int:
            try:
                return int(text)
            except ValueError:
                pass
        if option is float:
            try:
                return float(text)
            except ValueError:
                pass
    if str in options or any(get_origin(o) is Literal for o in options):
        return text
    return _check_value(text, hint, name)  # raises with the allowed types


def _options(hint: Any) -> list[Any]:
    origin = get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        out = []
        for arg in get_args(hint):
            out.extend(_options(arg))
        return out
    return [hint]


def _describe(hint: Any) -> str:
    parts = []
    for option in _options(hint):
        if get_origin(option) is Literal:
            parts.append("one of " + ", ".join(repr(a) for a in get_args(option)))
        elif option is type(None):
            parts.append("null")
        elif get_origin(option) is list:
            parts.append(f"a list of {get_args(option)[0].__name__}")
        else:
            parts.append(getattr(option, "__name__", str(option)))
    return " or ".join(parts)


def _check_value(value: Any, hint: Any, name: str) -> Any:
    for option in _options(hint):
        if option is type(None) and value is None:
            return None
        if get_origin(option) is Literal and value in get_args(option) and isinstance(value, str):
            return value
        if option is bool and isinstance(value, bool):
            return value
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if option is str and isinstance(value, str):
            return value
        list_of = get_args(option)[0] if get_origin(option) is list else None
        if list_of is not None and isinstance(value, list) and all(isinstance(v, list_of) for v in value):
            return list(value)
    raise ConfigError(f"{name}={value!r} is not allowed: expected {_describe(hint)}")


def _require(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r} is not allowed: {allowed}")


WEIGHT_SHAPE_FIELDS = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "intermediate_size",
    "vocab_size",
)
"""The `ModelConfig` sizes that fix the weights' shapes of a model built from the config (no pretrained_path)."""


def _validate(obj: Any, prefix: str) -> None:
    """Range and cross-field checks beyond types."""
    p = prefix
    if isinstance(obj, ModelConfig):
        for name in (*WEIGHT_SHAPE_FIELDS, "max_position_embeddings"):
            _require(getattr(obj, name) >= 1, f"{p}{name}", getattr(obj, name), "must be >= 1")
        _require(
            obj.hidden_size % obj.num_heads == 0,
            f"{p}num_heads",
            obj.num_heads,
            f"must divide hidden_size={obj.hidden_size}",
        )
        _require(
            obj.num_heads % obj.num_kv_heads == 0,
            f"{p}num_kv_heads",
            obj.num_kv_heads,
            f"must divide num_heads={obj.num_heads}",
        )
    elif isinstance(obj, DataConfig):
        _require(obj.max_length >= 2, f"{p}max_length", obj.max_length, "must be >= 2")
        _require(
            obj.tokenizer_vocab_size >= 64,
            f"{p}tokenizer_vocab_size",
            obj.tokenizer_vocab_size,
            "must be >= 64",
        )
        _require(
            obj.max_examples is None or obj.max_examples >= 1,
            f"{p}max_examples",
            obj.max_examples,
            "must be >= 1 or null",
        )
        _require(
            0.0 <= obj.eval_fraction <= 0.5, f"{p}eval_fraction", obj.eval_fraction, "must be in [0, 0.5]"
        )
    elif isinstance(obj, BucketConfig):
        _require(
            obj.max_buckets == "auto" or obj.max_buckets >= 1,
            f"{p}max_buckets",
            obj.max_buckets,
            "must be >= 1 or 'auto'",
        )
        _require(
            obj.max_buckets != "auto" or obj.strategy in ("optimal", "none") or obj.packing,
            f"{p}strategy",
            obj.strategy,
            "max_buckets 'auto' chooses among exact optimal plans: use strategy 'optimal' or a number of buckets",
        )
        for name in ("compile_seconds", "seconds_per_padded_token"):
            value = getattr(obj, name)
            _require(value is None or value > 0, f"{p}{name}", value, "must be > 0 or null")
        _require(obj.multiple_of >= 1, f"{p}multiple_of", obj.multiple_of, "must be >= 1")
        _require(
            obj.tokens_per_batch is None or obj.tokens_per_batch >= 1,
            f"{p}tokens_per_batch",
            obj.tokens_per_batch,
            "must be >= 1 or null",
        )
    elif isinstance(obj, MeshConfig):
        for name in ("data", "fsdp", "model"):
            value = getattr(obj, name)
            _require(
                value == -1 or value >= 1,
                f"{p}{name}",
                value,
                "must be >= 1, or -1 to fill from the device count",
            )
        _require(obj.num_slices >= 1, f"{p}num_slices", obj.num_slices, "must be >= 1")
        _require(
            [obj.data, obj.fsdp, obj.model].count(-1) <= 1,
            f"{p}axes",
            (obj.data, obj.fsdp, obj.model),
            "at most one axis may be -1",
        )
    elif isinstance(obj, TrainConfig):
        for name in ("steps", "batch_size", "grad_accum", "log_every", "keep_checkpoints"):
            _require(getattr(obj, name) >= 1, f"{p}{name}", getattr(obj, name), "must be >= 1")
        for name in ("warmup_steps", "eval_every", "dynamic_batch_every"):
            _require(getattr(obj, name) >= 0, f"{p}{name}", getattr(obj, name), "must be >= 0")
        every = obj.checkpoint_every
        _require(
            every >= 0 if isinstance(every, int) else duration_with_unit(every) is not None,
            f"{p}checkpoint_every",
            every,
            "must be steps >= 0 (0: only at the end) or a duration with a unit such as '20m' or '1h30m'",
        )
        _require(
            obj.time_limit is None or (duration_or_none(obj.time_limit) or 0) > 0,
            f"{p}time_limit",
            obj.time_limit,
            "must be seconds > 0, a duration such as '8h30m', or null (no limit)",
        )
        _require(obj.learning_rate > 0, f"{p}learning_rate", obj.learning_rate, "must be > 0")
        _require(0.0 <= obj.min_lr_ratio <= 1.0, f"{p}min_lr_ratio", obj.min_lr_ratio, "must be in [0, 1]")
        _require(obj.weight_decay >= 0, f"{p}weight_decay", obj.weight_decay, "must be >= 0")
        _require(
            obj.max_grad_norm is None or obj.max_grad_norm > 0,
            f"{p}max_grad_norm",
            obj.max_grad_norm,
            "must be > 0 or null",
        )
        _require(
            obj.dynamic_batch_factor > 1.0,
            f"{p}dynamic_batch_factor",
            obj.dynamic_batch_factor,
            "must be > 1",
        )
        _require(
            obj.dynamic_batch_max is None or obj.dynamic_batch_max >= obj.batch_size,
            f"{p}dynamic_batch_max",
            obj.dynamic_batch_max,
            f"must be >= batch_size={obj.batch_size} or null",
        )
        _require(
            obj.loss_chunk_tokens == "auto" or obj.loss_chunk_tokens >= 0,
            f"{p}loss_chunk_tokens",
            obj.loss_chunk_tokens,
            "must be >= 1 (tokens per chunk), 0 (never chunk) or 'auto'",
        )
        _require(0.0 <= obj.distill_alpha <= 1.0, f"{p}distill_alpha", obj.distill_alpha, "must be in [0, 1]")
        _require(
            obj.distill_temperature > 0, f"{p}distill_temperature", obj.distill_temperature, "must be > 0"
        )
        _require(
            obj.distill_hidden_weight >= 0,
            f"{p}distill_hidden_weight",
            obj.distill_hidden_weight,
            "must be >= 0",
        )
    elif isinstance(obj, LoraConfig):
        _require(obj.rank >= 0, f"{p}rank", obj.rank, "must be >= 0 (0 turns LoRA off)")
        _require(obj.alpha > 0, f"{p}alpha", obj.alpha, "must be > 0")
        _require(0.0 <= obj.dropout < 1.0, f"{p}dropout", obj.dropout, "must be in [0, 1)")
        names = obj.target_modules
        _require(
            names == "auto" or (bool(names) and all(_MODULE_NAME.fullmatch(n) for n in names)),
            f"{p}target_modules",
            names,
            "'auto' or a non-empty list of module names (letters, digits, '_', '.'; e.g. [q_proj, v_proj])",
        )
    elif isinstance(obj, WorkbenchConfig):
        _require(
            obj.data.max_length <= obj.model.max_position_embeddings or obj.model.pretrained_path is not None,
            "data.max_length",
            obj.data.max_length,
            f"must be <= model.max_position_embeddings={obj.model.max_position_embeddings}",
        )
        # A quantized base is frozen integers: only LoRA adapters can train on top of it.
        _require(
            obj.model.quantize == "none" or obj.lora.rank > 0,
            "model.quantize",
            obj.model.quantize,
            f"needs LoRA adapters to train (lora.rank={obj.lora.rank} trains the base weights, which "
            "'int8'/'int4' freeze as integers): set lora.rank >= 1 (e.g. 16) or model.quantize=none",
        )
        # With a token budget the loader sizes every bucket's batch from it and ignores
        # train.batch_size, so growing the batch would change no batch and only skip data (the
        # epoch resumes as if the batches had grown).
        _require(
            obj.train.dynamic_batch_every == 0 or obj.bucketing.tokens_per_batch is None,
            "train.dynamic_batch_every",
            obj.train.dynamic_batch_every,
            f"must be 0 while bucketing.tokens_per_batch={obj.bucketing.tokens_per_batch} is set "
            "(the token budget fixes every batch size); unset one of them",
        )


def load_config(path: str | Path | None = None, overrides: typing.Iterable[str] = ()) -> WorkbenchConfig:
    """Load `path` (or the defaults when None) and apply dotted overrides."""
    base = WorkbenchConfig() if path is None else WorkbenchConfig.from_yaml(Path(path))
    return base.with_overrides(list(overrides))
