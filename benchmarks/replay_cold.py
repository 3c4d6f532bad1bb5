"""Items added after training, ranked from their features: the cold-item figure of a finished replay.

Run from the repository root, after ``benchmarks/replay.py`` with a feature arm (``warm_features``,
``scratch_features``) while its ``<workdir>`` (the MLflow store of its models) is still there; scoring
only, minutes:

    .venv/bin/python benchmarks/replay_cold.py docs/results/replay-features-ml1m.json

The replay's own targets are items of step ``k``'s catalog (``replay.next_period_examples``). Here, for
each seed and step ``k``, the **cold targets** are the items whose first event in the log falls in
the next period ``[b_k, b_(k+1))``, added after every model of the step was trained: each user with
history before ``b_k`` and a next-period event on such an item is a cold test user, and the first such
event is the target. Each feature arm ranks its catalog plus those items, encoded from the item table
(``data.items``) by its trained feature encoder (``serving.new_items``, what ``score --items`` does the
day they are added), seen items excluded. The candidate set holds the period's new items, not which one
the user chose. An id-only model cannot rank an item it never saw: its cold targets are misses (HR@10 0
by construction, written as such, not measured).

The cost to the known items: each feature arm also ranks the replay's own test examples with the
period's new items among the candidates (``with_new_items``), compared per user with its id-only twin's
figures in the replay (``warm_features`` with ``warm``, ``scratch_features`` with ``scratch``). Each figure
is also given with one place of the top 10 held for the best new item (``score.new_item_slots=1``,
``serving.topk.reserve_new_items``; keys ending ``_slot``), and over both kinds of target together
(``all_targets``: the twin misses every cold one).

Writes ``<replay>.cold.json`` (``--output``; ``runs/<replay>.cold.json`` for a replay under docs/results/), with the
command, the machine and the protocol (the paragraph above that starts "The replay's own targets"): per seed and step, ``new_items`` of the next period,
``cold_test_users`` and per feature arm ``cold`` {n, HR@10, NDCG@10}, ``cold_median_rank_fraction`` (the
median cold target's rank over the number of candidates: 0.5 is a random order), ``with_new_items``
{NDCG@10, HR@10} and ``top10_share_new`` (share of top-10 slots on the replay's examples held by the new items); pooled
over (seed, step, user) with percentile-bootstrap 95 % intervals: ``cold_<arm>`` (the arm's figures on
the cold targets against the twin's 0) and ``<arm>_with_new_items_minus_<twin>``; and ``cold_among_new_items``
per arm: the cold targets ranked among the period's new items alone (HR@1, HR@5 beside a random order's) and
the median rank the best-scored new item takes over the unseen catalog (``replay_scoring.new_item_ranks``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import polars as pl

TWINS = {"warm_features": "warm", "scratch_features": "scratch"}  # feature arm -> its id-only twin
SLOTS = 1  # score.new_item_slots measured beside the plain ranking (the "_slot" figures)
# the JSON's "protocol": the module doc's paragraph on the cold targets (not its usage line)
PROTOCOL = next(p for p in __doc__.split("\n\n") if p.startswith("The replay's own targets")).replace("\n", " ")


def cold_examples(prepared: Path, events: pl.DataFrame, lo: int, hi: int, fresh: set, model) -> pl.DataFrame:
    """Cold test examples of the period ``[lo, hi)`` (module doc).

    Args:
        prepared: the step's prepared directory (histories in its numbering).
        events: the canonical log (``user_id``, ``item_id``, ``timestamp`` in seconds).
        fresh: raw ids of the items whose first event falls in ``[lo, hi)``.
        model: the ranker (its time-gap buckets, if it reads any).

    Returns:
        ``user_id``, ``history`` list<Int32> (prepared numbering), ``target_id`` (raw id of the first
        next-period event on a fresh item) and, for a time-gap model, ``history_time_gaps``.
    """
    from recsys_alibi.data.prepare import read_sequences
    from recsys_alibi.data.schema import TIME_GAPS
    from recsys_alibi.data.splits import HISTORY, HISTORY_TIME_GAPS
    from recsys_alibi.data.time_gaps import sequences_for

    sequences = sequences_for(model, read_sequences(prepared))
    upcoming = (
        events.filter((pl.col("timestamp") >= lo) & (pl.col("timestamp") < hi) & pl.col("item_id").is_in(list(fresh)))
        .sort("timestamp", "item_id")
        .group_by("user_id", maintain_order=True)
        .first()
    )  # fmt: skip
    gaps = [pl.col(TIME_GAPS).cast(pl.List(pl.Int32)).alias(HISTORY_TIME_GAPS)] if TIME_GAPS in sequences.columns else []
    return sequences.join(upcoming.select("user_id", pl.col("item_id").alias("target_id")), on="user_id").select(
        "user_id", pl.col("item_idx").cast(pl.List(pl.Int32)).alias(HISTORY), "target_id", *gaps
    )


def with_targets(examples: pl.DataFrame, n_items: int, extra) -> pl.DataFrame:
    """``examples`` with ``targets`` [N + 1 + j] for a ``target_id`` that is ``extra.ids[j]`` (the index
    :func:`replay_scoring.rank_examples` gives it; [0], a miss, for an item without a table row),
    ``target_id`` dropped."""
    from recsys_alibi.data.splits import TARGETS

    index = pl.DataFrame({"target_id": extra.ids, "_idx": pl.int_range(n_items + 1, n_items + 1 + extra.count, eager=True)})
    out = examples.join(index.cast({"target_id": examples.schema["target_id"]}), on="target_id", how="left", maintain_order="left")
    # a fresh item without a row in the table: column 0 (padding, masked), a miss for every model
    return out.with_columns(pl.concat_list(pl.col("_idx").fill_null(0).cast(pl.Int32)).alias(TARGETS)).drop("target_id", "_idx")


def arm_figures(loaded, prepared: Path, events: pl.DataFrame, lo: int, hi: int, fresh: set, table: str) -> dict:
    """One feature arm at one step: per-user [NDCG@10, HR@10] on the cold targets and on the replay's
    examples with the new items among the candidates, and the new items' share of top-10 slots there."""
    from replay import next_period_examples
    from replay_scoring import new_item_ranks, rank_examples
    from recsys_alibi.evaluation.metrics import per_user_metrics
    from serving.inputs import vocabulary_remap
    from recsys_alibi.data.sequences import read_items
    from serving.new_items import NewItems, new_items

    remap, _ = vocabulary_remap(read_items(prepared), loaded.items)
    if remap is not None:
        raise SystemExit("a feature arm's vocabulary is not its step's catalog: not a replay of benchmarks/replay.py")
    found = new_items(loaded.model, loaded.items, table)
    keep = found.ids.is_in(list(fresh)).to_numpy()
    extra = NewItems(found.ids.filter(keep), found.vectors[np.flatnonzero(keep)], found.source)  # the period's items
    n_items = loaded.items.height

    def values(examples: pl.DataFrame, slots: int = 0) -> tuple[dict, list, np.ndarray]:
        if not examples.height:
            return {}, [], np.zeros(0)
        ranks, tops = rank_examples(loaded, examples, extra, slots=slots)
        m = per_user_metrics(ranks, [10])
        per_user = {str(u): [float(n), float(h)] for u, n, h in zip(examples["user_id"], m["NDCG@10"], m["HR@10"])}
        return per_user, tops, ranks

    cold_targets = with_targets(cold_examples(prepared, events, lo, hi, fresh, loaded.model), n_items, extra)
    cold, _, ranks = values(cold_targets)
    within, best = new_item_ranks(loaded, cold_targets, extra) if cold_targets.height else (np.zeros(0), np.zeros(0))
    known_examples = next_period_examples(prepared, events, lo, hi, loaded.model)
    known, tops, _ = values(known_examples)
    slot = {"cold": values(cold_targets, SLOTS)[0], "with_new_items": values(known_examples, SLOTS)[0]}
    slots = [i for top in tops for i in top]
    share = sum(i in fresh for i in slots) / len(slots) if slots else None
    # where the cold targets land: rank / candidates (0.5 for a random order; 1 - 1/C best ... 1/C)
    percentiles = np.minimum(ranks / (n_items + extra.count), 1.0).tolist()
    return {"cold": cold, "with_new_items": known, "slot": slot, "top10_share_new": share, "ranked_new_items": extra.count,
            "cold_rank_fraction": percentiles, "among_new": [int(w) for w in within if w > 0],
            "best_new_rank": [int(b) for b in best if b > 0]}  # fmt: skip


