"""[from config] Typed configuration for a workbench run.

One `WorkbenchConfig` holds seven sections (model, data, bucketing, mesh, train, lora, and grpo: the
GRPO objective's, `workbench.config_grpo`), each a
dataclass whose fields carry a docstring-comment below them. Configs come from YAML
(safe loader only), are overridden with dotted ``key=value`` strings (the form a CLI flag
or a papermill parameter takes), round-trip through ``to_dict`` / ``from_dict`` and save
back to YAML.

Every bad value raises `ConfigError` naming the field, the value and what is allowed;
unknown keys get a did-you-mean suggestion. Strings are coerced with explicit parsers,
never ``eval``. The generic machinery (building sections, overrides, coercion) is
`workbench.config_parse`; this module holds the fields and the checks that know them (`_validate`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from workbench.config_checks import (  # noqa: F401 (REFERENCE_FREE_LOSSES, REPORT_TO: public here)
    REFERENCE_FREE_LOSSES,
    REPORT_TO,
    validate_report_to,
    validate_run,
)
from workbench.config_grpo import (  # noqa: F401 (the generation batch: public here too, for the estimate)
    GRPOConfig,
    keeps_old_logps,
    steps_per_generation,
    validate_grpo,
)
from workbench.config_parse import (
    ConfigError,
    build_section,
    require,
    set_dotted,
    split_override,
    yaml_problem,
)
from workbench.families import FAMILY_NAMES
from workbench.objective_registry import objective_names
from workbench.units import duration_or_none, duration_with_unit

ModelFamily = Literal[FAMILY_NAMES]  # type: ignore[valid-type]
"""The allowed values of ``ModelConfig.family``: the names in `workbench.families.FAMILIES`
(``typing.get_args(ModelFamily) == FAMILY_NAMES``)."""


@dataclass
class ModelConfig:
    family: ModelFamily = "llama"
    """Architecture family in `transformers` used to build the model from this config (see `workbench.families`)."""
    pretrained_path: str | None = None
    """Model directory for `from_pretrained(dir)` (a transformers checkpoint, a LoRA adapter or a training checkpoint) or a Hub id ('org/name' or 'org/name@revision': its weights, config and tokenizer, through the local Hub cache; a local directory of that name wins); when set, the size fields below are ignored."""
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
    mlp_chunk_tokens: int | Literal["auto"] | None = None
    """Run each decoder layer's MLP a tile of N tokens (all rows, N // rows positions) at a time, each tile recomputed in the backward pass, so the [tokens x intermediate] activations never exist whole (exact: the same losses and gradients, LoRA adapters included); 'auto' tiles when one layer's MLP activations would exceed a share of device memory (long rows); null (the default) never tiles. `workbench.models.mlp_tiles`."""
    attention: Literal["auto", "eager", "sdpa", "flash", "chunked"] = "auto"
    """Attention kernel (`workbench.models.attention`): 'chunked' (any XLA device: query blocks, never the whole T x T scores), 'flash' (TPU: Pallas flash attention), 'sdpa' (torch's fused kernels, for CUDA), 'eager' (transformers' reference); 'auto' picks flash on TPU, chunked on other XLA devices for long rows, sdpa on CUDA, eager elsewhere, and says which."""


COLUMN_KEYS = (
    "prompt",
    "response",
    "system",
    "messages",
    "conversations",
    "instruction",
    "input",
    "output",
    "text",
    "chosen",
    "rejected",
    "answer",
)
"""The names `DataConfig.columns` maps onto: every column a record format reads (`workbench.data.formats`)."""


@dataclass
class DataConfig:
    source: str = "embedded"
    """'embedded' (text shipped with Python itself), 'chat-sample' (the shipped SFT records), 'preference-sample' (the shipped prompt/chosen/rejected pairs, for `train.objective: dpo`), 'math-sample' (arithmetic word problems with answers, made deterministically: prompts for `train.objective: grpo`, question/solution chat records otherwise), a local file or directory of files, a directory written by `datasets`' save_to_disk (a DatasetDict gives its `split`, or its only one), or a Hub dataset id ('org/name' or 'org/name@revision'; its data files for `subset` and `split`, read by the same loaders; a local path of that name wins)."""
    subset: str | None = None
    """A Hub dataset's subset: its config name (e.g. 'main' for openai/gsm8k); None takes the repo's default or only one. Read only when `source` is a Hub id."""
    split: str = "train"
    """The split to read from a Hub dataset or a save_to_disk DatasetDict ('train', 'validation', 'test' or the repo's own name); the eval part is still `eval_fraction` of it."""
    format: Literal["auto", "text", "messages", "prompt_response", "alpaca", "sharegpt"] = "auto"
    """Record format: 'messages' (lists of {role, content}); 'sharegpt' (conversations: lists of {from, value}, from in human/user, gpt/assistant/model, system); 'alpaca' (instruction, optional input, output, optional system; the user turn is instruction + blank line + input when input is not empty); 'prompt_response' (prompt, response, optional system; other columns such as scores are kept for `filter`); 'text' (the `text_field` column). 'auto' takes the first that fits, in that order, and says which. Under `train.objective: dpo` records are pairs (prompt/chosen/rejected, chosen/rejected conversations, or scored responses with `pair_by`) and this field is not read. Configs written before `file_type` existed set a file type here: jsonl/json/csv/parquet move to `file_type`, and 'text' (now plain-text records) still reads a file of unknown extension as lines of text."""
    file_type: Literal["auto", "jsonl", "json", "csv", "parquet", "text"] = "auto"
    """How a local `source` file is read; 'auto' goes by the extension (.jsonl, .json, .csv, .parquet, .txt, .text). A save_to_disk directory is read as what it is."""
    columns: dict[str, str] | None = None
    """Your column names for the format's own, e.g. {prompt: question, response: answer}; keys: prompt, response, system, messages, conversations, instruction, input, output, text (as `text_field`), for preference pairs chosen, rejected, and for GRPO prompts answer (the reference the rewards compare with). On the command line: 'data.columns={prompt: question, response: answer}'."""
    filter: str | list[str] | None = None
    """Rows to keep, before tokenising: 'column op literal' conditions (ops == != >= <= > <; literals: numbers, quoted strings, true, false, null) joined by 'and', or a list of such strings that must all hold; e.g. 'helpfulness >= 3 and verbosity <= 2'."""
    text_field: str = "text"
    """Column holding raw text for language-model training (the 'text' format)."""
    chat: bool = False
    """Insist on chat records: under format 'auto' only the chat formats are tried (an error when none fits). Chat formats train as chat either way: labels only on the assistant's turns."""
    tokenizer_path: str | None = None
    """Local tokenizer directory (or a Hub id: the repo's tokenizer files) for `AutoTokenizer.from_pretrained`; None takes the tokenizer beside `model.pretrained_path` when that is set, else trains one on the corpus."""
    tokenizer_vocab_size: int = 512
    """Vocabulary size of the locally trained tokenizer."""
    max_length: int = 256
    """Longest sequence kept after tokenisation (longer ones go through `bucketing.overflow`)."""
    max_examples: int | None = None
    """Cap on the number of records used, counted after `filter` (None uses every one)."""
    pair_by: str | None = None
    """Preference data (`train.objective: dpo`) from scored responses, e.g. HelpSteer2's: the column whose score ranks the responses to one prompt; the best becomes `chosen`, the worst `rejected` (ties make no pair). None: records carry prompt/chosen/rejected themselves."""
    eval_fraction: float = 0.05
    """Fraction of examples held out for evaluation, in [0, 0.5]."""

    LEGACY_VALUES: ClassVar[dict[str, tuple[str, ...]]] = {"format": ("jsonl", "json", "csv", "parquet")}
    """Values `format` took before `file_type` existed (file types), moved onto `file_type` when built."""

    def __post_init__(self) -> None:
        # Configs written before data.file_type named the file type in data.format: keep them working.
        if self.format in self.LEGACY_VALUES["format"]:
            if self.file_type not in ("auto", self.format):
                raise ConfigError(
                    f"data.format={self.format!r} is not allowed with data.file_type={self.file_type!r}: "
                    "data.format names the record format now (auto, text, messages, prompt_response, "
                    "alpaca, sharegpt); set the file type in data.file_type only"
                )
            self.file_type, self.format = self.format, "auto"


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
    """On XLA, use SPMD sharding over `data` x `fsdp` x `model` at all; False runs on one XLA device. Torchrun's processes (`train --nproc N` on GPUs or CPU ranks) always split as `data` x `fsdp`, whatever this says."""
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
    """Steps of linear warm-up to `learning_rate`, before the cosine decay to `min_lr_ratio` of it."""
    weight_decay: float = 0.0
    """Decoupled weight decay (as AdamW's), on every weight except biases and norm weights."""
    optimizer: Literal["adamw", "adafactor", "sgd"] = "adamw"
    """Optimizer (`workbench.train.optim`): 'adamw' (torch's AdamW, betas 0.9/0.95: two moments per weight), 'adafactor' (factored second moments, far less state; it follows the schedule's learning rate instead of its own relative step) or 'sgd' (momentum 0.9: one buffer per weight)."""
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
    rank_timeout: float | str = "60s"
    """Under torchrun: how long the ranks wait for a rank that stops answering before they stop too, naming it."""
    dynamic_batch_every: int = 0
    """Grow the batch every this many steps (0 disables dynamic batch size)."""
    dynamic_batch_factor: float = 2.0
    """Factor the batch grows by each time."""
    dynamic_batch_max: int | None = None
    """Largest batch dynamic growth may reach; None: as large as the memory estimate allows (no cap where memory is unknown)."""
    compile_cache_dir: str | None = "auto"
    """Persistent XLA compilation cache, kept across sessions; 'auto' uses one on a TPU (Drive, /kaggle/working or ./.xla_cache), None turns it off."""
    prewarm: bool = True
    """On XLA, and for a compiled native step (`compile`), compile every batch shape the run can meet before the first step (no compiles mid-run)."""
    compile: Literal["auto", "off", "on"] = "auto"
    """Plain torch (CPU, CUDA, torchrun): run the step's forward and loss through torch.compile (inductor, static shapes: one graph per bucket shape, compiled in warm-up). 'auto': on with CUDA, off on the CPU, where compiling a shape (17 s for the quickstart's model, 86 s for SmolLM2-135M's, on 2 cores) took 90 to 7,000 steps to pay back (`bench/compile_native.py`). Not read on XLA, which compiles every step anyway. A YAML on/off means 'on'/'off'."""
    resume: bool = True
    """Resume from the latest complete checkpoint in `checkpoint_dir` when there is one."""
    progress_bar: bool = True
    """Show a tqdm progress bar (updated only at log intervals; it never forces a device sync)."""
    report_to: str | list[str] = "none"
    """Trackers that get every log interval besides the dashboard: 'none', 'tensorboard', 'trackio', 'wandb', or a list of them (transformers' names); each an optional extra (pip install 'xla-workbench[tensorboard]', ...). W&B never prompts: without a key it logs offline and says where its files are."""
    run_name: str | None = None
    """The run's name in the trackers (None: the objective and the start time, e.g. 'sft-20261128-143005')."""
    logging_dir: str = "runs"
    """Where TensorBoard's event files (logging_dir/run_name) and W&B's runs go; trackio keeps its own store (TRACKIO_DIR, else HF_HOME/trackio)."""
    loss_chunk_tokens: int | Literal["auto"] = "auto"
    """Tokens per chunk of the LM head + cross-entropy, recomputed in backward, so the [tokens x vocab] logits never exist whole; 'auto' chunks when they would exceed a share of device memory, 0 never chunks."""
    offload_activations: Literal["auto", "on", "off"] = "auto"
    """With gradient_checkpointing, keep each layer's checkpointed input in host memory and bring it back for that layer's backward pass (on XLA under the scanned layer stack, where torch_xla places them in pinned host memory; on CUDA through pinned buffers copied on a side stream); 'auto' turns it on only where the memory estimate says the run does not fit the device without it. The doctor and the memory estimate report the host RAM it takes. A YAML on/off means 'on'/'off'."""
    distill_alpha: float = 0.5
    """Distillation: weight of the KL(teacher || student) term; 1 - alpha weighs the label cross-entropy."""
    distill_temperature: float = 2.0
    """Distillation: softmax temperature of the KL term (the term is scaled by temperature squared)."""
    distill_hidden_weight: float = 0.0
    """Distillation: weight of the last-hidden-state MSE through a learned projection (0 disables it)."""
    objective: str = "sft"
    """What the run trains, one of the registered objectives (`workbench.objectives`): 'sft': next-token cross-entropy on the labelled tokens (distillation when a teacher is given: `Trainer(cfg, teacher=model)`, weighted by the distill_* keys). 'dpo': preference optimisation on prompt/chosen/rejected pairs (`workbench.objectives.dpo`; the loss is `dpo_loss`). 'grpo': reinforcement learning from rewards on sampled completions (the `grpo` section, `workbench.rl`). An objective of your own registers its name (`workbench.objective_registry.register_objective`)."""
    dpo_beta: float = 0.1
    """DPO: strength of the pull towards the reference model (the beta of the DPO and IPO losses); SimPO's beta (TRL's CPOConfig default is 0.1 too; the SimPO paper uses 2 to 10); ORPO's lambda, the odds-ratio term's weight (TRL's ORPOConfig default 0.1)."""
    dpo_loss: Literal["sigmoid", "ipo", "simpo", "orpo"] = "sigmoid"
    """DPO: 'sigmoid' (the DPO paper's -log sigmoid of the scaled margin) or 'ipo' (squared distance of the length-averaged margin from 1 / (2 beta)); reference-free, no reference model at all: 'simpo' (-log sigmoid(beta (chosen - rejected) - simpo_gamma) of the length-averaged log-probs) or 'orpo' (the chosen answer's token-averaged NLL minus beta log sigmoid of the log odds ratio)."""
    simpo_gamma: float = 0.5
    """SimPO: the target reward margin gamma, >= 0 (TRL's CPOConfig default 0.5); read only with dpo_loss 'simpo'."""
    dpo_reference: Literal["auto", "adapters_off", "copy", "precompute"] = "auto"
    """DPO: where the reference log-probs come from (not read by the reference-free 'simpo' and 'orpo'). 'adapters_off': the same weights with the LoRA adapters switched off, in the same program; 'copy': a frozen copy of the starting model (its weights count in the memory estimate); 'precompute': one pass before training, stored with the dataset. 'auto': adapters_off under fresh LoRA adapters, precompute when the run continues an adapter (the reference is then the adapter's model), copy for a full fine-tune."""


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
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """GRPO: rollouts, rewards and the clipped policy loss (read under `train.objective: grpo`)."""

    # ---- construction -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkbenchConfig:
        return build_section(cls, data or {}, "", _validate)

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
            raise ConfigError(yaml_problem(err, candidate if is_file else None)) from None
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
        items = overrides.items() if isinstance(overrides, dict) else (split_override(o) for o in overrides)
        for key, value in items:
            set_dotted(data, type(self), key, value)
        return type(self).from_dict(data)


