"""A tokenizer as GGUF metadata: llama.cpp's ``tokenizer.ggml.*`` keys, read from its ``tokenizer.json``.

Two kinds, as the families use them:

- **byte-level BPE** (``tokenizer.ggml.model = "gpt2"``: Llama 3, SmolLM, Qwen2/3, the workbench's own
  tokenizer): tokens in the byte alphabet, the merges, and the pre-tokenizer's name
  (``tokenizer.ggml.pre``), told from its split rule: ``gpt-2`` (the byte-level regex itself),
  ``llama-bpe`` (Llama 3's), ``qwen2``, ``smollm`` (digits one by one);
- **SentencePiece-style BPE** with byte fallback (``"llama"``: Llama 2, Mistral, Gemma): ``▁`` for
  spaces, ``<0xNN>`` byte pieces, a score per piece (llama.cpp merges the best-scoring pair first, so
  a piece made by the ``r``-th merge scores ``-r``), whether a space is put before the text
  (``add_space_prefix``), and the merges too (transformers' GGUF reader rebuilds from them).

Both carry each token's type (normal, unknown, control for special added tokens, user-defined for
other added ones, byte, unused for the rows a padded vocabulary has beyond the tokenizer's), the
bos/eos/unk/pad ids, whether bos/eos are added, and the chat template. A tokenizer of another kind
(Unigram, WordPiece, an unknown split rule) is refused by `GGUFVocabError`, before any weight is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
"""llama.cpp's token types."""

_SPLITS = {
    "llama-bpe": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "qwen2": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
}
"""A byte-level tokenizer's split regex -> llama.cpp's pre-tokenizer name."""


class GGUFVocabError(ValueError):
    """A tokenizer the GGUF writer cannot describe: the message says what it is and what is written."""


@dataclass(frozen=True)
class GGUFVocab:
    model: str
    """``gpt2`` (byte-level BPE) or ``llama`` (SentencePiece-style BPE)."""
    pre: str | None
    tokens: list[str]
    types: list[int]
    merges: list[str]
    scores: list[float] | None
    special: dict[str, int]
    """bos, eos, unknown, padding: their ids where the tokenizer has them."""
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool | None
    chat_template: str | None

    def metadata(self) -> list[tuple[str, str, Any]]:
        """(key, GGUF value type, value) of every ``tokenizer.*`` key."""
        rows: list[tuple[str, str, Any]] = [
            ("tokenizer.ggml.model", "string", self.model),
            ("tokenizer.ggml.tokens", "array", self.tokens),
            ("tokenizer.ggml.token_type", "array", self.types),
            ("tokenizer.ggml.merges", "array", self.merges),
        ]
        if self.pre is not None:
            rows.append(("tokenizer.ggml.pre", "string", self.pre))
        if self.scores is not None:
            rows.append(("tokenizer.ggml.scores", "array", self.scores))
        rows += [(f"tokenizer.ggml.{name}_token_id", "uint32", value) for name, value in self.special.items()]
        rows += [
            ("tokenizer.ggml.add_bos_token", "bool", self.add_bos),
            ("tokenizer.ggml.add_eos_token", "bool", self.add_eos),
        ]
        if self.add_space_prefix is not None:
            rows.append(("tokenizer.ggml.add_space_prefix", "bool", self.add_space_prefix))
        if self.chat_template:
            rows.append(("tokenizer.chat_template", "string", self.chat_template))
        return rows


