"""``recsys-alibi export``: the vectors ``score`` ranks with, for a nearest-neighbour serving stack.

    recsys-alibi export --model-uri models:/recsys-alibi-ranker@champion --input prepared/ --output export/ \\
        [--index faiss]

The model scores item i for a user as the inner product of the user's query vector (the final
hidden state at the last event of the history, :meth:`serving.rank.ShardRanker.user_vectors`:
the same context window, sinks and batches as ``score``) with row i of its tied item table. The
export writes exactly these vectors:

================== ===============================================================================
``items.parquet``   ``item_id`` (raw), ``vector`` fixed-size list<float32>[D]: rows 1..N of the
                    item table, in item-index order (index 0, padding, is not exported), then the
                    items ``score`` ranks from their features alone (``score.items``, by default
                    the prepared input's item table: :mod:`serving.new_items`), by raw id
``users.parquet``   ``user_id`` (raw), ``vector`` fixed-size list<float32>[D], one row per user
                    of the input with at least one event the model knows
``items.faiss``     with ``--index faiss`` (``export.index``): a FAISS index over the item vectors,
                    ids = row numbers of ``items.parquet``; exact inner product (``IndexFlatIP``)
                    up to ``export.hnsw_above`` items, HNSW (``IndexHNSWFlat``, inner product)
                    above, its recall@100 against exact search measured and recorded
``export.json``     the manifest (written last): model URI, run, registry version, weights
                    digest, width, similarity, and the rules a consumer applies
================== ===============================================================================

With ``score.popularity_prior`` on, both vector files carry one more coordinate (width D + 1): the
item's ``weight * log(1 + recent count)`` of the input (as ``score`` adds it) and 1 for every user.
``score.new_item_slots`` is no vector operation: ``export.json`` (``new_item_slots``) says which rows
are new items and how ``score`` holds their places.

Top-K by ``users.vector @ items.vector`` with each user's history removed (``score.exclude_seen``)
and ties to the lower row is ``score``'s ranking. The allow / deny rules of ``score`` are not in
the vectors: a consumer filters with the same files.

Input and model loading are ``score``'s (:func:`serving.inputs.open_input`,
:func:`recsys_alibi.tracking.load_ranker`). The files are written into a hidden staging folder
beside ``--output`` (``.NAME.<token>.tmp``, :mod:`recsys_alibi.staging`) and moved into place at
the end, ``export.json`` last and the old one removed first: a reader that finds ``export.json``
finds the complete set it describes; a killed export leaves the previous export (or nothing) and
is simply run again (its staging folder is removed then; the staging of an export still running,
to this or any other folder, is never touched).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from recsys_alibi.atomic import json_text, publish_files
from recsys_alibi.config import ConfigError, ExportConfig, JobConfig, ScoreConfig
from recsys_alibi.data import schema
from recsys_alibi.data.ingest import DataError
from recsys_alibi.staging import staging_dir
from serving.changed import model_digest
from serving.inputs import open_input
from serving.new_items import with_default_items
from serving.rank import ShardRanker

log = logging.getLogger(__name__)

ITEMS, USERS, INDEX, MANIFEST = "items.parquet", "users.parquet", "items.faiss", "export.json"
VECTOR = "vector"
FAISS_MISSING = "export.index=faiss needs faiss-cpu: install the optional extra (pip install --no-deps -r requirements/faiss.lock.txt, part of `make install`)"  # fmt: skip


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote.

    Attributes:
        output_dir: the export directory; items: item vectors written (the model's N, then the new items);
        users: user vectors written; users_without_vector: input users with no event the model knows (not
        exported); width: D; seconds: wall time; index: the manifest's index entry (None without one);
        new_items: items of ``items`` that the model never saw, vectors from their features alone.
    """

    output_dir: Path
    items: int
    users: int
    users_without_vector: int
    width: int
    seconds: float
    index: dict | None = field(default=None)
    new_items: int = 0
    notes: tuple[str, ...] = ()  # score settings the vectors hold, or that a consumer applies (export.json)

    def summary(self) -> str:
        fresh = f" ({self.new_items} of them new, from their features alone)" if self.new_items else ""
        line = (f"exported {self.items} item vectors{fresh} and {self.users} user vectors (D={self.width}, inner product) -> "
                f"{self.output_dir} in {self.seconds:.1f} s; users without a known item: {self.users_without_vector}")  # fmt: skip
        if self.index:
            recall = ("not measured (export.recall_queries=0)" if self.index["recall"] is None else
                      f"{self.index['recall']:.4f} vs exact on {self.index['recall_queries']} users")  # fmt: skip
            line += f"\nindex: {self.index['type']} over {self.items} items, recall@{self.index['recall_k']} {recall}"
        return "\n".join((line, *self.notes))


