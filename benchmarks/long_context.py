"""Training tokens/s and peak memory against ``model.max_len``: random padded batches vs length buckets.

For each max_len, the training windows (each history's last ``max_len + 1`` events) go through
optimiser steps of the ranker either in batches of ``--batch-size`` windows drawn at random and
padded to the batch's longest window (the default ``train`` path) or in length-bucketed batches of
at most ``--batch-tokens`` padded tokens (``train.batch_tokens``, ``recsys_alibi.data.buckets``).
Every (max_len, mode) runs in a fresh process so that its peak RSS (``ru_maxrss``) is its own;
``peak_rss_gib`` includes the data and the model (the same for both modes), ``tokens_per_second``
counts supervised positions only.

Usage (from the repository root, after ``recsys-alibi prepare`` of some data):

    .venv/bin/python -m benchmarks.long_context --prepared runs/default/prepared --max-lens 200 1000 3000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
from pathlib import Path


def _run(prepared: str, max_len: int, mode: str, batch_size: int, batch_tokens: int, steps: int, threads: int) -> dict:
    import numpy as np
    import torch

    from benchmarks.training import _on_device, make_step, measure
    from recsys_alibi.config import ModelConfig, TrainConfig
    from recsys_alibi.data.buckets import LengthBuckets
    from recsys_alibi.data.loader import FlatSequences, NextItemWindows, collate_next_item
    from recsys_alibi.data.prepare import read_items, read_sequences
    from recsys_alibi.data.splits import leave_one_out
    from recsys_alibi.training.module import RankerModule

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    histories = FlatSequences.from_series(leave_one_out(read_sequences(prepared), "train").get_column("history"))
    n_items = read_items(prepared).height
    dataset = NextItemWindows(histories, max_len)
    if mode == "buckets":
        groups = LengthBuckets(dataset.ends - dataset.starts, batch_tokens, batch_size, seed=0).batches(0)
    else:
        order = np.random.default_rng(0).permutation(len(dataset))
        groups = [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]
    batches = [collate_next_item([dataset[i] for i in g]) for g in groups[: steps + 2]]
    computed = sum(b["inputs"].numel() for b in batches[2:])
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, max_len=max_len, attention_backend="sdpa", free_heads=1)
    module = RankerModule(cfg, TrainConfig(), n_items, torch.ones(n_items + 1, dtype=torch.int64))
    device = torch.device("cpu")
    out = measure(make_step(module, device, bf16=False), [_on_device(b, device) for b in batches], 2, device)
    out.update(max_len=max_len, mode=mode, batches_per_epoch=len(groups), padding_waste=1 - out["tokens"] / computed,
               mean_rows=float(np.mean([len(g) for g in groups])),
               peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepared", type=Path, required=True)
    parser.add_argument("--max-lens", type=int, nargs="+", default=[200, 1000, 3000])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = []
    ctx = multiprocessing.get_context("spawn")
    for max_len in args.max_lens:
        for mode in ("random", "buckets"):
            with ctx.Pool(1) as pool:
                r = pool.apply(_run, (str(args.prepared), max_len, mode, args.batch_size, args.batch_tokens,
                                      args.steps, args.threads))  # fmt: skip
            results.append(r)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
    print("| max_len | batches | mean rows | tokens/s random | tokens/s buckets | peak RSS GiB random | buckets |")
    print("|---|---|---|---|---|---|---|")
    for max_len in args.max_lens:
        a, b = (next(r for r in results if r["max_len"] == max_len and r["mode"] == m) for m in ("random", "buckets"))
        print(f"| {max_len} | {a['batches_per_epoch']} / {b['batches_per_epoch']} | {a['mean_rows']:.0f} / {b['mean_rows']:.0f} "
              f"| {a['tokens_per_second']:.0f} | {b['tokens_per_second']:.0f} | {a['peak_rss_gib']:.2f} | {b['peak_rss_gib']:.2f} |")
    if args.json:
        from recsys_alibi.atomic import write_text_atomic

        write_text_atomic(args.json, json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