# ---- validation ----------------------------------------------------------------------

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")


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
            require(getattr(obj, name) >= 1, f"{p}{name}", getattr(obj, name), "must be >= 1")
        require(
            obj.hidden_size % obj.num_heads == 0,
            f"{p}num_heads",
            obj.num_heads,
            f"must divide hidden_size={obj.hidden_size}",
        )
        require(
            obj.num_heads % obj.num_kv_heads == 0,
            f"{p}num_kv_heads",
            obj.num_kv_heads,
            f"must divide num_heads={obj.num_heads}",
        )
        require(
            obj.mlp_chunk_tokens in ("auto", None) or obj.mlp_chunk_tokens >= 1,
            f"{p}mlp_chunk_tokens",
            obj.mlp_chunk_tokens,
            "must be >= 1 (tokens per tile), 'auto' or null (never tile)",
        )
    elif isinstance(obj, DataConfig):
        require(obj.max_length >= 2, f"{p}max_length", obj.max_length, "must be >= 2")
        require(
            obj.tokenizer_vocab_size >= 64,
            f"{p}tokenizer_vocab_size",
            obj.tokenizer_vocab_size,
            "must be >= 64",
        )
        require(
            obj.max_examples is None or obj.max_examples >= 1,
            f"{p}max_examples",
            obj.max_examples,
            "must be >= 1 or null",
        )
        require(
            0.0 <= obj.eval_fraction <= 0.5, f"{p}eval_fraction", obj.eval_fraction, "must be in [0, 0.5]"
        )
        require(
            not (obj.chat and obj.format == "text"),
            f"{p}format",
            obj.format,
            "chat=True needs a chat format: auto, messages, prompt_response, alpaca or sharegpt",
        )
        require(bool(obj.split.strip()), f"{p}split", obj.split, "a split name such as 'train' or 'test'")
        _validate_columns(obj, p)
        conditions = [obj.filter] if isinstance(obj.filter, str) else obj.filter
        require(
            conditions is None or (bool(conditions) and all(c.strip() for c in conditions)),
            f"{p}filter",
            obj.filter,
            "a condition such as 'helpfulness >= 3', a non-empty list of them, or null",
        )
    elif isinstance(obj, BucketConfig):
        require(
            obj.max_buckets == "auto" or obj.max_buckets >= 1,
            f"{p}max_buckets",
            obj.max_buckets,
            "must be >= 1 or 'auto'",
        )
        require(
            obj.max_buckets != "auto" or obj.strategy in ("optimal", "none") or obj.packing,
            f"{p}strategy",
            obj.strategy,
            "max_buckets 'auto' chooses among exact optimal plans: use strategy 'optimal' or a number of buckets",
        )
        for name in ("compile_seconds", "seconds_per_padded_token"):
            value = getattr(obj, name)
            require(value is None or value > 0, f"{p}{name}", value, "must be > 0 or null")
        require(obj.multiple_of >= 1, f"{p}multiple_of", obj.multiple_of, "must be >= 1")
        require(
            obj.tokens_per_batch is None or obj.tokens_per_batch >= 1,
            f"{p}tokens_per_batch",
            obj.tokens_per_batch,
            "must be >= 1 or null",
        )
    elif isinstance(obj, MeshConfig):
        for name in ("data", "fsdp", "model"):
            value = getattr(obj, name)
            require(
                value == -1 or value >= 1,
                f"{p}{name}",
                value,
                "must be >= 1, or -1 to fill from the device count",
            )
        require(obj.num_slices >= 1, f"{p}num_slices", obj.num_slices, "must be >= 1")
        require(
            [obj.data, obj.fsdp, obj.model].count(-1) <= 1,
            f"{p}axes",
            (obj.data, obj.fsdp, obj.model),
            "at most one axis may be -1",
        )
    elif isinstance(obj, TrainConfig):
        for name in ("steps", "batch_size", "grad_accum", "log_every", "keep_checkpoints"):
            require(getattr(obj, name) >= 1, f"{p}{name}", getattr(obj, name), "must be >= 1")
        for name in ("warmup_steps", "eval_every", "dynamic_batch_every"):
            require(getattr(obj, name) >= 0, f"{p}{name}", getattr(obj, name), "must be >= 0")
        every = obj.checkpoint_every
        require(
            every >= 0 if isinstance(every, int) else duration_with_unit(every) is not None,
            f"{p}checkpoint_every",
            every,
            "must be steps >= 0 (0: only at the end) or a duration with a unit such as '20m' or '1h30m'",
        )
        require(
            obj.time_limit is None or (duration_or_none(obj.time_limit) or 0) > 0,
            f"{p}time_limit",
            obj.time_limit,
            "must be seconds > 0, a duration such as '8h30m', or null (no limit)",
        )
        require(
            (duration_or_none(obj.rank_timeout) or 0) > 0,
            f"{p}rank_timeout",
            obj.rank_timeout,
            "must be seconds > 0 or a duration such as '90s'",
        )
        require(obj.learning_rate > 0, f"{p}learning_rate", obj.learning_rate, "must be > 0")
        require(0.0 <= obj.min_lr_ratio <= 1.0, f"{p}min_lr_ratio", obj.min_lr_ratio, "must be in [0, 1]")
        require(obj.weight_decay >= 0, f"{p}weight_decay", obj.weight_decay, "must be >= 0")
        require(
            obj.max_grad_norm is None or obj.max_grad_norm > 0,
            f"{p}max_grad_norm",
            obj.max_grad_norm,
            "must be > 0 or null",
        )
        require(
            obj.dynamic_batch_factor > 1.0,
            f"{p}dynamic_batch_factor",
            obj.dynamic_batch_factor,
            "must be > 1",
        )
        require(
            obj.dynamic_batch_max is None or obj.dynamic_batch_max >= obj.batch_size,
            f"{p}dynamic_batch_max",
            obj.dynamic_batch_max,
            f"must be >= batch_size={obj.batch_size} or null",
        )
        require(
            obj.loss_chunk_tokens == "auto" or obj.loss_chunk_tokens >= 0,
            f"{p}loss_chunk_tokens",
            obj.loss_chunk_tokens,
            "must be >= 1 (tokens per chunk), 0 (never chunk) or 'auto'",
        )
        require(
            obj.offload_activations != "on" or obj.gradient_checkpointing,
            f"{p}offload_activations",
            obj.offload_activations,
            "'on' needs gradient_checkpointing: true (it moves the layers' checkpoints to host memory)",
        )
        require(0.0 <= obj.distill_alpha <= 1.0, f"{p}distill_alpha", obj.distill_alpha, "must be in [0, 1]")
        require(
            obj.distill_temperature > 0, f"{p}distill_temperature", obj.distill_temperature, "must be > 0"
        )
        require(
            obj.distill_hidden_weight >= 0,
            f"{p}distill_hidden_weight",
            obj.distill_hidden_weight,
            "must be >= 0",
        )
        validate_report_to(obj)
        require(
            obj.objective in objective_names(),
            f"{p}objective",
            obj.objective,
            f"one of {', '.join(objective_names())} (an objective of your own registers with "
            "workbench.objective_registry.register_objective)",
        )
        require(obj.dpo_beta > 0, f"{p}dpo_beta", obj.dpo_beta, "must be > 0")
        require(obj.simpo_gamma >= 0, f"{p}simpo_gamma", obj.simpo_gamma, "must be >= 0")
    elif isinstance(obj, LoraConfig):
        require(obj.rank >= 0, f"{p}rank", obj.rank, "must be >= 0 (0 turns LoRA off)")
        require(obj.alpha > 0, f"{p}alpha", obj.alpha, "must be > 0")
        require(0.0 <= obj.dropout < 1.0, f"{p}dropout", obj.dropout, "must be in [0, 1)")
        names = obj.target_modules
        require(
            names == "auto" or (bool(names) and all(_MODULE_NAME.fullmatch(n) for n in names)),
            f"{p}target_modules",
            names,
            "'auto' or a non-empty list of module names (letters, digits, '_', '.'; e.g. [q_proj, v_proj])",
        )
    elif isinstance(obj, GRPOConfig):
        validate_grpo(obj, p)
    elif isinstance(obj, WorkbenchConfig):
        validate_run(obj)  # the core sections against each other, then the objective's own requirements


