"""Preference tuning: the DPO objective, its reference model and its reward metrics.

A batch holds pairs, interleaved row by row (`workbench.data.collate.PairCollator`): row 2i is
pair i's prompt + chosen answer, row 2i+1 its prompt + rejected answer, both padded to the
bucket of the longer one, labels -100 everywhere but the answers. Per row the objective sums the
answer tokens' log-probabilities under the policy (the model being trained) and under the
reference (the model it started from), and per pair ``h = (π_c − ref_c) − (π_r − ref_r)``:

- ``sigmoid`` (Rafailov et al., 2023): ``−log σ(β h)``;
- ``ipo`` (Azar et al., 2023): ``(h − 1 / (2β))²`` with every log-prob averaged over its answer's
  tokens, as TRL's ``DPOTrainer`` computes it.

Two losses need no reference at all (`workbench.config.REFERENCE_FREE_LOSSES`: no reference model, no reference forward),
on the answers' log-probs averaged over their tokens (``c``, ``r``), as TRL computes them:

- ``simpo`` (Meng et al., 2024; TRL's ``CPOTrainer`` with ``loss_type="simpo"``, ``cpo_alpha=0``):
  ``−log σ(β (c − r) − γ)`` with the margin γ ``train.simpo_gamma``;
- ``orpo`` (Hong et al., 2024; TRL's ``ORPOTrainer``): ``−c − β log σ(log odds(c) − log odds(r))``,
  ``odds(p) = p / (1 − p)``: the chosen answer's token-averaged NLL plus the odds-ratio term, β as
  the paper's λ. The NLL is the token mean over the (micro-)batch's chosen answers, as TRL averages
  it; TRL's also counts the prompts' tokens, the workbench trains on answers only.

Rewards are ``β (π − ref)`` per answer, from the summed log-probs under sigmoid and ipo, ``β c``
and ``β r`` under the reference-free losses (as TRL reports them): ``reward_accuracy`` is the share of pairs whose chosen
reward is the higher, ``reward_margin`` the mean difference. Like every objective here it returns
*sums* (`loss_sum`, and the metrics' ``stats``) with their count (``tokens``: the real pairs,
filler pairs of an eval's last batch count 0), so the step engine averages over every pair of an
optimizer step however micro-batches split them, on the device, without a host read.

Where the reference comes from (``train.dpo_reference``, `resolve_reference`):

- ``adapters_off``: the policy's own weights with its LoRA adapters switched off (peft's
  ``disable_adapter``), traced into the same program as the policy's forward: no second copy,
  one more forward without gradients.
- ``copy``: a frozen copy of the starting model in its own precision, placed on the mesh like the
  model (`workbench.analysis.estimate` counts its weights).
- ``precompute``: before training, one pass over the train and eval pairs with the starting
  model (`precompute_reference`); the log-probs are stored with the datasets (in memory) and arrive
  in each batch as ``reference_logps``. No reference forward in the step at all. One host only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from workbench.analysis.metrics import PREFERENCE_KEYS
from workbench.backend.xla import runtime
from workbench.config import REFERENCE_FREE_LOSSES, WorkbenchConfig
from workbench.data.chat import IGNORE_INDEX
from workbench.data.loader import make_loader
from workbench.data.preference import is_pair_dataset
from workbench.models.inputs import model_inputs
from workbench.models.lm_head import LMHead, chunked_sums, next_token_labels
from workbench.train.lora import is_lora
from workbench.train.objective import ChunkPlan, LossChunking, Notice, shift_for_next_token
from workbench.train.objective_run import ObjectiveRun
from workbench.train.trainer import place

STAT_NAMES = tuple(key for key in PREFERENCE_KEYS if not key.startswith("eval_"))
"""The sums a DPO step reports beside its loss, averaged over pairs: `workbench.analysis.metrics` keys."""

REFERENCE_COLUMNS = ("reference_chosen_logp", "reference_rejected_logp")
"""The dataset columns a precomputed reference adds (the collator turns them into ``reference_logps``)."""

"""The ``train.dpo_loss`` values that take no reference model."""

PRECOMPUTE_BUCKETS = 4
"""Shapes of the precomputing pass when the run's own number is 'auto' (chosen after it)."""


