"""``recsys-alibi score``: top-K rankings for every user, written as Parquet part files.

Input: a prepared directory or a sequences Parquet file (``user_id``, ``item_idx`` list). Users
are split into shards of ``score.shard_users``; each shard becomes ``part-NNNNN.parquet`` in the
output directory, written atomically (temporary file, then rename) and then recorded in
``_manifest.json``. A killed job started again with the same model, input and K skips the shards
in the manifest, so the output has no duplicate (user, rank) and no missing user.

Output rows (long format): ``user_id`` (raw), ``rank`` int32 (1 = best), ``item_id`` (raw),
``score`` float32; per user ``min(K, N - seen)`` rows when seen items are excluded.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from recsys_alibi.config import JobConfig
from recsys_alibi.data import schema
from recsys_alibi.data.loader import FlatSequences, pad_right
from recsys_alibi.evaluation.ranking import mask_seen, topk

log = logging.getLogger(__name__)

MANIFEST = "_manifest.json"


@dataclass(frozen=True)
class ScoreJobResult:
    """Where the rankings went and how fast they were made."""

    output_dir: Path
    users: int
    shards: int
    shards_skipped: int
    rows: int
    seconds: float

    def summary(self) -> str:
        rate = self.users / self.seconds if self.seconds > 0 else float("nan")
        return (
            f"scored {self.users} users in {self.shards} shards ({self.shards_skipped} already done) "
            f"in {self.seconds:.1f} s ({rate:.0f} users/s); {self.rows} rows -> {self.output_dir}"
        )


def read_score_input(input_path: str | Path) -> pl.DataFrame:
    """Users to score: ``user_id`` and ``item_idx`` list<int32> from a prepared dir or sequences Parquet.

    Raises:
        FileNotFoundError: the input does not exist.
        ValueError: the Parquet file lacks the sequence columns.
    """
    path = Path(input_path)
    if path.is_dir():
        path = path / schema.SEQUENCES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"score input not found: {path} (give a prepared dir or a sequences Parquet file)")
    frame = pl.read_parquet(path, columns=None)
    missing = {schema.USER_ID, schema.ITEM_IDX} - set(frame.columns)
    if missing:
        raise ValueError(f"{path} lacks columns {sorted(missing)}: expected sequences from `recsys-alibi prepare`")
    return frame.select(schema.USER_ID, schema.ITEM_IDX)


def _read_manifest(output_dir: Path, identity: dict) -> dict:
    path = output_dir / MANIFEST
    if not path.exists():
        return {"identity": identity, "shards": {}}
    manifest = json.loads(path.read_text())
    if manifest.get("identity") != identity:
        raise ValueError(
            f"{output_dir} holds rankings from another job ({manifest.get('identity')}); "
            "choose a new --output or delete that directory"
        )
    return manifest


def _write_atomic_json(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, path)


def rank_shard(scorer, histories: FlatSequences, user_ids: pl.Series, items: pl.Series, config: JobConfig, k: int) -> pl.DataFrame:
    """Top-K rows for one shard of users (long format, contract schema)."""
    cfg = config.score
    context = min(cfg.max_context, scorer.max_context or cfg.max_context)
    order = np.argsort(histories.lengths(), kind="stable")  # similar lengths together: less padding
    frames = []
    item_ids = items.to_numpy() if items.dtype != pl.Utf8 else np.asarray(items.to_list(), dtype=object)
    for start in range(0, len(order), cfg.batch_size):
        rows = order[start : start + cfg.batch_size]
        history, lengths = pad_right([histories.get(int(u), last=context) for u in rows])
        scores = scorer.score(history, lengths)  # (B, N + 1)
        scores = mask_seen(scores, history, exclude_seen=cfg.exclude_seen)
        values, indices = topk(scores, min(k, scores.shape[1] - 1))  # (B, K)
        valid = torch.isfinite(values)  # fewer than K unseen items: drop the -inf tail
        user_pos = np.repeat(rows, valid.sum(1).numpy())
        ranks = (torch.arange(values.shape[1]) + 1).expand_as(values)[valid]
        frames.append(
            pl.DataFrame(
                {
                    schema.USER_ID: user_ids.gather(pl.Series(user_pos)),
                    schema.RANK: ranks.numpy().astype(np.int32),
                    schema.ITEM_ID: pl.Series(item_ids[indices[valid].numpy() - 1]).cast(items.dtype),
                    schema.SCORE: values[valid].numpy().astype(np.float32),
                }
            )
        )
    return pl.concat(frames) if frames else pl.DataFrame(
        schema={schema.USER_ID: user_ids.dtype, schema.RANK: pl.Int32, schema.ITEM_ID: items.dtype, schema.SCORE: pl.Float32}
    )


def run_score(
    config: JobConfig,
    model_uri: str,
    input_path: str | Path,
    output_dir: str | Path,
    *,
    k: int | None = None,
    progress: bool = True,
) -> ScoreJobResult:
    """Score every user of ``input_path`` with ``model_uri`` and write top-``k`` part files.

    Raises:
        ModelUriError: the model URI does not resolve.
        FileNotFoundError / ValueError: bad input, or ``output_dir`` holds another job's rankings.
    """
    from rich.progress import Progress

    from recsys_alibi.model.scorer import RankerScorer
    from recsys_alibi.tracking import load_ranker, setup_tracking

    k = k or config.score.k
    setup_tracking(config.tracking)
    loaded = load_ranker(model_uri)
    scorer = RankerScorer(loaded.model, name="model")
    frame = read_score_input(input_path)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    identity = {"model_uri": model_uri, "input": str(Path(input_path).resolve()), "k": k,
                "shard_users": config.score.shard_users, "users": frame.height}
    manifest = _read_manifest(output_dir, identity)
    shard_users = config.score.shard_users
    n_shards = max(1, -(-frame.height // shard_users))
    started = time.perf_counter()
    skipped = 0
    with Progress(disable=not progress) as bar:
        task = bar.add_task("scoring users", total=frame.height)
        for shard in range(n_shards):
            part = f"part-{shard:05d}.parquet"
            chunk = frame.slice(shard * shard_users, shard_users)
            if part in manifest["shards"] and (output_dir / part).exists():
                skipped += 1
                bar.advance(task, chunk.height)
                continue
            histories = FlatSequences.from_series(chunk.get_column(schema.ITEM_IDX))
            rankings = rank_shard(scorer, histories, chunk.get_column(schema.USER_ID), loaded.items.get_column(schema.ITEM_ID), config, k)
            tmp = output_dir / f".{part}.tmp"
            rankings.sort(schema.USER_ID, schema.RANK).write_parquet(tmp)
            os.replace(tmp, output_dir / part)
            manifest["shards"][part] = {"users": chunk.height, "rows": rankings.height}
            _write_atomic_json(output_dir / MANIFEST, manifest)
            bar.advance(task, chunk.height)
    seconds = time.perf_counter() - started
    rows = sum(s["rows"] for s in manifest["shards"].values())
    return ScoreJobResult(output_dir, frame.height, n_shards, skipped, rows, seconds)
