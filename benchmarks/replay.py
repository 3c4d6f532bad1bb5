"""Replay a retraining schedule on a timestamped log: retrain from scratch vs warm start, each step.

Run (from the repository root; a heavy job: one at a time, one torch thread):

    .venv/bin/python benchmarks/replay.py --config configs/movielens-100k.yaml \\
        --input ../shared/data/ml-100k/u.data --format movielens --start 0.5 --period-days 28 \\
        --output docs/results/replay-ml100k.json

The log is read with the project's readers (``data.*`` of the config) and cut at boundaries
``b_0 < b_1 < ...``: ``b_0`` is the ``--start`` quantile of the timestamps, then one boundary every
``--period-days``. Step 0 prepares the events before ``b_0`` and trains a model from scratch.
Step ``k >= 1`` appends the period ``[b_(k-1), b_k)`` to the prepared directory (``prepare
--append``: the directory of a full prepare of every event before ``b_k``), then trains

* **scratch**: the config's recipe from random weights, and
* **warm**: ``train.init_from`` the previous step's warm model (step 1: the step-0 model), with
  the config's ``train.warm`` schedule,

and evaluates both on the NEXT period ``[b_k, b_(k+1))``: every user with history before ``b_k``
(in the prepared directory) and an event in the next period is a test user; the target is that
user's first next-period event whose item is in the catalog of step ``k`` and not already in the
user's history; it is ranked on the full catalog with the history's items excluded. Per step it
records ``period_end`` (``b_k``, ISO date), ``new_events``, ``new_items``, ``new_users`` (vs step
``k - 1``), ``test_users``, ``scratch`` and ``warm`` (``NDCG@10``, ``HR@10``, ``train_seconds``)
and ``ci95``: the percentile-bootstrap 95 % interval of the per-user paired difference warm -
scratch in NDCG@10 (:func:`recsys_alibi.evaluation.paired.paired_difference`). The JSON also holds
the command, the machine and the mean difference over steps; ``--plot`` draws both curves.

Models are not registered; MLflow runs go to ``MLFLOW_TRACKING_URI`` or ``<workdir>/mlflow.db``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

DAY = 86_400


def read_log(config, input_path: str, fmt: str | None) -> pl.DataFrame:
    """The canonical events (``user_id``, ``item_id``, ``timestamp``) of a log, read as ``prepare`` reads it."""
    from recsys_alibi.data.ingest import canonical_events
    from recsys_alibi.data.readers import scan_source

    source = scan_source(config.data, input_path, fmt)
    return canonical_events(source, config.data).select("user_id", "item_id", "timestamp").collect()


def boundaries(timestamps: np.ndarray, start: float, period_days: float) -> list[int]:
    """``[b_0, b_1, ...]``: ``b_0`` the ``start`` quantile (seconds), then every ``period_days``;
    the last boundary is the first one past the last event (so every period but the last is whole).

    >>> boundaries(np.arange(0, 10 * DAY, DAY), 0.5, 2)
    [388800, 561600, 734400, 907200]
    """
    first = int(np.quantile(timestamps, start))
    step = int(period_days * DAY)
    last = int(timestamps.max())
    return [first + i * step for i in range((last - first) // step + 2)]


def next_period_examples(prepared: Path, events: pl.DataFrame, lo: int, hi: int, model) -> pl.DataFrame:
    """Test examples of the period ``[lo, hi)`` for a model trained on ``prepared`` (module doc).

    Returns:
        ``user_id``, ``history`` list<Int32>, ``targets`` list<Int32> (one item), and
        ``history_time_gaps`` when ``model`` reads time gaps.
    """
    from recsys_alibi.data.prepare import read_items, read_sequences
    from recsys_alibi.data.splits import HISTORY, HISTORY_TIME_GAPS, TARGETS
    from recsys_alibi.data.schema import TIME_GAPS
    from recsys_alibi.data.time_gaps import sequences_for

    sequences = sequences_for(model, read_sequences(prepared))
    items = read_items(prepared).select("item_idx", "item_id")
    upcoming = (
        events.filter((pl.col("timestamp") >= lo) & (pl.col("timestamp") < hi))
        .join(items, on="item_id", how="inner")  # items of this step's catalog
        .join(sequences.select("user_id", "item_idx").explode("item_idx").rename({"item_idx": "seen"}),
              left_on=["user_id", "item_idx"], right_on=["user_id", "seen"], how="anti")  # not already seen
        .sort("timestamp", "item_idx")
        .group_by("user_id", maintain_order=True)
        .first()
    )  # fmt: skip
    gaps = [pl.col(TIME_GAPS).cast(pl.List(pl.Int32)).alias(HISTORY_TIME_GAPS)] if TIME_GAPS in sequences.columns else []
    return sequences.join(upcoming.select("user_id", "item_idx"), on="user_id", how="inner").select(
        "user_id",
        pl.col("item_idx").cast(pl.List(pl.Int32)).alias(HISTORY),
        pl.concat_list(pl.col("item_idx_right").cast(pl.Int32)).alias(TARGETS),
        *gaps,
    )


def score_model(config, uri: str, prepared: Path, events: pl.DataFrame, lo: int, hi: int) -> dict:
    """NDCG@10, HR@10 and the per-user NDCG@10 (by ``user_id``) of a logged model on the period ``[lo, hi)``."""
    from recsys_alibi.data.prepare import read_items
    from recsys_alibi.evaluation.evaluator import evaluate
    from recsys_alibi.model.scorer import RankerScorer
    from recsys_alibi.tracking import load_ranker

    model = load_ranker(uri).model
    examples = next_period_examples(prepared, events, lo, hi, model)
    cfg = config.evaluate.model_copy(update={"context_lengths": [], "ks": [10]})
    result = evaluate(RankerScorer(model, name="replay"), examples, read_items(prepared).height, cfg,
                      protocol_name="next period")  # fmt: skip
    per_user = dict(zip(result.user_ids.tolist(), result.per_user["NDCG@10"].tolist()))
    return {"NDCG@10": result.metrics["NDCG@10"], "HR@10": result.metrics["HR@10"], "per_user": per_user}


def grow(config, period: Path, prepared: Path, first: bool) -> None:
    """Prepare the first period into ``prepared``, or append a later one to it (``prepare --append``)."""
    from recsys_alibi.data.append import append
    from recsys_alibi.data.prepare import prepare

    data = config.data.model_copy(update={"format": "parquet"})
    (prepare if first else append)(data, period, prepared)


def counts(prepared: Path) -> tuple[int, set, set]:
    """(events, user ids, item ids) of a prepared directory."""
    from recsys_alibi.data.prepare import read_items, read_sequences

    sequences = read_sequences(prepared)
    return int(sequences["length"].sum()), set(sequences["user_id"].to_list()), set(read_items(prepared)["item_id"].to_list())


def train(config, prepared: Path, output: Path, init_from: str | None = None) -> tuple[str, float]:
    """Train (no registry) and return the model URI and training seconds."""
    from pipelines.train import run_train
    from recsys_alibi.config import with_overrides

    warm = {"init_from": init_from} if init_from else {"init_from": None, "warm": {}}  # scratch: no warm schedule
    config = with_overrides(config, output=str(output), train=warm)
    trained = run_train(config, prepared, progress=False, register=False)
    return trained.model.uri, trained.train_seconds


def replay(config, events: pl.DataFrame, bounds: list[int], workdir: Path, steps: int | None = None,
           report=None) -> tuple[list[dict], dict]:
    """Every step of the replay (module doc); ``steps`` caps the number of evaluated steps; ``report(steps,
    pooled)`` is called after each step (the JSON is written step by step: a stopped replay keeps its steps).

    Returns:
        the steps, and the pooled paired difference warm - scratch in NDCG@10 over every (step, test user)
        pair: ``{"difference", "ci95", "pairs"}`` (a step has ~50-100 test users on ML-100K: one step's
        interval is wide; the pooled one answers "does warm starting cost quality over the schedule").
    """
    from recsys_alibi.evaluation.paired import paired_difference

    periods_dir = workdir / "periods"
    periods_dir.mkdir(parents=True, exist_ok=True)
    edges = [int(events["timestamp"].min()), *bounds]
    files = []
    for k in range(len(bounds)):
        path = periods_dir / f"period-{k:03d}.parquet"
        events.filter((pl.col("timestamp") >= edges[k]) & (pl.col("timestamp") < edges[k + 1])).write_parquet(path)
        files.append(path)
    prepared = workdir / "prepared"
    grow(config, files[0], prepared, first=True)
    before = counts(prepared)
    warm_uri, _ = train(config, prepared, workdir / "step-000")
    last = len(bounds) - 2 if steps is None else min(len(bounds) - 2, steps)
    out = []
    pooled_warm: list[float] = []
    pooled_scratch: list[float] = []
    for k in range(1, last + 1):
        grow(config, files[k], prepared, first=False)
        now = counts(prepared)
        scratch_uri, scratch_s = train(config, prepared, workdir / f"step-{k:03d}-scratch")
        warm_uri, warm_s = train(config, prepared, workdir / f"step-{k:03d}-warm", init_from=warm_uri)
        lo, hi = bounds[k], bounds[k + 1]
        scratch = score_model(config, scratch_uri, prepared, events, lo, hi)
        warm = score_model(config, warm_uri, prepared, events, lo, hi)
        users = sorted(scratch["per_user"])
        warm_values, scratch_values = [warm["per_user"][u] for u in users], [scratch["per_user"][u] for u in users]
        diff = paired_difference(np.array(warm_values), np.array(scratch_values))
        pooled_warm += warm_values
        pooled_scratch += scratch_values
        step = {
            "step": k,
            "period_end": dt.datetime.fromtimestamp(lo, dt.timezone.utc).date().isoformat(),
            "new_events": now[0] - before[0],
            "new_items": len(now[2] - before[2]),
            "new_users": len(now[1] - before[1]),
            "test_users": len(users),
            "scratch": {"NDCG@10": scratch["NDCG@10"], "HR@10": scratch["HR@10"], "train_seconds": round(scratch_s, 1)},
            "warm": {"NDCG@10": warm["NDCG@10"], "HR@10": warm["HR@10"], "train_seconds": round(warm_s, 1)},
            "difference": diff.difference,
            "ci95": list(diff.ci95),
        }
        print(f"step {k} (to {step['period_end']}): {len(users)} test users; NDCG@10 scratch {scratch['NDCG@10']:.4f} "
              f"({scratch_s:.0f} s), warm {warm['NDCG@10']:.4f} ({warm_s:.0f} s), difference {diff.difference:+.4f} "
              f"[{diff.ci95[0]:+.4f}, {diff.ci95[1]:+.4f}]", flush=True)  # fmt: skip
        out.append(step)
        before = now
        if report is not None:
            report(out, _pooled(pooled_warm, pooled_scratch))
    return out, _pooled(pooled_warm, pooled_scratch)


def _pooled(warm: list[float], scratch: list[float]) -> dict | None:
    """The paired difference warm - scratch over every (step, test user) pair so far."""
    from recsys_alibi.evaluation.paired import paired_difference

    if not warm:
        return None
    diff = paired_difference(np.array(warm), np.array(scratch))
    return {"difference": diff.difference, "ci95": list(diff.ci95), "pairs": len(warm)}


def plot(steps: list[dict], path: Path, title: str) -> None:
    """NDCG@10 on the next period per step, scratch and warm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from recsys_alibi.atomic import atomic_path

    fig, ax = plt.subplots(figsize=(7, 4))
    x = [s["period_end"] for s in steps]
    for name, style in (("scratch", "o-"), ("warm", "s--")):
        ax.plot(x, [s[name]["NDCG@10"] for s in steps], style, label=name)
    ax.set_xlabel("model trained on events before")
    ax.set_ylabel("NDCG@10 on the next period")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.autofmt_xdate()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--input", help="the log (default: data.input of the config)")
    parser.add_argument("--format", help="default: data.format of the config")
    parser.add_argument("--start", type=float, default=0.5, help="quantile of the timestamps where step 0 ends")
    parser.add_argument("--period-days", type=float, default=28.0)
    parser.add_argument("--steps", type=int, help="evaluate at most this many steps")
    parser.add_argument("--workdir", type=Path, default=Path("runs/replay"))
    parser.add_argument("--output", type=Path, required=True, help="JSON path")
    parser.add_argument("--plot", type=Path, help="PNG path (default: the JSON path with .png)")
    args = parser.parse_args(argv)

    from pipelines.cli import configure_logging
    from recsys_alibi.atomic import write_json_atomic
    from recsys_alibi.config import load_config
    from recsys_alibi.tracking import setup_tracking

    configure_logging()
    args.workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{args.workdir.resolve() / 'mlflow.db'}")
    # train.init_from is set per run (the previous warm model, or none for scratch); given here so that the
    # config's train.warm schedule is accepted (it takes effect only with train.init_from)
    config = load_config(args.config, [*args.overrides, "train.init_from=champion"])
    setup_tracking(config.tracking)
    events = read_log(config, args.input or config.data.input, args.format)
    bounds = boundaries(events["timestamp"].to_numpy(), args.start, args.period_days)
    started = time.perf_counter()

    def write(steps: list[dict], pooled: dict | None) -> None:
        diffs = [s["difference"] for s in steps]
        scratch_s = sum(s["scratch"]["train_seconds"] for s in steps)
        warm_s = sum(s["warm"]["train_seconds"] for s in steps)
        result = {
            "command": shlex.join(["python", "benchmarks/replay.py", *(argv if argv is not None else sys.argv[1:])]),
            "config": args.config,
            "start_quantile": args.start,
            "period_days": args.period_days,
            "protocol": "next period: each test user's first next-period event with a catalog item not in the "
                        "history, full catalog, seen items excluded",
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "seconds": round(time.perf_counter() - started, 1),
            "steps_planned": len(bounds) - 2 if args.steps is None else min(len(bounds) - 2, args.steps),
            "mean_difference_NDCG@10": float(np.mean(diffs)) if diffs else None,
            "pooled_difference_NDCG@10": pooled,
            "warm_over_scratch_train_time": warm_s / scratch_s if scratch_s else None,
            "steps": steps,
        }
        write_json_atomic(args.output, result)
        plot(steps, args.plot or args.output.with_suffix(".png"), f"{Path(args.config).stem}: next-period NDCG@10")

    steps, pooled = replay(config, events, bounds, args.workdir, args.steps, report=write)
    write(steps, pooled)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