# ---- the loss ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DPOSettings:
    beta: float = 0.1
    """``train.dpo_beta``: the pull towards the reference."""
    loss: str = "sigmoid"
    """``train.dpo_loss``: 'sigmoid', 'ipo', 'simpo' or 'orpo'."""
    simpo_gamma: float = 0.5
    """``train.simpo_gamma``: SimPO's target margin."""

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"train.dpo_beta={self.beta!r} is not allowed: must be > 0")
        if self.loss not in ("sigmoid", "ipo", *REFERENCE_FREE_LOSSES):
            raise ValueError(
                f"train.dpo_loss={self.loss!r} is not allowed: 'sigmoid', 'ipo', 'simpo' or 'orpo'"
            )

    @property
    def reference_free(self) -> bool:
        """Whether the loss takes no reference (SimPO, ORPO)."""
        return self.loss in REFERENCE_FREE_LOSSES


def dpo_losses(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    settings: DPOSettings,
) -> torch.Tensor:
    """Per pair, the loss from the log-probs it takes: summed over the answer for 'sigmoid',
    averaged over the answer's tokens for 'ipo'."""
    margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
    if settings.loss == "sigmoid":
        return -F.logsigmoid(settings.beta * margin)
    return (margin - 1.0 / (2.0 * settings.beta)) ** 2


