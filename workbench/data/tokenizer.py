"""[from data] Text in, token ids out: the embedded corpus, a locally trained tokenizer, user data, chat SFT records.

**The embedded corpus** (`embedded_corpus`) is real English technical prose that ships with
Python itself, so the defaults need no download: the 79 topics of ``pydoc_data.topics`` (the
language reference pages behind ``help("if")`` etc.), split at their reST headings into
sections, plus the docstrings of ~110 standard-library modules and of their public classes,
methods and functions. Pieces longer than ``max_chars`` (500) are split at paragraph breaks,
then line breaks, then spaces; pieces under 40 characters are left out and identical texts
are kept once; the order is fixed. On CPython 3.11 that gives about 4,000 documents, 1.0 M
characters. With the default 512-token BPE trained on it their lengths in tokens (bos/eos
included) are long-tailed: median ~125, p90 ~240, p99 ~295, max ~430, about 4% above the
default ``data.max_length`` of 256 — short docstrings next to long reference sections.
That spread is what makes bucketing matter.

**The tokenizer** (`get_tokenizer`) is a byte-level BPE trained with ``tokenizers`` on that
corpus (deterministic: same corpus and size, same vocabulary), wrapped as a
``transformers.PreTrainedTokenizerFast`` with ``<|bos|>``, ``<|end|>`` (eos), ``<|pad|>``,
role tokens and a chat template. It is cached on disk under ``$XLA_WORKBENCH_CACHE`` (default
``~/.cache/xla-workbench``) keyed by a hash of the corpus, the size and the recipe. A
user's own tokenizer directory (``data.tokenizer_path``) loads with
``AutoTokenizer.from_pretrained(path)`` instead.

**Records** (`load_records`): "embedded" (column ``text``), "chat-sample" (the shipped
``assets/chat_sample.jsonl``: questions about stdlib functions answered with the first
paragraph of their docstrings; most as ``messages`` lists, some as prompt/response) or a
local jsonl/json/csv/parquet/text file or directory, loaded through ``datasets``.

**Tokenising** (`tokenize_records`): plain text becomes ``bos + text + eos`` with labels equal
to the ids; chat records (``messages`` or ``prompt``/``response``) are rendered with the chat
template and their labels are -100 everywhere except the assistant turns. Records that
teach nothing are left out — texts that are empty, not strings or a single token, chat
records with no assistant token to predict — and counted in one ``RuntimeWarning``. Sequences
are not cut here: lengths above ``data.max_length`` are truncated or dropped by the batch
sampler, which counts them (`workbench.bucketing`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from workbench.data.corpus import embedded_corpus

CACHE_ENV = "XLA_WORKBENCH_CACHE"
_TOKENIZER_RECIPE = "bytelevel-bpe-v1"

BOS, EOS, PAD = "<|bos|>", "<|end|>", "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, BOS, EOS, *ROLE_TOKENS)
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


# ---- the tokenizer ---------------------------------------------------------------------------


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the workbench caches files: `cache_dir`, else $XLA_WORKBENCH_CACHE, else ~/.cache/xla-workbench."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "xla-workbench"


def _tokenizer_key(corpus: list[str], vocab_size: int) -> str:
    digest = hashlib.sha256()
    digest.update(f"{_TOKENIZER_RECIPE}|{vocab_size}|{'|'.join(SPECIAL_TOKENS)}|{CHAT_TEMPLATE}".encode())
    for text in corpus:
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()[:20]


def train_tokenizer(corpus: list[str], vocab_size: int) -> Any:
    """A byte-level BPE trained on `corpus`, as a `transformers` fast tokenizer with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 64:
        raise ValueError(f"data.tokenizer_vocab_size={vocab_size} is not allowed: must be >= 64")
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=1_000_000,
        clean_up_tokenization_spaces=False,
    )


def get_tokenizer(data_cfg: Any, cache_dir: str | os.PathLike[str] | None = None) -> Any:
    """`data_cfg.tokenizer_path` through AutoTokenizer, else the BPE on the embedded corpus (cached)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if data_cfg.tokenizer_path:
        path = Path(data_cfg.tokenizer_path).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(
                f"data.tokenizer_path={data_cfg.tokenizer_path!r} is not a directory; "
                "give a local tokenizer directory (from save_pretrained) or null to train one"
            )
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        if tokenizer.pad_token is None and tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token  # padding is masked out of the loss anyway
        return tokenizer
    corpus = embedded_corpus()
    vocab = int(data_cfg.tokenizer_vocab_size)
    target = cache_root(cache_dir) / "tokenizers" / _tokenizer_key(corpus, vocab)
    if (target / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(str(target))
    tokenizer = train_tokenizer(corpus, vocab)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tok-", dir=target.parent))
    try:
        tokenizer.save_pretrained(str(staging))
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared like any cache dir
        # Atomic: a reader never sees a half-written tokenizer. OSError: another process won the
        # race, and its copy is identical.
        with contextlib.suppress(OSError):
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tokenizer
