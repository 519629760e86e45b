"""Text in, token ids out: the embedded corpus, a locally trained tokenizer, user data, chat SFT records.

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
import importlib
import inspect
import itertools
import json
import os
import random
import re
import shutil
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

IGNORE_INDEX = -100
"""Label of a token that is not predicted (prompt, padding, packed borders); `torch`'s default ignore_index."""
ASSETS = Path(__file__).resolve().parent / "assets"
CHAT_SAMPLE = ASSETS / "chat_sample.jsonl"
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

# Standard-library modules whose docstrings join the corpus: importing them has no side effects.
_DOC_MODULES = (
    "abc", "argparse", "array", "ast", "asyncio", "base64", "bisect", "builtins", "bz2", "calendar",
    "cmath", "codecs", "collections", "collections.abc", "colorsys", "configparser", "contextlib",
    "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "dis", "doctest", "email.message",
    "enum", "filecmp", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext", "glob",
    "graphlib", "gzip", "hashlib", "heapq", "hmac", "html", "html.parser", "http.client",
    "http.server", "imaplib", "inspect", "io", "ipaddress", "itertools", "json", "keyword",
    "linecache", "locale", "logging", "lzma", "math", "mimetypes", "numbers", "operator", "os",
    "os.path", "pathlib", "pickle", "platform", "pprint", "queue", "random", "re", "reprlib", "sched",
    "secrets", "selectors", "shelve", "shlex", "shutil", "signal", "smtplib", "socket", "sqlite3",
    "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
    "time", "timeit", "tokenize", "tomllib", "traceback", "types", "typing", "unicodedata",
    "unittest", "urllib.parse", "urllib.request", "uuid", "warnings", "wave", "weakref",
    "xml.etree.ElementTree", "zipfile", "zlib", "zoneinfo",
)  # fmt: skip

_HEADING = re.compile(r"^(?P<title>[^\n]+)\n(?P<rule>[*=\-~^\"]{3,})$", re.MULTILINE)


# ---- the embedded corpus ---------------------------------------------------------------------


def _pack_units(units: list[str], sep: str, max_chars: int) -> list[str]:
    """Join consecutive units with `sep` into pieces of at most `max_chars` (a longer unit stays whole)."""
    out: list[str] = []
    current = ""
    for unit in units:
        if current and len(current) + len(sep) + len(unit) > max_chars:
            out.append(current)
            current = unit
        else:
            current = f"{current}{sep}{unit}" if current else unit
    if current:
        out.append(current)
    return out


def _chunks(text: str, max_chars: int) -> list[str]:
    """Split at blank lines into pieces of at most `max_chars`; a longer paragraph splits at line
    breaks, a longer line at spaces."""
    units: list[str] = []
    for para in re.split(r"\n\s*\n", text.strip()):
        para = para.strip("\n")
        if not para.strip():
            continue
        if len(para) <= max_chars:
            units.append(para)
            continue
        lines: list[str] = []
        for line in para.split("\n"):
            lines.extend([line] if len(line) <= max_chars else _pack_units(line.split(" "), " ", max_chars))
        units.extend(_pack_units(lines, "\n", max_chars))
    return _pack_units(units, "\n\n", max_chars)


def _topic_sections(text: str) -> list[str]:
    """A pydoc topic split at its reST headings (each section keeps its heading)."""
    starts = [m.start() for m in _HEADING.finditer(text) if len(m.group("rule")) >= len(m.group("title")) - 2]
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    bounds = [*starts, len(text)]
    return [text[a:b].strip() for a, b in itertools.pairwise(bounds) if text[a:b].strip()]


def _module_docstrings(name: str) -> list[str]:
    try:
        module = importlib.import_module(name)
    except ImportError:  # e.g. tomllib before 3.11
        return []
    docs = [inspect.getdoc(module) or ""]
    owner = module.__name__
    for attr in sorted(vars(module)):
        if attr.startswith("_"):
            continue
        obj = vars(module)[attr]
        if getattr(obj, "__module__", None) not in (owner, name) and name != "builtins":
            continue
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        docs.append(inspect.getdoc(obj) or "")
        if inspect.isclass(obj):
            for member in sorted(vars(obj)):
                if member.startswith("_") and member != "__init__":
                    continue
                value = vars(obj)[member]
                if inspect.isroutine(value) or isinstance(value, (property, classmethod, staticmethod)):
                    docs.append(inspect.getdoc(value) or "")
    return docs


