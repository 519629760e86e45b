"""The text the defaults train on, shipped with Python: the embedded corpus, the chat sample and the preference sample.

**The embedded corpus** (`embedded_corpus`) is real English technical prose taken from Python
itself, so the defaults need no download: the 79 topics of ``pydoc_data.topics`` (the
language reference pages behind ``help("if")`` etc.), split at their reST headings into
sections, plus the docstrings of ~110 standard-library modules and of their public classes,
methods and functions. Those texts differ between Python versions (and with what a process has
imported: transformers adds methods to ``logging.Logger``), so they are shipped, read once on
CPython 3.11 as a training run read them (`generate_embedded_corpus`), as
``assets/embedded_corpus.jsonl.gz``: the same data and the same losses on every Python
(`EMBEDDED_CORPUS_SHA256` records what ``embedded_corpus()`` returns). Pieces longer than
``max_chars`` (500) are split at paragraph breaks, then line breaks, then spaces; pieces under
40 characters are left out and identical texts are kept once; the order is fixed. That gives
4,031 documents, 1.0 M characters. With the default 512-token BPE trained on it their lengths
in tokens (bos/eos included) are long-tailed: median ~125, p90 ~240, p99 ~295, max ~430, about 4% above the
default ``data.max_length`` of 256 — short docstrings next to long reference sections.
That spread is what makes bucketing matter.

**The chat sample** (`CHAT_SAMPLE`, the shipped ``assets/chat_sample.jsonl``) holds questions
about stdlib functions answered with the first paragraph of their docstrings, most as
``messages`` lists, some as prompt/response; `generate_chat_sample` is how it was made.
`workbench.data.records.load_records` reads both by name ("embedded", "chat-sample").

**The preference sample** (`PREFERENCE_SAMPLE`, the shipped ``assets/preference_sample.jsonl``)
holds 120 prompt/chosen/rejected records (some with a ``system``) for ``train.objective: dpo``
(``data.source: preference-sample``, read by `workbench.data.preference.load_pairs`): the
chat sample's questions; chosen answers polite, one short complete sentence from the docstring
ending with a period; rejected answers curt, rude or off-topic, without one. The style is
consistent so a small model trained a few dozen steps visibly prefers the chosen answers.
`generate_preference_sample` is how it was made.
"""

from __future__ import annotations

import gzip
import importlib
import inspect
import itertools
import json
import os
import random
import re
import warnings
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
CHAT_SAMPLE = ASSETS / "chat_sample.jsonl"
PREFERENCE_SAMPLE = ASSETS / "preference_sample.jsonl"
EMBEDDED_CORPUS = ASSETS / "embedded_corpus.jsonl.gz"
"""The embedded corpus's source texts (one JSON string a line), before they are cut into pieces."""
EMBEDDED_CORPUS_SHA256 = "32e5dc8856c95316debbf936d1a8074c4880f794fc1f1489e3ddadd7547ad795"
"""SHA-256 of ``"\\0".join(embedded_corpus())`` (UTF-8): the quickstart's data on any Python."""

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


def _stdlib_sources() -> list[str]:
    """The running Python's pydoc topic sections and stdlib docstrings, in a fixed order, each kept once."""
    import pydoc_data.topics

    sources = [
        section
        for key in sorted(pydoc_data.topics.topics)
        for section in _topic_sections(pydoc_data.topics.topics[key])
    ]
    with warnings.catch_warnings():  # reading e.g. typing.io's docstring warns that it is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        sources += [doc for name in _DOC_MODULES for doc in _module_docstrings(name)]
    # a repeated text repeats only pieces already kept: dropping it changes nothing
    return list(dict.fromkeys(text for text in sources if text.strip()))


RUN_LIBRARIES = ("torch", "transformers", "peft", "datasets")
"""What a training run had imported when it read the corpus from the standard library: transformers
adds three methods to ``logging.Logger`` (``info_once``, ``warning_once``, ``warning_advice``) and
torch replaces ``inspect.getfile``, so their docstrings were part of the corpus every measured run
(the README's figures) trained on."""


