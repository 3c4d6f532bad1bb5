"""The Markdown tables of docs/results.md's "Replay" section, from a JSON of ``benchmarks/replay.py``.

Run: ``python benchmarks/replay_tables.py docs/results/replay-ml100k.json`` prints the per-step table
(every seed), the pooled line and the target-kind table, so the docs quote the JSON and nothing else.
The columns are the arms the JSON holds (its ``arms``, in that order; ``scratch``, ``warm`` and
``stale`` when it does not say), and the pooled line every ``pooled_A_minus_B`` comparison in it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DEFAULT_ARMS = ("scratch", "warm", "stale")


def arms_of(doc: dict) -> list[str]:
    """The arms of the replay, in the order it ran them."""
    return list(doc.get("arms") or DEFAULT_ARMS)


def _ci(d: dict) -> str:
    return f"{d['difference']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]"


def _headline(doc: dict) -> str:
    """The comparison of the step table: warm - scratch where both ran, else the replay's first one."""
    keys = [k.removeprefix("pooled_") for k in doc if k.startswith("pooled_")]
    return "warm_minus_scratch" if "warm_minus_scratch" in keys else keys[0]


def _trained(doc: dict) -> list[str]:
    """The arms whose epochs and seconds the step table shows: scratch and warm where both ran."""
    arms = arms_of(doc)
    return ["scratch", "warm"] if {"scratch", "warm"} <= set(arms) else [a for a in arms if a != "stale"]


def step_rows(doc: dict) -> list[str]:
    """One row per (seed, step): dates, growth, test users, NDCG@10 per arm, the headline difference, epochs, seconds."""
    arms, key, trained = arms_of(doc), _headline(doc), _trained(doc)
    out = [
        "| seed | step | trained on events before | new events / users / items | test users | " + " | ".join(arms)
        + f" | {key.replace('_minus_', ' - ')} [95 % CI] | epochs {' / '.join(trained)} | train s {' / '.join(trained)} |",
        "|---|---|---|---|---|" + "---|" * len(arms) + "---|---|---|",
    ]
    for seed, run in doc["runs"].items():
        for s in run.get("steps", []):
            a = s["arms"]
            epochs = " / ".join(str(a[t]["epochs"]) for t in trained)
            seconds = " / ".join(f"{a[t]['train_seconds']:.0f}" for t in trained)
            out.append(
                f"| {seed} | {s['step']} | {s['period_end']} | {s['new_events']:,} / {s['new_users']} / {s['new_items']} "
                f"| {s['test_users']} | " + " | ".join(f"{a[arm]['NDCG@10']:.4f}" for arm in arms)
                + f" | {_ci(s['differences'][key]['NDCG@10'])} "
                f"| {epochs} | {seconds} |"
            )
    return out


def pooled_line(doc: dict) -> str:
    """Every pooled comparison (the headline first) over (seed, step, user), and the training-time ratio."""
    first = f"pooled_{_headline(doc)}"
    parts = []
    for key in sorted((k for k in doc if k.startswith("pooled_")), key=lambda k: k != first):
        p = doc[key]
        a, b = key.removeprefix("pooled_").split("_minus_")
        parts.append(f"{a} - {b} NDCG@10 {_ci(p['NDCG@10'])}, HR@10 {_ci(p['HR@10'])}")
    pairs = doc[first]["NDCG@10"]["pairs"]
    seeds = [seed for seed, run in doc["runs"].items() if run.get("steps")]
    ratio = doc.get("warm_over_scratch_train_time")
    timing = "" if ratio is None else f"; warm / scratch training time {ratio:.2f}"
    if doc.get("warm_over_scratch_epochs") is not None:
        timing += f" (in epochs {doc['warm_over_scratch_epochs']:.2f})"
    trend = doc.get(first.replace("pooled_", "trend_", 1))
    if trend:  # replays written before the trend was computed lack it
        t = trend["NDCG@10"]
        timing += f"; trend of {_headline(doc).replace('_minus_', ' - ')} NDCG@10 {t['slope_per_step']:+.4f} per step " \
                  f"[{t['ci95'][0]:+.4f}, {t['ci95'][1]:+.4f}]"  # fmt: skip
    return f"Pooled over seeds {', '.join(seeds)} ({pairs} (seed, step, user) pairs): " + "; ".join(parts) + timing + "."


def kind_rows(doc: dict) -> list[str]:
    """Targets by when their item entered the catalog, per arm: n / HR@10 / NDCG@10."""
    kinds, arms = doc["by_target_kind"], arms_of(doc)
    out = ["| target kind | " + " | ".join(f"{arm} n / HR@10 / NDCG@10" for arm in arms) + " |", "|---|" + "---|" * len(arms)]
    for kind in ("new_this_period", "new_earlier", "older"):
        cells = []
        for arm in arms:
            k = kinds[arm][kind]
            cells.append(f"{k['n']} / -" if not k["n"] else f"{k['n']} / {k['HR@10']:.3f} / {k['NDCG@10']:.4f}")
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    share = " | ".join("-" if kinds[arm]["top10_share_new"] is None else f"{kinds[arm]['top10_share_new']:.4f}" for arm in arms)
    return [*out, f"| top-10 share of items new this period | {share} |"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path)
    doc = json.loads(parser.parse_args(argv).json.read_text())
    print("\n".join([*step_rows(doc), "", pooled_line(doc), "", *kind_rows(doc)]))


if __name__ == "__main__":
    main()
