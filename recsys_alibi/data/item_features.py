"""The prepared item features: per-item feature rows and feature vocabularies, built and appended by ``prepare``.

Files of the prepared directory (written only when an item table was given, now or earlier):

============================== ==================================================================
``item_features.parquet``      one row per item of the table (also items without events: the
                               catalog ``score`` can rank from features): ``item_id`` (raw, the
                               events' type), ``item_idx`` Int32 (null: not in ``items.parquet``:
                               no events, or events the k-core removed), each categorical column List(String), each
                               numeric column Float64 (null: missing); items with an index first,
                               by index, then the others by id
``item_features_vocab.parquet`` the feature vocabularies: ``feature`` (column), ``value`` String,
                               ``value_idx`` Int32 (1-based per feature; 0 is padding), ``count``
                               Int64 (items of the table holding the value)
``item_rejects.parquet``       rejected table rows (:mod:`recsys_alibi.data.item_table`), only
                               when a row was rejected
============================== ==================================================================

``stats.json`` holds ``item_table``: the declaration, the counts (rows read, accepted, rejected by
reason, items with events but no row, table items without events, values per feature, missing
numbers per column) and the table files read.

Vocabularies are numbered like items: a full prepare by descending count, ties by ascending value;
an append keeps every existing value at its index (also a value no item holds any more, count 0)
and numbers new values after the feature's last index in that order. An append's table updates
the earlier one: its rows replace the earlier rows of the same ids (counted as ``updated`` where
their values changed), new ids are added; an append without a table keeps the earlier rows. The declaration must stay the same
(:class:`DataError` otherwise).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import polars as pl

from recsys_alibi.config import DataConfig, ItemFeaturesConfig
from recsys_alibi.data.errors import DataError
from recsys_alibi.data.item_table import clean_item_table, empty_rejects, feature_rows_schema, read_item_table
from recsys_alibi.data.prepared import cleaned_item_ids, read_consistent
from recsys_alibi.data.schema import COUNT, ITEM_ID, ITEM_IDX, REJECT_REASON

log = logging.getLogger(__name__)

ITEM_FEATURES_FILE = "item_features.parquet"
ITEM_FEATURES_VOCAB_FILE = "item_features_vocab.parquet"
ITEM_REJECTS_FILE = "item_rejects.parquet"
STATS_KEY = "item_table"
FEATURE, VALUE, VALUE_IDX = "feature", "value", "value_idx"
VOCAB_SCHEMA = {FEATURE: pl.String, VALUE: pl.String, VALUE_IDX: pl.Int32, COUNT: pl.Int64}


def declaration(feats: ItemFeaturesConfig) -> dict:
    """The declaration as ``stats.json`` stores it (what an append must repeat)."""
    return feats.model_dump(mode="json")


def feature_vocabulary(rows: pl.DataFrame, categorical: list[str], before: pl.DataFrame | None = None) -> pl.DataFrame:
    """The value vocabularies of the categorical columns of ``rows`` (module doc for the numbering).

    Args:
        rows: one row per item, each categorical column List(String).
        categorical: the columns.
        before: an earlier vocabulary (``VOCAB_SCHEMA``) whose values keep their indices.

    Returns:
        ``feature``, ``value``, ``value_idx`` Int32, ``count`` Int64, by feature (declaration
        order) then ``value_idx``.
    """
    parts = []
    for column in categorical:
        counts = (
            rows.select(pl.col(column).explode().alias(VALUE)).drop_nulls().group_by(VALUE).len(COUNT)
            .with_columns(pl.col(COUNT).cast(pl.Int64))
        )  # fmt: skip
        old = before.filter(pl.col(FEATURE) == column).select(VALUE, VALUE_IDX) if before is not None else None
        if old is None or old.height == 0:
            start, kept = 1, counts.head(0).with_columns(pl.lit(None, pl.Int32).alias(VALUE_IDX))
        else:
            start = int(old.get_column(VALUE_IDX).max()) + 1
            kept = old.join(counts, on=VALUE, how="left").with_columns(pl.col(COUNT).fill_null(0))
        new = counts.join(kept.select(VALUE), on=VALUE, how="anti").sort([COUNT, VALUE], descending=[True, False])
        new = new.with_row_index(VALUE_IDX, offset=start)
        part = pl.concat([kept.select(VALUE, VALUE_IDX, COUNT), new.select(VALUE, VALUE_IDX, COUNT)], how="vertical_relaxed")
        parts.append(part.with_columns(pl.lit(column).alias(FEATURE)).sort(VALUE_IDX))
    if not parts:
        return pl.DataFrame(schema=VOCAB_SCHEMA)
    return pl.concat([p.select(list(VOCAB_SCHEMA)) for p in parts]).cast(VOCAB_SCHEMA)


def vocabularies(vocab: pl.DataFrame, categorical: list[str]) -> dict[str, list[str]]:
    """``{column: [value of index 1, value of index 2, ...]}`` from a vocabulary frame (indices are dense)."""
    out = {}
    for column in categorical:
        values = vocab.filter(pl.col(FEATURE) == column).sort(VALUE_IDX)
        out[column] = values.get_column(VALUE).to_list()
        assert values.get_column(VALUE_IDX).to_list() == list(range(1, len(out[column]) + 1)), "value indices are dense"
    return out


def _earlier(directory: Path | None) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, dict] | None:
    """An append's earlier rows, vocabulary, rejects and stats block (None: the directory has no table)."""
    if directory is None or not (directory / ITEM_FEATURES_FILE).is_file():
        return None
    stats = json.loads((directory / "stats.json").read_text()).get(STATS_KEY) or {}
    rows = pl.read_parquet(directory / ITEM_FEATURES_FILE)
    vocab = pl.read_parquet(directory / ITEM_FEATURES_VOCAB_FILE)
    rejects_path = directory / ITEM_REJECTS_FILE
    rejects = pl.read_parquet(rejects_path) if rejects_path.is_file() else empty_rejects()
    return rows, vocab, rejects, stats


