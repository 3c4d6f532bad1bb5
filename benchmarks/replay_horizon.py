"""Every next-period item of each test user, not only the first: how a replay chain's top 10 covers the period ahead.

Run from the repository root on a finished ``benchmarks/replay.py`` JSON whose models are still in its tracking
store, after ``benchmarks/replay_prior.py`` chose its prior (minutes on a CPU):

    .venv/bin/python benchmarks/replay_horizon.py runs/ml1m-s1-gate.json --prior warm=runs/ml1m-s1-gate.prior.json

The replay ranks one target per test user (``replay.next_period_examples``: the first next-period event of a
catalog item not in the history). A daily batch job writes each user's top K for the days ahead, so here the
same test users keep **every** distinct catalog item of their next-period events not in the history (``targets``,
in the order of their first event) and each model's top 10 (seen items excluded, the whole history read) is
scored against the set:

    Recall@10 = |top10 & T| / |T|,   NDCG@10 = sum over hits at rank r of 1 / log2(r + 1), over the same sum for
    the first min(|T|, 10) ranks (binary relevance; Jarvelin & Kekalainen 2002).

A model of an earlier catalog (``stale``: model k-1 on step k's period) ranks in its own numbering by raw
``item_id``; the targets it does not know are its misses (|T| unchanged). Each arm is scored alone (``model``) and
with the prior ``replay_prior.py`` chose walk-forward for its chain (``--prior ARM=FILE``: the recorded point of
each (seed, step), ``chosen -> prior``; no new choice is made here), the stale model under the warm chain's point.
Writes ``--output`` (default ``REPLAY.horizon.json``; ``runs/`` for a replay under docs/results/): the command,
the machine, per arm the means, and the paired differences
``warm_minus_<other>`` (``model`` and ``prior``) pooled over (seed, step, user) with percentile-bootstrap 95 %
intervals, also per step; per user in ``.per_user.json``. Refused with one line (exit 2): a file that is not a
finished replay, an arm it did not train, a ``--prior`` file that is not ``replay_prior.py``'s output for that arm
of this replay, an ``--output`` that is a folder or one of the replay's files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import torch

from recsys_alibi.diagnostics.machine import command_line, machine_line

METRICS = ("NDCG@10", "Recall@10")
K = 10


def horizon_examples(prepared: Path, events: pl.DataFrame, lo: int, hi: int, model) -> pl.DataFrame:
    """The test users of the period ``[lo, hi)`` (those of ``replay.next_period_examples``) with every distinct
    catalog item of their events in the period that is not in their history.

    Returns:
        ``user_id``, ``history`` list<Int32>, ``targets`` list<Int32> (item_idx, first event first, ties by index)
        and ``history_time_gaps`` when ``model`` reads time gaps.
    """
    from recsys_alibi.data.prepare import read_items, read_sequences
    from recsys_alibi.data.schema import TIME_GAPS
    from recsys_alibi.data.splits import HISTORY, HISTORY_TIME_GAPS, TARGETS
    from recsys_alibi.data.time_gaps import sequences_for

    sequences = sequences_for(model, read_sequences(prepared))
    items = read_items(prepared).select("item_idx", "item_id")
    upcoming = (
        events.filter((pl.col("timestamp") >= lo) & (pl.col("timestamp") < hi))
        .join(items, on="item_id", how="inner")
        .join(sequences.select("user_id", "item_idx").explode("item_idx").rename({"item_idx": "seen"}),
              left_on=["user_id", "item_idx"], right_on=["user_id", "seen"], how="anti")
        .sort("timestamp", "item_idx")
        .unique(["user_id", "item_idx"], keep="first", maintain_order=True)
        .group_by("user_id", maintain_order=True)
        .agg(pl.col("item_idx").cast(pl.Int32).alias("_targets"))
    )  # fmt: skip
    gaps = [pl.col(TIME_GAPS).cast(pl.List(pl.Int32)).alias(HISTORY_TIME_GAPS)] if TIME_GAPS in sequences.columns else []
    return sequences.join(upcoming, on="user_id", how="inner").select(
        "user_id", pl.col("item_idx").cast(pl.List(pl.Int32)).alias(HISTORY), pl.col("_targets").alias(TARGETS), *gaps
    )


def set_metrics(scores: torch.Tensor, targets: list[list[int]], sizes: list[int]) -> np.ndarray:
    """(B, 2) float64 [NDCG@10, Recall@10] of each row's top 10 against its target set.

    Args:
        scores: (B, N + 1) float, seen items and padding at -inf.
        targets: B lists of item indices (the ones the model knows; others are misses).
        sizes: B target-set sizes |T| (the denominators, unknown targets included), each >= 1.
    """
    top = torch.topk(scores, K, dim=1).indices.numpy()  # (B, K)
    discount = 1.0 / np.log2(np.arange(2, K + 2))  # (K,)
    out = np.zeros((len(sizes), 2))
    for row, (wanted, size) in enumerate(zip(targets, sizes)):
        hits = np.isin(top[row], np.asarray(wanted, dtype=np.int64))  # (K,)
        out[row, 0] = float(discount[hits].sum() / discount[: min(size, K)].sum())
        out[row, 1] = hits.sum() / size
    return out


def model_values(loaded, prepared: Path, examples: pl.DataFrame, logprior: np.ndarray | None,
                 point: tuple[float, float | None] | None) -> dict[str, np.ndarray]:  # fmt: skip
    """{str(user_id): (2,) [NDCG@10, Recall@10]} of one model (of this step's catalog or an earlier one) on
    ``examples``, alone (``point`` None) or with ``beta * log(1 + c)`` added (``point`` = (beta, half-life),
    ``recsys_alibi.evaluation.popularity_prior``; beta inf: the counts first, the model breaks ties).

    Args:
        logprior: (len(HALF_LIVES), N + 1) float64 ``log(1 + c)`` in the data's numbering (column 0 padding).
    """
    from recsys_alibi.evaluation.popularity_prior import HALF_LIVES, TIE_SCALE
    from replay_prior import in_model_view
    from replay_scoring import scored_batches

    sizes = dict(zip(examples["user_id"].to_list(), (len(t) for t in examples["targets"].to_list())))
    examples, logprior = in_model_view(loaded, prepared, examples, logprior)
    out = {str(u): np.zeros(2) for u in sizes}  # a user the model can serve nothing of: a miss
    for part, scores in scored_batches(loaded, examples):
        logits = scores.double()  # (B, N + 1)
        if point is not None:
            beta, half_life = point
            p = torch.from_numpy(logprior[HALF_LIVES.index(half_life)])[None, :]  # (1, N + 1)
            logits = p * TIE_SCALE + logits if math.isinf(beta) else logits + beta * p
        users = part["user_id"].to_list()
        values = set_metrics(logits, part["targets"].to_list(), [sizes[u] for u in users])
        out.update({str(u): v for u, v in zip(users, values)})
    return out


def _chosen(path: Path, arm: str, replay: Path, parser) -> dict:
    """{seed: {step: (beta, half-life)}} of a ``replay_prior.py`` output for ``arm`` of ``replay``."""
    try:
        doc = json.loads(path.read_text())
        if doc["arm"] != arm or Path(doc["replay"]).resolve() != replay.resolve():
            raise ValueError(f"it is for arm {doc['arm']} of {doc['replay']}")
        return {seed: {int(k): (math.inf if v["prior"]["beta"] == "inf" else float(v["prior"]["beta"]),
                                v["prior"]["half_life_days"]) for k, v in steps.items()}
                for seed, steps in doc["chosen"].items()}  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        parser.error(f"--prior {arm}={path}: not an output of replay_prior.py for arm {arm} of {replay} ({err})")


def comparisons(values: dict[str, dict], sizes: dict[str, int], arms: list[str], seeds: list[str], last: int) -> dict:
    """Means and the paired differences ``warm_minus_<arm>_<model|prior>`` (pooled and ``by_step``) of per-user
    values ``{"<arm>/<model|prior>": {"seed/step/user": (2,)}}`` with target-set sizes ``sizes``; printed too."""
    import replay as replay_script

    keys = sorted(values["warm/model"])  # one order however the values were gathered: the bootstrap resamples it
    out = {"arms": arms, "seeds": seeds, "steps": last, "metrics": list(METRICS), "test_users": len(keys),
           "targets_per_user": float(np.mean([sizes[key] for key in keys])),
           "means": {name: dict(zip(METRICS, np.mean([values[name][key] for key in keys], 0).tolist()))
                     for name in values}}  # fmt: skip
    for other in [a for a in arms if a != "warm"]:
        for mode in ("model", "prior"):
            def difference(chosen: list[str]) -> dict:
                return replay_script._difference([values[f"warm/{mode}"][key] for key in chosen],
                                                 [values[f"{other}/{mode}"][key] for key in chosen], METRICS,
                                                 users=[key.split("/")[2] for key in chosen])

            pooled = difference(keys)
            by_step = {str(k): difference([key for key in keys if key.split("/")[1] == str(k)]) for k in range(1, last + 1)}
            out[f"warm_minus_{other}_{mode}"] = {**pooled, "by_step": by_step}
            d = pooled["NDCG@10"]
            print(f"warm - {other} ({mode}): NDCG@10 {d['difference']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}] "
                  f"(resampling users [{d['ci95_by_user'][0]:+.4f}, {d['ci95_by_user'][1]:+.4f}]), "
                  f"Recall@10 {pooled['Recall@10']['difference']:+.4f} over {d['pairs']} pairs of {d['users']} users")  # fmt: skip
    return out


def pool(paths: list[Path], output: Path, parser, argv: list[str] | None = None) -> None:
    """Pool outputs of this script on disjoint seeds of one log (their ``.per_user.json``) into ``output``."""
    from recsys_alibi.atomic import write_json_atomic

    values: dict[str, dict] = {}
    sizes: dict[str, int] = {}
    docs = []
    for path in paths:
        try:
            doc, rows = json.loads(path.read_text()), json.loads(path.with_suffix(".per_user.json").read_text())
            doc["arms"], doc["seeds"], doc["steps"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            parser.error(f"--pool {path}: not an output of replay_horizon.py with its .per_user.json ({err})")
        if docs and (doc["arms"] != docs[0]["arms"] or doc["steps"] != docs[0]["steps"]):
            parser.error(f"--pool {path}: other arms or steps than {paths[0]}")
        if set(doc["seeds"]) & {s for d in docs for s in d["seeds"]}:
            parser.error(f"--pool {path}: a seed already pooled (pool outputs of disjoint seeds)")
        docs.append(doc)
        for key, row in rows.items():
            sizes[key] = int(row.pop("targets"))
            for name, v in row.items():
                values.setdefault(name, {})[key] = np.asarray(v)
    out = {"pooled": [str(p) for p in paths], "command": command_line("benchmarks/replay_horizon.py", argv), "machine": machine_line(),
           **comparisons(values, sizes, docs[0]["arms"], [s for d in docs for s in d["seeds"]], docs[0]["steps"])}
    write_json_atomic(output, out)
    print(f"wrote {output}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="replay_horizon.py", description=__doc__.splitlines()[0])
    parser.add_argument("replay", type=Path, nargs="?", help="a finished benchmarks/replay.py JSON")
    parser.add_argument("--prior", action="append", default=[], metavar="ARM=FILE",
                        help="replay_prior.py's output for a trained arm (warm first); repeat for others")
    parser.add_argument("--pool", type=Path, nargs="+", metavar="HORIZON_JSON",
                        help="instead: pool outputs of this script on disjoint seeds into --output")
    parser.add_argument("--store", help="MLflow tracking URI of the models (default: MLFLOW_TRACKING_URI, else the "
                        "replay's workdir store)")
    parser.add_argument("--output", type=Path, help="JSON path (default: REPLAY.horizon.json beside it, runs/REPLAY.horizon.json for a replay in docs/results/)")
    args = parser.parse_args(argv)
    if args.pool:
        if args.replay is not None or args.prior or args.output is None:
            parser.error("--pool takes the files to pool and --output, no replay and no --prior")
        return pool(args.pool, args.output, parser, argv)
    if args.replay is None or not args.prior:
        parser.error("give a replay JSON and --prior warm=FILE (or --pool)")

    import replay as replay_script
    from pipelines.cli import configure_logging
    from recsys_alibi.atomic import write_json_atomic
    from recsys_alibi.evaluation.popularity_prior import HALF_LIVES, recency_counts

    configure_logging()
    doc, r, runs, output = replay_script.read_for_output(args.replay, args.output, ".horizon.json", parser)
    chosen = {}
    for item in args.prior:
        arm, _, path = item.partition("=")
        if arm not in doc.get("arms", []) or arm == "stale" or not path:
            parser.error(f"--prior {item}: give ARM=FILE with a trained arm of {args.replay} ({doc.get('arms')})")
        chosen[arm] = _chosen(Path(path), arm, args.replay, parser)
    if "warm" not in chosen:
        parser.error("--prior warm=FILE is needed: the stale model is read under the warm chain's prior")
    os.environ["MLFLOW_TRACKING_URI"] = args.store or os.environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{Path(r.workdir).resolve() / 'mlflow.db'}"  # fmt: skip
    from recsys_alibi.tracking import ModelUriError, load_ranker

    config, events, bounds = replay_script.replayed_log(r, [o for o in r.overrides if o.startswith("data.")])
    seeds = [s for s in runs if runs[s].get("steps") and all(s in c for c in chosen.values())]
    last = min(max(st["step"] for st in runs[s]["steps"]) for s in seeds) if seeds else 0
    if not seeds or last < 1:
        parser.error(f"{args.replay}: no seed with a finished step and a chosen prior")
    arms = list(chosen)
    values: dict[str, dict] = {f"{a}/{m}": {} for a in [*arms, "stale"] for m in ("model", "prior")}
    sizes: dict[str, int] = {}  # "seed/step/user" -> |T|

    def uri_of(seed: str, arm: str, k: int) -> str:
        if k == 0:
            return runs[seed]["step0"]["uri"]
        return next(st for st in runs[seed]["steps"] if st["step"] == k)["arms"][arm]["uri"]

    def load(seed: str, arm: str, k: int):
        try:
            return load_ranker(uri_of(seed, arm, k))
        except (ModelUriError, KeyError) as err:
            parser.error(f"seed {seed} step {k} {arm}: its model is not in the tracking store ({err}); give --store")

    with tempfile.TemporaryDirectory(prefix="replay-horizon-") as tmp:
        previous: dict[str, object] = {}
        for k, prepared in replay_script.prepared_steps(config, events, bounds, last, Path(tmp)):
            logprior, examples = None, None
            for seed in seeds:
                models = {a: load(seed, a, k) for a in arms} if k else {}
                if k:
                    if examples is None:
                        examples = horizon_examples(prepared, events, bounds[k], bounds[k + 1], models["warm"].model)
                        logprior = np.log1p(recency_counts(prepared, bounds[k], HALF_LIVES))
                    for u, t in zip(examples["user_id"].to_list(), examples["targets"].to_list()):
                        sizes[f"{seed}/{k}/{u}"] = len(t)
                    for name, loaded in [*models.items(), ("stale", previous[seed])]:
                        point = chosen["warm" if name == "stale" else name][seed][k]
                        for mode, at in (("model", None), ("prior", point)):
                            for u, v in model_values(loaded, prepared, examples, logprior, at).items():
                                values[f"{name}/{mode}"][f"{seed}/{k}/{u}"] = v
                previous[seed] = models["warm"] if k else load(seed, "warm", 0)
            if k:
                print(f"step {k}: {examples.height} test users, {sum(map(len, examples['targets'].to_list()))} "
                      "targets", flush=True)  # fmt: skip

    out = {"replay": str(args.replay), "command": command_line("benchmarks/replay_horizon.py", argv), "machine": machine_line(),
           "priors": {a: str(p.partition("=")[2]) for a, p in zip(chosen, args.prior)},
           **comparisons(values, sizes, [*arms, "stale"], seeds, last)}  # fmt: skip
    keys = list(values["warm/model"])
    write_json_atomic(output.with_suffix(".per_user.json"),
                      {key: {"targets": sizes[key], **{name: list(map(float, values[name][key])) for name in values}}
                       for key in keys})  # fmt: skip
    write_json_atomic(output, out)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