@lru_cache(maxsize=4)
def _corpus(max_chars: int) -> tuple[str, ...]:
    import pydoc_data.topics

    pieces: list[str] = []
    for key in sorted(pydoc_data.topics.topics):
        for section in _topic_sections(pydoc_data.topics.topics[key]):
            pieces.extend(_chunks(section, max_chars))
    with warnings.catch_warnings():  # reading e.g. typing.io's docstring warns that it is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        docstrings = [doc for name in _DOC_MODULES for doc in _module_docstrings(name)]
    for doc in docstrings:
        pieces.extend(_chunks(doc, max_chars))
    seen: set[str] = set()
    out = []
    for piece in pieces:
        if len(piece) >= 40 and piece not in seen:
            seen.add(piece)
            out.append(piece)
    return tuple(out)


def embedded_corpus(max_chars: int = 500) -> list[str]:
    """Real text shipped with Python: pydoc topic sections and stdlib docstrings, in a fixed order."""
    if max_chars < 100:
        raise ValueError(f"max_chars={max_chars} is not allowed: must be >= 100")
    return list(_corpus(int(max_chars)))


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


# ---- records ---------------------------------------------------------------------------------

_FORMATS = {
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".txt": "text",
    ".text": "text",
}


def _read_chat_sample() -> list[dict[str, Any]]:
    with open(CHAT_SAMPLE, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _as_messages(record: dict[str, Any]) -> list[dict[str, str]]:
    if record.get("messages"):
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in record["messages"]]
    if record.get("prompt") is not None and record.get("response") is not None:
        messages = []
        if record.get("system"):
            messages.append({"role": "system", "content": str(record["system"])})
        messages.append({"role": "user", "content": str(record["prompt"])})
        messages.append({"role": "assistant", "content": str(record["response"])})
        return messages
    raise ValueError(f"a chat record needs 'messages' or 'prompt' and 'response'; got keys {sorted(record)}")


def load_records(data_cfg: Any, cache_dir: str | os.PathLike[str] | None = None) -> Any:
    """The raw records for `data_cfg.source` as a `datasets.Dataset` (capped at `max_examples`)."""
    import datasets

    source = data_cfg.source
    if source == "embedded":
        ds = datasets.Dataset.from_dict({"text": embedded_corpus()})
    elif source == "chat-sample":
        ds = datasets.Dataset.from_list([{"messages": _as_messages(r)} for r in _read_chat_sample()])
    else:
        ds = _load_local(Path(source).expanduser(), data_cfg.format, cache_dir)
    if data_cfg.max_examples is not None and len(ds) > data_cfg.max_examples:
        ds = ds.select(range(int(data_cfg.max_examples)))
    return ds


def _load_local(path: Path, fmt: str, cache_dir: str | os.PathLike[str] | None) -> Any:
    import datasets

    if not path.exists():
        raise FileNotFoundError(
            f"data.source={str(path)!r} does not exist; use 'embedded', 'chat-sample' or a local file/directory"
        )
    files = sorted(p for p in path.rglob("*") if p.suffix.lower() in _FORMATS) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"data.source={str(path)!r} holds no {'/'.join(sorted(_FORMATS))} files")
    if fmt == "auto":
        kinds = {_FORMATS.get(p.suffix.lower()) for p in files}
        if None in kinds or len(kinds) != 1:
            raise ValueError(
                f"data.format='auto' cannot tell the format of {[p.name for p in files][:5]}: "
                f"set data.format to one of jsonl, json, csv, parquet, text"
            )
        builder = kinds.pop()
    else:
        builder = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "text": "text"}[fmt]
    return datasets.load_dataset(
        builder,
        data_files=[str(p) for p in files],
        split="train",
        cache_dir=str(cache_root(cache_dir) / "datasets"),
    )


# ---- tokenising ------------------------------------------------------------------------------


def _chat_reason(dataset: Any, data_cfg: Any) -> str | None:
    """Why the records count as chat (``data.chat`` or the column that gave it away), or None."""
    names = set(dataset.column_names)
    if data_cfg.chat:
        return "data.chat=True"
    if "messages" in names:
        return "the 'messages' column of the records"
    if {"prompt", "response"} <= names:
        return "the 'prompt' and 'response' columns of the records"
    return None


def _is_chat(dataset: Any, data_cfg: Any) -> bool:
    return _chat_reason(dataset, data_cfg) is not None


def _warn_left_out(dropped: int, total: int, why: str) -> None:
    """One warning for the records tokenising left out, so a shrunken dataset is never a surprise."""
    if dropped:
        warnings.warn(
            f"{dropped} of {total} records were left out when tokenising: {why}",
            RuntimeWarning,
            stacklevel=3,
        )