def run_export(config: JobConfig, model_uri: str, input_path: str | Path, output_dir: str | Path) -> ExportResult:
    """Load ``model_uri`` (as ``score`` does) and :func:`export_model` the users of ``input_path``.

    Raises:
        ModelUriError: the URI does not resolve; DataError: bad input (as ``score``);
        ConfigError: ``export.index=faiss`` without faiss-cpu installed.
    """
    from recsys_alibi.tracking import load_ranker, setup_tracking

    if config.export.index == "faiss":
        _import_faiss()  # before loading anything
    setup_tracking(config.tracking, reading=model_uri)
    loaded = load_ranker(model_uri)
    ref = {"model_uri": model_uri, "run_id": loaded.run_id, "version": _registry_version(model_uri)}
    return export_model(config, loaded.model, loaded.items, input_path, output_dir, model_ref=ref)


def export_model(config: JobConfig, model, items: pl.DataFrame, input_path: str | Path, output_dir: str | Path,
                 *, model_ref: dict | None = None) -> ExportResult:  # fmt: skip
    """Write the item and user vectors of ``model`` for the users of ``input_path`` (module docstring).

    Args:
        config: ``score`` (context, sinks, batching, device, exclude_seen), ``data`` (raw events),
            ``export`` (index).
        model: an ``AlibiRanker``; items: its vocabulary (``item_idx`` 1..N, ``item_id``).
        input_path: prepared dir, sequences Parquet or raw events (as ``score``).
        output_dir: the export directory (created; an earlier export there is replaced).
        model_ref: identifies the model in the manifest (default ``{"model": "in-memory"}``).
    """
    started = time.perf_counter()
    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    config = with_default_items(config, model, input_path)  # the new items score ranks are exported too
    # no slots in the ranker: they are no vector operation (export.json states them from config.score)
    ranker = ShardRanker(model, items, config.score.model_copy(update={"new_item_slots": 0}), 1)
    with staging_dir(output_dir) as staging:  # a killed export's staging removed first, no other's
        # messages name the user's input, and rejects they name are kept in <output>/_input (the staging goes)
        source = ranker.for_input(open_input(input_path, items, config.data, staging / "_input",
                                             time_gap_buckets=ranker.time_gap_buckets, report_dir=output_dir / "_input",
                                             max_unknown_share=config.score.max_unknown_share,
                                             new_item_ids=ranker.new_item_ids))  # fmt: skip
        ranker.use_input_popularity(source, items)  # score's prior as one more coordinate (item bias, user 1)
        served = np.ones(ranker.n_items + 1, dtype=bool)  # items score may serve: not the padding, not the withheld
        served[0] = False
        if source.withheld is not None:
            served[source.withheld] = False
        item_vectors = ranker.table.float().cpu().numpy()  # (N + 1, D)
        if ranker.bias is not None:
            item_vectors = np.concatenate([item_vectors, ranker.bias.float().cpu().numpy()[:, None]], axis=1)
        item_vectors = item_vectors[served]  # (N', D) or (N', D + 1) with the prior
        pl.DataFrame({schema.ITEM_ID: ranker.item_ids.filter(pl.Series(served)),
                      VECTOR: _vectors(item_vectors)}).write_parquet(staging / ITEMS)  # fmt: skip
        n_users, user_sample = _write_users(ranker, source, config.score.shard_users, staging / USERS,
                                            config.export.recall_queries)  # fmt: skip
        index = _write_index(item_vectors, user_sample, config.export, staging / INDEX) if config.export.index == "faiss" else None
        manifest = _manifest(ranker, model, model_ref or {"model": "in-memory"}, input_path, n_users, source.n_users, index,
                             served, config.score)  # fmt: skip
        (staging / MANIFEST).write_text(json_text(manifest))
        output_dir.mkdir(exist_ok=True)
        (output_dir / MANIFEST).unlink(missing_ok=True)  # no manifest while the set is being replaced
        publish_files(staging, output_dir, (ITEMS, USERS, INDEX, MANIFEST), last=MANIFEST)
    return ExportResult(output_dir=output_dir, items=int(item_vectors.shape[0]), users=n_users,
                        users_without_vector=source.n_users - n_users, width=int(item_vectors.shape[1]),
                        seconds=time.perf_counter() - started, index=index,
                        new_items=int(served[ranker.first_new_item:].sum()), notes=_notes(manifest))  # fmt: skip


