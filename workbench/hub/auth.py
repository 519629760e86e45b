"""The Hub token a notebook or terminal has: ``HF_TOKEN``, else Colab's secrets, else Kaggle's secrets.

The token is passed to ``huggingface_hub`` and never printed, logged or written anywhere by the
workbench; messages say only where one was looked for. Without one, ``huggingface_hub`` falls back
to the token ``hf auth login`` stored, if any. Nothing here ever prompts: a notebook run by papermill
has nobody to answer.
"""

from __future__ import annotations

import os
from collections.abc import Callable

SECRET_NAME = "HF_TOKEN"
"""The name of the secret looked for, in the environment and in Colab's and Kaggle's secret stores."""

WHERE_TOKENS_COME_FROM = (
    "set HF_TOKEN (on Colab: a secret named HF_TOKEN with notebook access; on Kaggle: Add-ons > Secrets > "
    "HF_TOKEN)"
)
"""How a user gives the workbench a token, as a message's fix names it."""


def _colab_secret() -> str | None:
    try:
        from google.colab import userdata  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        value = userdata.get(SECRET_NAME)
    except Exception:  # no such secret, or the notebook was not granted access to it
        return None
    return str(value) if value else None


def _kaggle_secret() -> str | None:
    try:
        from kaggle_secrets import UserSecretsClient  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        value = UserSecretsClient().get_secret(SECRET_NAME)
    except Exception:  # no such secret attached to the notebook, or no secrets service here
        return None
    return str(value) if value else None


_SOURCES: tuple[tuple[str, Callable[[], str | None]], ...] = (
    ("the HF_TOKEN environment variable", lambda: os.environ.get(SECRET_NAME) or None),
    ("Colab's secret HF_TOKEN", _colab_secret),
    ("Kaggle's secret HF_TOKEN", _kaggle_secret),
)


def hub_token() -> str | None:
    """The first token found (see the module's docstring), or None: ``huggingface_hub``'s own login then."""
    for _, source in _SOURCES:
        token = source()
        if token:
            return token.strip()
    return None


def token_source() -> str | None:
    """Where `hub_token` found its token, in words (never the token itself); None without one."""
    for where, source in _SOURCES:
        if source():
            return where
    return None
