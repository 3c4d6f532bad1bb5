"""The Markdown tables of docs/results.md's "Replay" section, from a JSON of ``benchmarks/replay.py``.

Run: ``python benchmarks/replay_tables.py docs/results/replay-ml100k.json`` prints the per-step table
(every seed), the pooled line and the target-kind table, so the docs quote the JSON and nothing else.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ARMS = ("scratch", "warm", "stale")


def _ci(d: dict) -> str:
    return f"{d['difference']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]"


def step_rows(doc: dict) -> list[str]:
    """One row per (seed, step): dates, growth, test users, NDCG@10 per arm, warm - scratch, epochs, seconds."""
    out = [
        "| seed | step | trained on events before | new events / users / items | test users | scratch | warm | stale "
        "| warm - scratch [95 % CI] | epochs scratch / warm | train s scratch / warm |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for seed, run in doc["runs"].items():
        for s in run.get("steps", []):
            a = s["arms"]
            out.append(
                f"| {seed} | {s['step']} | {s['period_end']} | {s['new_events']:,} / {s['new_users']} / {s['new_items']} "
                f"| {s['test_users']} | " + " | ".join(f"{a[arm]['NDCG@10']:.4f}" for arm in ARMS)
                + f" | {_ci(s['differences']['warm_minus_scratch']['NDCG@10'])} "
                f"| {a['scratch']['epochs']} / {a['warm']['epochs']} "
                f"| {a['scratch']['train_seconds']:.0f} / {a['warm']['train_seconds']:.0f} |"
            )
    return out


def pooled_line(doc: dict) -> str:
    """Warm - scratch and warm - stale pooled over (seed, step, user), and the training-time ratio."""
    parts = []
    for other in ("scratch", "stale"):
        p = doc[f"pooled_warm_minus_{other}"]
        parts.append(f"warm - {other} NDCG@10 {_ci(p['NDCG@10'])}, HR@10 {_ci(p['HR@10'])}")
    pairs = doc["pooled_warm_minus_scratch"]["NDCG@10"]["pairs"]
    seeds = [seed for seed, run in doc["runs"].items() if run.get("steps")]
    return (f"Pooled over seeds {', '.join(seeds)} ({pairs} (seed, step, user) pairs): " + "; ".join(parts)
            + f"; warm / scratch training time {doc['warm_over_scratch_train_time']:.2f}.")  # fmt: skip


def kind_rows(doc: dict) -> list[str]:
    """Targets by when their item entered the catalog, per arm: n / HR@10 / NDCG@10."""
    kinds = doc["by_target_kind"]
    out = ["| target kind | " + " | ".join(f"{arm} n / HR@10 / NDCG@10" for arm in ARMS) + " |", "|---|---|---|---|"]
    for kind in ("new_this_period", "new_earlier", "older"):
        cells = []
        for arm in ARMS:
            k = kinds[arm][kind]
            cells.append(f"{k['n']} / -" if not k["n"] else f"{k['n']} / {k['HR@10']:.3f} / {k['NDCG@10']:.4f}")
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    share = " | ".join(f"{kinds[arm]['top10_share_new']:.4f}" for arm in ARMS)
    return [*out, f"| top-10 share of items new this period | {share} |"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path)
    doc = json.loads(parser.parse_args(argv).json.read_text())
    print("\n".join([*step_rows(doc), "", pooled_line(doc), "", *kind_rows(doc)]))


if __name__ == "__main__":
    main()
