"""The tokenizer: a byte-level BPE trained locally on the embedded corpus and cached, or the user's own.

`get_tokenizer` returns a byte-level BPE trained with ``tokenizers`` (`train_tokenizer`) on the
embedded corpus (`workbench.data.corpus`; deterministic: same corpus and size, same
vocabulary), wrapped as a ``transformers.PreTrainedTokenizerFast`` with ``<|bos|>``,
``<|end|>`` (eos), ``<|pad|>``, role tokens and a chat template (`CHAT_TEMPLATE`). It is
cached on disk under `cache_root` (``$XLA_WORKBENCH_CACHE``, default
``~/.cache/xla-workbench``) keyed by a hash of the corpus, the size and the recipe, so only
the first call trains; the cached entry loads under transformers 4.x and 5.x alike. A user's
own tokenizer directory (``data.tokenizer_path``, or a Hub id: the repo's tokenizer files) loads with
``AutoTokenizer.from_pretrained(path)`` instead.
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
from workbench.hub.resolve import local_dir

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
    return _wrap(core)


def _wrap(core: Any) -> Any:
    """A ``tokenizers.Tokenizer`` as the workbench's `transformers` fast tokenizer (special tokens, template)."""
    from transformers import PreTrainedTokenizerFast

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


def get_tokenizer(
    data_cfg: Any, cache_dir: str | os.PathLike[str] | None = None, model_path: str | None = None
) -> Any:
    """`data_cfg.tokenizer_path` through AutoTokenizer; else, with a `model_path` (``model.pretrained_path``:
    any model directory, `workbench.model_dirs`), the tokenizer beside it or its base; else the BPE
    trained on the embedded corpus (cached)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    beside_model = _model_tokenizer(model_path) if model_path and not data_cfg.tokenizer_path else None
    if data_cfg.tokenizer_path or beside_model is not None:
        path = (
            local_dir(data_cfg.tokenizer_path, use="tokenizer", field="data.tokenizer_path")
            if data_cfg.tokenizer_path
            else beside_model
        )
        if not path.is_dir():
            raise FileNotFoundError(
                f"data.tokenizer_path={str(path)!r} is not a directory; "
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
        # From tokenizer.json alone (the ``tokenizers`` format, read by every version): the
        # directory's tokenizer_config.json is in the format of the transformers that wrote it,
        # and one written by transformers 5 does not load under 4.x (its class
        # "TokenizersBackend", its list of "extra_special_tokens"), while the cache is shared.
        return _wrap(Tokenizer.from_file(str(target / "tokenizer.json")))
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


def tokenizer_setting(data_cfg: Any) -> str:
    """What chose a run's tokenizer, as a message names it: ``data.tokenizer_path``, else the model's."""
    if data_cfg.tokenizer_path:
        return f"data.tokenizer_path={data_cfg.tokenizer_path!r}"
    return "the one beside the model directory"


def missing_chat_template(tokenizer: Any, named_by: str) -> str | None:
    """None when `tokenizer` has a chat template; else what to tell the user: which tokenizer has none
    (its directory, and `named_by`: the setting or flag that led to it) and how to give it one."""
    if getattr(tokenizer, "chat_template", None):
        return None
    where = str(getattr(tokenizer, "name_or_path", "") or "")
    if not where or not Path(where).is_dir():
        return f"the tokenizer ({named_by}) has none"
    return (
        f"the tokenizer in {where!r} ({named_by}) has none: add one there (a chat_template.jinja file "
        "beside its tokenizer_config.json)"
    )


def _model_tokenizer(model_path: str) -> Path | None:
    """The tokenizer directory beside ``model.pretrained_path`` (or its base); None when there is none."""
    from workbench.model_dirs import ModelDirError, resolve_model_dir, tokenizer_dir

    try:
        return tokenizer_dir(resolve_model_dir(model_path, field="model.pretrained_path"))
    except ModelDirError:
        return None  # loading the model will say what is wrong with the directory
