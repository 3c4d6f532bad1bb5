"""Items the model never saw, ranked from their features alone (``score --items``, the pyfunc's ``items``).

A model trained with item features (``model.item_features.enabled``) scores an item as the user's
state times the item's vector, and an item's vector is its id row plus the encoding of its features
(:mod:`recsys_alibi.model.item_features`). An item added to the catalog after training has no id row,
but it has features: :func:`new_items` reads an item table, keeps the items that are not in the
model's vocabulary (matched by raw id) and encodes them with the trained feature encoder, so
``score`` ranks them beside the known items the same day they appear.

The table (``score.items``, ``score --items PATH``) is a prepared directory (its
``item_features.parquet``: the default, when ``--input`` is a prepared directory with an item table)
or an item table file read with the model's own declaration (``data.item_features`` at training:
the same columns, separator and ranges) and the same reject rules as ``prepare`` (rejected rows
are counted and logged, never ranked). Feature values the model's vocabularies do not hold (new
genres, tags) are left out of an item's encoding and counted; an item with no known value and no
number gets the zero vector (score 0 for every user).

New items are appended after the model's items (indices N + 1 .. N + M, by raw id), so every rule
of ``score`` applies to them: allow / deny files, top-K ties. Histories are read with the model's
vocabulary only: an event on a new item in a history is an unknown event, dropped as today.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import torch

from recsys_alibi.config import ItemFeaturesConfig, JobConfig
from recsys_alibi.data import schema
from recsys_alibi.data.errors import DataError
from recsys_alibi.data.feature_rows import feature_rows
from recsys_alibi.data.item_features import ITEM_FEATURES_FILE, has_item_features, read_item_features
from recsys_alibi.data.item_table import RECORD, REJECT_COLUMNS, ROW, SOURCE, clean_item_table, id_as, read_item_table
from recsys_alibi.data.prepared import cleaned_item_ids

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewItems:
    """The items of a table that the model never saw, with their feature vectors.

    Attributes:
        ids: (M,) raw item ids (the model vocabulary's type), ascending.
        vectors: (M, D) float32 encodings of their features (no id part).
        source: the table read (a prepared directory or a file).
        rejected: table rows rejected (bad id, bad number, duplicate id...).
        rejects: those rows with their ``reject_reason`` (``prepare``'s item rejects schema; a prepared directory's
            table was checked when prepared: only ids the model's id type cannot hold, ``bad_item_id``).
        unknown_values: feature values of the new items that the model's vocabularies lack (left out).
    """

    ids: pl.Series
    vectors: torch.Tensor
    source: str
    rejected: int = 0
    unknown_values: int = 0
    rejects: pl.DataFrame | None = field(default=None, compare=False, repr=False)

    @property
    def count(self) -> int:
        return self.ids.len()

    def digest(self) -> str:
        """sha256 of the ids and vectors: what a resumed scoring job must find again."""
        sha = hashlib.sha256(self.ids.cast(pl.String).str.join("\0").item().encode())
        sha.update(self.vectors.detach().cpu().contiguous().numpy().tobytes())
        return sha.hexdigest()


def _table_rows(path: Path, decl: ItemFeaturesConfig, id_dtype: pl.DataType) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The accepted rows of a prepared directory's or a file's item table, ids in ``id_dtype``, and the rejected rows
    (``REJECT_COLUMNS``; a prepared table's rows were checked when prepared: only ids ``id_dtype`` cannot hold)."""
    if path.is_dir():
        if not has_item_features(path):
            raise DataError(f"score.items: {path} is a directory without an item table (prepare it with --items)")
        rows, _, prepared = read_item_features(path)
        missing = [c for c in decl.columns if c not in prepared.columns]
        if missing:
            raise DataError(f"score.items: {path}'s item table has no column {missing[0]!r} the model reads "
                            f"(the model was trained on {decl.columns})")  # fmt: skip
        rows, rejects = _ids_of_the_model(rows, id_dtype, path / ITEM_FEATURES_FILE)
        events = cleaned_item_ids(path, id_dtype)  # a row without an index but with events: the k-core removed it,
        if events is not None:  # so it is not a new item (ShardRanker.for_input)
            rows = rows.filter(pl.col(schema.ITEM_IDX).is_not_null() | ~pl.col(schema.ITEM_ID).is_in(events[schema.ITEM_ID].implode()))
    else:
        rows, rejects = clean_item_table(read_item_table(path), decl, id_dtype)
    if rejects.height:
        reasons = rejects.group_by(schema.REJECT_REASON).len().sort(schema.REJECT_REASON).rows()
        log.warning("score.items: %d rows of %s rejected (%s), not ranked", rejects.height, path,
                    ", ".join(f"{r}: {n}" for r, n in reasons))  # fmt: skip
    return rows, rejects


def _ids_of_the_model(rows: pl.DataFrame, id_dtype: pl.DataType, source: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A prepared item table's rows with ids in the model's ``id_dtype``, and the rows whose id that type cannot hold
    (``007`` for an integer-id model: ``bad_item_id``, as in a table file), with the columns of ``REJECT_COLUMNS``."""
    rows = rows.with_row_index(ROW).with_columns(
        pl.col(ROW).cast(pl.Int64), id_as(schema.ITEM_ID, rows.schema[schema.ITEM_ID], id_dtype).alias("_id"))
    bad = rows.filter(pl.col("_id").is_null() & pl.col(schema.ITEM_ID).is_not_null())
    record = [c for c in bad.columns if c not in (ROW, "_id", schema.ITEM_IDX)]
    rejects = bad.select(
        pl.lit(str(source)).alias(SOURCE), pl.col(ROW), pl.col(schema.ITEM_ID).cast(pl.String),
        pl.lit("bad_item_id").alias(schema.REJECT_REASON), pl.struct(record).struct.json_encode().alias(RECORD),
    ).cast(REJECT_COLUMNS)  # fmt: skip
    accepted = rows.filter(pl.col("_id").is_not_null()).drop(schema.ITEM_ID, ROW).rename({"_id": schema.ITEM_ID})
    return accepted, rejects


def new_items(model, items: pl.DataFrame, path: str | Path) -> NewItems:
    """Encode the items of the table at ``path`` that are not in ``items`` (module doc).

    Args:
        model: an ``AlibiRanker`` with item features, in eval mode on its device.
        items: its vocabulary (``item_idx`` 1..N, ``item_id``).
        path: a prepared directory or an item table file.

    Returns:
        The new items, ids ascending, vectors (M, D) on the model's device.

    Raises:
        DataError: the model reads no item features; the table cannot be read or lacks a column the
            model reads (a declared column, the id column).
    """
    features = model.features
    if features is None:
        raise DataError(
            f"score.items={path}: this model reads no item features, so it cannot rank items it never saw; "
            "train it with model.item_features.enabled=true, or drop score.items / --items (the pyfunc's model_config 'items')"
        )
    decl = ItemFeaturesConfig.model_validate(features.declaration)
    rows, rejects = _table_rows(Path(path), decl, items.schema[schema.ITEM_ID])
    fresh = rows.join(items.select(schema.ITEM_ID), on=schema.ITEM_ID, how="anti").sort(schema.ITEM_ID)
    encoded, unknown = feature_rows(fresh, features.vocabularies, decl.numeric)
    device = features.encoder.numeric_mean.device
    with torch.no_grad():
        vectors = features.encoder(encoded.to(device)).float()  # (M, D)
    _warn_far_numbers(encoded.numeric, features.encoder, decl.numeric, path)
    found = NewItems(fresh.get_column(schema.ITEM_ID), vectors, str(path), rejects.height,
                     sum(unknown.values()), rejects)  # fmt: skip
    if found.count:  # a table with nothing new says nothing (the summary counts new items where there are any)
        log.info("score.items: %d items of %s are not in the model's vocabulary: vectors from their features alone "
                 "(%d feature values unknown to the model left out); those served are counted at the end",
                 found.count, path, found.unknown_values)  # fmt: skip
    return found


FAR_Z = 10.0  # standard deviations of the training items beyond which a new item's number is warned about


def _warn_far_numbers(numeric: torch.Tensor, encoder, columns: list[str], path) -> None:
    """One warning when new items hold numbers more than :data:`FAR_Z` training standard deviations from the
    training mean (``numeric``: (M, C) float32, NaN = missing): the encoder is linear in them, so one such value
    can put an item first for every user (a popularity of 1e9 where training saw -2.3 .. 0)."""
    if numeric.numel() == 0:
        return
    z = ((numeric.float() - encoder.numeric_mean.cpu()) / encoder.numeric_std.cpu()).abs().nan_to_num(nan=0.0)  # (M, C)
    far = z > FAR_Z
    if not far.any():
        return
    worst = int(z.max(dim=0).values.argmax())
    log.warning("score.items %s: %d new items hold a number more than %g standard deviations from the training "
                "items' (worst: %s, %.3g sd): their scores are extrapolated beyond anything the model learnt; check "
                "those values or bound them with data.item_features.ranges", path, int(far.any(dim=1).sum()), FAR_Z,
                columns[worst], float(z[:, worst].max()))  # fmt: skip


def extended_vocabulary(items: pl.DataFrame, extra: NewItems) -> pl.DataFrame:
    """``items`` (``item_idx`` 1..N, ``item_id``) followed by the new items at N + 1 .. N + M."""
    base = items.select(schema.ITEM_IDX, schema.ITEM_ID).sort(schema.ITEM_IDX)
    start = base.height + 1
    added = pl.DataFrame({schema.ITEM_IDX: pl.int_range(start, start + extra.count, dtype=pl.Int64, eager=True),
                          schema.ITEM_ID: extra.ids})  # fmt: skip
    return pl.concat([base, added.cast(base.schema)])


def _warn_other_declaration(given: ItemFeaturesConfig, model: ItemFeaturesConfig) -> bool:
    """Warn, and say True, when the config declares item-table columns other than the model's: an item table is
    always read with the declaration the model was trained with (the columns its encoder knows), not the config's."""
    ours, theirs = given.model_dump(), model.model_dump()
    differ = [f"{key} {ours[key]!r} against {theirs[key]!r}" for key in ours if ours[key] != theirs[key]]
    if given.columns and differ:
        log.warning("score: data.item_features differs from the model's declaration (%s); item tables are read with "
                    "the model's, the columns it was trained on", "; ".join(differ))  # fmt: skip
        return True
    return False


def with_default_items(config: JobConfig, model, input_path: str | Path) -> JobConfig:
    """``config`` with ``score.items`` set, when it is unset and the model reads item features, to the prepared
    ``input_path`` that holds an item table (the contract's ``score --items`` default; ``PREPARED/sequences.parquet``
    reads its folder's, as ``ScoreInput.vocabulary`` reads the ``items.parquet`` beside it), else to ``data.items``
    (raw events given with their item table: the table the staged prepare reads)."""
    features = getattr(model, "features", None)
    if features is None:
        return config
    declared = ItemFeaturesConfig.model_validate(features.declaration)
    if _warn_other_declaration(config.data.item_features, declared):  # the staged prepare reads with the model's too
        config = config.model_copy(update={"data": config.data.model_copy(update={"item_features": declared})})
    if config.score.items is not None:
        return config
    path = Path(input_path)
    folder = path.parent if path.name == schema.SEQUENCES_FILE and path.is_file() else path
    table = str(folder) if has_item_features(folder) else config.data.items
    if table is None:
        return config
    return config.model_copy(update={"score": config.score.model_copy(update={"items": str(table)})})
