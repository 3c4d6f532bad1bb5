"""Long histories that pay? One recipe at several max_len or short-to-long schedules, compared user by user.

Run (from the repository root, after ``make install``). The converged comparison of issue 43
(the recipe's 30 epochs, whose cosine schedule decays the learning rate to 0 at the last one, and
its early stopping on validation NDCG@10, patience 20; no clock cut; two seeds, one thread per
run; it takes longer than a session: start it in the background, and start it again with the same
command after a stop: every unfinished run continues from its last epoch checkpoint):

    .venv/bin/python benchmarks/long_histories.py --config configs/movielens-1m.yaml \\
        --prepared runs/movielens-1m/prepared --max-lens 200 1000 whole \\
        --schedules "[[0, 200], [25, whole]]" "[[0, 200], [25, 1000]]" --seeds 42 43 --threads 1 --jobs 1 \\
        --set train.packing=false --set train.batch_tokens=32768 --set train.max_minutes=null \\
        --set evaluate.batch_size=32 --json runs/long-histories/long-histories-converged.json

The equal-budget race measured before (35 minutes per run, three side by side) is the same
command with ``--max-lens 200 1000 whole --set train.max_minutes=35 --jobs 3`` and one seed.

Each entry is trained at every ``--seeds`` seed (default: the config's ``seed``): a fixed
``--max-lens`` value (``whole`` = the longest history of the prepared data) sets
``model.max_len``; a ``--schedules`` value (YAML ``[[epoch, window], ...]``, ``whole`` allowed)
sets ``train.context_schedule`` (recsys_alibi.training.context_schedule: the model's max_len is
its last window). Everything else is the same (the budget ``train.max_epochs`` /
``train.max_minutes``). Each run is evaluated on the test protocol on the whole history
(leave-one-out, full-catalog ranking, seen items excluded) and recorded with:

* ``max_len`` (the model's: a schedule's last window), ``schedule`` (resolved, absent for a
  fixed max_len), ``seed``, ``NDCG@10``, ``HR@10``, ``train_seconds``, ``epochs``,
  ``val_curve`` (validation NDCG@10 after each epoch: the runs compared at equal epochs as well
  as at equal budget), ``torch_threads``;
* ``slices``: ``">=200"``, ``">=500"`` (users with at least that many events): ``NDCG@10``,
  ``HR@10``, ``n_users``;
* ``ci95``: the per-user paired difference to the first ``--max-lens`` run of the same seed
  (200 in the commands above) with its percentile-bootstrap 95 % interval
  (``recsys_alibi.evaluation.paired``), overall and per slice, for NDCG@10 and HR@10:
  ``{"all": {"NDCG@10": {"difference": .., "ci95": [lo, hi]}, ...}}``.

``--set`` overrides are applied to every run (e.g. ``model.time_gap_buckets=32`` for "with time
gaps"). ``--tiny`` shrinks the training to 1 epoch of 20 batches and 64 validation users (a ``--set``
after it wins, e.g. ``train.max_epochs=2`` for a schedule that switches at epoch 1): a dry run that
checks the script end to end, not a result. Each run still evaluates every user: on ML-1M with
``--max-lens 200 1000`` on 2 cores about 3 minutes in all (47 s and 82 s of training, about 30 s of
evaluation per run). Each finished run is written to the JSON at once; runs already there (same
label, seed and entry) are skipped, and a run killed mid-way resumes from the ``last.ckpt`` of its
folder ``<output>/long-histories/<label-seed-entry>`` (``train.resume``: the same MLflow run,
optimizer, learning-rate schedule and data order; equal to an uninterrupted run on one thread;
``resumed_from`` in its record, whose ``train_seconds`` counts the sessions before the kill too).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import as_completed
from pathlib import Path

SLICES = (200, 500)
METRICS = ("NDCG@10", "HR@10")
TINY = ["train.max_epochs=1", "train.limit_train_batches=20", "train.val_users=64"]


def _whole(prepared: Path) -> int:
    from recsys_alibi.data.prepare import read_sequences

    return int(read_sequences(prepared).get_column("length").max())


def entry_name(entry: dict) -> str:
    """How a run's entry is keyed and shown: ``"200"`` or ``"schedule [[0, 200], [25, 2314]]"``."""
    return f"schedule {entry['schedule']}" if entry.get("schedule") else str(entry["max_len"])


def run_key(label: str, seed: int | None, entry: dict) -> str:
    """The key of one run in the JSON and the per-user file (runs recorded before seeds: no seed part)."""
    return "|".join([label, *([] if seed is None else [str(seed)]), entry_name(entry)])


