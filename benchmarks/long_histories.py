"""Long histories that pay? The same recipe trained at several ``model.max_len``, compared user by user.

Run (from the repository root, after ``make install``; ~45 min on ML-1M with an equal 35-minute
budget per run, the three side by side; docs/results.md "Long histories on real data"):

    .venv/bin/python benchmarks/long_histories.py --config configs/movielens-1m.yaml \\
        --prepared runs/movielens-1m/prepared --max-lens 200 1000 whole \\
        --set train.packing=false --set train.batch_tokens=32768 --set train.max_minutes=35 \\
        --set evaluate.batch_size=32 --jobs 3 --json docs/results/long-histories.json

For each max_len (``whole`` = the longest history of the prepared data) it trains the config with
``model.max_len`` set (everything else the same: the same budget ``train.max_epochs`` /
``train.max_minutes``), evaluates the test protocol on the whole history (leave-one-out,
full-catalog ranking, seen items excluded) and records, per run:

* ``max_len``, ``NDCG@10``, ``HR@10``, ``train_seconds``, ``epochs``, ``val_curve`` (validation
  NDCG@10 after each epoch: the runs compared at equal epochs as well as at equal budget);
* ``slices``: ``">=200"``, ``">=500"`` (users with at least that many events): ``NDCG@10``,
  ``HR@10``, ``n_users``;
* ``ci95``: the per-user paired difference to the first max_len (200 in the command above) with
  its percentile-bootstrap 95 % interval (``recsys_alibi.evaluation.paired``), overall and per
  slice, for NDCG@10 and HR@10: ``{"all": {"NDCG@10": {"difference": .., "ci95": [lo, hi]}, ...}}``.

``--set`` overrides are applied to every run (e.g. ``model.time_gap_buckets=32`` for "with time
gaps"). ``--tiny`` shrinks the run to a dry run of a minute (1 epoch, 20 batches) that checks the
script end to end, not a result. Each finished run is written to the JSON at once; runs already
there (same max_len and label) are skipped, so a killed benchmark resumes.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
from concurrent.futures import as_completed
from pathlib import Path

SLICES = (200, 500)
METRICS = ("NDCG@10", "HR@10")
TINY = ["train.max_epochs=1", "train.limit_train_batches=20", "train.val_users=64"]


def _whole(prepared: Path) -> int:
    from recsys_alibi.data.prepare import read_sequences

    return int(read_sequences(prepared).get_column("length").max())


def run_config(config_path: str, overrides: list[str], max_len: int):
    """The resolved ``JobConfig`` of the run at ``max_len`` (read in the benchmark's process, once:
    a config edited while the benchmark runs changes nothing in it)."""
    from recsys_alibi.config import load_config

    return load_config(config_path, [*overrides, f"model.max_len={max_len}", f"evaluate.min_history={list(SLICES)}"])


def run_one(config, prepared: Path, max_len: int, label: str) -> tuple[dict, dict]:
    """Train ``config`` (from :func:`run_config`) at ``max_len`` and evaluate on the test protocol;
    returns (record, per-user arrays)."""
    from pipelines.evaluate import run_evaluate
    from pipelines.train import run_train

    # one output folder per run: runs side by side never share checkpoints or reports
    run_dir = "-".join(filter(None, [label.replace(" ", "_"), f"max_len{max_len}"]))
    config = config.model_copy(update={"output": str(Path(config.output) / "long-histories" / run_dir)})
    trained = run_train(config, prepared, progress=False, register=False)
    job = run_evaluate(config, prepared, model_uri=trained.model.uri,
                       output_dir=Path(config.output) / "report")  # fmt: skip
    r = job.result
    slices = {key: {m: r.by_min_history[key][m] for m in METRICS} for key in r.by_min_history}
    for key in slices:
        slices[key]["n_users"] = int((r.history_lengths >= int(key[2:])).sum())
    record = {
        "max_len": max_len, "run_id": trained.run_id, "epochs": trained.epochs,
        "train_seconds": round(trained.train_seconds, 1), "n_users": r.n_users,
        **{m: r.metrics[m] for m in METRICS}, "slices": slices, "val_curve": val_curve(trained.run_id),
    }  # fmt: skip
    arrays = {"user_ids": r.user_ids.tolist(), "lengths": r.history_lengths.tolist(),
              **{m: r.per_user[m].tolist() for m in METRICS}}  # fmt: skip
    return record, arrays


def val_curve(run_id: str) -> list[float]:
    """Validation NDCG@10 after each epoch of a tracked run (to compare runs at equal epochs)."""
    import mlflow

    from recsys_alibi.tracking import metric_key

    history = mlflow.MlflowClient().get_metric_history(run_id, metric_key("val/ndcg_at_10"))
    return [float(m.value) for m in sorted(history, key=lambda m: m.step)]


def paired_to_reference(arrays: dict, reference: dict) -> dict:
    """slice -> metric -> paired difference (this run - reference) with its 95 % interval."""
    import numpy as np

    from recsys_alibi.evaluation.paired import paired_difference

    if arrays["user_ids"] != reference["user_ids"]:
        raise ValueError("runs evaluated different users: compare them on the same prepared data")
    lengths = np.asarray(arrays["lengths"])
    rows = {"all": np.arange(lengths.size), **{f">={s}": np.flatnonzero(lengths >= s) for s in SLICES}}
    out: dict = {}
    for label, idx in rows.items():
        if idx.size == 0:
            continue
        out[label] = {}
        for m in METRICS:
            d = paired_difference(np.asarray(arrays[m])[idx], np.asarray(reference[m])[idx])
            out[label][m] = {"difference": d.difference, "ci95": list(d.ci95), "n_users": d.n_users}
    return out


def markdown(records: list[dict]) -> str:
    """One row per run: overall and per slice, with the CI of the difference to the first run."""
    head = "| label | max_len | NDCG@10 | HR@10 | " + " | ".join(f"NDCG@10 {s} / HR@10 {s}" for s in (f">={x}" for x in SLICES))
    head += " | NDCG@10 diff [95 % CI] | train s |"
    lines = [head, "|" + "---|" * (6 + len(SLICES))]
    for r in records:
        cells = [r.get("label", ""), str(r["max_len"]), f"{r['NDCG@10']:.4f}", f"{r['HR@10']:.4f}"]
        for s in SLICES:
            sl = r["slices"].get(f">={s}")
            cells.append("—" if sl is None else f"{sl['NDCG@10']:.4f} / {sl['HR@10']:.4f} (n={sl['n_users']})")
        ci = r.get("ci95", {}).get("all", {}).get("NDCG@10")
        cells.append("reference" if ci is None else f"{ci['difference']:+.4f} [{ci['ci95'][0]:+.4f}, {ci['ci95'][1]:+.4f}]")
        cells.append(f"{r['train_seconds']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Train and compare every ``--max-lens`` run; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--prepared", type=Path, required=True)
    parser.add_argument("--max-lens", nargs="+", default=["200", "1000", "whole"], help="ints or 'whole'; the first is the reference")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="dotted.key=value for every run")
    parser.add_argument("--label", default="", help="names this series in the JSON (e.g. 'with time gaps')")
    parser.add_argument("--json", type=Path, default=Path("docs/results/long-histories.json"))
    parser.add_argument("--tiny", action="store_true", help="a dry run of a minute: checks the script, measures nothing")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each with cores / jobs torch threads")
    args = parser.parse_args(argv)
    overrides = [*args.overrides, *(TINY if args.tiny else [])]
    whole = _whole(args.prepared)
    max_lens = [whole if x == "whole" else int(x) for x in args.max_lens]
    doc = json.loads(args.json.read_text()) if args.json.exists() else {"runs": []}
    doc["command"] = shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv])
    doc["machine"] = f"{platform.machine()}, {platform.system()}, python {platform.python_version()}"
    arrays_path = args.json.with_suffix(".per_user.json")
    per_user = json.loads(arrays_path.read_text()) if arrays_path.exists() else {}
    reference_key = f"{args.label}|{max_lens[0]}"
    done = {f"{r.get('label', '')}|{r['max_len']}" for r in doc["runs"]}
    todo = [m for m in max_lens if f"{args.label}|{m}" not in done]
    from recsys_alibi.config import load_config
    from recsys_alibi.tracking import setup_tracking
    from worker_pool import training_pool  # benchmarks/worker_pool.py (this script's folder is on sys.path)

    # create the tracking store and experiment once: parallel workers migrating a new SQLite store race
    setup_tracking(load_config(args.config, overrides).tracking)
    with training_pool(args.jobs) as (pool, threads):
        configs = {m: run_config(args.config, overrides, m) for m in todo}
        futures = {pool.submit(run_one, configs[m], args.prepared, m, args.label): m for m in todo}
        for future in as_completed(futures):  # each finished run is saved at once: a killed benchmark resumes
            record, arrays = future.result()
            record["label"] = args.label
            record["whole"] = record["max_len"] == whole
            record["torch_threads"] = threads
            per_user[f"{args.label}|{record['max_len']}"] = arrays
            doc["runs"].append(record)
            _save(args.json, doc, arrays_path, per_user)
    for record in doc["runs"]:  # the paired CIs, once the reference run of the series is there
        key = f"{record.get('label', '')}|{record['max_len']}"
        if record.get("label", "") == args.label and key != reference_key and reference_key in per_user:
            record["ci95"] = paired_to_reference(per_user[key], per_user[reference_key])
    _save(args.json, doc, arrays_path, per_user)
    print(markdown(doc["runs"]))
    return 0


def _save(json_path: Path, doc: dict, arrays_path: Path, per_user: dict) -> None:
    from recsys_alibi.atomic import write_json_atomic

    write_json_atomic(json_path, doc)
    write_json_atomic(arrays_path, per_user)


if __name__ == "__main__":
    raise SystemExit(main())