def _declared(cfg: DataConfig, earlier: dict | None, out: Path) -> ItemFeaturesConfig:
    """The declaration in force: the config's, which an append must share with the directory's."""
    given = cfg.item_features != ItemFeaturesConfig()
    if earlier is None:
        return cfg.item_features
    was = earlier.get("declaration")
    if given and declaration(cfg.item_features) != was:
        raise DataError(
            f"cannot append to {out}: its item table was declared {json.dumps(was, sort_keys=True)}, "
            f"data.item_features now {json.dumps(declaration(cfg.item_features), sort_keys=True)}; declare the same "
            "columns, or prepare all inputs again without --append"
        )
    return ItemFeaturesConfig.model_validate(was)


def write_item_features(
    cfg: DataConfig, work: Path, items: pl.DataFrame, tag: dict[str, str], base_dir: Path | None = None
) -> dict | None:
    """Build the item-feature files into ``work`` (module doc) and return the ``stats.json`` block.

    Args:
        cfg: ``data`` (``items``: the new table or None; ``item_features``: its declaration).
        work: the staging directory of the prepare.
        items: the new vocabulary (``item_idx``, ``item_id``, ``count``) of the events.
        tag: the prepare id footer metadata.
        base_dir: an append's prepared directory (its table is merged), None for a full prepare.

    Returns:
        The ``item_table`` stats block, or None when there is no table (nothing written).

    Raises:
        DataError: the table cannot be read or does not match its declaration; an append with
            another declaration than the directory's (no accepted row that is an item of the events: a warning).
    """
    earlier = _earlier(base_dir)
    if cfg.items is None and earlier is None:
        return None
    feats = _declared(cfg, earlier[3] if earlier else None, base_dir or work)
    id_dtype = items.schema[ITEM_ID]
    schema = feature_rows_schema(feats, id_dtype)
    rows = pl.DataFrame(schema=schema).drop(ITEM_IDX)
    rejects, before_vocab, sources, updated, read_rows = empty_rejects(), None, [], 0, 0
    if earlier is not None:
        old_rows, before_vocab, rejects, old_stats = earlier
        rows = old_rows.drop(ITEM_IDX).with_columns(pl.col(ITEM_ID).cast(id_dtype, strict=False)).drop_nulls(ITEM_ID)
        sources, read_rows = list(old_stats.get("sources", [])), int(old_stats.get("rows", 0))
    new_rejected = 0
    if cfg.items is not None:
        table = read_item_table(cfg.items)
        accepted, new_rejects = clean_item_table(table, feats, id_dtype)
        updated = _changed_rows(rows, accepted.select(rows.columns))
        rows = pl.concat([rows.join(accepted.select(ITEM_ID), on=ITEM_ID, how="anti"), accepted.select(rows.columns)])
        rejects = pl.concat([rejects, new_rejects])
        sources, read_rows, new_rejected = [*sources, str(cfg.items)], read_rows + table.frame.height, new_rejects.height
    index = items.select(ITEM_ID, ITEM_IDX)
    rows = rows.join(index, on=ITEM_ID, how="left").select(list(schema)).cast(schema)
    rows = rows.sort([pl.col(ITEM_IDX).is_null(), ITEM_IDX, ITEM_ID])
    vocab = feature_vocabulary(rows, feats.categorical, before_vocab)
    rows.write_parquet(work / ITEM_FEATURES_FILE, metadata=tag)
    vocab.write_parquet(work / ITEM_FEATURES_VOCAB_FILE, metadata=tag)
    if rejects.height:
        rejects.write_parquet(work / ITEM_REJECTS_FILE, metadata=tag)
    by_reason = {r: int(n) for r, n in rejects.group_by(REJECT_REASON).len().sort(REJECT_REASON).iter_rows()}
    with_row = rows.get_column(ITEM_IDX).drop_nulls().len()
    removed = _removed_by_k_core(rows, work)
    if with_row == 0 and items.height:  # an empty table, every row rejected, ids of another catalog, or only
        log.warning(  # items still without events (score's staged prepare of a day's new items): train refuses it
            "item table %s: none of its %d accepted rows (%d read, %d rejected) is an item of the events; if that is "
            "not meant, check its id column (data.item_features.id_column=%s) against the events' item_id",
            cfg.items or base_dir, rows.height, read_rows, rejects.height, feats.id_column,
        )  # fmt: skip
    stats = {
        "declaration": declaration(feats),
        "sources": sources[-20:],
        "rows": read_rows,
        "rejected": rejects.height,
        "rejects_by_reason": by_reason,
        "items": rows.height,
        "items_with_events": with_row,
        "items_without_events": rows.height - with_row - removed,
        "items_removed_by_k_core": removed,
        "items_without_row": items.height - with_row,
        "updated": updated,
        "values": {c: int((vocab.get_column(FEATURE) == c).sum()) for c in feats.categorical},
        "missing": {c: int(rows.get_column(c).null_count()) for c in feats.numeric}
        | {c: int((rows.get_column(c).list.len() == 0).sum()) for c in feats.categorical},
    }
    log.debug(  # the prepare summary prints the same (item_table_line)
        "item table: %d items (%d without events%s), %d rows rejected%s; %d of %d event items have no row",
        rows.height, stats["items_without_events"], _removed_words(removed), new_rejected,
        f" ({by_reason})" if new_rejected else "", stats["items_without_row"], items.height,
    )  # fmt: skip
    return stats


