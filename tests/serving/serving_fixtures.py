"""Tiny models and inputs for the scoring tests: random weights, a few dozen users, CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch

from recsys_alibi.config import JobConfig, ModelConfig, with_overrides
from recsys_alibi.data import schema
from recsys_alibi.model.transformer import AlibiRanker

N_ITEMS = 30


def tiny_model(n_items: int = N_ITEMS, seed: int = 0, **model) -> AlibiRanker:
    """A randomly initialised 1-layer ranker (D=16, H=2) over ``n_items`` items."""
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=16, n_heads=2, n_layers=1, max_len=8, dropout=0.0, **model)
    return AlibiRanker(cfg, n_items=n_items).eval()


def vocabulary(n_items: int = N_ITEMS) -> pl.DataFrame:
    """``item_idx`` 1..N, raw ``item_id`` = 1000 + idx, ``count``."""
    idx = np.arange(1, n_items + 1)
    return pl.DataFrame(
        {schema.ITEM_IDX: pl.Series(idx, dtype=pl.Int32), schema.ITEM_ID: pl.Series(1000 + idx, dtype=pl.Int64),
         schema.COUNT: pl.Series(np.ones(n_items), dtype=pl.Int64)}
    )


def write_prepared(path: Path, n_users: int = 23, n_items: int = N_ITEMS, max_len: int = 40, seed: int = 1) -> Path:
    """A prepared dir: ``sequences.parquet`` (random histories of 1..max_len events) and ``items.parquet``."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, n_users)
    lengths[0] = n_items - 3  # a user who saw most of the catalog: fewer than K rankable items
    histories = [rng.choice(np.arange(1, n_items + 1), size=int(n), replace=True).astype(np.int32) for n in lengths]
    histories[0] = np.arange(1, n_items - 2, dtype=np.int32)
    path.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(
        {
            schema.USER_ID: pl.Series([f"u{u:03d}" for u in range(n_users)], dtype=pl.String),
            schema.ITEM_IDX: pl.Series([h.tolist() for h in histories], dtype=pl.List(pl.Int32)),
            schema.TIMESTAMP: pl.Series([list(range(len(h))) for h in histories], dtype=pl.List(pl.Int64)),
            schema.LENGTH: pl.Series(lengths, dtype=pl.Int32),
        }
    ).write_parquet(path / schema.SEQUENCES_FILE)
    vocabulary(n_items).write_parquet(path / schema.ITEMS_FILE)
    return path


def score_config(**score) -> JobConfig:
    """The default job config with a small ``score`` section (K=10, shards of 5 users, sdpa)."""
    fields = {"k": 10, "shard_users": 5, "batch_size": 4, "catalog_chunk": 7, "attention_backend": "sdpa",
              "device": "cpu", **score}
    return with_overrides(JobConfig(), score=fields)


def read_rankings(output_dir: Path) -> pl.DataFrame:
    return pl.read_parquet(output_dir / "part-*.parquet").sort(schema.USER_ID, schema.RANK)


class Killed(Exception):
    """Stands for a kill: raised by the hook, it skips everything the job would do next."""


def kill_at(point: str, shard: int):
    def hook(at: str, s: int) -> None:
        if (at, s) == (point, shard):
            raise Killed(f"{at} {s}")

    return hook


def killed_temp(target: Path, content: bytes = b"half a file") -> Path:
    """The temporary a writer of ``target`` killed mid-write leaves (its lock released: recsys_alibi.staging)."""
    from recsys_alibi.staging import held_temp, release

    path, held = held_temp(target)
    path.write_bytes(content)
    release(held)
    return path


def snapshot(output_dir: Path) -> dict[str, bytes]:
    """Every file below ``output_dir`` by relative path (part files, manifest, staged input)."""
    return {str(p.relative_to(output_dir)): p.read_bytes() for p in sorted(output_dir.rglob("*")) if p.is_file()}


def dot_product_rankings(export_dir: Path, prepared: Path, k: int) -> pl.DataFrame:
    """Top-``k`` of ``users.vector @ items.vector`` with each user's history removed, ties to the lower
    row: what a serving stack computes from the export (numpy reference), in the rankings schema."""
    items = pl.read_parquet(export_dir / "items.parquet")
    users = pl.read_parquet(export_dir / "users.parquet")
    item_ids = items.get_column(schema.ITEM_ID)
    scores = users.get_column("vector").to_numpy() @ items.get_column("vector").to_numpy().T  # (U, N)
    row_of = {raw: row for row, raw in enumerate(item_ids.to_list())}
    vocab = pl.read_parquet(prepared / schema.ITEMS_FILE).sort(schema.ITEM_IDX).get_column(schema.ITEM_ID).to_list()
    histories = dict(pl.read_parquet(prepared / schema.SEQUENCES_FILE).select(schema.USER_ID, schema.ITEM_IDX).iter_rows())
    frames = []
    for u, user in enumerate(users.get_column(schema.USER_ID).to_list()):
        row = scores[u].astype(np.float32)
        row[[row_of[vocab[i - 1]] for i in histories[user]]] = -np.inf  # seen items
        order = np.argsort(-row, kind="stable")[:k]
        order = order[np.isfinite(row[order])]
        frames.append(pl.DataFrame({schema.USER_ID: [user] * len(order),
                                    schema.RANK: pl.Series(np.arange(1, len(order) + 1), dtype=pl.Int32),
                                    schema.ITEM_ID: item_ids.gather(order), schema.SCORE: pl.Series(row[order], dtype=pl.Float32)}))  # fmt: skip
    return pl.concat(frames).sort(schema.USER_ID, schema.RANK)
