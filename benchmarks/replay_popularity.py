"""A popularity ranker on a finished replay's next periods, paired with the replay's arms.

Run from the repository root on a ``benchmarks/replay.py`` JSON (its ``.per_user.json`` beside it and the
replay's log where its command says; no models needed, a minute):

    .venv/bin/python benchmarks/replay_popularity.py docs/results/replay-ml100k.json

At each step ``k`` the step's prepared data (period 0, then periods 1..k appended, as the replay built it) gives
the catalog and every event before the boundary ``b_k``; the ranker scores each item by its number of those
events (``recsys_alibi.evaluation.baselines.PopularityScorer``: ties to the item seen last, then the raw id) and
ranks the replay's next-period targets (``replay.next_period_examples``: each test user's first next-period event
on a catalog item not in the history, full catalog, seen items excluded). It is the same list for every seed, so
each (seed, step, user) of the replay pairs with the step's popularity value. Writes ``--output`` (default
``REPLAY.popularity.json`` beside the replay; ``runs/`` for a replay under docs/results/) with the command, the
machine and per step the popularity NDCG@10 and HR@10, and
``popularity_minus_<arm>`` for every arm of the replay, pooled over (seed, step, user) with a percentile-bootstrap
95 % interval (``replay._difference``). Refused with one line (exit 2): a file that is not a finished replay, the
replay's log not there, a step whose test users differ from the replay's (another log or periods).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import polars as pl


def popularity_per_user(prepared: Path, examples: pl.DataFrame) -> dict[str, list[float]]:
    """{str(user_id): [NDCG@10, HR@10]} of the popularity ranker fitted on every event of ``prepared``, on the
    next-period ``examples`` (``history`` and one-item ``targets``, the step's numbering)."""
    import torch

    from recsys_alibi.data.loader import pad_right
    from recsys_alibi.data.prepare import read_items, read_sequences
    from recsys_alibi.data.splits import HISTORY, TARGETS
    from recsys_alibi.evaluation.baselines import PopularityScorer
    from recsys_alibi.evaluation.metrics import per_user_metrics
    from recsys_alibi.evaluation.ranking import mask_seen, target_ranks

    items = read_items(prepared).sort("item_idx")
    events = read_sequences(prepared).select(pl.col("item_idx").alias("history"), "timestamp")
    scorer = PopularityScorer().fit(events, n_items=items.height, item_ids=items["item_id"])
    history, lengths = pad_right([np.asarray(h) for h in examples[HISTORY].to_list()])  # (U, L), (U,)
    scores = mask_seen(scorer.score(history, lengths), history)  # (U, N + 1)
    targets = torch.tensor([t[0] for t in examples[TARGETS].to_list()], dtype=torch.int64)  # (U,)
    m = per_user_metrics(target_ranks(scores, targets).numpy(), [10])
    return {str(u): [float(n), float(h)] for u, n, h in zip(examples["user_id"].to_list(), m["NDCG@10"], m["HR@10"])}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="replay_popularity.py", description=__doc__.splitlines()[0])
    parser.add_argument("replay", type=Path, help="a finished benchmarks/replay.py JSON")
    parser.add_argument("--output", type=Path, help="JSON path (default: REPLAY.popularity.json beside it, runs/REPLAY.popularity.json for a replay in docs/results/)")
    args = parser.parse_args(argv)

    import replay as replay_script
    from pipelines.cli import configure_logging
    from recsys_alibi.atomic import write_json_atomic
    from recsys_alibi.diagnostics.machine import command_line, machine_line

    configure_logging()
    doc, r, runs, output = replay_script.read_for_output(args.replay, args.output, ".popularity.json", parser)
    config, events, bounds = replay_script.replayed_log(r, [o for o in r.overrides if o.startswith("data.")])
    finished = sorted({st["step"] for run in runs.values() for st in run.get("steps", [])})
    steps, values = {}, {}
    with tempfile.TemporaryDirectory(prefix="replay-popularity-") as scratch_dir:
        files = replay_script.write_periods(events, bounds, Path(scratch_dir) / "periods", finished[-1] if finished else 0)
        prepared = Path(scratch_dir) / "prepared"
        for k in finished:
            replay_script.rebuild(config, files, prepared, k)
            examples = replay_script.next_period_examples(prepared, events, bounds[k], bounds[k + 1], None)
            values[k] = popularity_per_user(prepared, examples)
            arr = np.array(list(values[k].values())).reshape(-1, 2)
            steps[str(k)] = {"test_users": len(values[k]), "NDCG@10": float(arr[:, 0].mean()) if len(arr) else None,
                             "HR@10": float(arr[:, 1].mean()) if len(arr) else None}  # fmt: skip
            print(f"step {k}: {len(values[k])} test users; popularity NDCG@10 {steps[str(k)]['NDCG@10'] or 0:.4f}",
                  flush=True)  # fmt: skip
    out = {"replay": str(args.replay), "command": command_line("benchmarks/replay_popularity.py", argv), "machine": machine_line(), "steps": steps}
    for arm in doc.get("arms", []):
        pop, other = [], []
        for seed, run in runs.items():
            for st in run.get("steps", []):
                scored = st["per_user"].get(arm)
                if scored is None:
                    continue
                if set(scored) != set(values[st["step"]]):
                    parser.error(f"seed {seed} step {st['step']}: the replay's test users are not this log's "
                                 "(another log, periods or data settings)")  # fmt: skip
                for user in sorted(scored):
                    pop.append(values[st["step"]][user])
                    other.append(scored[user])
        if pop:
            out[f"popularity_minus_{arm}"] = replay_script._difference(pop, other)
            d = out[f"popularity_minus_{arm}"]["NDCG@10"]
            print(f"popularity - {arm}: NDCG@10 {d['difference']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}] "
                  f"over {d['pairs']} (seed, step, user) pairs")  # fmt: skip
    write_json_atomic(output, out)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
