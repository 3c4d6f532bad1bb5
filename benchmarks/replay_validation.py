"""The replay steps' own validation split, over all users and over the users who just came back.

Run from the repository root after one or more ``benchmarks/replay.py`` runs on the same log and periods,
while their workdirs (the MLflow stores of their models) are still there; scoring only, minutes:

    .venv/bin/python benchmarks/replay_validation.py \\
        --model plain=docs/results/replay-ml100k.json:warm --model scratch=docs/results/replay-ml100k.json:scratch \\
        --output docs/results/replay-ml100k.validation.json

Each ``--model LABEL=REPLAY.json:ARM`` names one arm of one finished replay; the first is the baseline the
others are compared with. For every seed and step ``k`` that all of them finished, the step's prepared data
(period 0, then periods 1..k appended, as the replay built it) gives the leave-one-out validation examples
(each user's second-to-last event from the events before it: what every arm's best epoch and every warm rule
were chosen on). Each model ranks them over the full catalog, seen items excluded. Two sets of users:

* ``all``: every validation user (the replay's ``val_NDCG@10``, recomputed);
* ``returning``: the users with at least one event in the step's own new period ``[b_(k-1), b_k)``: the users
  who just came back, whom a next period is mostly about. Validation over all users dilutes a gap on
  them (docs/results.md, "Screened and dropped: warm epochs over the new period").

Writes ``--output``: per label and user set the mean NDCG@10 and HR@10 and the number of (seed, step, user)
pairs; per other label ``<label>_minus_<baseline>`` per user set, paired with a percentile-bootstrap 95 %
interval (``replay._difference``); and per (seed, step) the means. Refused with one line (exit 2): a file that
is not a finished replay, an arm it did not run, replays of another log or other periods.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import numpy as np
import polars as pl

SETS = ("all", "returning")


def stores(args: argparse.Namespace, seen: set | None = None) -> list[str]:
    """Tracking URIs that may hold a replay's models (``args``: its recorded command, parsed):
    ``MLFLOW_TRACKING_URI`` when set (a replay run with it set keeps its models there), its workdir's store,
    then those of the replays its ``--reuse`` arms came from (a reused arm's models live there)."""
    import json

    from replay import build_parser

    seen = seen if seen is not None else set()
    env = os.environ.get("MLFLOW_TRACKING_URI")
    out = [*([env] if env else []), f"sqlite:///{args.workdir.resolve() / 'mlflow.db'}"]
    for item in args.reuse:
        earlier = Path(item.partition("=")[2])
        if earlier.resolve() in seen or not earlier.is_file():
            continue
        seen.add(earlier.resolve())
        command = json.loads(earlier.read_text()).get("command", "")
        out += stores(build_parser().parse_args(shlex.split(command)[2:]), seen)
    return out


def load_from(uri: str, candidates: list[str]):
    """The model ``uri`` from the first tracking store in ``candidates`` that holds it.

    Raises:
        SystemExit: none holds it (one line).
    """
    import mlflow

    from recsys_alibi.tracking import ModelUriError, load_ranker

    for store in candidates:
        mlflow.set_tracking_uri(store)
        try:
            return load_ranker(uri)
        except ModelUriError:
            continue
    raise SystemExit(f"replay_validation.py: {uri} is in none of the stores {candidates}: a replay's workdir is gone")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="replay_validation.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, metavar="LABEL=REPLAY.json:ARM",
                        help="an arm of a finished replay; the first is the baseline (at least two)")
    parser.add_argument("--store", action="append", default=[], metavar="TRACKING_URI",
                        help="another MLflow store to look for models in (a replay run with MLFLOW_TRACKING_URI set)")
    parser.add_argument("--seeds", nargs="+", help="only these seeds (default: every seed all of them finished)")
    parser.add_argument("--output", type=Path, required=True, help="JSON path")
    args = parser.parse_args(argv)

    import replay as replay_script
    from replay_scoring import returning_users, validation_per_user
    from pipelines.cli import configure_logging
    from recsys_alibi.atomic import write_json_atomic
    from recsys_alibi.config import load_config
    from replay_cold import read_replay

    configure_logging()
    models = []
    for item in args.model:
        label, _, rest = item.partition("=")
        path, _, arm = rest.rpartition(":")
        if not label or not path or not arm:
            parser.error(f"--model {item}: expected LABEL=REPLAY.json:ARM")
        doc, r, runs = read_replay(Path(path), parser, replay_script.build_parser())
        if arm not in doc.get("arms", []):
            parser.error(f"--model {item}: {path} has no arm {arm} (its arms: {doc.get('arms')})")
        models.append((label, arm, r, runs, stores(r) + args.store))
    if len(models) < 2 or len({m[0] for m in models}) < len(models):
        parser.error("--model: at least two, with different labels")
    base = models[0][2]
    for label, _, r, _, _ in models[1:]:
        if (r.config, r.input, r.format, r.start, r.period_days) != (base.config, base.input, base.format, base.start,
                                                                     base.period_days):  # fmt: skip
            parser.error(f"--model {label}: a replay of another log or other periods than {models[0][0]}'s")
    config = load_config(base.config, [o for o in base.overrides if o.startswith("data.")] + ["train.init_from=champion"])
    events = replay_script.read_log(config, base.input or config.data.input, base.format)
    bounds = replay_script.boundaries(events["timestamp"].to_numpy(), base.start, base.period_days)
    seeds = sorted(set.intersection(*[set(m[3]) for m in models], *([set(args.seeds)] if args.seeds else [])), key=int)
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"replay-validation-{os.getpid()}"
    per: dict = {m[0]: {s: [] for s in SETS} for m in models}
    steps = []
    for seed in seeds:
        finished = [{st["step"]: st for st in m[3][seed].get("steps", [])} for m in models]
        common = sorted(set.intersection(*[set(f) for f in finished]))
        if not common:
            continue
        files = []
        periods = workdir / f"seed-{seed}" / "periods"
        periods.mkdir(parents=True, exist_ok=True)
        edges = [int(events["timestamp"].min()), *bounds]
        for k in range(common[-1] + 1):
            path = periods / f"period-{k:03d}.parquet"
            events.filter((pl.col("timestamp") >= edges[k]) & (pl.col("timestamp") < edges[k + 1])).write_parquet(path)
            files.append(path)
        prepared = workdir / f"seed-{seed}" / "prepared"
        for k in common:
            replay_script.rebuild(config, files, prepared, k)
            back = {str(u) for u in returning_users(events, bounds[k - 1], bounds[k])}
            row = {"seed": int(seed), "step": k}
            for (label, arm, _, _, candidates), done in zip(models, finished):
                values = validation_per_user(load_from(done[k]["arms"][arm]["uri"], candidates), prepared)
                for name, users in (("all", sorted(values)), ("returning", sorted(u for u in values if u in back))):
                    per[label][name].append({f"{seed}/{k}/{u}": values[u] for u in users})
                    row[f"{label}_{name}_NDCG@10"] = float(np.mean([values[u][0] for u in users])) if users else None
                row["returning_users"] = len([u for u in values if u in back])
                row["validation_users"] = len(values)
            steps.append(row)
            print(f"seed {seed} step {k}: {row['returning_users']} of {row['validation_users']} validation users "
                  "returning; NDCG@10 returning " + ", ".join(f"{m[0]} {row[m[0] + '_returning_NDCG@10'] or 0:.4f}"
                                                             for m in models), flush=True)  # fmt: skip
    out = {"command": shlex.join(["python", "benchmarks/replay_validation.py", *(argv if argv is not None else sys.argv[1:])]),
           "protocol": __doc__.split("\n\n")[2].replace("\n", " "), "baseline": models[0][0], "sets": {}, "steps": steps}  # fmt: skip
    for name in SETS:
        merged = {label: {k: v for part in per[label][name] for k, v in part.items()} for label in per}
        keys = sorted(merged[models[0][0]])
        entry = {label: {"pairs": len(keys), **{metric: float(np.mean([merged[label][k][i] for k in keys])) if keys else None
                                                for i, metric in enumerate(replay_script.METRICS)}} for label in merged}  # fmt: skip
        for label in list(merged)[1:]:
            entry[f"{label}_minus_{models[0][0]}"] = replay_script._difference(
                [merged[label][k] for k in keys], [merged[models[0][0]][k] for k in keys]) if keys else None  # fmt: skip
        out["sets"][name] = entry
    write_json_atomic(args.output, out)
    for name in SETS:
        print(f"{name}: " + "; ".join(
            f"{lab} {d['NDCG@10']['difference']:+.4f} [{d['NDCG@10']['ci95'][0]:+.4f}, {d['NDCG@10']['ci95'][1]:+.4f}]"
            for lab, d in out["sets"][name].items() if "_minus_" in lab and d))  # fmt: skip
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
