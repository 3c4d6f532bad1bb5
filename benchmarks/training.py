"""Training-step throughput and memory on CPU or CUDA: the ML-1M recipe and long windows, flex vs sdpa.

``--mode backends`` (default): for each max_len in ``--lengths`` and each attention backend in
``--backends``, the ranker of ``configs/movielens-1m.yaml`` (d_model 128, 2 layers, 2 heads,
dropout 0.2, full softmax cross-entropy, fused and chunked; packed rows; bf16 autocast on CUDA)
takes ``--steps`` timed optimiser steps (AdamW, gradient clipping 1.0, as the Lightning step
does) after ``--warmup`` untimed ones (flex compiles there). Reported per case: training tokens
(supervised positions) per second, seconds per ML-1M epoch (the recipe's epoch of windows of
that length, at the measured rate), seconds per step, peak memory (CUDA:
``torch.cuda.max_memory_allocated`` over the timed steps) and host synchronisations in one step
(CUDA: ``torch.cuda.set_sync_debug_mode("warn")`` warnings). The plain ``nn.Embedding`` item
table is used (``model.embedding_backend=torch``), so nothing needs torchrec, fbgemm-gpu, MLflow
or polars: the ML-1M sequences are read from a prepared directory with pyarrow.

- max_len 200: the recipe's epoch: each training history's last 201 events (leave-one-out),
  128 users a step packed into rows of 200, shuffled with the run's seed. Needs ``--prepared``
  (``recsys-alibi prepare`` of ML-1M); without it, synthetic histories with ML-1M's user and
  item counts and a long-tailed length distribution stand in (say so in any figure).
- max_len >= 1,000: synthetic histories of exactly max_len + 1 events (uniform items), one per
  row, ``--tokens-per-step`` positions a step; the epoch figure is then the ML-1M epoch of windows
  of that length at the measured rate.

``--mode layouts``: the CPU comparisons of docs/benchmarks.md on ML-1M lengths (padded vs packed
batches, the fused loss vs a plain softmax over materialised logits, bf16 autocast).

Usage (from the repository root):

    python benchmarks/training.py --device cuda --prepared runs/ml1m/prepared --json out.json
    python benchmarks/training.py --device cpu --lengths 200 --backends sdpa --steps 2 --warmup 1
    python benchmarks/training.py --mode layouts --prepared runs/ml1m/prepared --steps 12
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from recsys_alibi.atomic import write_text_atomic
from recsys_alibi.config import ModelConfig, TrainConfig
from recsys_alibi.data.loader import FlatSequences, NextItemWindows, collate_next_item, collate_packed_next_item
from recsys_alibi.training.module import RankerModule

ML1M_USERS, ML1M_ITEMS = 6040, 3416  # SASRec preprocessing of MovieLens-1M


def train_histories(prepared: Path | None, seed: int = 0) -> tuple[FlatSequences, int, str]:
    """Leave-one-out training histories (each sequence without its last two events, users with
    >= 4 events), the catalog size N and where they came from."""
    if prepared is None:  # ML-1M-like stand-in: 6,040 users, 3,416 items, lengths 20..2,314 long-tailed
        rng = np.random.default_rng(seed)
        lengths = np.clip(rng.lognormal(np.log(95), 0.95, ML1M_USERS), 20, 2314).astype(np.int64)
        sequences = [rng.integers(1, ML1M_ITEMS + 1, n) for n in lengths]
        n_items, source = ML1M_ITEMS, "synthetic ML-1M-like histories"
    else:
        flat = FlatSequences.from_arrow(pq.read_table(prepared / "sequences.parquet", columns=["item_idx"])["item_idx"])
        sequences = [flat.get(u) for u in range(len(flat))]
        n_items, source = pq.read_metadata(prepared / "items.parquet").num_rows, str(prepared)
    kept = [s[:-2] for s in sequences if len(s) >= 4]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in kept])]).astype(np.int64)
    return FlatSequences(np.concatenate(kept).astype(np.int64), offsets), n_items, source


def epoch_batches(histories: FlatSequences, max_len: int, batch_size: int, seed: int) -> list[dict]:
    """One epoch of the recipe: last max_len + 1 events per user, ``batch_size`` users packed a step."""
    windows = NextItemWindows(histories, max_len)
    order = np.random.default_rng([seed, 0]).permutation(len(windows))
    groups = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return [collate_packed_next_item([windows[int(i)] for i in g], row_len=max_len) for g in groups]


def long_batches(max_len: int, tokens_per_step: int, n_items: int, steps: int, seed: int) -> list[dict]:
    """Synthetic full windows of max_len + 1 events, ``tokens_per_step // max_len`` rows a step."""
    rng = np.random.default_rng(seed)
    rows = max(1, tokens_per_step // max_len)
    return [collate_next_item(list(rng.integers(1, n_items + 1, (rows, max_len + 1)))) for _ in range(steps)]


def epoch_tokens(histories: FlatSequences, max_len: int) -> int:
    """Supervised positions in one epoch of windows of max_len (each history's last max_len + 1 events)."""
    return int((np.minimum(histories.lengths(), max_len + 1) - 1).clip(min=0).sum())


def recipe_module(max_len: int, backend: str, n_items: int, device: torch.device) -> RankerModule:
    """The ``configs/movielens-1m.yaml`` ranker with the plain item table, on ``device``."""
    cfg = ModelConfig(d_model=128, n_layers=2, n_heads=2, max_len=max_len, dropout=0.2,
                      attention_backend=backend, embedding_backend="torch")  # fmt: skip
    counts = torch.ones(n_items + 1, dtype=torch.int64)
    module = RankerModule(cfg, TrainConfig(loss="softmax", lr=2e-3), n_items, counts)
    module.log = lambda *args, **kwargs: None  # no trainer attached
    return module.to(device)


def make_step(module: RankerModule, device: torch.device, bf16: bool):
    """One optimiser step as Lightning runs it: autocast forward, backward, clip 1.0, AdamW, zero grad."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=2e-3, betas=(0.9, 0.98))

    def step(batch: dict) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = module.training_step(batch, 0)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_syncs(step, batch: dict, device: torch.device) -> int | None:
    """Host synchronisations in one step (CUDA only: the sync-debug warnings it raises)."""
    if device.type != "cuda":
        return None
    _sync(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    _sync(device)
    return sum("synchroniz" in str(w.message) for w in caught)


def measure(step, batches: list[dict], warmup: int, device: torch.device) -> dict:
    """Seconds per step, training tokens/s and peak memory over ``batches[warmup:]``."""
    for batch in batches[:warmup]:
        step(batch)
    timed = batches[warmup:]
    tokens = sum(b.pop("n_targets") for b in timed)
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started, cpu_started = time.perf_counter(), time.process_time()
    for batch in timed:
        loss = step(batch)
    _sync(device)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {"steps": len(timed), "tokens": tokens, "seconds_per_step": seconds / len(timed),
            "cpu_seconds_per_step": cpu_seconds / len(timed), "tokens_per_second": tokens / seconds,
            "peak_memory_mib": peak, "last_loss": float(loss)}  # fmt: skip


def _on_device(batch: dict, device: torch.device) -> dict:
    moved = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    moved["n_targets"] = int((batch["targets"] > 0).sum())  # counted on the host, before the step
    return moved


def run_backends(args) -> dict:
    device = torch.device(args.device)
    bf16 = device.type == "cuda" and not args.fp32
    histories, n_items, source = train_histories(args.prepared, args.seed)
    cases = []
    for max_len in args.lengths:
        for backend in args.backends:
            case = {"max_len": max_len, "backend": backend, "precision": "bf16-mixed" if bf16 else "32-true"}
            if backend == "flex" and device.type == "cpu":
                cases.append(case | {"skipped": "flex attention has no backward on the CPU (torch 2.13)"})
                print(cases[-1], flush=True)
                continue
            torch.manual_seed(args.seed)
            if max_len <= 1000:
                batches = epoch_batches(histories, max_len, args.batch_size, args.seed)
                batches = (batches * math.ceil((args.warmup + args.steps) / len(batches)))[: args.warmup + args.steps]
                case["data"] = source
            else:
                batches = long_batches(max_len, args.tokens_per_step, n_items, args.warmup + args.steps, args.seed)
                case["data"] = f"synthetic full windows of {max_len + 1} events"
            batches = [_on_device(b, device) for b in batches]
            case["rows_per_step"] = float(np.mean([b["inputs"].shape[0] for b in batches]))
            module = recipe_module(max_len, backend, n_items, device)
            step = make_step(module, device, bf16)
            try:
                case |= measure(step, batches, args.warmup, device)
                case["host_syncs_per_step"] = host_syncs(step, batches[-1], device)
            except Exception as err:  # noqa: BLE001 - recorded as the case's result, the others go on
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                case["error"] = f"{type(err).__name__}: {first}"[:300]
            if "tokens_per_second" in case:
                case["ml1m_epoch_tokens"] = epoch_tokens(histories, max_len)
                case["seconds_per_ml1m_epoch"] = case["ml1m_epoch_tokens"] / case["tokens_per_second"]
            cases.append(case)
            print({k: round(v, 4) if isinstance(v, float) else v for k, v in case.items()}, flush=True)
            del module, step, batches
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return {"machine": machine(device), "command": args.command, "cases": cases, "summary": summarise(cases)}


def summarise(cases: list[dict]) -> dict:
    """flex / sdpa tokens/s per max_len (where both ran)."""
    rate = {(c["max_len"], c["backend"]): c.get("tokens_per_second") for c in cases}
    lengths = sorted({c["max_len"] for c in cases})
    return {f"flex_over_sdpa@{n}": rate[(n, "flex")] / rate[(n, "sdpa")]
            for n in lengths if rate.get((n, "flex")) and rate.get((n, "sdpa"))}  # fmt: skip


def machine(device: torch.device) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "device": str(device),
            "cpu_threads": torch.get_num_threads()}  # fmt: skip
    if device.type == "cuda":
        info |= {"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda}
    return info


class PlainSoftmaxLoss(torch.nn.Module):
    """The full softmax over materialised (T, N + 1) logits: what the fused loss replaced."""

    def forward(self, hidden, targets, table):
        logits = hidden @ table.T
        logits[:, 0] = float("-inf")
        return torch.nn.functional.cross_entropy(logits, targets, ignore_index=0)


def run_layouts(args) -> dict:
    """padded vs packed, fused vs plain loss, bf16 autocast: d_model 64, sdpa, CPU (docs/benchmarks.md)."""
    device = torch.device(args.device)
    histories, n_items, _ = train_histories(args.prepared, args.seed)
    max_len = args.lengths[0]
    windows = NextItemWindows(histories, max_len)
    order = np.random.default_rng(0).permutation(len(windows))
    size = args.batch_size
    groups = [[windows[int(i)] for i in order[s * size : (s + 1) * size]] for s in range(args.steps)]
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=2, max_len=max_len, attention_backend="sdpa",
                      embedding_backend="torch")  # fmt: skip
    results = {}
    packed = lambda g: collate_packed_next_item(g, row_len=max_len)  # noqa: E731
    for name, collate, plain_loss, bf16 in (
        ("padded", collate_next_item, False, False),
        ("packed", packed, False, False),
        ("packed_plain_softmax", packed, True, False),
        ("packed_bf16_autocast", packed, False, True),
    ):
        torch.manual_seed(0)
        module = RankerModule(cfg, TrainConfig(), n_items, torch.ones(n_items + 1, dtype=torch.int64)).to(device)
        module.log = lambda *a, **k: None
        if plain_loss:
            module.loss = PlainSoftmaxLoss()
        batches = [_on_device(collate(g), device) for g in groups]
        computed = sum(b["inputs"].numel() for b in batches[2:])
        results[name] = measure(make_step(module, device, bf16), batches, 2, device)
        results[name]["padding_waste"] = 1 - results[name]["tokens"] / computed
        print(name, {k: round(v, 4) if isinstance(v, float) else v for k, v in results[name].items()}, flush=True)
    rate = {name: results[name]["tokens_per_second"] for name in ("padded", "packed", "packed_plain_softmax")}
    results["packed_speedup"] = rate["packed"] / rate["padded"]
    results["fused_loss_speedup"] = rate["packed"] / rate["packed_plain_softmax"]
    print(f"packed / padded tokens/s: {results['packed_speedup']:.2f}x")
    print(f"fused / plain softmax loss tokens/s (packed): {results['fused_loss_speedup']:.2f}x")
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["backends", "layouts"], default="backends")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--prepared", type=Path, help="prepared ML-1M directory (default: synthetic stand-in)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[200, 2048, 8192])
    parser.add_argument("--backends", nargs="+", default=["flex", "sdpa"], choices=["flex", "sdpa", "eager"])
    parser.add_argument("--batch-size", type=int, default=128, help="users per step at max_len <= 1,000 (the recipe)")
    parser.add_argument("--tokens-per-step", type=int, default=65536, help="positions per step of the long windows")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp32", action="store_true", help="no bf16 autocast on CUDA")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.command = "python benchmarks/training.py " + " ".join(argv if argv is not None else __import__("sys").argv[1:])
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision("high")  # as fit_ranker
    results = run_backends(args) if args.mode == "backends" else run_layouts(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.json, json.dumps(results, indent=2))  # whole file or nothing
    return results


if __name__ == "__main__":
    main()
