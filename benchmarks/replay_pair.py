"""Next-period NDCG@10 and HR@10 of arms of finished replays, paired per (seed, step, user).

Run from the repository root on two or more ``benchmarks/replay.py`` JSONs of the same log and periods
(their ``.per_user.json`` beside them; no models needed, seconds):

    .venv/bin/python benchmarks/replay_pair.py \\
        --model rule=docs/results/replay-ml100k.json:warm \\
        --model opt=docs/results/replay-ml100k-optstate.json:warm --steps 1-4

Each ``--model LABEL=REPLAY.json:ARM`` names one arm (``stale`` too) of one replay; the first is the baseline.
The pairs are the (seed, step, user) of the steps every replay finished (a replay still running gives its
finished steps); ``--steps A-B`` keeps steps A to B. Replays of the same log and periods have the same test
users and targets at a step, and that is checked. Prints, and with ``--output`` writes, per label the mean
NDCG@10 and ``<label>_minus_<baseline>`` with a percentile-bootstrap 95 % interval (``replay._difference``) and
the number of pairs. Refused with one line (exit 2): a malformed value, a file that is not a replay or whose
per-user file is malformed, an arm it did not run, replays of another log or other periods, a step whose test
users or targets differ between replays, no pair in common, an ``--output`` that is a folder, lies in none, or
is one of the inputs.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from recsys_alibi.diagnostics.machine import command_line, machine_line

def _per_user(runs, arm: str) -> dict[tuple[int, int, str], tuple[tuple[float, float], str]]:
    """{(seed, step, user): ((NDCG@10, HR@10), target kind)} of one arm of a replay's per-user runs.

    Raises:
        ValueError, KeyError, TypeError, IndexError, AttributeError: a malformed per-user file.
    """
    values = {}
    for seed, state in runs.items():
        for step in state.get("steps", []):
            k, kinds = int(step["step"]), step["target_kinds"]
            for user, v in step["per_user"].get(arm, {}).items():
                ndcg, hr = (float(v[0]), float(v[1])) if len(v) == 2 else (math.nan, math.nan)
                if not (math.isfinite(ndcg) and math.isfinite(hr)):
                    raise ValueError(f"seed {seed} step {k} user {user}: {v!r} is not two finite numbers")
                values[(int(seed), k, str(user))] = ((ndcg, hr), kinds[user])
    return values


def read_arms(items: list[str], parser) -> list[tuple[str, Path, dict]]:
    """``--model`` values -> (label, the replay's path, :func:`_per_user` of its arm); refused with one line
    (``parser.error``) as the module doc says."""
    import replay as replay_script

    out, base = [], None
    for item in items:
        label, arm, _, args, runs = replay_script.read_arm_option(item, parser)
        path = Path(item.partition("=")[2].rpartition(":")[0])
        same = replay_script.log_key(args)
        if base is not None and same != base:
            parser.error(f"--model {label}: a replay of another log or other periods than {out[0][0]}'s")
        base = base or same
        try:
            values = _per_user(runs, arm)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
            parser.error(f"{path.with_suffix('.per_user.json')}: not a replay's per-user file ({err!r})")
        out.append((label, path, values))
    if len(out) < 2 or len({label for label, _, _ in out}) < len(out):
        parser.error("--model: at least two, with different labels")
    return out


def pair(arms: list[tuple[str, Path, dict]], steps: tuple[int, int] | None, parser) -> dict:
    """The paired differences against the first arm over the (seed, step, user) every arm holds (module doc)."""
    import replay as replay_script

    def users_by_step(values: dict) -> dict:
        out: dict = {}
        for seed, k, user in values:
            out.setdefault((seed, k), set()).add(user)
        return out

    by_step = [users_by_step(values) for _, _, values in arms]
    finished = set.intersection(*(set(b) for b in by_step))  # (seed, step) every replay finished
    common = finished
    for seed, k in sorted(common):
        if any(b[(seed, k)] != by_step[0][(seed, k)] for b in by_step[1:]):
            parser.error(f"seed {seed} step {k}: the replays' test users differ (not the same log and periods)")
    if steps is not None:
        common = {(seed, k) for seed, k in common if steps[0] <= k <= steps[1]}
    keys = sorted((seed, k, user) for seed, k in common for user in by_step[0][(seed, k)])
    if not keys:
        ran = sorted({k for _, k in finished})
        parser.error(f"no (seed, step, user) that every --model scored{' in steps %d-%d' % steps if steps else ''} "
                     f"(the steps all of them finished: {ran or 'none'})")  # fmt: skip
    for key in keys:
        if len({values[key][1] for _, _, values in arms}) > 1:
            parser.error(f"seed {key[0]} step {key[1]} user {key[2]}: the replays' targets differ (not the same log)")
    (base_label, _, base), *others = arms
    b = [base[k][0] for k in keys]
    out = {"pairs": len(keys), "steps": sorted({k[1] for k in keys}), "seeds": sorted({k[0] for k in keys}),
           "mean_NDCG@10": {label: sum(v[k][0][0] for k in keys) / len(keys) for label, _, v in arms}}  # fmt: skip
    for label, _, values in others:
        out[f"{label}_minus_{base_label}"] = replay_script._difference([values[k][0] for k in keys], b,
                                                                        users=[k[2] for k in keys])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="replay_pair.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, metavar="LABEL=REPLAY.json:ARM",
                        help="an arm of a finished replay; the first is the baseline (at least two)")
    parser.add_argument("--steps", metavar="A-B", help="only steps A to B (default: every step)")
    parser.add_argument("--output", type=Path, help="JSON path (default: print only)")
    args = parser.parse_args(argv)
    steps = None
    if args.steps is not None:
        match = re.fullmatch(r"([0-9]+)-([0-9]+)", args.steps)
        if match is None or int(match[1]) > int(match[2]):
            parser.error(f"--steps {args.steps}: expected A-B with A <= B, e.g. 1-4")
        steps = (int(match[1]), int(match[2]))
    arms = read_arms(args.model, parser)
    if args.output is not None:
        target = args.output.resolve()
        if target.is_dir() or not target.parent.is_dir():
            parser.error(f"--output {args.output}: " + ("a folder" if target.is_dir() else "its folder does not exist"))
        inputs = {p.resolve() for _, path, _ in arms for p in (path, path.with_suffix(".per_user.json"))}
        if target in inputs:
            parser.error(f"--output {args.output}: one of the replays read (it would be overwritten)")
    out = {"command": command_line("benchmarks/replay_pair.py", argv), "machine": machine_line(), **pair(arms, steps, parser)}
    print(f"{out['pairs']} (seed, step, user) pairs, seeds {out['seeds']}, steps {out['steps']}; mean NDCG@10 "
          + ", ".join(f"{label} {mean:.4f}" for label, mean in out["mean_NDCG@10"].items()))  # fmt: skip
    for key, d in out.items():
        if "_minus_" in key:
            n = d["NDCG@10"]
            print(f"{key}: NDCG@10 {n['difference']:+.4f} [{n['ci95'][0]:+.4f}, {n['ci95'][1]:+.4f}] "
                  f"(resampling {n['users']} users [{n['ci95_by_user'][0]:+.4f}, {n['ci95_by_user'][1]:+.4f}])")
    if args.output is not None:
        from recsys_alibi.atomic import write_json_atomic

        try:
            write_json_atomic(args.output, out)
        except (OSError, ValueError) as err:  # OutputKindError is a ValueError
            parser.error(f"--output {args.output}: cannot be written ({err})")
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