def generate_embedded_corpus(
    path: str | os.PathLike[str] = EMBEDDED_CORPUS, after_importing: Sequence[str] = RUN_LIBRARIES
) -> int:
    """Write the embedded corpus's sources, read from the running Python after importing
    `after_importing`, as a training run read them; returns their count.

    This is how ``assets/embedded_corpus.jsonl.gz`` was made, on CPython 3.11.7 with torch 2.9.0
    and transformers 5.24.0 (another Python or transformers reads other docstrings, and
    `EMBEDDED_CORPUS_SHA256` then no longer holds)::

        python -c "from workbench.data.corpus import generate_embedded_corpus; generate_embedded_corpus()"

    The gzip stream carries no name or time, so the same texts always give the same bytes.
    """
    for name in after_importing:
        importlib.import_module(name)
    sources = _stdlib_sources()
    lines = "".join(json.dumps(text, ensure_ascii=False) + "\n" for text in sources)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as handle:
        handle.write(lines.encode("utf-8"))
    return len(sources)


@lru_cache(maxsize=1)
def _shipped_sources() -> tuple[str, ...]:
    with gzip.open(EMBEDDED_CORPUS, "rt", encoding="utf-8") as handle:
        return tuple(json.loads(line) for line in handle if line.strip())


@lru_cache(maxsize=4)
def _corpus(max_chars: int) -> tuple[str, ...]:
    seen: set[str] = set()
    out = []
    for source in _shipped_sources():
        for piece in _chunks(source, max_chars):
            if len(piece) >= 40 and piece not in seen:
                seen.add(piece)
                out.append(piece)
    return tuple(out)


def embedded_corpus(max_chars: int = 500) -> list[str]:
    """Real text from Python's own documentation: pydoc topic sections and stdlib docstrings, as
    shipped in ``assets/embedded_corpus.jsonl.gz`` (the same on every Python), in a fixed order."""
    if max_chars < 100:
        raise ValueError(f"max_chars={max_chars} is not allowed: must be >= 100")
    return list(_corpus(int(max_chars)))


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


# ---- how the shipped preference sample was made ------------------------------------------------

_OPENERS = ("Happy to help!", "Good question.", "Glad you asked.", "Thanks for asking.", "Sure, gladly.")
_REJECTED = (
    "look it up yourself",
    "why are you asking me",
    "not my problem, read the docs",
    "no idea and I do not care",
    "ugh, it does stuff",
    "figure it out",
    "who even uses that",
    "I had pizza for lunch",
    "the weather is nice today lol",
    "ask someone else",
    "whatever",
    "do you even code",
)
_PREFERENCE_SYSTEM = "You are a polite assistant for Python questions."


def _first_sentence(text: str, max_chars: int = 110) -> str | None:
    """The answer's first sentence, ending with a period; None when it is too long to be short."""
    sentence = re.split(r"(?<=\.)\s", text.strip(), maxsplit=1)[0].rstrip(" .;:")
    return f"{sentence}." if 10 <= len(sentence) <= max_chars else None


def generate_preference_sample(
    path: str | os.PathLike[str] = PREFERENCE_SAMPLE, limit: int = 120, seed: int = 0
) -> int:
    """Write the preference sample from the chat sample's first question and answer per record.

    Chosen: a polite opener and the answer's first sentence (ending with a period); rejected: a
    curt, rude or off-topic line without a final period. Every fourth record has a system turn.
    Returns the record count.
    """
    rng = random.Random(seed)
    records = []
    with open(CHAT_SAMPLE, encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    for row in rows:
        if "messages" in row:
            turns = [m for m in row["messages"] if m["role"] != "system"]
            question, answer = turns[0]["content"], turns[1]["content"]
        else:
            question, answer = row["prompt"], row["response"]
        sentence = _first_sentence(answer)
        if sentence is None:
            continue
        record = {"prompt": question}
        if len(records) % 4 == 3:
            record = {"system": _PREFERENCE_SYSTEM, **record}
        record["chosen"] = f"{rng.choice(_OPENERS)} {sentence[0].upper()}{sentence[1:]}"
        record["rejected"] = rng.choice(_REJECTED)
        records.append(record)
        if len(records) == limit:
            break
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(records)