def _vectors(matrix: np.ndarray) -> pl.Series:
    """(R, D) float32 as a Polars ``Array(Float32, D)`` column (Arrow fixed-size list)."""
    return pl.Series(VECTOR, np.ascontiguousarray(matrix, dtype=np.float32), dtype=pl.Array(pl.Float32, matrix.shape[1]))


def _write_users(ranker: ShardRanker, source, shard_users: int, path: Path, sample: int) -> tuple[int, np.ndarray]:
    """Write ``users.parquet`` shard by shard (bounded memory); returns the users written and up to
    ``sample`` of their vectors (the first ones), the queries of the recall measurement."""
    import pyarrow.parquet as pq

    written, kept = 0, []
    writer = None
    try:
        for start in range(0, source.n_users, shard_users):
            shard = source.read_shard(start, shard_users)
            rows, vectors = ranker.user_vectors(shard.histories, shard.gaps)
            if ranker.bias is not None:  # the popularity prior's coordinate (items hold weight * log(1 + count))
                vectors = np.concatenate([vectors, np.ones((len(vectors), 1), np.float32)], axis=1)
            table = pl.DataFrame({schema.USER_ID: shard.user_ids.gather(rows), VECTOR: _vectors(vectors)}).to_arrow()
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
            written += len(rows)
            if sum(len(k) for k in kept) < sample:
                kept.append(vectors[: sample - sum(len(k) for k in kept)])
    finally:
        if writer is not None:
            writer.close()
    if not written:  # as score refuses the same input: an earlier export stays as it was
        raise DataError("no user of the input has an event on an item the model knows: no user vector to export; "
                        "check --input and --model-uri")  # fmt: skip
    width = ranker.table.shape[1] + (ranker.bias is not None)
    return written, np.concatenate(kept) if kept else np.zeros((0, width), np.float32)


def _import_faiss():
    try:
        import faiss
    except ImportError:
        raise ConfigError(FAISS_MISSING) from None
    return faiss