def among_new_summary(among: list[int], best: list[int], counts: list[int]) -> dict:
    """The cold targets among the period's new items alone: HR@1 / HR@5 there beside a random order's (the mean of
    1/M and min(5, M)/M over the targets' periods), and the median rank the best-scored new item takes among the
    catalog items a user has not seen (how far new items as a group stand from a top 10)."""
    w, m, b = np.asarray(among), np.asarray(counts, dtype=np.float64), np.asarray(best)
    if not len(w):
        return {"n": 0}
    return {"n": len(w), "HR@1": float(np.mean(w <= 1)), "HR@5": float(np.mean(w <= 5)),
            "random_HR@1": float(np.mean(1 / m)), "random_HR@5": float(np.mean(np.minimum(5, m) / m)),
            "median_rank": float(np.median(w)), "best_new_item_median_rank": float(np.median(b)),
            "best_new_item_in_top10": float(np.mean(b <= 10))}  # fmt: skip


def _summary(per_user: dict) -> dict:
    rows = np.array(list(per_user.values())) if per_user else np.zeros((0, 2))
    return {"n": len(rows), "NDCG@10": float(rows[:, 0].mean()) if len(rows) else None,
            "HR@10": float(rows[:, 1].mean()) if len(rows) else None}  # fmt: skip