def _parts(node: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """A tokenizer.json component and, for a ``Sequence``, its members."""
    if not node:
        return []
    return [node, *[m for inner in node.get(key, []) for m in _parts(inner, key)]]


def _byte_level_pre(pre_tokenizer: dict[str, Any] | None) -> str:
    parts = _parts(pre_tokenizer, "pretokenizers")
    kinds = [p.get("type") for p in parts]
    splits = [
        p["pattern"].get("Regex")
        for p in parts
        if p.get("type") == "Split" and "Regex" in p.get("pattern", {})
    ]
    if splits:
        name = next((n for n, regex in _SPLITS.items() if regex == splits[0]), None)
        if name is None:
            raise GGUFVocabError(
                f"the tokenizer splits text with {splits[0][:80]!r}, a rule the GGUF writer does not name "
                f"(it knows {', '.join([*_SPLITS, 'gpt-2', 'smollm'])})"
            )
        return name
    if "Digits" in kinds:
        return "smollm"
    return "gpt-2"


def vocab_of(tokenizer: Any, vocab_size: int) -> GGUFVocab:
    """`tokenizer` as GGUF metadata for a model of `vocab_size` embedding rows (see the module's docstring)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise GGUFVocabError(
            f"GGUF export needs a fast (tokenizers) tokenizer; {type(tokenizer).__name__} is not one"
        )
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise GGUFVocabError(f"GGUF export writes BPE tokenizers; this one is {model.get('type')!r}")
    pre_parts = _parts(spec.get("pre_tokenizer"), "pretokenizers")
    byte_level = (
        any(p.get("type") == "ByteLevel" for p in pre_parts)
        or (spec.get("decoder") or {}).get("type") == "ByteLevel"
    )
    if not byte_level and not model.get("byte_fallback"):
        raise GGUFVocabError(
            "GGUF export writes byte-level BPE (Llama 3, Qwen) and SentencePiece-style BPE with byte fallback "
            "(Llama 2, Mistral, Gemma); this tokenizer is neither"
        )
    tokens: list[str | None] = [None] * vocab_size
    types = [NORMAL] * vocab_size
    for token, index in model["vocab"].items():
        if index < vocab_size:
            tokens[index] = token
    for added in spec.get("added_tokens") or []:
        index = int(added["id"])
        if index < vocab_size:
            tokens[index] = added["content"]
            types[index] = CONTROL if added.get("special") else USER_DEFINED
    if len(tokenizer) > vocab_size:
        raise GGUFVocabError(
            f"the tokenizer has {len(tokenizer)} tokens, more than the model's {vocab_size} embedding rows"
        )
    for index, token in enumerate(tokens):
        if token is None:  # rows of a padded embedding beyond the tokenizer
            tokens[index], types[index] = f"[PAD{index}]", UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    unk = model.get("unk_token")
    scores = None
    if not byte_level:
        scores = [0.0] * vocab_size
        ids = {t: i for i, t in enumerate(tokens)}
        for rank, merge in enumerate(merges):
            made = ids.get(merge.replace(" ", "", 1))
            if made is not None and scores[made] == 0.0:
                scores[made] = -float(rank + 1)
        for index, token in enumerate(tokens):
            if types[index] == NORMAL and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                types[index] = BYTE
            elif token == unk:
                types[index] = UNKNOWN
    return GGUFVocab(
        model="gpt2" if byte_level else "llama",
        pre=_byte_level_pre(spec.get("pre_tokenizer")) if byte_level else None,
        tokens=[str(t) for t in tokens],
        types=types,
        merges=merges,
        scores=scores,
        special=_special_ids(tokenizer),
        add_bos=_adds(tokenizer, "bos"),
        add_eos=_adds(tokenizer, "eos"),
        add_space_prefix=None if byte_level else _space_prefix(spec),
        chat_template=_template(tokenizer),
    )


def _special_ids(tokenizer: Any) -> dict[str, int]:
    out = {}
    for name, attribute in (
        ("bos", "bos_token_id"),
        ("eos", "eos_token_id"),
        ("unknown", "unk_token_id"),
        ("padding", "pad_token_id"),
    ):
        value = getattr(tokenizer, attribute, None)
        if isinstance(value, int):
            out[name] = value
    return out


def _adds(tokenizer: Any, which: str) -> bool:
    """Whether encoding a text puts the bos (or eos) token at its start (or end)."""
    token = getattr(tokenizer, f"{which}_token_id", None)
    if token is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0 if which == "bos" else -1] == token


def _space_prefix(spec: dict[str, Any]) -> bool:
    """Whether a SentencePiece-style tokenizer puts ``▁`` before the text (Llama 2's yes, Gemma's no)."""
    for part in _parts(spec.get("normalizer"), "normalizers"):
        if part.get("type") == "Prepend":
            return True
    for part in _parts(spec.get("pre_tokenizer"), "pretokenizers"):
        if part.get("type") == "Metaspace":
            return part.get("prepend_scheme", "always") != "never" and part.get("add_prefix_space", True)
    return False


def _template(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default") or next(iter(template.values()), None)
    return str(template) if template else None
