"""Pool outputs of ``benchmarks/replay_prior.py`` over disjoint seeds of one replayed log.

A seed added to a replay later (trained in another tracking store, or after the earlier seeds' models were
gone) is scored alone (``replay_prior.py REPLAY --seeds S``); this pools its per-user values with the earlier
outputs' into one set of paired differences over every (seed, step, user), as if one run had scored them all.
Run from the repository root (seconds):

    .venv/bin/python benchmarks/replay_prior_pool.py docs/results/replay-ml1m.prior.json \\
        docs/results/replay-ml1m-seed3.prior.json --output runs/replay-ml1m-seeds1-3.prior.json

Writes ``--output``: the command, the machine, the inputs, their arm, ``seeds``, ``chosen`` (each seed's walk-forward choices, as its input
made them), ``mean_NDCG@10`` of the arm, ``prior``, ``recent`` and ``stale_prior`` (the previous model of the chain
with the same choice), and the percentile-bootstrap paired differences ``prior_minus_arm``,
``prior_minus_recent``, ``recent_minus_arm`` and ``prior_minus_stale_with_prior`` (``replay._difference``), the
last also per step over the seeds (``by_step``: does retraining pay after a small append?). When
every input was made ``--against`` another chain, also ``prior_minus_their_prior`` and ``arm_minus_their_arm``
over the (seed, step, user) each input shares with its own ``--against`` file (``against_arm`` names that chain).

Refused with one line (exit 2): an input that is not an output of ``replay_prior.py`` with its per-user file,
inputs of different arms or of replays of different logs or periods (``replay.log_key``) or chains (a gated
and an ungated one, ``replay.py --gate``), a (seed, step, user)
in two inputs, some inputs made ``--against`` another chain and others not, an ``--output`` that is an input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAMES = ("arm", "prior", "recent", "stale_prior")  # the per-user columns of replay_prior.py, in its order


def _read(path: Path, parser) -> tuple[dict, dict]:
    """(the output's JSON, its per-user values {"seed/step/user": [[NDCG@10, HR@10] per NAMES]}); refused with one
    line when it is not an output of ``replay_prior.py``."""
    try:
        doc = json.loads(path.read_text())
        values = json.loads(path.with_suffix(".per_user.json").read_text())
        if not isinstance(doc.get("arm"), str) or not isinstance(doc.get("replay"), str):
            raise ValueError("no 'arm' or 'replay'")
        return doc, {key: [[float(x) for x in v] for v in rows[: len(NAMES)]] for key, rows in values.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        parser.error(f"{path}: not an output of replay_prior.py with its .per_user.json ({err})")


def _log_key(doc: dict, path: Path, parser) -> tuple:
    """The replayed log and periods an output was made on (``replay.log_key`` of its replay's command), and whether
    its chain went through the pipeline's gate (``--gate``: another chain, never pooled with an ungated one)."""
    import replay as replay_script

    replay_path = Path(doc["replay"])
    if not replay_path.is_file():
        parser.error(f"{path}: its replay {replay_path} is not there: run from the folder it was made in")
    _, args, _ = replay_script.read_replay(replay_path, parser)
    return (*replay_script.log_key(args), args.gate)


def pool(inputs: list[tuple[Path, dict, dict]], parser) -> dict:
    """The pooled document (module doc) of ``inputs``: (path, JSON, per-user values) of each output."""
    import replay as replay_script

    arms = {doc["arm"] for _, doc, _ in inputs}
    if len(arms) > 1:
        parser.error(f"the inputs score different arms ({', '.join(sorted(arms))}): pool one chain at a time")
    keys = [tuple(_log_key(doc, path, parser)) for path, doc, _ in inputs]
    if len(set(keys)) > 1:
        parser.error("the inputs come from replays of different logs, periods or chains (config, input, format, "
                     "start, period days, --gate): " + "; ".join(f"{path}: {key}" for (path, _, _), key in zip(inputs, keys)))
    values: dict[str, list] = {}
    for path, _, mine in inputs:
        twice = sorted(set(values) & set(mine))
        if twice:
            parser.error(f"{path}: (seed, step, user) {twice[0]} is in another input too: pool disjoint seeds")
        values.update(mine)
    with_against = [doc.get("against") is not None for _, doc, _ in inputs]
    if any(with_against) and not all(with_against):
        parser.error("some inputs were made --against another chain and some not: pool like with like")
    order = sorted(values)
    column = {name: [values[key][i] for key in order] for i, name in enumerate(NAMES)}
    users = [key.split("/")[2] for key in order]
    out = {
        "inputs": [str(path) for path, _, _ in inputs], "arm": arms.pop(),
        "seeds": sorted({key.split("/")[0] for key in order}, key=lambda s: (len(s), s)),
        "chosen": {seed: steps for _, doc, _ in inputs for seed, steps in doc.get("chosen", {}).items()},
        "mean_NDCG@10": {name: sum(v[0] for v in rows) / len(rows) for name, rows in column.items()},
        "prior_minus_arm": replay_script._difference(column["prior"], column["arm"], users=users),
        "prior_minus_recent": replay_script._difference(column["prior"], column["recent"], users=users),
        "recent_minus_arm": replay_script._difference(column["recent"], column["arm"], users=users),
        "prior_minus_stale_with_prior": replay_script._difference(column["prior"], column["stale_prior"], users=users),
    }  # fmt: skip
    at_step: dict[str, list] = {}  # the same per step, over the seeds
    for key in order:
        at_step.setdefault(key.split("/")[1], []).append(values[key])
    out["by_step"] = {k: {"prior_minus_stale_with_prior": replay_script._difference([v[1] for v in rows], [v[3] for v in rows])}
                      for k, rows in sorted(at_step.items(), key=lambda item: int(item[0]))}  # fmt: skip
    if all(with_against):
        mine_prior, their_prior, mine_arm, their_arm, their_arms, paired_users = [], [], [], [], set(), []
        for path, doc, mine in inputs:
            against = Path(doc["against"]["file"])
            their_doc, theirs = _read(against, parser)
            their_arms.add(their_doc["arm"])
            for key in sorted(set(mine) & set(theirs)):
                mine_prior.append(mine[key][1])
                their_prior.append(theirs[key][1])
                mine_arm.append(mine[key][0])
                their_arm.append(theirs[key][0])
                paired_users.append(key.split("/")[2])
        if len(their_arms) > 1 or not mine_prior:
            parser.error("the inputs' --against files score different chains or share no (seed, step, user) with them")
        out["against_arm"] = their_arms.pop()
        out["prior_minus_their_prior"] = replay_script._difference(mine_prior, their_prior, users=paired_users)
        out["arm_minus_their_arm"] = replay_script._difference(mine_arm, their_arm, users=paired_users)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="replay_prior_pool.py", description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="outputs of replay_prior.py (disjoint seeds)")
    parser.add_argument("--output", type=Path, required=True, help="JSON path")
    args = parser.parse_args(argv)

    from recsys_alibi.atomic import write_json_atomic
    from recsys_alibi.diagnostics.machine import command_line, machine_line

    if args.output.resolve() in {p.resolve() for p in args.inputs} or args.output.resolve().is_dir():
        parser.error(f"--output {args.output}: one of the inputs, or a folder")
    out = {"command": command_line("benchmarks/replay_prior_pool.py", argv), "machine": machine_line(), **pool([(path, *_read(path, parser)) for path in args.inputs], parser)}
    for name in ("prior_minus_arm", "prior_minus_recent", "prior_minus_stale_with_prior", "prior_minus_their_prior",
                 "arm_minus_their_arm"):  # fmt: skip
        if name in out:
            d = out[name]["NDCG@10"]
            print(f"{name}: NDCG@10 {d['difference']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}] (resampling users "
                  f"[{d['ci95_by_user'][0]:+.4f}, {d['ci95_by_user'][1]:+.4f}]) over {d['pairs']} pairs")
    write_json_atomic(args.output, out)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
