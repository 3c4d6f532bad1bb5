"""Item vocabulary and per-user sequences, and the readers of a prepared directory.

Vocabulary (``items.parquet``): ``item_idx`` Int32 1..N (0 is padding) by descending event count,
ties by ascending raw ``item_id``; ``item_id`` raw; ``count`` Int64.

Sequences (``sequences.parquet``): one row per user, ``user_id`` raw, ``item_idx``
list<Int32>, ``timestamp`` list<Int64>, ``length`` Int32; the events of the user in time
order, equal timestamps in source order.

The readers check that the file belongs to the directory's prepare
(:func:`recsys_alibi.data.prepared.read_consistent`): a mixed or half-written directory is a
``DataError``.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from recsys_alibi.data.ingest import DataError
from recsys_alibi.data.prepared import PREPARE_AGAIN, read_consistent, unreadable_error
from recsys_alibi.data.schema import (
    COUNT,
    ITEM_ID,
    ITEM_IDX,
    ITEMS_FILE,
    LENGTH,
    SEQUENCES_FILE,
    SOURCE_ROW,
    TIMESTAMP,
    USER_ID,
)

ID_TYPES = (pl.Int64, pl.String)
SEQUENCES_SCHEMA = {ITEM_IDX: pl.List(pl.Int32), TIMESTAMP: pl.List(pl.Int64), LENGTH: pl.Int32}
ITEMS_SCHEMA = {ITEM_IDX: pl.Int32, COUNT: pl.Int64}


def build_vocabulary(item_counts: pl.LazyFrame) -> pl.LazyFrame:
    """``item_id``, ``count`` -> the vocabulary ``item_idx`` Int32 (1-based), ``item_id``, ``count`` Int64.

    Indices follow descending count, ties broken by ascending raw id, so the result does not
    depend on row order.
    """
    return (
        item_counts.select(ITEM_ID, pl.col(COUNT).cast(pl.Int64))
        .sort([COUNT, ITEM_ID], descending=[True, False])
        .with_row_index(ITEM_IDX, offset=1)
        .select(pl.col(ITEM_IDX).cast(pl.Int32), ITEM_ID, COUNT)
    )


def group_sequences(sorted_events: pl.LazyFrame) -> pl.LazyFrame:
    """Events already sorted by (user, time, source row), with ``item_idx`` -> one row per user.

    Users come out in the order of the input; within a group polars keeps the row order.
    """
    return (
        sorted_events.group_by(USER_ID, maintain_order=True)
        .agg(pl.col(ITEM_IDX).cast(pl.Int32), pl.col(TIMESTAMP).cast(pl.Int64))
        .with_columns(pl.col(ITEM_IDX).list.len().cast(pl.Int32).alias(LENGTH))
    )


def build_sequences(events: pl.LazyFrame) -> pl.LazyFrame:
    """Events with ``item_idx`` and ``source_row`` in any order -> sequences sorted by user."""
    return group_sequences(events.sort(USER_ID, TIMESTAMP, SOURCE_ROW))


def read_parquet_file(path: Path, columns: list[str] | None = None) -> pl.DataFrame:
    """``pl.read_parquet(path, columns=columns)``; DataError (naming ``prepare``) when missing or unreadable."""
    try:
        return pl.read_parquet(path, columns=columns)
    except (pl.exceptions.PolarsError, OSError) as err:
        raise unreadable_error(path, err) from None


def _read(prepared_dir: str | Path, name: str, expected: dict[str, pl.DataType], prepare_id: str | None) -> pl.DataFrame:
    path = Path(prepared_dir) / name
    df = read_consistent(prepared_dir, name, read_parquet_file, prepare_id)
    problems = [f"{col} should be {dtype}" for col, dtype in expected.items() if df.schema.get(col) != dtype]
    id_col = USER_ID if name == SEQUENCES_FILE else ITEM_ID
    if df.schema.get(id_col) not in ID_TYPES:
        problems.append(f"{id_col} should be Int64 or String")
    if problems:
        raise DataError(f"{path} has the wrong schema ({'; '.join(problems)}); {PREPARE_AGAIN}")
    return df


def read_sequences(prepared_dir: str | Path, prepare_id: str | None = None) -> pl.DataFrame:
    """Read and check ``sequences.parquet`` of a prepared directory.

    Args:
        prepared_dir: output of ``prepare``.
        prepare_id: the prepare an earlier read of this job saw (None: the directory's own).

    Raises:
        DataError: the file is missing, unreadable, has another schema, or is not from the
            directory's (or the given) prepare.
    """
    return _read(prepared_dir, SEQUENCES_FILE, SEQUENCES_SCHEMA, prepare_id)


def read_items(prepared_dir: str | Path, prepare_id: str | None = None) -> pl.DataFrame:
    """Read and check ``items.parquet`` (the vocabulary) of a prepared directory.

    Raises:
        DataError: as :func:`read_sequences`.
    """
    return _read(prepared_dir, ITEMS_FILE, ITEMS_SCHEMA, prepare_id)


def vocabulary_difference(model_ids: pl.Series, data_ids: pl.Series) -> str:
    """What differs between two item vocabularies, as one phrase with counts and an example.

    Args:
        model_ids: (N,) raw ``item_id`` of a model's vocabulary, by ``item_idx`` (1..N).
        data_ids: (M,) raw ``item_id`` of the data's vocabulary, by ``item_idx``.

    Returns:
        e.g. ``"3 of the model's 100 ids are not in the data (e.g. 'i7') and 3 of the data's 100
        are new (e.g. 'x1')"``, ``"the same 100 ids, 98 of them at other indices (e.g. 'i1' is 1
        in the model, 3 in the data)"``, prefixed by the id types when they differ; ``"none"``
        when both are equal.
    """
    prefix = ""
    if model_ids.dtype != data_ids.dtype:
        prefix = f"ids are {model_ids.dtype} in the model and {data_ids.dtype} in the data; "
        model_ids, data_ids = model_ids.cast(pl.String), data_ids.cast(pl.String)
    model_set, data_set = set(model_ids.to_list()), set(data_ids.to_list())
    gone = sorted(model_set - data_set, key=str)
    new = sorted(data_set - model_set, key=str)
    if gone or new:
        return (
            f"{prefix}{len(gone)} of the model's {len(model_set)} ids are not in the data"
            + (f" (e.g. {gone[0]!r})" if gone else "")
            + f" and {len(new)} of the data's {len(data_set)} are new"
            + (f" (e.g. {new[0]!r})" if new else "")
        )
    index = {value: i + 1 for i, value in enumerate(data_ids.to_list())}
    moved = [(value, i + 1, index[value]) for i, value in enumerate(model_ids.to_list()) if index[value] != i + 1]
    if not moved:
        return prefix.removesuffix("; ") or "none"
    value, old, now = moved[0]
    return (
        f"{prefix}the same {len(model_set)} ids, {len(moved)} of them at other indices "
        f"(e.g. {value!r} is {old} in the model, {now} in the data)"
    )
