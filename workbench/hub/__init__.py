"""The Hugging Face Hub: ids where a path goes, tokens, downloads, dataset files, model cards and pushes.

A Hub id (``org/name`` or ``org/name@revision``) may stand wherever the workbench takes a model,
tokenizer or data directory (``model.pretrained_path``, ``data.tokenizer_path``, ``data.source``,
the commands' ``--model``). `workbench.hub.resolve` turns it into a local directory through
``huggingface_hub.snapshot_download`` (the local cache and ``HF_HUB_OFFLINE`` honoured); a local
directory of the same name wins, as in transformers. What goes wrong (no such repo, a gated one, no
network, a revision or subset that does not exist) is a `HubError`: one line naming the id and the fix.

The other way, `workbench.hub.push` uploads a saved model with a model card (`workbench.hub.card`).

Modules: `ids` (what a Hub id is, told from a local path), `auth` (the token: ``HF_TOKEN``, Colab's
or Kaggle's secrets, never printed), `resolve` (ids to local snapshots), `dataset_files` (a dataset
repo's files for a subset and split), `card` (the README a Hub user expects), `push` (the upload).
This package imports nothing of the rest of the workbench; ``huggingface_hub`` only when a function runs.
"""

from __future__ import annotations

from workbench.hub.ids import HubError, HubRef, parse_hub_id

__all__ = ["HubError", "HubRef", "parse_hub_id"]
