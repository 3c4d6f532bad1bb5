"""Training throughput, padded vs packed batches, on the ML-1M history-length distribution.

The same batches of users (last ``max_len + 1`` events of each training history) go through one
optimiser step of the ranker either right-padded to the batch's longest window or packed several
users to a row of ``max_len`` positions (``train.packing``). Reported: padding waste (share of
computed positions that are padding) and real training tokens (supervised positions) per second,
wall and per CPU second (``time.process_time``, steadier on a shared machine). A third run,
packed with the plain softmax over materialised logits, measures the fused chunked loss
(``recsys_alibi.training.losses``); a fourth runs packed under bf16 autocast (``train.precision=
bf16-mixed``; pays off where the CPU has AVX512-BF16 or AMX).

Usage (from the repository root, after ``recsys-alibi prepare`` of ML-1M):

    .venv/bin/python benchmarks/training.py --prepared runs/movielens-1m/prepared --steps 12
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from recsys_alibi.config import ModelConfig, TrainConfig
from recsys_alibi.data.loader import FlatSequences, NextItemWindows, collate_next_item, collate_packed_next_item
from recsys_alibi.data.prepare import read_items, read_sequences
from recsys_alibi.data.splits import leave_one_out
from recsys_alibi.training.module import RankerModule


class PlainSoftmaxLoss(torch.nn.Module):
    """The full softmax over materialised (T, N + 1) logits: what the fused loss replaced."""

    def forward(self, hidden, targets, table):
        logits = hidden @ table.T
        logits[:, 0] = float("-inf")
        return torch.nn.functional.cross_entropy(logits, targets)


def _step(module: RankerModule, optimizer, batch, bf16: bool = False) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = module.training_step(batch, 0)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(module, batches, warmup: int = 2, bf16: bool = False) -> dict[str, float]:
    """Seconds per step and real tokens/s over ``batches`` (after ``warmup`` untimed steps)."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    module.log = lambda *a, **k: None  # no trainer attached
    for batch in batches[:warmup]:
        _step(module, optimizer, batch, bf16)
    timed = batches[warmup:]
    tokens = sum(int((b["targets"] > 0).sum()) for b in timed)
    computed = sum(b["inputs"].numel() for b in timed)
    started, cpu_started = time.perf_counter(), time.process_time()
    for batch in timed:
        _step(module, optimizer, batch, bf16)
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    return {
        "steps": len(timed),
        "seconds_per_step": seconds / len(timed),
        "cpu_seconds_per_step": cpu_seconds / len(timed),
        "tokens_per_second": tokens / seconds,
        "padding_waste": 1 - tokens / computed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepared", type=Path, default=Path("runs/movielens-1m/prepared"))
    parser.add_argument("--max-len", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    histories = FlatSequences.from_series(leave_one_out(read_sequences(args.prepared), "train").get_column("history"))
    n_items = read_items(args.prepared).height
    dataset = NextItemWindows(histories, args.max_len)
    order = np.random.default_rng(0).permutation(len(dataset))
    groups = [[dataset[int(i)] for i in order[s * args.batch_size : (s + 1) * args.batch_size]] for s in range(args.steps)]
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=2, max_len=args.max_len, attention_backend="sdpa")
    results = {}
    packed = lambda g: collate_packed_next_item(g, row_len=args.max_len)  # noqa: E731
    for name, collate, plain_loss, bf16 in (
        ("padded", collate_next_item, False, False),
        ("packed", packed, False, False),
        ("packed_plain_softmax", packed, True, False),
        ("packed_bf16_autocast", packed, False, True),
    ):
        torch.manual_seed(0)
        module = RankerModule(cfg, TrainConfig(), n_items, torch.ones(n_items + 1, dtype=torch.int64))
        if plain_loss:
            module.loss = PlainSoftmaxLoss()
        results[name] = measure(module, [collate(g) for g in groups], bf16=bf16)
        print(name, {k: round(v, 4) for k, v in results[name].items()}, flush=True)
    results["packed_speedup"] = results["packed"]["tokens_per_second"] / results["padded"]["tokens_per_second"]
    results["fused_loss_speedup"] = (
        results["packed"]["tokens_per_second"] / results["packed_plain_softmax"]["tokens_per_second"]
    )
    print(f"packed / padded tokens/s: {results['packed_speedup']:.2f}x")
    print(f"fused / plain softmax loss tokens/s (packed): {results['fused_loss_speedup']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