def _write_index(items: np.ndarray, queries: np.ndarray, cfg: ExportConfig, path: Path) -> dict:
    """Build the FAISS index over ``items`` (N, D) float32, write it to ``path``, measure its recall.

    Recall@k (k = ``cfg.recall_k``, capped at N) is the mean share of each query's exact top-k
    (inner product, ``IndexFlatIP``) that the index returns, over the ``queries`` (Q, D) float32.

    Returns:
        the manifest's index entry: ``type``, ``metric``, parameters, ``recall``, ``recall_k``,
        ``recall_queries``, ``queries_per_second`` of the index on those queries (one search call).
    """
    faiss = _import_faiss()
    n, d = items.shape
    exact = faiss.IndexFlatIP(d)
    exact.add(items)
    if n <= cfg.hnsw_above:
        index, entry = exact, {"type": "IndexFlatIP", "exact": True}
    else:
        index = faiss.IndexHNSWFlat(d, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.ef_construction
        index.add(items)
        index.hnsw.efSearch = cfg.ef_search
        entry = {"type": "IndexHNSWFlat", "exact": False, "M": cfg.hnsw_m, "efConstruction": cfg.ef_construction,
                 "efSearch": cfg.ef_search}  # fmt: skip
    k = min(cfg.recall_k, n)
    recall = qps = None  # not measured without queries (export.recall_queries=0): null in export.json
    if len(queries):
        truth = exact.search(queries, k)[1]
        started = time.perf_counter()
        found = index.search(queries, k)[1]
        qps = len(queries) / max(time.perf_counter() - started, 1e-9)
        recall = float(np.mean([len(np.intersect1d(a, b)) / k for a, b in zip(truth, found)]))
    faiss.write_index(index, str(path))
    return {**entry, "metric": "inner_product", "file": INDEX, "ids": f"row number in {ITEMS}", "recall": recall,
            "recall_k": k, "recall_queries": int(len(queries)), "queries_per_second": qps}  # fmt: skip


def _notes(manifest: dict) -> tuple[str, ...]:
    """The summary's lines on the score settings of ``manifest`` (export.json) that change the ranking."""
    notes = []
    if (prior := manifest["popularity_prior"]) is not None:
        notes.append(f"score.popularity_prior (weight {prior['weight']:g}) is in the vectors: coordinate "
                     f"{prior['coordinate']} (export again when the input changes)")
    if (slots := manifest["new_item_slots"]) is not None:
        notes.append(f"score.new_item_slots={slots['slots']} is not in the vectors: apply it as export.json's "
                     "new_item_slots says")
    return tuple(notes)


def _registry_version(model_uri: str) -> str | None:
    """The registry version behind ``models:/NAME/VERSION`` or ``models:/NAME@ALIAS`` (None otherwise)."""
    if not model_uri.startswith("models:/"):
        return None
    import mlflow

    spec = model_uri[len("models:/") :]
    if "@" in spec:
        name, alias = spec.split("@", 1)
        return str(mlflow.MlflowClient().get_model_version_by_alias(name, alias).version)
    version = spec.partition("/")[2]
    return version if version.isdigit() else None


def _manifest(ranker: ShardRanker, model, model_ref: dict, input_path, n_users: int, input_users: int,
              index: dict | None, served: np.ndarray, score: ScoreConfig) -> dict:  # fmt: skip
    """``export.json``: what the vectors are and what a consumer must apply to get ``score``'s rankings; ``served``
    (N + M + 1,) bool: the ranker's items written to ``items.parquet``; ``score``: the settings it follows."""
    width = int(ranker.table.shape[1]) + (ranker.bias is not None)
    prior = None
    if ranker.bias is not None:
        prior = {"weight": score.popularity_prior.weight, "half_life_days": score.popularity_prior.half_life_days,
                 "coordinate": width - 1,
                 "rule": ("score.popularity_prior is in the vectors: each item's last coordinate is weight * log(1 + "
                          "its recent events in the input), each user's is 1; export again when the input changes")}
    new_items = int(served[ranker.first_new_item:].sum())
    slots = None
    if score.new_item_slots and new_items:
        slots = {"slots": score.new_item_slots, "first_new_row": int(served[1:ranker.first_new_item].sum()),
                 "rule": ("score.new_item_slots is not in the vectors: when a user's top-K holds fewer than `slots` "
                          "rows from first_new_row on (the new items), its last places go to the best of them not in "
                          "it yet, best first")}
    seen = ("remove each user's own history (every item of the input's history, not only the context window) "
            "from the results" if ranker.cfg.exclude_seen else "none: score.exclude_seen was false")  # fmt: skip
    return {
        "model": {**model_ref, "digest": model_digest(model)},
        "input": str(Path(input_path).resolve()) if "*" not in str(input_path) else str(input_path),
        "width": width,
        "items": int(served[1:].sum()),
        "new_items": new_items,
        "users": n_users,
        "users_without_vector": input_users - n_users,
        "similarity": "inner_product",
        "score": ("dot(users.vector, items.vector): `score`'s float32 score up to float32 rounding (~1e-6 "
                  "relative: another summation order), so items whose scores tie within it may swap places"),
        "padding": "item index 0 is padding and is not exported; every row of items.parquet is a real item",
        "seen_items": seen,
        "ties": "equal scores rank the lower row of items.parquet first",
        "rules": "score.allow / score.deny are not in the vectors: filter the results with the same files",
        "popularity_prior": prior,
        "new_item_slots": slots,
        "context": {"max_context": ranker.context, "sinks": ranker.sinks},
        "index": index,
    }
