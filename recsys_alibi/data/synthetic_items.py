"""The item table of the embedded synthetic data: features that carry the generator's own signal.

The default task's generator (:mod:`recsys_alibi.data.synthetic`) gives every item a latent
structure (:func:`recsys_alibi.data.synthetic.latent_items`): a topic (the short-term interest
draws pick a topic, then an item inside it), a popularity rank inside the topic, and a latent
vector ``v_i`` (``TASTE_DIM`` standard normal entries; the long-term taste events follow
``u . v_i``). The item table shows each of them, coarsened as real metadata would be:

============== ============= ===================================================================
``topic``      categorical   ``"topic-07"``: the item's topic, exactly
``tags``       categorical   a list: ``"d03+"`` for each latent dimension d with ``v_i[d] > 1``,
               (list)        ``"d03-"`` for ``v_i[d] < -1`` (about 7.6 tags per item of 48 values):
                             the sign pattern of the strong directions of ``v_i``
``popularity`` numeric       ``-log(rank)`` of the item inside its topic (the log of its Zipf
                             weight over ``ZIPF_A``): 0 for the most drawn item of a topic
============== ============= ===================================================================

So a model that reads the table can rank an item it never saw by its topic, its taste direction
and its popularity: what decides who consumes it in the generator. Declare it with
:data:`DECLARATION` (``data.item_features``).

With ``generate.item_table: true`` (set by the pipeline when ``data.item_features`` is declared),
``generate`` writes ``items.parquet`` beside the events (:func:`item_table_path`); ``generate
--days`` writes, for each day, the table rows of the items whose first event is that day (every
item without an event at all goes to day 1: the catalog at the start) into ``_items/day-NNN.parquet``
inside the days directory (``_``-prefixed: a directory given as ``--input`` never reads it as events),
so that ``prepare --append --input day-NNN.parquet --items _items/day-NNN.parquet`` brings each day's
new items with their features. The long-range probe has no latent vectors: no item table.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from recsys_alibi.config import GenerateConfig
from recsys_alibi.data.schema import ITEM_ID

DECLARATION = {"categorical": ["topic", "tags"], "numeric": ["popularity"]}  # data.item_features of the table
TAG_THRESHOLD = 1.0  # |v_i[d]| above it: the item is tagged with direction d
ITEM_TABLE_FILE = "items.parquet"
DAILY_ITEMS_DIR = "_items"
GENERATED_KEY = "recsys_alibi.generated"  # Parquet footer key of a table ``generate`` wrote: it may write it again


def item_table(vectors: np.ndarray, topic: np.ndarray, topic_rank: np.ndarray) -> pl.DataFrame:
    """The item table of a latent catalog (module doc).

    Args:
        vectors: (N, K) float latent item vectors; item i has raw id i + 1.
        topic: (N,) int topic of each item.
        topic_rank: (N,) int popularity rank inside its topic, 1 = most drawn.

    Returns:
        ``item_id`` Int64 1..N, ``topic`` String, ``tags`` List(String) (dimension order), ``popularity`` Float64.
    """
    n, k = vectors.shape
    strong = np.abs(vectors) > TAG_THRESHOLD  # (N, K)
    names = np.array([f"d{d:02d}{s}" for d in range(k) for s in "+-"]).reshape(k, 2)  # (K, 2)
    per_dim = np.where(vectors > 0, names[None, :, 0], names[None, :, 1])  # (N, K)
    tags = [per_dim[i][strong[i]].tolist() for i in range(n)]
    return pl.DataFrame({
        ITEM_ID: pl.Series(np.arange(1, n + 1), dtype=pl.Int64),
        "topic": pl.Series([f"topic-{t:02d}" for t in topic], dtype=pl.String),
        "tags": pl.Series(tags, dtype=pl.List(pl.String)),
        "popularity": pl.Series(-np.log(topic_rank.astype(np.float64)), dtype=pl.Float64),
    })  # fmt: skip


def generate_item_table(cfg: GenerateConfig, seed: int) -> pl.DataFrame | None:
    """The item table of the log ``generate_events(cfg, seed)`` writes (None for the long-range probe)."""
    if cfg.task != "default":
        return None
    from recsys_alibi.data.synthetic import latent_items

    latent = latent_items(cfg.items, seed)
    return item_table(latent.vectors, latent.topic, latent.topic_rank)


def daily_item_tables(table: pl.DataFrame, days: list[pl.DataFrame]) -> list[pl.DataFrame]:
    """Split ``table`` by the day of each item's first event in ``days`` (items without events: day 1)."""
    first = pl.concat([d.select(ITEM_ID).unique().with_columns(pl.lit(i, pl.Int64).alias("_day"))
                       for i, d in enumerate(days)]).group_by(ITEM_ID).agg(pl.col("_day").min())  # fmt: skip
    dated = table.join(first, on=ITEM_ID, how="left").with_columns(pl.col("_day").fill_null(0))
    return [dated.filter(pl.col("_day") == i).drop("_day").sort(ITEM_ID) for i in range(len(days))]


