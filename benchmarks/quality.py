"""Ranking quality over several seeds: the ALiBi ranker beside SASRec and popularity, one JSON.

Run (from the repository root, after ``make install``):

    .venv/bin/python benchmarks/quality.py --config configs/movielens-1m.yaml --seeds 1 2 3

For each seed it trains the config's ALiBi model and the SASRec baseline (the same config with
``model.position=learned`` and ALiBi's own keys at their defaults, ``recsys_alibi.config.sasrec_overrides``:
SASRec's learned position table, same code, data, loss, schedule and
time budget ``train.max_minutes``), evaluates each on the test protocol (leave-one-out,
full-catalog ranking, seen items excluded) and fits popularity once. ``--jobs`` runs train at
once (default 2: the ALiBi model and SASRec side by side, each with cores / jobs torch threads,
which on 2 cores is faster in total than one 2-thread run after the other). It writes:

* ``--json`` (default ``<workdir>/<config stem>.json``; the committed figures are in docs/results/): ``NDCG@10``, ``HR@10`` (means over
  seeds), ``NDCG@10_std``, ``HR@10_std`` (sample standard deviation, ddof = 1), ``seeds``,
  ``train_seconds`` (per seed), ``command``, ``baseline`` (the same keys for SASRec),
  ``popularity``, ``per_seed`` (every metric of every run) and the validation curves.
* ``--curve`` (default ``<workdir>/<config stem>-curve.png``): validation NDCG@10 per epoch.

and prints the Markdown table of docs/results.md. Models are not registered; runs go to the
config's MLflow experiment with ``quality`` in the run name's output path.

The config is read once, when the benchmark starts: every run's config is resolved then and sent
to its worker, so editing the YAML while a benchmark runs changes nothing in it. Each finished run
is recorded in ``<workdir>/finished.json`` under the hash of its resolved config; a re-run of the
same command (after a kill, or with more ``--seeds``) reuses those runs instead of training them
again and says so, and a run killed mid-way continues from its last epoch checkpoint
(``train.resume``; ``train_seconds`` then counts the time before the kill too). Delete that file to
retrain after a code change.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
from concurrent.futures import as_completed
from pathlib import Path

REPORTED = ("HR@10", "NDCG@10", "HR@20", "NDCG@20", "MRR", "Coverage@10")


MODELS = ("ALiBi", "SASRec")


def summarise(runs: list[dict]) -> dict:
    """Mean and sample std (ddof = 1; 0 for one run) of the reported metrics over seed runs."""
    out: dict = {}
    for name in REPORTED:
        values = [r["metrics"][name] for r in runs if name in r["metrics"]]
        if not values:
            continue
        out[name] = statistics.fmean(values)
        out[f"{name}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    out["seeds"] = [r["seed"] for r in runs]
    out["train_seconds"] = [r["train_seconds"] for r in runs]
    out["epochs"] = [r["epochs"] for r in runs]
    return out


def run_key(config) -> str:
    """The key of a run in ``finished.json``: sha256 of its resolved config (a ``JobConfig``)."""
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:16]


def config_record(config) -> dict:
    """The resolved config as a finished run records it (``config`` of its ``finished.json`` entry), JSON values."""
    return json.loads(config.model_dump_json())


def _same_but_new_defaults(stored, current, default) -> bool:
    """``stored`` (a recorded config) equals ``current`` but for keys added since, which are at their defaults."""
    if not (isinstance(stored, dict) and isinstance(current, dict)):
        return stored == current
    default = default if isinstance(default, dict) else {}
    return set(stored) <= set(current) and all(
        _same_but_new_defaults(stored[key], value, default.get(key)) if key in stored else value == default.get(key)
        for key, value in current.items()
    )


def find_finished(finished: dict[str, dict], config) -> dict | None:
    """The finished run of ``config`` (a resolved ``JobConfig``): the one under its :func:`run_key`, else one recorded
    with a config equal to it but for keys the config gained since, at their defaults (a new setting that changes
    nothing does not train every finished run again; a default that changed does). None: not finished."""
    if (run := finished.get(run_key(config))) is not None:
        return run
    current, default = config_record(config), config_record(type(config)())
    return next((run for run in finished.values()
                 if "config" in run and _same_but_new_defaults(run["config"], current, default)), None)  # fmt: skip


def read_finished(path: Path) -> dict[str, dict]:
    """Runs recorded by earlier invocations (``run_key`` -> run); empty when there is no file."""
    return json.loads(path.read_text()) if path.exists() else {}


def train_and_test(config, prepared: Path) -> dict:
    """One training run (no registry) of ``config`` (a resolved ``JobConfig``) and its test
    metrics, with its validation curve."""
    import mlflow

    from pipelines.evaluate import run_evaluate
    from pipelines.train import run_train
    from recsys_alibi.tracking import metric_key

    from run_marker import resuming_if_same  # benchmarks/run_marker.py (this script's folder is on sys.path)

    # train.resume: a run killed mid-way (a session's end) continues from its last epoch checkpoint in its
    # output folder, on the same MLflow run, when the benchmark is started again with the same config (another
    # config starts a new run); the finished run's key (run_key) is taken from the config as given
    config = resuming_if_same(config)
    trained = run_train(config, prepared, progress=False, register=False)
    report = run_evaluate(config, prepared, model_uri=trained.model.uri, output_dir=Path(config.output) / "report")
    history = mlflow.MlflowClient().get_metric_history(trained.run_id, metric_key("val/ndcg_at_10"))
    return {
        "seed": config.seed,
        "position": config.model.position,
        "run_id": trained.run_id,
        "epochs": trained.epochs,
        "train_seconds": round(trained.train_seconds, 1),
        "resumed_from": trained.resumed_from,  # set: train_seconds counts the sessions before it too
        "best_val_NDCG@10": trained.best_val_ndcg_at_10,
        "metrics": {k: float(v) for k, v in report.result.metrics.items()},
        "val_curve": [float(m.value) for m in sorted(history, key=lambda m: m.step)],
    }


def plot_curves(runs: dict[str, list[dict]], path: Path, title: str) -> None:
    """Validation NDCG@10 per epoch, one line per (model, seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from recsys_alibi.atomic import atomic_path

    fig, ax = plt.subplots(figsize=(7, 4))
    for (label, seed_runs), style in zip(runs.items(), ("-", "--")):
        for i, run in enumerate(seed_runs):
            curve = run["val_curve"]
            ax.plot(range(1, len(curve) + 1), curve, style, color=f"C{i}", label=f"{label}, seed {run['seed']}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation NDCG@10")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def markdown_table(result: dict) -> str:
    """The results table: mean ± std over seeds for each model, popularity beside them."""

    def cell(block: dict, name: str) -> str:
        if name not in block:
            return "–"
        std = block.get(f"{name}_std")  # over several seeds, 0.0 included; none for popularity or one seed
        return f"{block[name]:.4f}" + (f" ± {std:.4f}" if std is not None and len(block.get("seeds", [])) > 1 else "")

    names = ("HR@10", "NDCG@10", "HR@20", "NDCG@20", "MRR")
    rows = [("ALiBi ranker", result), ("SASRec (learned positions)", result.get("baseline", {})),
            ("popularity", result["popularity"])]
    lines = ["| model | " + " | ".join(names) + " | train s (per seed) |", "|---|" + "---:|" * (len(names) + 1)]
    for label, block in rows:
        seconds = ", ".join(f"{s:.0f}" for s in block.get("train_seconds", [])) or "–"
        lines.append(f"| {label} | " + " | ".join(cell(block, n) for n in names) + f" | {seconds} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                        help="which models to train (default both); one alone re-measures it and keeps the other's "
                             "finished runs of the same seeds from the workdir (else its block of the earlier --json)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, each with cores / jobs torch threads")
    parser.add_argument("--workdir", type=Path, help="default: runs/quality/<config stem>")
    parser.add_argument("--json", type=Path, help="default: <workdir>/<config stem>.json")
    parser.add_argument("--curve", type=Path, help="default: <workdir>/<config stem>-curve.png")
    args = parser.parse_args(argv)

    from pipelines.cli import configure_logging
    from pipelines.data_steps import reading_generated_table, run_generate, run_prepare
    from pipelines.evaluate import run_evaluate
    from recsys_alibi.atomic import write_json_atomic
    from recsys_alibi.config import load_config, sasrec_overrides
    from recsys_alibi.diagnostics.machine import command_line, machine_line
    from recsys_alibi.tracking import setup_tracking
    from worker_pool import training_pool  # benchmarks/worker_pool.py (this script's folder is on sys.path)

    configure_logging()
    stem = Path(args.config).stem
    workdir = args.workdir or Path("runs/quality") / stem
    json_path = args.json or workdir / f"{stem}.json"
    curve_path = args.curve or workdir / f"{stem}-curve.png"
    base = load_config(args.config, args.overrides)
    prepared = workdir / "prepared"
    input_path = None  # data.input of the config, or the synthetic log when generate.enabled
    if base.generate.enabled:
        generated = run_generate(base, workdir / "events.parquet")
        print(generated.summary(), flush=True)
        input_path = str(generated.path)
        base = reading_generated_table(base, generated)
    print(run_prepare(base, input_path, prepared).summary(), flush=True)
    # create the tracking store and experiment once: parallel workers migrating a new SQLite store race
    setup_tracking(base.tracking)

    tasks = [
        (label, seed, [*args.overrides, f"seed={seed}", f"output={workdir / f'{label.lower()}-seed{seed}'}", *extra])
        for seed in args.seeds
        for label, extra in (("ALiBi", []), ("SASRec", sasrec_overrides()))
    ]
    configs = [load_config(args.config, overrides) for _, _, overrides in tasks]  # the YAML is read here, once
    finished_path = workdir / "finished.json"
    finished = read_finished(finished_path)
    # a model left out of --models: its finished runs of every seed are kept (never trained here), else the
    # earlier JSON's block of it
    kept = [label for label in MODELS if label not in args.models
            and all(find_finished(finished, c) is not None for (lab, _, _), c in zip(tasks, configs) if lab == label)]  # fmt: skip
    wanted = [i for i, (label, _, _) in enumerate(tasks) if label in args.models or label in kept]
    tasks, configs = [tasks[i] for i in wanted], [configs[i] for i in wanted]
    results: dict[int, dict] = {}
    with training_pool(args.jobs) as (pool, threads):
        futures = {}
        for index, config in enumerate(configs):
            if (run := find_finished(finished, config)) is not None:
                results[index] = {key: value for key, value in run.items() if key != "config"}
                print(f"{tasks[index][0]} seed {tasks[index][1]}: reused the finished run in {finished_path}", flush=True)
            else:
                futures[pool.submit(train_and_test, config, prepared)] = index
        for future in as_completed(futures):
            index = futures[future]
            results[index] = run = future.result()
            finished[run_key(configs[index])] = {**run, "config": config_record(configs[index])}
            write_json_atomic(finished_path, finished)  # a killed benchmark keeps every run it finished
            print(
                f"{tasks[index][0]} seed {tasks[index][1]}: {run['epochs']} epochs in {run['train_seconds']:.0f} s, "
                f"test HR@10 {run['metrics']['HR@10']:.4f} NDCG@10 {run['metrics']['NDCG@10']:.4f}",
                flush=True,
            )
    runs: dict[str, list[dict]] = {label: [] for label in MODELS if label in args.models or label in kept}
    for index, (label, _, _) in enumerate(tasks):
        runs[label].append(results[index])
    popularity = run_evaluate(base, prepared, baseline="popularity", output_dir=workdir / "popularity")
    earlier = json.loads(json_path.read_text()) if json_path.is_file() else {}
    blocks = {"ALiBi": summarise(runs["ALiBi"]) if "ALiBi" in runs else None,
              "SASRec": {"name": "SASRec (model.position=learned)", **summarise(runs["SASRec"])} if "SASRec" in runs else None}
    for label in MODELS:
        if blocks[label] is None:  # not measured and no finished runs here: the earlier JSON's figures, if any
            block = ({k: earlier[k] for k in earlier if k in REPORTED or k.removesuffix("_std") in REPORTED
                      or k in ("seeds", "train_seconds", "epochs")} if label == "ALiBi" else earlier.get("baseline"))
            if block:
                blocks[label] = block
                runs[label] = earlier.get("per_seed", {}).get(label, [])
            print(f"{label}: not in --models and not every seed finished in {finished_path}: "
                  + (f"its figures kept from {json_path}" if block else "left out"), flush=True)  # fmt: skip
        elif label in kept:
            print(f"{label}: not in --models; its finished runs in {finished_path} kept", flush=True)
    result = {
        **(blocks["ALiBi"] or {}),
        **({"baseline": blocks["SASRec"]} if blocks["SASRec"] else {}),
        "popularity": {k: float(v) for k, v in popularity.result.metrics.items() if k in REPORTED},
        "command": command_line("benchmarks/quality.py", argv),
        "config": args.config,
        "protocol": "leave-one-out, full-catalog ranking, seen items excluded",
        "machine": machine_line(threads),
        "jobs": args.jobs,
        "torch_threads_per_run": threads,
        "per_seed": runs,
    }
    write_json_atomic(json_path, result)
    plot_curves(runs, curve_path, f"{stem}: validation NDCG@10 per epoch")
    print(markdown_table(result))
    print(f"wrote {json_path} and {curve_path}")


if __name__ == "__main__":
    main()