def _chat_example(messages: list[dict[str, str]], tokenizer: Any) -> dict[str, list[int]]:
    """Ids of the rendered conversation; labels only on the assistant turns.

    Each assistant turn's label span is found by rendering the conversation up to the turn
    with the generation prompt (the prefix) and up to its end: the tokens in between are the
    answer. Works with any chat template whose renders of a prefix are token prefixes.
    """

    def render(msgs: list[dict[str, str]], prompt: bool) -> list[int]:
        out = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=prompt)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return list(out)

    ids = render(messages, False)
    labels = [IGNORE_INDEX] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = render(messages[:i], True) if i else []
        upto = render(messages[: i + 1], False)
        start, end = len(prefix), len(upto)
        if ids[:start] != prefix or ids[:end] != upto:
            raise ValueError(
                "the tokenizer's chat template does not render conversation prefixes as token prefixes; "
                "cannot locate assistant turns to label"
            )
        labels[start:end] = ids[start:end]
    return {"input_ids": ids, "labels": labels, "length": len(ids)}


def tokenize_records(dataset: Any, tokenizer: Any, data_cfg: Any) -> Any:
    """Columns ``input_ids``, ``labels`` (-100 on chat prompts), ``length``; no truncation here.

    Records with nothing to predict are left out and counted in one ``RuntimeWarning``.
    """
    reason = _chat_reason(dataset, data_cfg)
    if reason is not None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"the records are chat records (from {reason}), which need a tokenizer with a chat template; "
                f"data.tokenizer_path={data_cfg.tokenizer_path!r} has none: give one with a chat template, "
                "or set data.text_field to train on a text column without data.chat"
            )
        names = set(dataset.column_names)
        if not ("messages" in names or {"prompt", "response"} <= names):
            raise ValueError(
                f"{reason} needs chat records: a 'messages' column or 'prompt' and 'response' columns; "
                f"found {sorted(names)}"
            )

        def chat(record: dict[str, Any]) -> dict[str, Any]:
            return _chat_example(_as_messages(record), tokenizer)

        out = dataset.map(chat, remove_columns=dataset.column_names, desc=None)
        # Label 0 is never predicted (nothing precedes it): a record needs a label after it.
        kept = out.filter(lambda r: any(x != IGNORE_INDEX for x in r["labels"][1:]))
        _warn_left_out(
            len(out) - len(kept),
            len(out),
            "chat records with no assistant token to predict (no assistant turn, or empty ones)",
        )
        return kept

    field = data_cfg.text_field
    if field not in dataset.column_names:
        raise ValueError(
            f"data.text_field={field!r} is not a column; the records have {dataset.column_names}"
        )
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id

    def text(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        texts = [t if isinstance(t, str) else "" for t in batch[field]]
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
        ids = [
            ([bos] if bos is not None else []) + e + ([eos] if eos is not None else []) for e in encoded if e
        ]
        # Empty texts and single tokens teach nothing (no next token): left out, and counted
        # below from the row counts (a batched map may shrink), not in here.
        ids = [x for x in ids if len(x) >= 2]
        return {"input_ids": ids, "labels": [list(x) for x in ids], "length": [len(x) for x in ids]}

    out = dataset.map(text, batched=True, remove_columns=dataset.column_names)
    _warn_left_out(
        len(dataset) - len(out),
        len(dataset),
        f"their data.text_field={field!r} was empty or not a string, or gave fewer than 2 tokens (nothing to predict)",
    )
    return out


# ---- hosts and the one-call builder ------------------------------------------------------------


def host_shard_bounds(
    length: int, num_processes: int, process_index: int, *, equal_shares: bool = False
) -> tuple[int, int]:
    """[start, stop) of host `process_index`'s contiguous share of `length` examples.

    By default the shares cover every example exactly once (the first ``length % num_processes``
    hosts get one more). ``equal_shares=True`` gives every host ``length // num_processes`` and
    leaves the remainder out, for loops that run an epoch to its end: a host with one more batch
    would run one more step and wait for the others at the next collective.
    """
    if num_processes < 1:
        raise ValueError(f"num_processes={num_processes} is not allowed: must be >= 1")
    if not 0 <= process_index < num_processes:
        raise ValueError(f"process_index={process_index} is not allowed: must be in [0, {num_processes})")
    share, extra = divmod(length, num_processes)
    if share == 0 and (equal_shares or process_index >= extra):
        raise ValueError(f"{length} examples cannot give each of {num_processes} hosts at least one")
    if equal_shares:
        return process_index * share, (process_index + 1) * share
    start = process_index * share + min(process_index, extra)
    return start, start + share + (process_index < extra)


def shard_for_host(
    dataset: Any, num_processes: int, process_index: int, *, equal_shares: bool = False
) -> Any:
    """Host `process_index`'s contiguous share of a `datasets.Dataset` or a sequence (see `host_shard_bounds`)."""
    start, stop = host_shard_bounds(len(dataset), num_processes, process_index, equal_shares=equal_shares)
    if start == 0 and stop == len(dataset):
        return dataset
    if hasattr(dataset, "select"):  # datasets.Dataset
        return dataset.select(range(start, stop))
    return dataset[start:stop]


def _host_share() -> tuple[int, int]:
    """(process count, index) when the XLA runtime already runs; (1, 0) otherwise (never starts it)."""
    from workbench import runtime

    if runtime.runtime_started():
        return runtime.process_count(), runtime.process_index()
    return 1, 0


def build_datasets(
    cfg: Any, tokenizer: Any = None, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[Any, Any, Any]:
    """(train, eval or None, tokenizer) for `cfg`: load, tokenise, split, and shard train by host.

    The eval split is a seeded random `data.eval_fraction` of the examples (at least one when
    the fraction is above 0); on a multi-host run each host keeps its share of the train split.
    """
    tokenizer = tokenizer if tokenizer is not None else get_tokenizer(cfg.data, cache_dir)
    records = load_records(cfg.data, cache_dir)
    tokenized = tokenize_records(records, tokenizer, cfg.data)
    if len(tokenized) == 0:
        raise ValueError(f"data.source={cfg.data.source!r} gave no usable examples after tokenisation")
    eval_ds = None
    fraction = float(cfg.data.eval_fraction)
    if fraction > 0 and len(tokenized) >= 2:
        n_eval = max(1, round(len(tokenized) * fraction))
        split = tokenized.train_test_split(test_size=n_eval, seed=int(cfg.train.seed), shuffle=True)
        train_ds, eval_ds = split["train"], split["test"]
    else:
        train_ds = tokenized.shuffle(seed=int(cfg.train.seed))
    count, index = _host_share()
    return shard_for_host(train_ds, count, index), eval_ds, tokenizer


# ---- how the shipped chat sample was made ------------------------------------------------------

_CHAT_MODULES = (
    "bisect", "collections", "copy", "csv", "datetime", "difflib", "fnmatch", "functools", "glob",
    "hashlib", "heapq", "itertools", "json", "math", "operator", "os", "os.path", "random", "re",
    "shlex", "shutil", "statistics", "string", "textwrap", "time", "urllib.parse", "zlib",
)  # fmt: skip
_QUESTIONS = (
    "What does `{q}` do?",
    "Explain `{q}` from the Python standard library.",
    "In Python, what is `{q}` for?",
    "I found `{q}` in some code. What does it do?",
    "Briefly, how does `{q}` behave?",
)
_SYSTEM = "You answer questions about the Python standard library, briefly and precisely."


def generate_chat_sample(path: str | os.PathLike[str] = CHAT_SAMPLE, limit: int = 320, seed: int = 0) -> int:
    """Write the chat sample: questions about stdlib callables answered from their docstrings.

    This is how ``assets/chat_sample.jsonl`` was made (CPython 3.11). Answers are the first
    paragraph of each docstring; some records get a system turn, some a second turn asking for
    the signature, and every fifth is stored in prompt/response form. Returns the record count.
    """
    rng = random.Random(seed)
    items = []
    for name in _CHAT_MODULES:
        module = importlib.import_module(name)
        for attr in sorted(vars(module)):
            obj = vars(module)[attr]
            if attr.startswith("_") or not callable(obj):
                continue
            doc = inspect.getdoc(obj) or ""
            para = " ".join(doc.split("\n\n")[0].split())
            if not 40 <= len(para) <= 600:
                continue
            try:
                signature = str(inspect.signature(obj))
            except (TypeError, ValueError):
                signature = None
            items.append((f"{name}.{attr}", para, signature))
    rng.shuffle(items)
    records = []
    for i, (qualname, answer, signature) in enumerate(items[:limit]):
        question = rng.choice(_QUESTIONS).format(q=qualname)
        if i % 5 == 4:
            records.append({"prompt": question, "response": answer})
            continue
        messages = [{"role": "system", "content": _SYSTEM}] if i % 3 == 0 else []
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        if signature is not None and i % 4 == 1:
            messages += [
                {"role": "user", "content": "What is its signature?"},
                {"role": "assistant", "content": f"`{qualname}{signature}`"},
            ]
        records.append({"messages": messages})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(records)


__all__ = [
    "CHAT_TEMPLATE",
    "IGNORE_INDEX",
    "SPECIAL_TOKENS",
    "build_datasets",
    "cache_root",
    "embedded_corpus",
    "generate_chat_sample",
    "get_tokenizer",
    "host_shard_bounds",
    "load_records",
    "shard_for_host",
    "tokenize_records",
    "train_tokenizer",
]
