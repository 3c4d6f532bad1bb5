"""Warm start of a model with item features: new items start from their features, feature tables grow by value.

:func:`recsys_alibi.training.warm_start.warm_state_dict` copies a trained model's weights into a new
model over a grown catalog. With item features (``model.item_features.enabled``) two things differ,
and :class:`WarmFeatures` does them:

* **a new item's row from its features** (:meth:`WarmFeatures.new_item_rows`): an item's vector is
  ``id row + f(features)`` (:mod:`recsys_alibi.model.item_features`), so a new item that has a row in
  the item table starts with an id row of zeros: its vector is then exactly the trained encoder's
  encoding of its features, the vector ``score`` ranks an unseen item with, instead of random noise
  around the average item. A new item without a table row has nothing but its id row and keeps the
  noise rule of ``new_item_rows`` (``mean + std * z`` of the trained rows);
* **the feature tables grow by value** (:meth:`WarmFeatures.grow_tables`): the new data's vocabularies
  may hold new values (a new genre); each value the old model knew keeps its trained row, matched by
  value (an append keeps value indices, a full re-prepare may renumber), a new value starts at zeros
  (adds nothing until trained). The numeric projection and standardisation are copied unchanged.

Refused (:class:`WarmStartError`, one line): a model with features from one without or the other way
round, or features declared differently (other columns).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from recsys_alibi.config import ItemFeaturesConfig, JobConfig
from recsys_alibi.model.item_features import TABLE_PREFIX
from recsys_alibi.training.warm_start import WarmStartError

TABLE_KEY = "item_features.encoder.bags.embedding_bags." + TABLE_PREFIX + "{}.weight"  # (V + 1, D) per column


@dataclass(frozen=True)
class WarmFeatures:
    """What a feature model's warm start needs beside the state dict.

    Attributes:
        old_vocabularies: the trained model's ``{column: values by index}``.
        new_vocabularies: the new data's.
        with_row: (N_new + 1,) bool, the new catalog's items that have a row in the item table.
    """

    old_vocabularies: dict[str, list[str]]
    new_vocabularies: dict[str, list[str]]
    with_row: np.ndarray

    def new_item_rows(self, noise: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """The id rows of the new items: zeros for those with features, ``noise`` for the others.

        Args:
            noise: (M, D) rows from ``new_item_rows`` (the rule without features), M = ``new.sum()``.
            new: (N_new + 1,) bool, the new items.

        Returns:
            (M, D) of ``noise``'s dtype.
        """
        has_features = torch.as_tensor(self.with_row, dtype=torch.bool)[new]  # (M,)
        return noise.masked_fill(has_features[:, None], 0.0)

    def grow_tables(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` with each categorical table laid out on the new vocabulary (module doc)."""
        state = dict(state)
        for column, values in self.new_vocabularies.items():
            key = TABLE_KEY.format(column)
            old = state[key]  # (V_old + 1, D)
            where = {value: i + 1 for i, value in enumerate(self.old_vocabularies.get(column, []))}
            rows = old.new_zeros(len(values) + 1, old.shape[1])
            rows[0] = old[0]  # padding row (never read): copied as every other weight
            source = torch.tensor([where.get(v, 0) for v in values], dtype=torch.int64)
            known = source > 0
            rows[1:][known] = old[source[known]]
            state[key] = rows
        return state


def feature_mismatch(source: str, parent_reads: bool, enabled: bool) -> str | None:
    """The one-line refusal of a warm start between a model that reads item features and one that does not
    (``train`` and the daily pipeline's check before the append); None when both agree."""
    if parent_reads == enabled:
        return None
    return (f"cannot warm-start from {source}: it {'reads' if parent_reads else 'reads no'} item features and "
            f"model.item_features.enabled={str(enabled).lower()} now; set the same, or leave train.init_from unset")  # fmt: skip


def warm_features(old_model, config: JobConfig, prepared_dir: str | Path, n_items: int,
                  source: str = "the model") -> WarmFeatures | None:  # fmt: skip
    """The :class:`WarmFeatures` of a warm start from ``old_model`` on ``prepared_dir`` (None: neither model
    reads features).

    Raises:
        WarmStartError: one model reads item features and the other not, or they declare other columns.
        DataError: the new model reads features but ``prepared_dir`` has no item table.
    """
    old = getattr(old_model, "features", None)
    enabled = config.model.item_features.enabled
    if old is None and not enabled:
        return None
    if mismatch := feature_mismatch(source, old is not None, enabled):
        raise WarmStartError(mismatch)
    from recsys_alibi.data.feature_rows import catalog_features

    catalog = catalog_features(prepared_dir, n_items)
    was = ItemFeaturesConfig.model_validate(old.declaration)
    if (was.categorical, was.numeric) != (catalog.declaration.categorical, catalog.declaration.numeric):
        raise WarmStartError(
            f"cannot warm-start from {source}: it reads the item features {was.columns}, the data declares "
            f"{catalog.declaration.columns}; declare the same columns or train from scratch"
        )
    return WarmFeatures(old.vocabularies, catalog.vocabularies, catalog.with_row)
