"""Next-period NDCG@10 and HR@10 of arms of finished replays, paired per (seed, step, user).

Run from the repository root on two or more ``benchmarks/replay.py`` JSONs of the same log and periods
(their ``.per_user.json`` beside them; no models needed, seconds):

    .venv/bin/python benchmarks/replay_pair.py \\
        --model rule=docs/results/replay-ml100k-lr2x.json:warm \\
        --model opt=docs/results/replay-ml100k-optstate.json:warm --steps 1-4

Each ``--model LABEL=REPLAY.json:ARM`` names one arm (``stale`` too) of one replay; the first is the baseline.
The pairs are the (seed, step, user) every arm scored (a user is one target of the next period, the same in
every replay of the same log and periods); ``--steps A-B`` keeps steps A to B. Prints, and with ``--output``
writes, ``<label>_minus_<baseline>`` with a percentile-bootstrap 95 % interval (``replay._difference``), the
number of pairs, and per label the mean. Refused with one line (exit 2): a malformed value, a file that is not
a finished replay, an arm it did not run, replays of another log or other periods, a user whose target kind
differs between replays, no pair in common.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

SAME = ("config", "input", "format", "start", "period_days")


def read_arms(items: list[str], parser) -> list[tuple[str, dict]]:
    """``--model`` values -> (label, {(seed, step, user): ((NDCG@10, HR@10), target kind)}); refused with one
    line (``parser.error``) as the module doc says."""
    import replay as replay_script

    out, base = [], None
    for item in items:
        label, arm, _, args, runs = replay_script.read_arm_option(item, parser)
        if base is not None and [getattr(args, k) for k in SAME] != [getattr(base, k) for k in SAME]:
            parser.error(f"--model {label}: a replay of another log or other periods than {out[0][0]}'s")
        base = base or args
        values = {}
        for seed, state in runs.items():
            for step in state.get("steps", []):
                for user, v in step["per_user"].get(arm, {}).items():
                    values[(seed, int(step["step"]), user)] = (tuple(v), step["target_kinds"][user])
        out.append((label, values))
    if len(out) < 2 or len({label for label, _ in out}) < len(out):
        parser.error("--model: at least two, with different labels")
    return out


def pair(arms: list[tuple[str, dict]], steps: tuple[int, int] | None, parser) -> dict:
    """The paired differences against the first arm over the keys every arm holds (module doc)."""
    import replay as replay_script

    keys = set.intersection(*(set(values) for _, values in arms))
    if steps is not None:
        keys = {k for k in keys if steps[0] <= k[1] <= steps[1]}
    keys = sorted(keys, key=lambda k: (int(k[0]), k[1], k[2]))
    if not keys:
        parser.error("no (seed, step, user) that every --model scored")
    for k in keys:
        if len({values[k][1] for _, values in arms}) > 1:
            parser.error(f"seed {k[0]} step {k[1]} user {k[2]}: the replays' targets differ (not the same log)")
    (base_label, base), *others = arms
    b = [base[k][0] for k in keys]
    out = {"pairs": len(keys), "steps": sorted({k[1] for k in keys}), "seeds": sorted({k[0] for k in keys}, key=int),
           "mean_NDCG@10": {label: float(np.mean([v[k][0][0] for k in keys])) for label, v in arms}}  # fmt: skip
    for label, values in others:
        out[f"{label}_minus_{base_label}"] = replay_script._difference([values[k][0] for k in keys], b)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, metavar="LABEL=REPLAY.json:ARM",
                        help="an arm of a finished replay; the first is the baseline (at least two)")
    parser.add_argument("--steps", metavar="A-B", help="only steps A to B (default: every step)")
    parser.add_argument("--output", type=Path, help="JSON path (default: print only)")
    args = parser.parse_args(argv)
    steps = None
    if args.steps is not None:
        low, _, high = args.steps.partition("-")
        if not (low.isdigit() and high.isdigit() and int(low) <= int(high)):
            parser.error(f"--steps {args.steps}: expected A-B with A <= B, e.g. 1-4")
        steps = (int(low), int(high))
    if args.output is not None and not args.output.parent.is_dir():
        parser.error(f"--output {args.output}: its folder does not exist")
    out = pair(read_arms(args.model, parser), steps, parser)
    for key, d in out.items():
        if "_minus_" in key:
            n = d["NDCG@10"]
            print(f"{key}: NDCG@10 {n['difference']:+.4f} [{n['ci95'][0]:+.4f}, {n['ci95'][1]:+.4f}] "
                  f"over {out['pairs']} (seed, step, user) pairs")  # fmt: skip
    if args.output is not None:
        from recsys_alibi.atomic import write_json_atomic

        write_json_atomic(args.output, out)
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