def parse_entries(max_lens: list[str], schedules: list[str], whole: int) -> list[dict]:
    """``{"max_len": m}`` per ``--max-lens`` value, then ``{"schedule": [[e, w], ...]}`` per ``--schedules``
    value, ``whole`` replaced by the longest history (the same number in both).

    Raises:
        ConfigError: a schedule is not YAML (its shape is checked with the config).
    """
    from recsys_alibi.config_reader import read_yaml

    entries = [{"max_len": whole if x == "whole" else int(x)} for x in max_lens]
    for text in schedules:
        schedule = read_yaml(text, f"--schedules {text}")
        if isinstance(schedule, list):
            schedule = [[whole if w == "whole" else w for w in pair] if isinstance(pair, list) else pair
                        for pair in schedule]  # fmt: skip
        entries.append({"schedule": schedule})
    return entries


def run_config(config_path: str, overrides: list[str], entry: dict, seed: int, prepared: Path):
    """The resolved ``JobConfig`` of one run (read in the benchmark's process, once: a config
    edited while the benchmark runs changes nothing in it). A schedule's last window becomes
    ``model.max_len`` (``data_rules.resolve_max_len``).

    Raises:
        ConfigError: an invalid schedule or override (one line).
    """
    from recsys_alibi.config import load_config
    from recsys_alibi.training.data_rules import resolve_max_len

    run = ([f"model.max_len={entry['max_len']}"] if "max_len" in entry
           else [f"train.context_schedule={json.dumps(entry['schedule'])}"])  # fmt: skip
    config = load_config(config_path, [*overrides, *run, f"seed={seed}", f"evaluate.min_history={list(SLICES)}"])
    return resolve_max_len(config, prepared)