def simpo_losses(chosen: torch.Tensor, rejected: torch.Tensor, beta: float, gamma: float) -> torch.Tensor:
    """Per pair, SimPO's ``−log σ(β (c − r) − γ)`` of the answers' token-averaged log-probs (TRL's
    ``CPOTrainer.cpo_loss``, ``loss_type="simpo"``, no label smoothing)."""
    return -F.logsigmoid(beta * ((chosen - rejected) - gamma / beta))


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 − exp(x))`` for x < 0, stable on both sides of −log 2 (TRL's ORPO helper)."""
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_odds_ratio(chosen: torch.Tensor, rejected: torch.Tensor, beta: float) -> torch.Tensor:
    """Per pair, ORPO's ``β log σ(log odds(c) − log odds(r))`` of the token-averaged log-probs: the
    term TRL's ``ORPOTrainer.odds_ratio_loss`` returns as its losses (to be subtracted)."""
    chosen, rejected = chosen.float(), rejected.float()
    log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
    return beta * F.logsigmoid(log_odds)


def preference_losses(
    policy: torch.Tensor, reference: torch.Tensor | None, tokens: torch.Tensor, settings: DPOSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per pair ``[pairs]``, the loss of ``train.dpo_loss`` from the ``[pairs, 2]`` summed answer
    log-probs (chosen, rejected) of the policy and the reference (None for SimPO and ORPO) and the
    answers' token counts; and the rewards ``[pairs, 2]`` as TRL reports them."""
    per_token = tokens.clamp(min=1.0)
    if settings.reference_free:
        average = policy / per_token
        if settings.loss == "simpo":
            losses = simpo_losses(average[:, 0], average[:, 1], settings.beta, settings.simpo_gamma)
        else:  # the NLL as TRL takes it: a token mean over the batch's chosen answers, spread over the pairs
            pairs = ((tokens[:, 0] > 0) & (tokens[:, 1] > 0)).sum()  # filler pairs have no answer tokens
            pairs_per_token = pairs / tokens[:, 0].sum().clamp(min=1.0)
            nll = -policy[:, 0] * pairs_per_token
            losses = nll - orpo_odds_ratio(average[:, 0], average[:, 1], settings.beta)
        return losses, settings.beta * average.detach()
    taken_policy, taken_reference = policy, reference
    if settings.loss == "ipo":
        taken_policy, taken_reference = policy / per_token, reference / per_token
    losses = dpo_losses(
        taken_policy[:, 0], taken_policy[:, 1], taken_reference[:, 0], taken_reference[:, 1], settings
    )
    # rewards from the summed log-probs, whichever the loss (as TRL reports them)
    return losses, settings.beta * (policy.detach() - reference)


def row_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per row, Σ log p(label) over the next-token positions whose label is not -100 (fp32) — from
    the full ``[rows, L, V]`` logits and unshifted labels."""
    shifted, targets = shift_for_next_token(logits, labels)
    return _token_logp_sums(shifted, targets)


def _token_logp_sums(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    token_nll = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    return -token_nll.view(targets.shape).sum(dim=-1)  # ignored positions contribute 0


class RowLogpChunk(torch.nn.Module):
    """One chunk of positions' per-row log-prob sums through the head (`chunked_sums` adds the chunks)."""

    def __init__(self, head: LMHead) -> None:
        super().__init__()
        self.head = head.head  # registered: `chunked_sums` sees whether the head trains
        self.lm_head = head

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _token_logp_sums(self.lm_head.logits(hidden), targets)


def answer_tokens(labels: torch.Tensor) -> torch.Tensor:
    """Per row, the answer's predicted positions (labels 1..L-1 that are not -100), fp32."""
    return (labels[:, 1:] != IGNORE_INDEX).sum(dim=-1).to(torch.float32)


# ---- the objective ----------------------------------------------------------------------------


class DPOObjective(torch.nn.Module):
    """The DPO loss of interleaved pair batches with reward metrics; `reference` is 'adapters_off',
    'copy' (give `reference_model`), 'precompute' (batches carry ``reference_logps``) or 'none'
    (SimPO and ORPO, which take none)."""

    stat_names = STAT_NAMES
    rows_per_example = 2
    """A pair is two rows: a split of the batch keeps them together."""

    def __init__(
        self,
        settings: DPOSettings,
        reference: str,
        *,
        reference_model: torch.nn.Module | None = None,
        chunking: LossChunking | None = None,
        notice: Notice | None = None,
    ) -> None:
        super().__init__()
        if reference not in ("adapters_off", "copy", "precompute", "none"):
            raise ValueError(
                f"train.dpo_reference={reference!r} is not allowed here: 'adapters_off', 'copy' or 'precompute'"
            )
        if (reference == "none") != settings.reference_free:
            raise ValueError(
                f"train.dpo_loss={settings.loss!r} "
                + (
                    "takes no reference"
                    if settings.reference_free
                    else f"needs a reference, not {reference!r}"
                )
            )
        if (reference == "copy") != (reference_model is not None):
            raise ValueError("train.dpo_reference='copy' takes a reference_model, and only it does")
        self.settings, self.reference = settings, reference
        self.plan = ChunkPlan(chunking, notice)
        # a plain attribute: the frozen copy's weights stay out of the optimizer and the checkpoints
        self.__dict__["reference_model"] = reference_model

    @property
    def chunking(self) -> LossChunking:
        return self.plan.chunking

    def logps(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per row, the answer's summed log-prob under `model` (chunked as ``train.loss_chunk_tokens`` says)."""
        labels = batch["labels"]
        chunked = self.plan.heads([model], labels)
        if chunked is None:
            return row_logps(model(**model_inputs(batch, model)).logits, labels)
        (head,), positions = chunked
        hidden = head.hidden_states(model_inputs(batch, model)).last_hidden_state
        (sums,) = chunked_sums(RowLogpChunk(head), [hidden, next_token_labels(labels)], positions)
        return sums

    def reference_logps(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per row, the answer's summed log-prob under the reference, without gradients."""
        if self.reference == "precompute":
            if "reference_logps" not in batch:
                raise ValueError(
                    "train.dpo_reference='precompute' but the batch has no reference_logps: "
                    "the datasets were not passed through precompute_reference"
                )
            return batch["reference_logps"].float()
        with torch.no_grad():
            if self.reference == "copy":
                return self.logps(self.__dict__["reference_model"], batch)
            with model.disable_adapter():
                return self.logps(model, batch)

    def forward(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        reference = None if self.reference == "none" else self.reference_logps(model, batch).view(-1, 2)
        policy = self.logps(model, batch).view(-1, 2)
        tokens = answer_tokens(batch["labels"]).view(-1, 2)
        # a filler pair (an eval's last batch filled to its shape) has no labels: it counts nowhere
        real = ((tokens[:, 0] > 0) & (tokens[:, 1] > 0)).to(torch.float32)
        losses, rewards = preference_losses(policy, reference, tokens, self.settings)
        with torch.no_grad():
            chosen_reward, rejected_reward = rewards[:, 0], rewards[:, 1]
            stats = {
                "reward_accuracy": ((chosen_reward > rejected_reward).float() * real).sum(),
                "reward_margin": ((chosen_reward - rejected_reward) * real).sum(),
                "chosen_logp": (policy[:, 0].detach() * real).sum(),
                "rejected_logp": (policy[:, 1].detach() * real).sum(),
            }
        return {"loss_sum": (losses * real).sum(), "tokens": real.sum(), "stats": stats}


# ---- the reference ----------------------------------------------------------------------------


def adapters_at_start(model: torch.nn.Module) -> bool:
    """Whether a LoRA model's adapters are where fresh ones start (every ``lora_B`` zero, peft's init),
    so switching them off gives the starting model. Read on the host, before the model is placed."""
    return all(not torch.count_nonzero(p).item() for name, p in model.named_parameters() if "lora_B" in name)


def _hosts() -> int:
    return runtime.xla_process_count() if runtime.runtime_started() else 1


def resolve_reference(
    cfg: WorkbenchConfig, model: torch.nn.Module, hosts: int | None = None
) -> tuple[str, str]:
    """``train.dpo_reference`` for this run's (prepared, host) model, and a sentence saying why.

    A precomputed reference is one host's pass over its own share of the pairs: on several hosts
    their passes would run different programs at the same time, so 'auto' copies there instead.
    """
    asked, lora = cfg.train.dpo_reference, is_lora(model)
    if cfg.train.dpo_loss in REFERENCE_FREE_LOSSES:
        return "none", f"train.dpo_loss={cfg.train.dpo_loss!r} takes no reference model"
    hosts = _hosts() if hosts is None else hosts
    if asked == "precompute" and hosts > 1:
        raise ValueError(
            f"train.dpo_reference='precompute' runs on one host; this run has {hosts}: use 'copy' (or "
            "'adapters_off' for fresh LoRA adapters)"
        )
    if asked == "adapters_off" and lora and not adapters_at_start(model):
        raise ValueError(
            "train.dpo_reference='adapters_off' would make the base model the reference, but this run "
            "continues trained adapters (model.pretrained_path is an adapter or a LoRA checkpoint): use "
            "'precompute' (the reference is then the adapter's model) or 'auto'"
        )
    if asked != "auto":
        return asked, f"train.dpo_reference={asked!r}"
    if lora and adapters_at_start(model):
        return "adapters_off", "fresh LoRA adapters: the reference is the same weights with the adapters off"
    if lora and hosts > 1:
        return (
            "copy",
            "the run continues trained adapters on several hosts: the reference is a frozen copy of them",
        )
    if lora:
        return "precompute", (
            "the run continues trained adapters, so the reference is their model: its log-probs are "
            "computed once before training"
        )
    return "copy", "a full fine-tune: the reference is a frozen copy of the starting model"


@dataclass
class Reference:
    """The run's resolved reference: its mode, and the frozen copy for 'copy'."""

    mode: str
    model: torch.nn.Module | None = None


def prepare_reference(
    cfg: WorkbenchConfig, model: torch.nn.Module, notice: Callable[[str], None]
) -> Reference:
    """The reference of `model` (prepared, still on the host): its mode said through `notice`, and for
    'copy' a frozen copy in the policy's own precision, so that at the first step the reference is the
    policy exactly (a bf16 copy of fp32 master weights would run its norms and residuals in bf16 and
    tilt every reward); mode 'none' for SimPO and ORPO."""
    mode, why = resolve_reference(cfg, model)
    notice(f"DPO reference: {mode} ({why})")
    if mode != "copy":
        return Reference(mode)
    frozen = copy.deepcopy(model)
    frozen.requires_grad_(False).eval()
    return Reference(mode, frozen)


class PreferenceRun(ObjectiveRun):
    """A DPO run: pairs for data, the reference prepared from the unplaced model (`prepare_reference`),
    then the loss of `DPOObjective` with the reference placed like the model, or precomputed into the
    datasets; the eval is the held-out pairs' loss and rewards (`eval_module`)."""

    reference: Reference | None = None

    def check_data(self, trainer: Any) -> None:
        """Preference pairs only: anything else has no rejected answer."""
        data = trainer.data
        for split in (data.train_dataset, data.eval_dataset):
            if split is not None and not is_pair_dataset(split):
                names = sorted(getattr(split, "column_names", None) or [])
                raise ValueError(
                    "train.objective='dpo' needs preference pairs (columns input_ids, labels, rejected_input_ids, "
                    f"rejected_labels: `workbench.data.preference.tokenize_pairs`); a dataset handed to the Trainer "
                    f"has {names}. Leave the datasets to the Trainer (data.source of prompt/chosen/rejected "
                    "records) or tokenise them with tokenize_pairs"
                )

    def prepare(self, trainer: Any, model: torch.nn.Module) -> None:
        self.reference = prepare_reference(trainer.cfg, model, trainer._notice)

    def loss(self, trainer: Any, chunking: LossChunking) -> torch.nn.Module:
        """A 'copy' reference placed like the model, a 'precompute' reference computed into the datasets
        now, and the objective over both."""
        reference, cfg = self.reference, trainer.cfg
        if reference is None:
            raise RuntimeError("PreferenceRun.prepare(trainer, model) comes before loss(): the reference")
        if reference.model is not None:
            place(reference.model, trainer.mesh, trainer.device)
        settings = DPOSettings(cfg.train.dpo_beta, cfg.train.dpo_loss, cfg.train.simpo_gamma)
        objective = DPOObjective(
            settings,
            reference.mode,
            reference_model=reference.model,
            chunking=chunking,
            notice=trainer._notice,
        )
        if reference.mode == "precompute":
            precompute_reference(
                objective,
                trainer.model,
                trainer.data,
                autocast=lambda: trainer.data.backend.autocast(cfg.train.precision),
                notice=trainer._notice,
            )
        return objective

    def eval_module(self, loss: torch.nn.Module) -> torch.nn.Module:
        """The held-out pairs' DPO loss and rewards."""
        return loss


def _pair_batches(
    dataset: Any, cfg: WorkbenchConfig, **loader_kwargs: Any
) -> Iterator[tuple[list[int], Any]]:
    """Every pair of `dataset` once, in the run's batch shapes: (example indices, host batch);
    a negative index is a filler (`workbench.data.collate.FillerMasked`)."""
    loader, sampler = make_loader(dataset, cfg, fill_last=True, **loader_kwargs)
    for indices in sampler:
        yield list(indices), loader.collate_fn([loader.dataset[i] for i in indices])


def precompute_reference(
    objective: DPOObjective,
    model: torch.nn.Module,
    data: Any,
    *,
    autocast: Callable[[], Any],
    notice: Callable[[str], None],
) -> None:
    """Add `REFERENCE_COLUMNS` to `data`'s train and eval datasets: the starting `model`'s answer
    log-probs, one pass in the run's bucket plan (at most `PRECOMPUTE_BUCKETS` shapes under
    ``max_buckets: auto``), one read from the device at the end of each split. The columns live with
    the datasets in memory: a resumed run computes them again from the starting model."""
    cfg = data.cfg
    if cfg.bucketing.max_buckets == "auto":
        # the run chooses its buckets later, from compile costs measured on its step; this pass
        # (another program) takes the bounded plan the workbench falls back to, not one per length
        cfg = cfg.with_overrides({"bucketing.max_buckets": PRECOMPUTE_BUCKETS})
    model.eval()
    for split in ("train_dataset", "eval_dataset"):
        dataset = getattr(data, split)
        if dataset is None:
            continue
        if not hasattr(dataset, "add_column"):
            raise ValueError(
                f"train.dpo_reference='precompute' stores the log-probs as columns of a datasets.Dataset; the "
                f"{split.replace('_', ' ')} is a {type(dataset).__name__}: pass a datasets.Dataset "
                "(e.g. datasets.Dataset.from_list(...)) or use 'adapters_off' / 'copy'"
            )
        epochs = data.train_epochs() if split == "train_dataset" else data.eval_passes()
        kwargs = dict(
            pad_token_id=data.pad_token_id, dp_size=data.dp_size, seed=cfg.train.seed, epochs=epochs
        )
        order: list[int] = []
        outputs: list[torch.Tensor] = []
        for indices, batch in _pair_batches(dataset, cfg, **kwargs):
            with torch.no_grad(), autocast():
                # every row, on every rank under torchrun: `order` names the whole batch's pairs, and
                # each rank's stream later takes its own rows of them (the model is not sharded yet)
                outputs.append(objective.logps(model, data.to_device(batch, whole=True)))
            data.backend.step_boundary()
            order.extend(indices)
        logps = torch.cat(outputs).cpu().view(-1, 2).numpy()  # the one read
        columns = np.zeros((len(dataset), 2), dtype=np.float64)
        for index, row in zip(order, logps):
            if index >= 0:
                columns[index] = row
        for name, values in zip(REFERENCE_COLUMNS, columns.T):
            if name in dataset.column_names:
                dataset = dataset.remove_columns(name)
            dataset = dataset.add_column(name, values.tolist())
        setattr(data, split, dataset)
    model.train()
    notice("DPO reference: log-probs of the starting model computed for every pair before training")
