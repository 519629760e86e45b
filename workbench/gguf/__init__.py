"""GGUF export: a trained model as one GGUF file for llama.cpp, Ollama and LM Studio, written in Python.

`write_gguf` (``writer.py``) writes a transformers causal LM (adapters merged first) and its tokenizer
with the ``gguf`` package alone (no llama.cpp checkout, no compiler), in f32, f16, bf16 or q8_0. The
tensor names and hyperparameters are the workbench's own table (``families.py``: llama, mistral,
qwen2, qwen3, gemma, gemma2), the tokenizer's keys ``vocab.py``'s (byte-level BPE and
SentencePiece-style BPE, special tokens, chat template). A family or tokenizer it cannot write is
refused by name before any weight is read (`check_writable`). The command is ``python -m workbench
export --to gguf`` (`workbench.export_command`).
"""

from __future__ import annotations

from workbench.gguf.families import GGUF_FAMILIES, GGUFFamilyError, family_of
from workbench.gguf.vocab import GGUFVocabError, vocab_of
from workbench.gguf.writer import OUTTYPES, GGUFMissingError, check_writable, write_gguf

__all__ = [
    "GGUF_FAMILIES",
    "OUTTYPES",
    "GGUFFamilyError",
    "GGUFMissingError",
    "GGUFVocabError",
    "check_writable",
    "family_of",
    "vocab_of",
    "write_gguf",
]