def _validate_columns(obj: DataConfig, p: str) -> None:
    """`DataConfig.columns`: keys a format reads, each onto its own non-empty column name."""
    columns = obj.columns or {}
    for key in columns:
        close = difflib.get_close_matches(key, COLUMN_KEYS, n=1, cutoff=0.6)
        require(
            key in COLUMN_KEYS,
            f"{p}columns",
            columns,
            f"{key!r} is not a column any format reads{f'; did you mean {close[0]!r}?' if close else ''} "
            f"(keys: {', '.join(COLUMN_KEYS)}; each maps onto one of your columns, e.g. {{prompt: question}})",
        )
    names = list(columns.values())
    require(
        all(n.strip() for n in names) and len(set(names)) == len(names),
        f"{p}columns",
        columns,
        "each key maps onto a different, non-empty column name",
    )
    # 'text' in columns and text_field name the same thing: two different answers would be a guess
    require(
        columns.get("text", obj.text_field) == obj.text_field or obj.text_field == "text",
        f"{p}columns",
        columns,
        f"maps 'text' onto {columns.get('text')!r} but text_field={obj.text_field!r}: set one of them",
    )


def load_config(path: str | Path | None = None, overrides: typing.Iterable[str] = ()) -> WorkbenchConfig:
    """Load `path` (or the defaults when None) and apply dotted overrides."""
    base = WorkbenchConfig() if path is None else WorkbenchConfig.from_yaml(Path(path))
    return base.with_overrides(list(overrides))
