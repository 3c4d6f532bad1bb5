"""Cold items on ML-1M (issue 44): 10 % of the items held out of training and ranked from their features alone.

    python -m benchmarks.cold_items                      # ML-1M, 6-epoch budget (configs/movielens-1m-6ep.yaml)
                                                         # -> runs/cold-items/cold-items-ml1m.json
    python -m benchmarks.cold_items --tiny --output OUT  # 300 users, a tiny model, 1 epoch (the test)

Protocol (leave-one-out on the SASRec ML-1M file, ``../shared/data/ml-1m/ml-1m.txt.gz``):

* item features: genres (a list) and the year in the title, from ``movies.dat`` through
  ``sas_to_original_items.txt``;
* H: 10 % of the items, drawn with the seed; every event on them is removed from the training data
  (the prepared directory still lists them in its item table, without events), so no model has an
  id row for them;
* test: each user's last event is the target, the events before it the history (events on held-out
  items cannot be read by the models and are dropped from the context; every event is still a seen
  item, masked); validation: the second-last event from the events before it. The training data's
  own split (last two of the filtered sequence held out) keeps both targets out of training;
* the catalog ranked is every item: the known ones with their model vectors, the held-out ones from
  features alone (feature model: the trained encoder, :mod:`serving.new_items`' rule) or, for the
  id-only model, by today's rule for an item without a row (``mean + std * z`` of the trained rows,
  :func:`recsys_alibi.training.warm_start.new_item_rows`);
* metrics: HR@10 over the users whose target is a held-out item, NDCG@10 over all users, both with
  the paired bootstrap CI of features - id-only (:mod:`recsys_alibi.evaluation.paired`);
* settings: the training recipe is ``configs/movielens-1m-6ep.yaml`` for both models; the feature
  model's ``model.item_features.id_min_events`` among :data:`ID_MIN_EVENTS` or its
  ``model.item_features.id_dropout`` among :data:`ID_DROPOUT` is chosen on validation
  only (the highest validation HR@10 on held-out targets among the settings whose validation NDCG@10
  is not below the id-only model's; else the highest validation NDCG@10); test is read once.

Writes a JSON (machine, load, command, settings, validation and test figures) and prints a summary.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

from recsys_alibi.diagnostics.machine import command_line, machine_line

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "ml-1m"
RECIPE = REPO / "configs" / "movielens-1m-6ep.yaml"
HELD_SHARE = 0.10
ID_MIN_EVENTS = (0, 20)  # the feature model's candidates, chosen on validation
ID_DROPOUT = (0.1, 0.25, 0.5)  # ... and with every id row kept, a share of them dropped in each training step (DropoutNet)
TINY = ["model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.max_len=50", "train.max_epochs=1",
        "train.batch_size=64", "train.warmup_steps=5", "train.val_users=100"]  # fmt: skip
K = 10
FIGURES = ("hr", "ndcg", "held", "hr_slot", "ndcg_slot")  # per user, kept in figures.npz

log = logging.getLogger("benchmarks.cold_items")


def load_sequences(folder: Path, max_users: int | None = None) -> pl.DataFrame:
    """``user_id``, ``items`` (list, time order) of the SASRec file (lines of one user are in time order)."""
    lines = pl.read_csv(folder / "ml-1m.txt.gz", separator=" ", has_header=False, new_columns=["user_id", "item_id"])
    seqs = lines.group_by("user_id", maintain_order=True).agg(pl.col("item_id").alias("items"))
    return seqs.head(max_users) if max_users else seqs


def load_item_table(folder: Path) -> pl.DataFrame:
    """``item_id`` (SASRec id), ``genres`` list, ``year`` Float64, from movies.dat via the id map."""
    from benchmarks.movielens_items import ml1m_items

    mapping = pl.read_csv(folder / "sas_to_original_items.txt", separator=" ", has_header=False,
                          new_columns=["item_id", "movie_id"])  # fmt: skip
    movies = ml1m_items(folder).rename({"item_id": "movie_id"})
    return mapping.join(movies, on="movie_id", how="left").select("item_id", "genres", "year").sort("item_id")


def held_out_items(seqs: pl.DataFrame, share: float, seed: int) -> np.ndarray:
    """(M,) sorted item ids drawn uniformly (without replacement) from the items of ``seqs``."""
    items = np.unique(seqs.get_column("items").explode().to_numpy())
    return np.sort(np.random.default_rng(seed).choice(items, size=max(1, round(share * items.size)), replace=False))


def prepare_training(seqs: pl.DataFrame, held: np.ndarray, table: pl.DataFrame, work: Path) -> Path:
    """The training data: every event but those on held-out items, line order as time; the item table of all items."""
    events = seqs.explode("items").rename({"items": "item_id"}).filter(~pl.col("item_id").is_in(held.tolist()))
    events = events.with_row_index("timestamp").select("user_id", "item_id", pl.col("timestamp").cast(pl.Int64))
    work.mkdir(parents=True, exist_ok=True)
    events.write_csv(work / "events.csv")
    table.write_parquet(work / "items.parquet")
    from recsys_alibi.config import DataConfig
    from recsys_alibi.data.prepare import prepare

    cfg = DataConfig(min_events_per_user=1, min_events_per_item=1, items=str(work / "items.parquet"),
                     item_features={"categorical": ["genres"], "numeric": ["year"]})  # fmt: skip
    prepare(cfg, work / "events.csv", work / "prepared")
    return work / "prepared"


def trained(config, prepared: Path, workdir: Path):
    """The model a finished :func:`train` kept in ``<workdir>/checkpoints/best.ckpt`` (to score it again)."""
    from recsys_alibi.training.data_rules import resolve_max_len
    from recsys_alibi.training.datamodule import SequenceDataModule
    from recsys_alibi.training.fit import catalog_of
    from recsys_alibi.training.module import RankerModule

    config = resolve_max_len(config, prepared, None)
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    module = RankerModule(config.model, config.train, datamodule.n_items, None, config.evaluate.exclude_seen,
                          seed=config.seed, catalog=catalog_of(config, datamodule))  # fmt: skip
    state = torch.load(workdir / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    module.load_state_dict(state, strict=False)
    return module.model.eval()


def train(config, prepared: Path, workdir: Path):
    """Fit a ranker with ``config`` on ``prepared`` (no tracking); returns (model, seconds, epochs)."""
    from recsys_alibi.training.data_rules import resolve_max_len
    from recsys_alibi.training.datamodule import SequenceDataModule
    from recsys_alibi.training.fit import fit_ranker

    config = resolve_max_len(config, prepared, None)
    datamodule = SequenceDataModule(prepared, config.model, config.train, config.seed)
    fit = fit_ranker(config, datamodule, workdir / "checkpoints", None, progress=False)
    return fit.module.model.eval(), fit.train_seconds, fit.epochs


def catalog_vectors(model, vocab: pl.DataFrame, held: np.ndarray, table: pl.DataFrame, seed: int) -> tuple[torch.Tensor, dict]:
    """(N + M + 1, D) vectors of every item (known: the model's, held-out: features or noise) and raw id -> column."""
    from recsys_alibi.data.feature_rows import feature_rows
    from recsys_alibi.training.warm_start import new_item_rows

    with torch.no_grad():
        known = model.item_vectors().detach().float()  # (N + 1, D)
        if model.features is not None:
            rows = table.filter(pl.col("item_id").is_in(held.tolist())).sort("item_id")
            encoded, _ = feature_rows(rows, model.features.vocabularies, ["year"])
            extra = model.features.encoder(encoded).float()  # (M, D): features alone
        else:
            extra = new_item_rows(known[1:], held.size, seed)  # today's rule for an item without a row
    column = dict(zip(vocab.get_column("item_id").to_list(), vocab.get_column("item_idx").to_list()))
    column.update({int(item): known.shape[0] + i for i, item in enumerate(held)})
    return torch.cat([known, extra]), column


def per_user(model, vectors: torch.Tensor, column: dict, seqs: pl.DataFrame, back: int, n_known: int,
             batch_tokens: int = 16_384) -> dict[str, np.ndarray]:  # fmt: skip
    """Per user (users with a target): HR@10, NDCG@10 and whether the target is held out; ``hr_slot`` and
    ``ndcg_slot`` with one place of the top 10 held for the best held-out item (``score.new_item_slots=1``).

    ``back`` 1: test (last event), 2: validation (second-last). The history is every earlier event;
    the model reads those it knows (columns 1..N), every one is masked as seen.
    """
    from recsys_alibi.data.loader import pad_right
    from recsys_alibi.evaluation.metrics import per_user_metrics
    from recsys_alibi.evaluation.ranking import mask_seen, target_ranks
    from serving.topk import slotted_ranks

    histories, targets, seen = [], [], []
    for items in seqs.get_column("items").to_list():
        if len(items) <= back:
            continue
        cols = [column[i] for i in items[: len(items) - back]]
        histories.append(np.array([c for c in cols if c <= n_known], dtype=np.int64))
        seen.append(np.array(cols, dtype=np.int64))
        targets.append(column[items[len(items) - back]])
    lengths = np.array([h.size for h in histories])
    order = np.argsort(lengths, kind="stable")
    ranks = np.full(len(histories), vectors.shape[0], dtype=np.int64)  # no known event: a miss
    slotted = ranks.copy()
    start = int(np.searchsorted(lengths[order], 1))
    with torch.no_grad():
        while start < order.size:
            stop = start + 1
            while stop < order.size and (stop - start + 1) * lengths[order[stop]] <= batch_tokens:
                stop += 1
            rows = order[start:stop]
            context, lens = pad_right([histories[r] for r in rows])
            hidden = model.last_hidden(context, lens)  # (B, D)
            scores = hidden.float() @ vectors.T  # (B, N + M + 1)
            scores = mask_seen(scores, pad_right([seen[r] for r in rows])[0])
            target = torch.tensor([targets[r] for r in rows])  # (B,)
            rank = target_ranks(scores, target)
            ranks[rows] = rank.numpy()
            slotted[rows] = slotted_ranks(scores, target, rank, K, 1, n_known + 1)[0].numpy()  # the best held-out item
            start = stop
    metrics, slot = per_user_metrics(ranks, [K]), per_user_metrics(slotted, [K])
    return {"hr": metrics[f"HR@{K}"], "ndcg": metrics[f"NDCG@{K}"], "held": np.array(targets) > n_known,
            "hr_slot": slot[f"HR@{K}"], "ndcg_slot": slot[f"NDCG@{K}"]}  # fmt: skip


def setting_figures(name: str, sets: list[str], prepared: Path, vocab: pl.DataFrame, held: np.ndarray,
                    table: pl.DataFrame, seqs: pl.DataFrame, args) -> tuple[dict, dict, dict]:  # fmt: skip
    """Train one setting and rank validation and test: (validation per user, test per user, its record).

    Kept in ``<workdir>/<name>/figures.npz`` and ``record.json`` once done: a run stopped between settings
    starts again with the same command and trains only those not done with the same overrides.
    """
    import json

    from recsys_alibi.atomic import write_json_atomic
    from recsys_alibi.config import load_config

    folder = args.workdir / name
    saved, record = folder / "figures.npz", folder / "record.json"
    done = json.loads(record.read_text()) if saved.is_file() and record.is_file() else None
    if done is not None and done["overrides"] == sets:
        with np.load(saved) as f:
            if "test_hr_slot" in f:
                return ({k: f[f"validation_{k}"] for k in FIGURES}, {k: f[f"test_{k}"] for k in FIGURES}, done)
        model = trained(load_config(RECIPE, sets), prepared, folder)  # figures of an earlier version: score again
    else:
        model, seconds, epochs = train(load_config(RECIPE, sets), prepared, folder)
        done = {"overrides": sets, "train_seconds": round(seconds, 1), "epochs": epochs}
    vectors, column = catalog_vectors(model, vocab, held, table, args.seed)
    validation = per_user(model, vectors, column, seqs, 2, vocab.height)
    test = per_user(model, vectors, column, seqs, 1, vocab.height)
    done["validation"] = summarise(validation)
    tmp = folder / "figures.tmp.npz"
    np.savez(tmp, **{f"validation_{k}": v for k, v in validation.items()}, **{f"test_{k}": v for k, v in test.items()})
    tmp.replace(saved)
    write_json_atomic(record, done)
    return validation, test, done


def summarise(user: dict[str, np.ndarray]) -> dict[str, float]:
    held = user["held"]
    return {"users": int(held.size), "held_targets": int(held.sum()), f"HR@{K} held-out targets": float(user["hr"][held].mean()),
            f"NDCG@{K} all": float(user["ndcg"].mean()), f"HR@{K} all": float(user["hr"].mean()),
            f"HR@{K} held-out targets, one slot": float(user["hr_slot"][held].mean()),
            f"NDCG@{K} all, one slot": float(user["ndcg_slot"].mean())}  # fmt: skip


def choose(validation: dict[str, dict]) -> str:
    """The feature setting chosen on validation (module doc)."""
    base = validation["id_only"][f"NDCG@{K} all"]
    feature = {name: v for name, v in validation.items() if name != "id_only"}
    ok = [n for n, v in feature.items() if v[f"NDCG@{K} all"] >= base]
    if ok:
        return max(ok, key=lambda n: feature[n][f"HR@{K} held-out targets"])
    return max(feature, key=lambda n: feature[n][f"NDCG@{K} all"])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="300 users, a tiny model, 1 epoch (tests)")
    parser.add_argument("--output", type=Path, default=REPO / "runs" / "cold-items" / "cold-items-ml1m.json",
                        help="default runs/cold-items/cold-items-ml1m.json (the committed figures are in docs/results/)")
    parser.add_argument("--workdir", type=Path, default=REPO / "runs" / "cold-items")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    from recsys_alibi.evaluation.paired import paired_difference

    args.output.parent.mkdir(parents=True, exist_ok=True)  # before the training: a finished run is never lost
    torch.set_num_threads(1)
    started, load_before = time.time(), os.getloadavg()
    seqs = load_sequences(args.data, 300 if args.tiny else None)
    table = load_item_table(args.data)
    held = held_out_items(seqs, HELD_SHARE, args.seed)
    prepared = prepare_training(seqs, held, table, args.workdir / "data")
    vocab = pl.read_parquet(prepared / "items.parquet")
    overrides = ["data.input=null", f"seed={args.seed}", "train.attention_health=false", *(TINY if args.tiny else [])]
    settings = {"id_only": overrides}
    settings |= {f"features_id_min_events_{m}": [*overrides, "model.item_features.enabled=true",
                 f"model.item_features.id_min_events={m}"] for m in ID_MIN_EVENTS}  # fmt: skip
    settings |= {f"features_id_dropout_{p}": [*overrides, "model.item_features.enabled=true",
                 f"model.item_features.id_dropout={p}"] for p in ID_DROPOUT}  # fmt: skip
    validation, test, runs = {}, {}, {}
    for name, sets in settings.items():
        validation[name], test[name], runs[name] = setting_figures(name, sets, prepared, vocab, held, table, seqs, args)
        log.info("%s: %s", name, runs[name]["validation"])
    chosen = choose({n: r["validation"] for n, r in runs.items()})
    base, cand = test["id_only"], test[chosen]
    held_rows = base["held"]
    result = {
        "protocol": "leave-one-out, ML-1M SASRec file; 10 % of items held out of training, ranked from features only "
                    "(genres + year, movies.dat via sas_to_original_items.txt); id-only: held-out items get "
                    "mean + std * noise rows (today's rule)",  # fmt: skip
        "command": command_line("-m", ["benchmarks.cold_items", *(sys.argv[1:] if argv is None else argv)]),
        "recipe": str(RECIPE.relative_to(REPO)), "tiny": args.tiny,
        "machine": f"{machine_line(1)}, torch {torch.__version__}",
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "seed": args.seed, "held_out_items": int(held.size), "items": int(vocab.height + held.size),
        "chosen_on_validation": chosen, "runs": runs,
        "test": {
            "id_only": summarise(base), "features": summarise(cand),
            f"HR@{K} held-out targets": paired_difference(cand["hr"][held_rows], base["hr"][held_rows]).to_json(),
            f"NDCG@{K} all": paired_difference(cand["ndcg"], base["ndcg"]).to_json(),
            # score.new_item_slots=1 in both (the id-only model's held-out rows are noise) and in the feature model only
            f"HR@{K} held-out targets, one slot each": paired_difference(cand["hr_slot"][held_rows], base["hr_slot"][held_rows]).to_json(),
            f"NDCG@{K} all, one slot each": paired_difference(cand["ndcg_slot"], base["ndcg_slot"]).to_json(),
            f"NDCG@{K} all, features with one slot - id-only without": paired_difference(cand["ndcg_slot"], base["ndcg"]).to_json(),
        },
        "wall_seconds": round(time.time() - started, 1),
    }
    from recsys_alibi.atomic import write_json_atomic

    write_json_atomic(args.output, result)  # strict JSON (no NaN), replaced as a whole
    hr, nd = result["test"][f"HR@{K} held-out targets"], result["test"][f"NDCG@{K} all"]
    ratio = f"x{hr['ratio']:.2f}" if hr["ratio"] else "the id-only model has no hit"
    print(f"held-out targets: {int(held_rows.sum())} of {held_rows.size} users; chosen on validation: {chosen}")
    print(f"HR@{K} held-out targets: id-only {hr['baseline']:.4f}, features {hr['candidate']:.4f} "
          f"({ratio}), diff {hr['difference']:+.4f} [{hr['ci95'][0]:+.4f}, {hr['ci95'][1]:+.4f}]")
    print(f"NDCG@{K} all: id-only {nd['baseline']:.4f}, features {nd['candidate']:.4f}, "
          f"diff {nd['difference']:+.4f} [{nd['ci95'][0]:+.4f}, {nd['ci95'][1]:+.4f}] -> {args.output}")
    return result


if __name__ == "__main__":
    from pipelines.cli import configure_logging

    configure_logging()  # the project's INFO lines, Lightning's banners silenced
    logging.getLogger("benchmarks").setLevel(logging.INFO)
    main()