def item_table_path(events_path: str | Path) -> Path:
    """Where ``generate`` writes the item table of ``events_path``: ``items.parquet`` beside it
    (``<stem>.items.parquet`` when the events themselves are named ``items.parquet``)."""
    events_path = Path(events_path)
    name = ITEM_TABLE_FILE if events_path.name != ITEM_TABLE_FILE else f"{events_path.stem}.items.parquet"
    return events_path.parent / name


def write_item_table(cfg: GenerateConfig, seed: int, events_path: str | Path) -> Path | None:
    """Write the item table of ``generate``'s log beside ``events_path`` (atomic) when ``cfg.item_table``;
    returns its path (None: not asked for)."""
    from recsys_alibi.atomic import atomic_path

    table = generate_item_table(cfg, seed) if cfg.item_table else None
    if table is None:
        return None
    path = item_table_path(events_path)
    with atomic_path(path) as tmp:
        table.write_parquet(tmp, metadata=GENERATED)
    return path


GENERATED = {GENERATED_KEY: "generate"}  # the footer of every file ``generate`` writes


def written_by_generate(path: Path, columns: set[str] | None = None) -> bool:
    """Whether ``path`` is a Parquet file whose footer carries :data:`GENERATED_KEY` (``generate`` wrote it), or,
    with ``columns``, whose columns are exactly those (a table written before the mark)."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
    except (OSError, ValueError):  # not Parquet, unreadable, a folder
        return False
    return GENERATED_KEY.encode() in (meta.metadata or {}) or (columns is not None and set(meta.schema.names) == columns)


def check_written_by_generate(paths: list[Path]) -> None:
    """Refuse to replace or remove any of ``paths`` that ``generate`` did not write (a user's file of that name).

    Raises:
        DataError: naming the first such file.
    """
    from recsys_alibi.data.errors import DataError

    for path in paths:
        if (path.exists() or path.is_symlink()) and not written_by_generate(path):
            raise DataError(f"'{path}' exists and generate did not write it: generate --days writes and replaces its "
                            "day-NNN.parquet files (and _items/day-NNN.parquet) there; write them into another folder "
                            "(--output), or move that file")  # fmt: skip


def check_item_table_free(cfg: GenerateConfig, events_path: str | Path) -> None:
    """Refuse to write the item table over a file that ``generate`` did not write (no flag names that path, and a
    user's own catalog is often ``items.parquet`` beside the events).

    Raises:
        DataError: naming the file and the ways out.
    """
    from recsys_alibi.data.errors import DataError

    path = item_table_path(events_path)
    if not cfg.item_table or not (path.exists() or path.is_symlink()):
        return
    if not written_by_generate(path, {ITEM_ID, *DECLARATION["categorical"], *DECLARATION["numeric"]}):
        raise DataError(f"'{path}' exists and generate did not write it: generate writes its item table there, beside "
                        "the events; write the events into another folder (--output), move that file, or set "
                        "generate.item_table=false")  # fmt: skip


def write_daily_item_tables(cfg: GenerateConfig, seed: int, directory: str | Path, days: list[pl.DataFrame],
                            names: list[str]) -> list[Path]:  # fmt: skip
    """Write each day's new items (module doc) as ``directory/_items/<name>``, atomically, when ``cfg.item_table``
    ([] otherwise); an earlier run's tables that these days do not replace are removed (they describe other days).

    Args:
        days: the daily event frames, in order; names: the daily file names (``day-001.parquet`` ...).
    """
    from recsys_alibi.atomic import atomic_path

    table = generate_item_table(cfg, seed) if cfg.item_table else None
    folder = Path(directory) / DAILY_ITEMS_DIR
    paths = [folder / name for name in names] if table is not None else []
    if folder.is_dir():  # an earlier run's tables: with more days, or of other days when none is written now
        for stale in sorted(set(folder.glob("day-*.parquet")) - set(paths)):
            stale.unlink()
    if table is None:
        return []
    folder.mkdir(exist_ok=True)
    for path, rows in zip(paths, daily_item_tables(table, days)):
        with atomic_path(path) as tmp:
            rows.write_parquet(tmp, metadata=GENERATED)
    return paths