def pooled(steps: list[dict], replay_steps: dict) -> dict:
    """Per feature arm, over (seed, step, user), paired (bootstrap 95 %: ``replay._difference``), for its plain
    ranking and with ``SLOTS`` place(s) held for the new items (``_slot``): the cold figures against the twin's
    misses; the with-new-items figures against the twin's replay figures; and both kinds of example together
    (``all_targets``: each user's known and cold targets, the twin missing every cold one)."""
    from replay import _difference

    out: dict = {}
    arms = sorted({a for s in steps for a in s["arms"]})
    views = (("", lambda d: d), ("_slot", lambda d: d["slot"]))  # the plain ranking, one place held
    for arm, (suffix, pick) in ((a, v) for a in arms for v in views):
        twin = TWINS[arm]
        cold = [v for s in steps for v in pick(s["per_user"][arm])["cold"].values()]
        out[f"cold_{arm}{suffix}"] = {**_summary(dict(enumerate(cold))), "minus_id_only": _difference(cold, [[0.0, 0.0]] * len(cold))
                                      if cold else None}  # fmt: skip
        a, b = [], []
        for s in steps:
            twin_users = replay_steps[(s["seed"], s["step"])][twin]
            for u, v in pick(s["per_user"][arm])["with_new_items"].items():
                a.append(v)
                b.append(twin_users[u])
        out[f"{arm}{suffix}_with_new_items_minus_{twin}"] = _difference(a, b) if a else None
        out[f"{arm}{suffix}_all_targets_minus_{twin}"] = _difference(a + cold, b + [[0.0, 0.0]] * len(cold)) if a else None
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="replay_cold.py", description=__doc__.splitlines()[0])
    parser.add_argument("replay", type=Path, help="a finished replay's JSON (its .per_user.json beside it)")
    parser.add_argument("--output", type=Path, help="default: <replay>.cold.json, runs/<replay>.cold.json for a replay in docs/results/")
    args = parser.parse_args(argv)

    import os

    import replay as replay_script
    from pipelines.cli import configure_logging
    from recsys_alibi.atomic import write_json_atomic
    from recsys_alibi.diagnostics.machine import command_line, machine_line
    from recsys_alibi.tracking import ModelUriError, load_ranker, setup_tracking
    from replay_scoring import entry_steps

    configure_logging()  # the project's lines; third-party notices silenced
    doc, r, runs = replay_script.read_replay(args.replay, parser)
    features = [a for a in r.arms if a in TWINS and TWINS[a] in r.arms]
    if not features:
        parser.error(f"{args.replay}: no feature arm with its id-only twin in --arms {r.arms}")
    gone = [s for s, run in runs.items() if run.get("steps")
            and not any((r.workdir / f"seed-{s}" / "periods").glob("period-*.parquet"))]  # fmt: skip
    if gone or ("MLFLOW_TRACKING_URI" not in os.environ and not (r.workdir / "mlflow.db").is_file()):
        parser.error(f"{r.workdir} does not hold the replay's periods and models (seed {gone[0] if gone else '-'}): "
                     "its workdir is gone; run benchmarks/replay.py again with its command")  # fmt: skip
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{r.workdir.resolve() / 'mlflow.db'}")
    config, events, bounds = replay_script.replayed_log(r, r.overrides)
    setup_tracking(config.tracking)
    entry = entry_steps(events, bounds)
    steps, replay_steps, fractions, among = [], {}, {}, {}
    for seed, run in runs.items():
        workdir = r.workdir / f"seed-{seed}"
        files = sorted((workdir / "periods").glob("period-*.parquet"))
        prepared = workdir / "prepared-cold"  # not the replay's own folder: a running replay may hold it
        for record in run.get("steps", []):
            k = record["step"]
            replay_script.rebuild(config, files, prepared, k)
            fresh = {i for i, e in entry.items() if e == k + 1}
            replay_steps[(seed, k)] = record["per_user"]
            step = {"seed": seed, "step": k, "new_items": len(fresh), "arms": {}, "per_user": {}}
            for arm in features:
                try:
                    loaded = load_ranker(record["arms"][arm]["uri"])
                except ModelUriError as err:
                    raise SystemExit(f"replay_cold.py: seed {seed} step {k} {arm}: {err}") from None
                got = arm_figures(loaded, prepared, events, bounds[k], bounds[k + 1], fresh, config.data.items)
                step["per_user"][arm] = {"cold": got["cold"], "with_new_items": got["with_new_items"], "slot": got["slot"]}
                fractions.setdefault(arm, []).extend(got["cold_rank_fraction"])
                for key, value in (("among", got["among_new"]), ("best", got["best_new_rank"]),
                                   ("counts", [got["ranked_new_items"]] * len(got["among_new"]))):  # fmt: skip
                    among.setdefault(arm, {}).setdefault(key, []).extend(value)
                step["arms"][arm] = {"cold": _summary(got["cold"]), "with_new_items": _summary(got["with_new_items"]),
                                     "cold_median_rank_fraction": float(np.median(got["cold_rank_fraction"]))
                                     if got["cold_rank_fraction"] else None,
                                     "top10_share_new": got["top10_share_new"], "ranked_new_items": got["ranked_new_items"]}  # fmt: skip
            step["cold_test_users"] = step["arms"][features[0]]["cold"]["n"]
            steps.append(step)
            print(f"seed {seed} step {k}: {len(fresh)} new items next period, {step['cold_test_users']} cold targets; "
                  + ", ".join(f"{a} cold HR@10 {step['arms'][a]['cold']['HR@10'] or 0:.3f}" for a in features), flush=True)  # fmt: skip
    out = {"replay": str(args.replay), "command": command_line("benchmarks/replay_cold.py", argv), "machine": machine_line(),
           "protocol": PROTOCOL, "twins": {a: TWINS[a] for a in features},
           **pooled(steps, replay_steps),
           "cold_median_rank_fraction": {a: float(np.median(f)) if f else None for a, f in fractions.items()},
           "cold_among_new_items": {a: among_new_summary(v["among"], v["best"], v["counts"]) for a, v in among.items()},
           "steps": [{k: v for k, v in s.items() if k != "per_user"} for s in steps]}  # fmt: skip
    path = args.output or replay_script.default_output(args.replay, ".cold.json")
    write_json_atomic(path, out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
