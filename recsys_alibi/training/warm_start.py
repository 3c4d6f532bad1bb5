"""Warm start: the initial weights of a new ranker taken from a trained one, items matched by raw id.

A daily job trains on a log that grew since yesterday: the item vocabulary gained items (an
appended prepared directory numbers them after every existing ``item_idx``; a full re-prepare may
also renumber). :func:`warm_state_dict` builds the state dict of the new ``AlibiRanker`` from the
old one's:

* **shared items** (in both vocabularies, matched by raw ``item_id`` through a row map the caller
  builds, e.g. with ``serving.inputs.vocabulary_remap``) keep their trained row bit for bit, at
  whatever index the new vocabulary gives them; the padding row 0 is copied too;
* **new items** get ``mean + std * z``: the per-dimension mean of the old model's item rows
  (1..N_old, padding excluded) plus standard-normal noise ``z`` scaled by their per-dimension
  standard deviation (population std), drawn from ``torch.Generator().manual_seed(seed)``
  (:func:`new_item_rows`). Why: the table is tied to the output layer, so a new row is both the
  item's input vector and its score vector. Drawn from the trained rows' statistics it has the
  norm and direction of a typical trained item, so the new item starts ranked like an average
  item and its rows' gradients have the scale of everyone else's; the model's own init
  (``normal(0, 0.02)``) would give vectors about 5x shorter than trained rows (scored ~0 by
  every user; on the default data, 6 of 7 days: trained rows' mean norm 0.82, init 0.16, new rows
  by this rule 0.85) and the mean alone would give every new item the same score (ties);
* items of the old vocabulary that are not in the new one are dropped (their rows are unused);
* **every other weight** (transformer blocks, norms, slopes when learnable, the time-gap table,
  learned positions) is copied unchanged.

A model of another architecture is refused before anything is trained (:func:`check_same_shape`,
:class:`WarmStartError`, one line naming every differing key): its weights would not fit, or
would fit and mean something else (another slope scheme reads the same weights at other
distances). Settings that change no weight and no fixed bias (dropout, attention and embedding
backends, ``max_len`` under ALiBi or no positions, ``window``, ``sinks``, ``bias_clamp``) may
differ: ALiBi has no position table, so a longer ``max_len`` as histories grow needs nothing.

Both embedding backends (torchrec ``EmbeddingCollection`` and plain ``nn.Embedding``) hold the
item table under the same state-dict key (:data:`ITEM_TABLE_KEY`, ``recsys_alibi.model.embeddings``),
so a model trained with one backend warm-starts a model with the other.

:class:`InitialWeights` loads such a state dict into the Lightning module when fitting begins
(before the first step; a resumed fit then restores its checkpoint over it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import lightning as L
import numpy as np
import torch

from recsys_alibi.config import ConfigError, ModelConfig
from recsys_alibi.model.embeddings import ITEM_TABLE

log = logging.getLogger(__name__)

ITEM_TABLE_KEY = f"items.collection.embeddings.{ITEM_TABLE}.weight"  # (N + 1, D), both backends
# model.* settings that define the weights or the fixed attention bias: they must be equal
SHAPE_KEYS = (
    "d_model", "n_layers", "n_heads", "ffn_mult", "position", "slopes", "max_bias", "long_context", "free_heads",
    "free_head_scale", "learnable_slopes", "slope_floor", "time_gap_buckets", "lowpass_window", "lowpass_mix",
)  # fmt: skip


class WarmStartError(ConfigError):
    """The model to warm-start from cannot initialise this one (another architecture); one line."""


def check_same_shape(old: ModelConfig, new: ModelConfig, source: str = "the model") -> None:
    """Refuse a warm start from a model of another architecture.

    Compared: :data:`SHAPE_KEYS`, and ``max_len`` under learned positions (the position table's
    rows). A key a model pickled by an older version lacks is taken at its default.

    Raises:
        WarmStartError: naming each differing key with both values and ``source``.
    """
    keys = SHAPE_KEYS + (("max_len",) if new.position == "learned" else ())
    fields = ModelConfig.model_fields
    differ = [
        f"model.{key}={getattr(old, key, fields[key].default)} (now {getattr(new, key)})"
        for key in keys
        if getattr(old, key, fields[key].default) != getattr(new, key)
    ]
    if differ:
        raise WarmStartError(
            f"cannot warm-start from {source}: it is another model ({', '.join(differ)}); set the same model.* "
            "values or leave train.init_from unset to train from scratch"
        )


def new_item_rows(trained: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """Rows for ``count`` new items from the statistics of the trained rows (module doc).

    Args:
        trained: (N_old, D) float item rows of the old model, padding row excluded.
        count: number of new rows M.
        seed: seed of the noise (``torch.Generator``), so the same warm start gives the same rows.

    Returns:
        (M, D) of ``trained``'s dtype: ``mean + std * z``, mean and population std per dimension
        over the N_old rows, ``z`` standard normal drawn as one (M, D) ``torch.randn`` in float32.
    """
    width = trained.shape[1]
    if count == 0:
        return trained.new_zeros(0, width)
    rows = trained.float()
    mean, std = rows.mean(dim=0), rows.std(dim=0, correction=0)  # (D,), (D,)
    noise = torch.randn(count, width, generator=torch.Generator().manual_seed(seed))
    return (mean + std * noise).to(trained.dtype)


def warm_state_dict(
    old_state: Mapping[str, torch.Tensor],
    rows: np.ndarray,
    old_cfg: ModelConfig,
    new_cfg: ModelConfig,
    seed: int,
    source: str = "the model",
    features=None,
) -> dict[str, torch.Tensor]:
    """The state dict of a new ``AlibiRanker(new_cfg, N_new)`` initialised from a trained one.

    Args:
        old_state: the trained model's ``state_dict()`` (either embedding backend).
        rows: (N_new + 1,) int64, for each new item index the old item index holding the same raw
            ``item_id``, 0 for an item the old model does not know (index 0, padding, maps to 0).
        old_cfg, new_cfg: the two models' configs (checked by :func:`check_same_shape`).
        seed: seed of the new rows' noise (:func:`new_item_rows`).
        source: how errors name the old model (e.g. its URI).
        features: a :class:`recsys_alibi.training.warm_features.WarmFeatures` when the models read item
            features: a new item with features starts from them (its feature-based row), the feature
            tables grow by value; None: the rule above.

    Returns:
        A new dict (tensors copied, never shared with ``old_state``): the item table
        (N_new + 1, D) with shared rows copied, new rows from :func:`new_item_rows`; every other
        tensor equal to the old one.

    Raises:
        WarmStartError: another architecture, or a state dict without the item table, or a row
            index outside the old table.
    """
    check_same_shape(old_cfg, new_cfg, source)
    if ITEM_TABLE_KEY not in old_state:
        raise WarmStartError(f"cannot warm-start from {source}: its weights have no item table ({ITEM_TABLE_KEY})")
    table = old_state[ITEM_TABLE_KEY]  # (N_old + 1, D)
    rows = torch.as_tensor(np.asarray(rows, dtype=np.int64))
    if rows.ndim != 1 or rows.numel() < 1 or int(rows.min()) < 0 or int(rows.max()) >= table.shape[0]:
        raise WarmStartError(f"cannot warm-start from {source}: the item map points outside its {table.shape[0]} rows")
    new = rows == 0
    new[0] = False  # padding: copied
    state = {key: value.detach().clone() for key, value in old_state.items() if key != ITEM_TABLE_KEY}
    grown = table.detach()[rows].clone()  # (N_new + 1, D); new items hold row 0 until filled below
    grown[new] = new_item_rows(table.detach()[1:], int(new.sum()), seed)
    if features is not None:  # item features: a new item's row from its features (warm_features)
        grown[new] = features.new_item_rows(grown[new], new)
    state[ITEM_TABLE_KEY] = grown
    return state if features is None else features.grow_tables(state)


class InitialWeights(L.Callback):
    """Load a state dict into ``pl_module.model`` when fitting begins (``setup``, before any step).

    Lightning restores a checkpoint (``ckpt_path``) after this hook, so a resumed fit keeps its
    checkpoint's weights; the job layer passes this callback only to a new run.

    Args:
        state: the ``AlibiRanker`` state dict to start from (loaded strictly: every key, every shape).
    """

    def __init__(self, state: Mapping[str, torch.Tensor]) -> None:
        self.state = state

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            pl_module.model.load_state_dict(self.state, strict=True)
            log.info("warm start: %d weights loaded before the first step", len(self.state))
