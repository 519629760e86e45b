"""The model card (``README.md``) a Hub user expects beside a pushed model, from plain facts.

The YAML header carries what the Hub indexes: ``base_model`` (a Hub id; left out for a local base),
``library_name`` (``peft`` for an adapter, ``transformers`` for whole weights, ``gguf`` for GGUF
files), ``tags``, ``datasets`` (the Hub datasets trained on) and ``pipeline_tag``. The body says what
was trained and how (the objective, the data, the resolved config), what came out (the final and eval
metrics), on what (the hardware), with which workbench version, and how to load it.

`ModelCard` holds the facts as plain values, so this module imports nothing; the commands gather
them (`workbench.publish`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["adapter", "transformers", "gguf"]

_OBJECTIVES = {
    "sft": "supervised fine-tuning (next-token cross-entropy)",
    "dpo": "preference tuning (DPO and its relatives)",
    "grpo": "reinforcement learning from rewards (GRPO)",
}


@dataclass(frozen=True)
class ModelCard:
    """What a pushed model's card says; `render` writes it."""

    repo_id: str
    kind: Kind
    base_model: str | None = None
    """The Hub id the weights started from (None: a local directory or a model built from a config)."""
    base_description: str | None = None
    """The base in words when it is not on the Hub (a local path, a config)."""
    objective: str = "sft"
    datasets: Sequence[str] = ()
    """Hub dataset ids trained on."""
    data_description: str | None = None
    """The data in words ('openai/gsm8k (subset main, split train)', 'a local file')."""
    config: Mapping[str, Any] | None = None
    """The run's resolved config (`WorkbenchConfig.to_dict`)."""
    metrics: Mapping[str, Any] = field(default_factory=dict)
    """Final figures: loss, eval loss, perplexity, tokens/s, steps, rewards, ..."""
    hardware: Mapping[str, Any] | None = None
    version: str = ""
    gguf_files: Sequence[str] = ()
    lora: Mapping[str, Any] | None = None
    """An adapter's rank, alpha and target modules."""
    extra_tags: Sequence[str] = ()

    def tags(self) -> list[str]:
        tags = ["xla-workbench", self.objective]
        if self.kind == "adapter":
            tags += ["lora", "peft"]
        if self.kind == "gguf":
            tags += ["gguf", "llama.cpp"]
        if self.base_model:  # the Hub's model-tree relation: an adapter of, a fine-tune of, a quantization of
            relation = {"adapter": "adapter", "transformers": "finetune", "gguf": "quantized"}[self.kind]
            tags.append(f"base_model:{relation}:{self.base_model}")
        return list(dict.fromkeys([*tags, *self.extra_tags]))

    def header(self) -> dict[str, Any]:
        """The card's YAML header as a mapping."""
        out: dict[str, Any] = {}
        if self.base_model:
            out["base_model"] = self.base_model
        out["library_name"] = {"adapter": "peft", "transformers": "transformers", "gguf": "gguf"}[self.kind]
        out["tags"] = self.tags()
        if self.datasets:
            out["datasets"] = list(self.datasets)
        out["pipeline_tag"] = "text-generation"
        return out

    def render(self) -> str:
        """The whole ``README.md``."""
        import yaml

        head = yaml.safe_dump(self.header(), sort_keys=False, allow_unicode=True).strip()
        parts = [f"---\n{head}\n---", f"# {self.repo_id.split('/')[-1]}", self._summary()]
        parts += [self._training(), self._results(), self._hardware(), self._loading(), self._config()]
        return "\n\n".join(p for p in parts if p) + "\n"

    def _summary(self) -> str:
        what = {
            "adapter": "A LoRA adapter",
            "transformers": "A fine-tuned model",
            "gguf": "GGUF weights (for llama.cpp, Ollama, LM Studio)",
        }[self.kind]
        base = (
            f"[{self.base_model}](https://huggingface.co/{self.base_model})"
            if self.base_model
            else (self.base_description or "a model built from its config")
        )
        version = f" {self.version}" if self.version else ""
        return f"{what} on {base}, trained with the XLA Workbench{version} (PyTorch/XLA)."

    def _training(self) -> str:
        rows = [("objective", _OBJECTIVES.get(self.objective, self.objective))]
        if self.data_description:
            rows.append(("data", self.data_description))
        train = (self.config or {}).get("train") or {}
        for key in ("steps", "batch_size", "grad_accum", "learning_rate", "precision", "optimizer"):
            if key in train:
                rows.append((key.replace("_", " "), str(train[key])))
        if self.lora:
            rows.append(
                (
                    "LoRA",
                    f"rank {self.lora.get('r')}, alpha {self.lora.get('lora_alpha')}, on "
                    f"{', '.join(sorted(self.lora.get('target_modules') or [])) or 'its target modules'}",
                )
            )
        return "## Training\n\n" + _table(rows, ("", ""))

    def _results(self) -> str:
        rows = [(name, _number(value)) for name, value in self.metrics.items() if value is not None]
        if not rows:
            return ""
        return "## Results\n\n" + _table(rows, ("metric", "value"))

    def _hardware(self) -> str:
        hw = self.hardware or {}
        if not hw:
            return ""
        via = ", via XLA" if hw.get("via_xla") else ""
        devices = hw.get("num_devices")
        line = f"{hw.get('chip', 'unknown')} ({hw.get('backend', '?')}{via}, {devices} device{'s' if devices != 1 else ''})"
        return f"## Hardware\n\n{line}"

    def _loading(self) -> str:
        repo = self.repo_id
        if self.kind == "adapter":
            code = (
                "from peft import AutoPeftModelForCausalLM\n"
                "from transformers import AutoTokenizer\n\n"
                f'model = AutoPeftModelForCausalLM.from_pretrained("{repo}")\n'
                f'tokenizer = AutoTokenizer.from_pretrained("{repo}")'
            )
            cli = f"python -m workbench generate --model {repo} --chat 'Hello!'"
        elif self.kind == "transformers":
            code = (
                "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
                f'model = AutoModelForCausalLM.from_pretrained("{repo}")\n'
                f'tokenizer = AutoTokenizer.from_pretrained("{repo}")'
            )
            cli = f"python -m workbench generate --model {repo} --chat 'Hello!'"
        else:
            name = self.gguf_files[0] if self.gguf_files else "MODEL.gguf"
            code = (
                "from transformers import AutoModelForCausalLM\n\n"
                f'model = AutoModelForCausalLM.from_pretrained("{repo}", gguf_file="{name}")'
            )
            cli = f"llama-cli -hf {repo} -p 'Hello!'   # or: ollama run hf.co/{repo}"
        return f"## How to load\n\n```python\n{code}\n```\n\n```bash\n{cli}\n```"

    def _config(self) -> str:
        if not self.config:
            return ""
        import yaml

        text = yaml.safe_dump(json.loads(json.dumps(self.config, default=str)), sort_keys=False).strip()
        return f"## Config (as resolved)\n\n```yaml\n{text}\n```"


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"


def _table(rows: Sequence[tuple[str, str]], head: tuple[str, str]) -> str:
    lines = [f"| {head[0]} | {head[1]} |", "|---|---|"]
    lines += [f"| {a} | {str(b).replace('|', '/')} |" for a, b in rows]
    return "\n".join(lines)


def read_header(readme: str) -> dict[str, Any]:
    """The YAML header of a card's text ({} without one)."""
    import yaml

    if not readme.startswith("---"):
        return {}
    end = readme.find("\n---", 3)
    if end < 0:
        return {}
    loaded = yaml.safe_load(readme[3:end])
    return loaded if isinstance(loaded, dict) else {}
