"""The replay steps' own validation split, over all users and over the users who just came back.

Run from the repository root after one or more ``benchmarks/replay.py`` runs on the same log and periods,
while their workdirs (the MLflow stores of their models) are still there; scoring only, minutes:

    .venv/bin/python benchmarks/replay_validation.py \\
        --model plain=docs/results/replay-ml100k.json:warm --model scratch=docs/results/replay-ml100k.json:scratch \\
        --output runs/replay-ml100k.validation.json

Each ``--model LABEL=REPLAY.json:ARM`` names one arm of one finished replay; the first is the baseline the
others are compared with. For every seed and step ``k`` that all of them finished, the step's prepared data
(period 0, then periods 1..k appended, as the replay built it) gives the leave-one-out validation examples
(each user's second-to-last event from the events before it: what every arm's best epoch and every warm rule
were chosen on). Each model ranks them over the full catalog as training validates (its last ``model.max_len``
items read, every history item excluded). Steps that not every replay finished (one still running) are left
out, and said. Two sets of users:

* ``all``: every validation user (the replay's ``val_NDCG@10``, recomputed in float32; training validates under
  bf16 autocast where the CPU has it: within 0.001 of it on the ML-100K replay);
* ``returning``: the users with at least one event in the step's own new period ``[b_(k-1), b_k)``: the users
  who just came back, whom a next period is mostly about. Validation over all users dilutes a gap on
  them (docs/results.md, "Screened and dropped: warm epochs over the new period").

Writes ``--output``: per label and user set the mean NDCG@10 and HR@10 and the number of (seed, step, user)
pairs; per other label ``<label>_minus_<baseline>`` per user set, paired with a percentile-bootstrap 95 %
interval (``replay._difference``); and per (seed, step) the means. Refused with one line (exit 2): a file that
is not a replay, an arm it did not train (``stale`` is not trained), replays of another log, other periods or
other ``data.*`` settings, a ``--seeds`` seed without finished steps in every replay, nothing in common, an
``--output`` folder that does not exist, a model in none of the stores (``--store`` adds one).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import numpy as np

from recsys_alibi.diagnostics.machine import command_line, machine_line

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
    """The model ``uri`` from the first tracking store in ``candidates`` that holds it (a local SQLite store that
    does not exist is passed over, never created).

    Raises:
        SystemExit: none holds it (one line, exit 2).
    """
    import mlflow

    from recsys_alibi.tracking import ModelUriError, load_ranker
    from recsys_alibi.tracking_store import local_store_path

    for store in candidates:
        local = local_store_path(store)
        if local is not None and not local.is_file():
            continue
        mlflow.set_tracking_uri(store)
        try:
            return load_ranker(uri)
        except ModelUriError:
            continue
    print(f"replay_validation.py: error: {uri} is in none of the stores {candidates}: the replay's workdir is gone, "
          "or it ran with MLFLOW_TRACKING_URI set (give that store with --store)", file=sys.stderr)  # fmt: skip
    raise SystemExit(2)


def read_models(items: list[str], extra_stores: list[str], parser) -> list[tuple]:
    """``--model LABEL=REPLAY.json:ARM`` -> (label, arm, the replay's parsed command, its per-user runs, stores);
    refused with one line (exit 2): a malformed value, a file that is not a replay, an arm it did not train at
    its steps (``stale`` is not trained), fewer than two, a label twice, replays of another log, periods or data."""
    import replay as replay_script

    models = []
    for item in items:
        label, arm, _, r, runs = replay_script.read_arm_option(item, parser, replay_script.TRAINED_ARMS)
        models.append((label, arm, r, runs, stores(r) + extra_stores))
    if len(models) < 2 or len({m[0] for m in models}) < len(models):
        parser.error("--model: at least two, with different labels")
    base = models[0][2]
    for label, _, r, _, _ in models[1:]:
        data = sorted(o for o in r.overrides if o.startswith("data."))
        if replay_script.log_key(r) != replay_script.log_key(base) or data != sorted(
                o for o in base.overrides if o.startswith("data.")):  # fmt: skip
            parser.error(f"--model {label}: a replay of another log, other periods or other data.* settings than "
                         f"{models[0][0]}'s")  # fmt: skip
    source = base.input
    if source is not None and not Path(source).exists():
        parser.error(f"the replays' log {source} is not there: run from the folder the replays ran in")
    return models


def planned_steps(models: list[tuple], seeds: list[str] | None, parser) -> list[tuple[str, list[int]]]:
    """[(seed, the steps every model finished)]; refused (one line, exit 2) when ``seeds`` names a seed that not
    every replay finished a step of, or when nothing is in common. Steps some replays have not finished are said."""
    finished = {s: [{st["step"] for st in m[3].get(s, {}).get("steps", [])} for m in models]
                for s in {s for m in models for s in m[3]}}  # fmt: skip
    held = sorted((s for s, f in finished.items() if all(f)), key=int)
    missing = [s for s in seeds or [] if s not in held]
    if missing:
        parser.error(f"--seeds {' '.join(missing)}: not a seed with finished steps in every replay (those: {held})")
    plan = [(s, sorted(set.intersection(*finished[s]))) for s in (seeds or held)]
    plan = [(s, steps) for s, steps in plan if steps]
    if not plan:
        parser.error("the replays have no finished step in common: nothing to score")
    for s in held:
        left = sorted(set.union(*finished[s]) - set.intersection(*finished[s]))
        if left and (not seeds or s in seeds):
            print(f"seed {s}: steps {left} are not finished in every replay and are left out", flush=True)
    return plan


def summarise(per: dict, baseline: str) -> dict:
    """Per user set: each label's means over the (seed, step, user) pairs and ``<label>_minus_<baseline>``."""
    from replay import METRICS, _difference

    out = {}
    for name in SETS:
        merged = {label: {k: v for part in per[label][name] for k, v in part.items()} for label in per}
        keys = sorted(merged[baseline])
        entry = {label: {"pairs": len(keys), **{metric: float(np.mean([merged[label][k][i] for k in keys])) if keys else None
                                                for i, metric in enumerate(METRICS)}} for label in merged}  # fmt: skip
        for label in list(merged)[1:]:
            entry[f"{label}_minus_{baseline}"] = _difference([merged[label][k] for k in keys],
                                                             [merged[baseline][k] for k in keys]) if keys else None  # fmt: skip
        out[name] = entry
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="replay_validation.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, metavar="LABEL=REPLAY.json:ARM",
                        help="a trained arm of a finished replay; the first is the baseline (at least two)")
    parser.add_argument("--store", action="append", default=[], metavar="TRACKING_URI",
                        help="another MLflow store to look for models in (a replay run with MLFLOW_TRACKING_URI set)")
    parser.add_argument("--seeds", nargs="+", help="only these seeds (default: every seed all of them finished)")
    parser.add_argument("--output", type=Path, required=True, help="JSON path")
    args = parser.parse_args(argv)
    if not args.output.parent.is_dir():
        parser.error(f"--output {args.output}: the folder {args.output.parent} does not exist")

    import tempfile

    import replay as replay_script
    from pipelines.cli import configure_logging
    from recsys_alibi.atomic import write_json_atomic
    from replay_scoring import returning_users, validation_per_user

    configure_logging()
    models = read_models(args.model, args.store, parser)
    plan = planned_steps(models, args.seeds, parser)
    base = models[0][2]
    config, events, bounds = replay_script.replayed_log(base, [o for o in base.overrides if o.startswith("data.")])
    per: dict = {m[0]: {s: [] for s in SETS} for m in models}
    steps = []
    with tempfile.TemporaryDirectory(prefix="replay-validation-") as scratch_dir:
        for seed, common in plan:
            files = replay_script.write_periods(events, bounds, Path(scratch_dir) / f"periods-{seed}", common[-1])
            prepared = Path(scratch_dir) / "prepared"
            for k in common:
                replay_script.rebuild(config, files, prepared, k)
                back = {str(u) for u in returning_users(events, bounds[k - 1], bounds[k])}
                row = {"seed": int(seed), "step": k}
                for label, arm, _, runs, candidates in models:
                    record = next(st for st in runs[seed]["steps"] if st["step"] == k)
                    values = validation_per_user(load_from(record["arms"][arm]["uri"], candidates), prepared)
                    for name, users in (("all", sorted(values)), ("returning", sorted(u for u in values if u in back))):
                        per[label][name].append({f"{seed}/{k}/{u}": values[u] for u in users})
                        row[f"{label}_{name}_NDCG@10"] = float(np.mean([values[u][0] for u in users])) if users else None
                    row["returning_users"] = len([u for u in values if u in back])
                    row["validation_users"] = len(values)
                steps.append(row)
                print(f"seed {seed} step {k}: {row['returning_users']} of {row['validation_users']} validation users "
                      "returning; NDCG@10 returning " + ", ".join(f"{m[0]} {row[m[0] + '_returning_NDCG@10'] or 0:.4f}"
                                                                 for m in models), flush=True)  # fmt: skip
    paragraphs = __doc__.split("\n\n")
    out = {"command": command_line("benchmarks/replay_validation.py", argv), "machine": machine_line(),
           "protocol": " ".join(p.replace("\n", " ") for p in paragraphs[3:5]), "baseline": models[0][0],
           "sets": summarise(per, models[0][0]), "steps": steps}  # fmt: skip
    write_json_atomic(args.output, out)
    for name in SETS:
        print(f"{name}: " + "; ".join(
            f"{lab} {d['NDCG@10']['difference']:+.4f} [{d['NDCG@10']['ci95'][0]:+.4f}, {d['NDCG@10']['ci95'][1]:+.4f}]"
            for lab, d in out["sets"][name].items() if "_minus_" in lab and d))  # fmt: skip
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