def run_one(config, prepared: Path, label: str, threads: int | None) -> tuple[dict, dict]:
    """Train ``config`` (from :func:`run_config`) and evaluate on the test protocol; returns (record,
    per-user arrays). ``threads``: torch threads of this run (None: the pool's)."""
    import torch

    from pipelines.evaluate import run_evaluate
    from pipelines.train import run_train

    if threads is not None:
        torch.set_num_threads(threads)
    schedule = config.train.context_schedule
    entry = {"schedule": schedule} if schedule else {"max_len": config.model.max_len}
    # one output folder per run: runs side by side never share checkpoints or reports
    name = f"schedule{'_'.join(f'{e}x{w}' for e, w in schedule)}" if schedule else f"max_len{config.model.max_len}"
    run_dir = "-".join(filter(None, [label.replace(" ", "_"), f"seed{config.seed}", name]))
    from run_marker import resuming_if_same  # benchmarks/run_marker.py (this script's folder is on sys.path)

    # train.resume: a run killed mid-way (a session's end) continues from its last epoch checkpoint in this
    # folder, on the same MLflow run, when the benchmark is started again with the same config
    config = resuming_if_same(config.model_copy(update={"output": str(Path(config.output) / "long-histories" / run_dir)}))
    trained = run_train(config, prepared, progress=False, register=False)
    job = run_evaluate(config, prepared, model_uri=trained.model.uri,
                       output_dir=Path(config.output) / "report")  # fmt: skip
    r = job.result
    slices = {key: {m: r.by_min_history[key][m] for m in METRICS} for key in r.by_min_history}
    for key in slices:
        slices[key]["n_users"] = int((r.history_lengths >= int(key[2:])).sum())
    record = {
        "max_len": config.model.max_len, **entry, "seed": config.seed, "run_id": trained.run_id,
        "epochs": trained.epochs, "train_seconds": round(trained.train_seconds, 1), "n_users": r.n_users,
        "resumed_from": trained.resumed_from,  # set: train_seconds counts the sessions before it too (fit.TrainClock)
        **{m: r.metrics[m] for m in METRICS}, "slices": slices, "val_curve": val_curve(trained.run_id),
        "torch_threads": torch.get_num_threads(),
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
    """One row per run: overall and per slice, with the CI of the difference to the reference run."""
    head = "| label | seed | max_len / schedule | epochs | NDCG@10 | HR@10 | "
    head += " | ".join(f"NDCG@10 {s} / HR@10 {s}" for s in (f">={x}" for x in SLICES))
    head += " | NDCG@10 diff [95 % CI] | train s |"
    lines = [head, "|" + "---|" * (8 + len(SLICES))]
    for r in records:
        shown = str(r["schedule"]) if r.get("schedule") else str(r["max_len"])
        cells = [r.get("label", ""), str(r.get("seed", "")), shown, str(r["epochs"]), f"{r['NDCG@10']:.4f}",
                 f"{r['HR@10']:.4f}"]  # fmt: skip
        for s in SLICES:
            sl = r["slices"].get(f">={s}")
            cells.append("—" if sl is None else f"{sl['NDCG@10']:.4f} / {sl['HR@10']:.4f} (n={sl['n_users']})")
        ci = r.get("ci95", {}).get("all", {}).get("NDCG@10")
        cells.append("reference" if ci is None else f"{ci['difference']:+.4f} [{ci['ci95'][0]:+.4f}, {ci['ci95'][1]:+.4f}]")
        cells.append(f"{r['train_seconds']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Train and compare every ``--max-lens`` and ``--schedules`` run at every seed; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--prepared", type=Path, required=True)
    parser.add_argument("--max-lens", nargs="+", default=["200", "1000", "whole"], help="ints or 'whole'; the first is the reference")
    parser.add_argument("--schedules", nargs="*", default=[],
                        help="train.context_schedule values, e.g. '[[0, 200], [25, whole]]'")  # fmt: skip
    parser.add_argument("--seeds", nargs="+", type=int, default=None,
                        help="every entry at each seed (default: the config's)")  # fmt: skip
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="dotted.key=value for every run")
    parser.add_argument("--label", default="", help="names this series in the JSON (e.g. 'with time gaps')")
    parser.add_argument("--json", type=Path, default=Path("runs/long-histories/long-histories.json"),
                        help="results (default runs/long-histories/long-histories.json; the committed ones are in docs/results/)")
    parser.add_argument("--tiny", action="store_true", help="a dry run (1 epoch of 20 batches per run, every user still evaluated: about 3 minutes on "
                        "ML-1M with two --max-lens on 2 cores): checks the script, measures nothing")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each with cores / jobs torch threads")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (default: cores / jobs)")
    args = parser.parse_args(argv)
    overrides = [*(TINY if args.tiny else []), *args.overrides]  # a --set wins over --tiny's
    from recsys_alibi.config import ConfigError, load_config
    from recsys_alibi.diagnostics.machine import command_line, machine_line

    whole = _whole(args.prepared)
    try:
        default_seed = load_config(args.config, overrides).seed
        seeds = args.seeds or [default_seed]
        entries = parse_entries(args.max_lens, args.schedules, whole)
        configs = {(seed, i): run_config(args.config, overrides, entry, seed, args.prepared)
                   for seed in seeds for i, entry in enumerate(entries)}  # fmt: skip
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json.is_dir():
        print(f"error: --json {args.json} is a folder", file=sys.stderr)
        return 2
    args.json.parent.mkdir(parents=True, exist_ok=True)  # before any training: a finished run is never lost
    for (seed, i), config in configs.items():  # resolved: schedules as the runs record them
        if "schedule" in entries[i]:
            entries[i] = {"schedule": config.train.context_schedule}
    doc = json.loads(args.json.read_text()) if args.json.exists() else {"runs": []}
    doc["command"] = command_line("benchmarks/long_histories.py", argv)
    doc["machine"] = machine_line()  # torch threads: each run's torch_threads
    arrays_path = args.json.with_suffix(".per_user.json")
    per_user = json.loads(arrays_path.read_text()) if arrays_path.exists() else {}
    # a run recorded before seeds: the config's seed
    done = {run_key(r.get("label", ""), r.get("seed", default_seed), r) for r in doc["runs"]}
    todo = [(seed, i) for seed in seeds for i, entry in enumerate(entries) if run_key(args.label, seed, entry) not in done]
    from recsys_alibi.tracking import setup_tracking
    from worker_pool import training_pool  # benchmarks/worker_pool.py (this script's folder is on sys.path)

    # create the tracking store and experiment once: parallel workers migrating a new SQLite store race
    setup_tracking(next(iter(configs.values())).tracking)
    with training_pool(args.jobs) as (pool, threads):
        futures = [pool.submit(run_one, configs[key], args.prepared, args.label, args.threads) for key in todo]
        for future in as_completed(futures):  # each finished run is saved at once: a killed benchmark resumes
            record, arrays = future.result()
            record["label"] = args.label
            record["whole"] = record["max_len"] == whole
            per_user[run_key(args.label, record["seed"], record)] = arrays
            doc["runs"].append(record)
            _save(args.json, doc, arrays_path, per_user)
    for record in doc["runs"]:  # the paired CIs, once the reference run of the series and seed is there
        seed = record.get("seed")
        key, reference = run_key(args.label, seed, record), run_key(args.label, seed, entries[0])
        if record.get("label", "") == args.label and key != reference and {key, reference} <= per_user.keys():
            record["ci95"] = paired_to_reference(per_user[key], per_user[reference])
    _save(args.json, doc, arrays_path, per_user)
    print(markdown(doc["runs"]))
    return 0


def _save(json_path: Path, doc: dict, arrays_path: Path, per_user: dict) -> None:
    from recsys_alibi.atomic import write_json_atomic

    write_json_atomic(json_path, doc)
    write_json_atomic(arrays_path, per_user)


if __name__ == "__main__":
    raise SystemExit(main())