def _removed_by_k_core(rows: pl.DataFrame, work: Path) -> int:
    """Rows without an index whose item has events in the cleaned log (``cleaned.parquet``) that the k-core
    (``data.min_events_per_item`` / ``min_events_per_user``) removed: not new items, so ``score`` never ranks them
    from their features (``ShardRanker.for_input``)."""
    outside = rows.filter(pl.col(ITEM_IDX).is_null()).select(ITEM_ID)
    events = cleaned_item_ids(work, outside.schema[ITEM_ID]) if outside.height else None
    return 0 if events is None else outside.join(events, on=ITEM_ID, how="semi").height


def _removed_words(removed: int) -> str:
    return f", {removed:,} whose events the k-core removed: not ranked" if removed else ""


def has_item_features(directory: str | Path) -> bool:
    """Whether the prepared directory holds an item table (``prepare --items``)."""
    return (Path(directory) / ITEM_FEATURES_FILE).is_file()


def _changed_rows(rows: pl.DataFrame, accepted: pl.DataFrame) -> int:
    """How many of ``accepted`` replace a row of ``rows`` (the same item id) with other values: a table that repeats
    yesterday's rows unchanged (a catalog snapshot) updates none."""
    def record(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.select(ITEM_ID, pl.struct(pl.exclude(ITEM_ID)).struct.json_encode().alias("_values"))

    both = record(accepted).join(record(rows), on=ITEM_ID, how="inner", suffix="_before")
    return both.filter(pl.col("_values") != pl.col("_values_before")).height


def read_item_features(directory: str | Path, prepare_id: str | None = None) -> tuple[pl.DataFrame, pl.DataFrame, ItemFeaturesConfig]:
    """``(rows, vocabulary, declaration)`` of a prepared directory's item table (module doc).

    Raises:
        DataError: the directory has no item table (prepare it with ``--items``), or its files
            are not of one prepare (:func:`recsys_alibi.data.prepared.read_consistent`).
    """
    directory = Path(directory)
    if not has_item_features(directory):
        raise DataError(
            f"{directory} has no item table ({ITEM_FEATURES_FILE}); prepare it with --items PATH (data.items) "
            "or set model.item_features.enabled=false"
        )
    rows = read_consistent(directory, ITEM_FEATURES_FILE, pl.read_parquet, prepare_id)
    vocab = read_consistent(directory, ITEM_FEATURES_VOCAB_FILE, pl.read_parquet, prepare_id)
    stats = read_consistent(directory, "stats.json", lambda p: json.loads(p.read_text()), prepare_id)
    if STATS_KEY not in stats:
        raise DataError(f"{directory}/stats.json has no {STATS_KEY} block; run `recsys-alibi prepare --items` again")
    return rows, vocab, ItemFeaturesConfig.model_validate(stats[STATS_KEY]["declaration"])


def item_table_line(stats: dict | None) -> str:
    """The summary line of a prepare's item table (empty without one)."""
    if not stats:
        return ""
    reasons = ", ".join(f"{k}: {v}" for k, v in stats["rejects_by_reason"].items())
    return (
        f"\nitem table: {stats['items']:,} items ({stats['items_without_events']:,} without events"
        f"{_removed_words(stats.get('items_removed_by_k_core', 0))}), "
        f"{stats['rejected']:,} rows rejected{f' ({reasons})' if reasons else ''}, {stats['updated']:,} updated; "
        f"{stats['items_without_row']:,} items with events have no row; values per feature {stats['values']}"
    )
