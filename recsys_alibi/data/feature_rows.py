"""Item feature rows as model inputs: value indices per categorical column (jagged) and a numeric matrix.

:func:`feature_rows` turns M rows of an item table (categorical columns List(String), numeric columns
Float64, as ``item_features.parquet`` holds them) into a :class:`FeatureRows` with a given set of
vocabularies: each value becomes its 1-based index; a value the vocabulary does not hold (an item
table newer than the model) is dropped and counted. :func:`catalog_features` builds the rows of a
model's whole catalog (item indices 0..N, row 0 = padding: no value) from a prepared directory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch

from recsys_alibi.data.item_features import read_item_features, vocabularies
from recsys_alibi.data.schema import ITEM_ID, ITEM_IDX
from recsys_alibi.model.item_features import CatalogFeatures, FeatureRows


def feature_rows(
    frame: pl.DataFrame, vocabs: dict[str, list[str]], numeric: list[str]
) -> tuple[FeatureRows, dict[str, int]]:
    """M item rows -> :class:`FeatureRows` under ``vocabs`` (module doc).

    Args:
        frame: M rows; each key of ``vocabs`` a List(String) column (null = no value), each of
            ``numeric`` a numeric column (null = missing).
        vocabs: ``{column: [value of index 1, value of index 2, ...]}``.
        numeric: the numeric columns, in order.

    Returns:
        ``(rows, unknown)``: ``unknown`` counts, per categorical column, the values not in its vocabulary (dropped).
    """
    values, offsets, unknown = [], [], {}
    for column, vocab in vocabs.items():
        lists = frame.get_column(column).fill_null(pl.lit([], pl.List(pl.String)))
        lengths = lists.list.len().to_numpy()
        flat = lists.explode(empty_as_null=False).drop_nulls() if lists.len() else pl.Series([], dtype=pl.String)
        index = pl.Series(vocab, dtype=pl.String)
        mapped = flat.replace_strict(index, pl.Series(np.arange(1, len(vocab) + 1)), default=0, return_dtype=pl.Int64)
        owner = np.repeat(np.arange(frame.height), lengths)
        keep = mapped.to_numpy() > 0
        unknown[column] = int((~keep).sum())
        counts = np.bincount(owner[keep], minlength=frame.height) if frame.height else np.zeros(0, np.int64)
        values.append(torch.from_numpy(mapped.to_numpy()[keep].astype(np.int64)))
        offsets.append(torch.from_numpy(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)))
    matrix = (
        frame.select(pl.col(c).cast(pl.Float32).fill_null(float("nan")) for c in numeric).to_numpy().astype(np.float32)
        if numeric else np.zeros((frame.height, 0), np.float32)
    )  # fmt: skip
    return FeatureRows(tuple(vocabs), tuple(values), tuple(offsets), torch.from_numpy(matrix.reshape(frame.height, len(numeric)))), unknown


def catalog_features(prepared_dir: str | Path, n_items: int, prepare_id: str | None = None) -> CatalogFeatures:
    """The feature rows of items 0..N of a prepared directory (``item_features*.parquet``).

    Raises:
        DataError: the directory has no item table, or its files are of another prepare.
    """
    table, vocab, decl = read_item_features(Path(prepared_dir), prepare_id)
    vocabs = vocabularies(vocab, decl.categorical)
    index = pl.DataFrame({ITEM_IDX: pl.Series(np.arange(n_items + 1), dtype=pl.Int32)})
    frame = index.join(table.drop_nulls(ITEM_IDX), on=ITEM_IDX, how="left", maintain_order="left")
    with_row = frame.get_column(ITEM_ID).is_not_null().to_numpy()
    rows, _ = feature_rows(frame, vocabs, decl.numeric)
    return CatalogFeatures(decl, vocabs, rows, with_row)
