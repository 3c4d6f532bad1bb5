"""Data-parallel training throughput (1 vs 2 gloo processes) and the memory of a 10^7-item table.

Throughput: the same small config (D 64, 2 layers, 2 heads, max_len 100, global batch 64, full
softmax over 2,000 items, SDPA) trains ``--steps`` optimiser steps on a synthetic prepared
directory, launched with torchrun as 1 process (1 and 2 torch threads) and as 2 DDP processes
(gloo, 1 thread each). Each rank times its training steps (forward, backward with the DDP
all-reduce, optimiser) after ``--warmup`` untimed ones and counts its supervised tokens
(positions with a target). Reported: tokens/s per rank and for the job, and tokens per CPU
second of each rank (``time.process_time``, steadier on a shared machine). The machine this was
measured on has 2 cores: the 2 processes share them, so this shows the cost of DDP on one
machine, not multi-node scaling.

Agreement: ``--agreement`` trains the tiny config of tests/training/test_distributed_training.py
(``training_fixtures.TINY`` on ``write_walks`` data) with seeds 0..9 on 1 process and seeds 0..4 on
2 processes, and prints validation NDCG@10 of each: the spread between seeds on one process is
the scale against which the test's 1-vs-2-process tolerance is set.

Sharded: ``--sharded`` trains the same config with ``train.loss=sampled_softmax`` on 2 processes
twice, the item table replicated (DDP) and sharded row-wise (``model.shard_embeddings=true``,
torchrec), and reports the same figures for both.

Memory: ``--memory`` prints the per-rank bytes of the item table replicated (DDP: weights,
gradient, AdamW's two moments) and row-wise sharded over W ranks (weights and the fused row-wise
Adagrad state, one float per row), for N = 10^7 items.

Usage (from the repository root):

    .venv/bin/python benchmarks/scaling.py --workdir /tmp/recsys-alibi-scaling --steps 40
    .venv/bin/python benchmarks/scaling.py --sharded --workdir /tmp/recsys-alibi-sharded --steps 30
    .venv/bin/python benchmarks/scaling.py --memory
    .venv/bin/python benchmarks/scaling.py --agreement --workdir /tmp/recsys-alibi-agreement
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "training"
SETTINGS = [(1, 1), (1, 2), (2, 1)]  # (processes, torch threads per process)


def write_prepared(path: Path, users: int, items: int, max_events: int, seed: int = 0) -> Path:
    """A prepared dir of ``users`` random walks over ``items`` items (20..max_events events each)."""
    import polars as pl

    from recsys_alibi.data import schema

    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, max_events + 1, users)
    steps = np.where(rng.random(lengths.sum()) < 0.5, 1, rng.integers(2, items, lengths.sum()))
    starts = np.repeat(rng.integers(0, items, users), lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    walk = np.cumsum(steps)
    walk -= np.repeat(walk[offsets[:-1]], lengths)
    flat = ((starts + walk) % items + 1).astype(np.int32)
    path.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(
        {
            schema.USER_ID: pl.Series(np.arange(users), dtype=pl.Int64),
            schema.ITEM_IDX: pl.Series([flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])], dtype=pl.List(pl.Int32)),
            schema.TIMESTAMP: pl.Series([np.arange(n) for n in lengths], dtype=pl.List(pl.Int64)),
            schema.LENGTH: pl.Series(lengths, dtype=pl.Int32),
        }
    ).write_parquet(path / schema.SEQUENCES_FILE)
    pl.DataFrame(
        {
            schema.ITEM_IDX: pl.Series(np.arange(1, items + 1), dtype=pl.Int32),
            schema.ITEM_ID: pl.Series(np.arange(1, items + 1), dtype=pl.Int64),
            schema.COUNT: pl.Series(np.bincount(flat, minlength=items + 1)[1:], dtype=pl.Int64),
        }
    ).write_parquet(path / schema.ITEMS_FILE)
    return path


def worker(args: argparse.Namespace) -> None:
    """One rank (started by torchrun): train ``args.steps`` steps and write its timing JSON."""
    import lightning as L
    import torch

    from recsys_alibi.config import load_config
    from recsys_alibi.training.datamodule import SequenceDataModule
    from recsys_alibi.training.module import RankerModule

    torch.set_num_threads(args.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    config = load_config(None, [
        f"model.d_model={args.d_model}", f"model.n_layers={args.layers}", "model.n_heads=2",
        f"model.max_len={args.max_len}", "model.attention_backend=sdpa", f"train.batch_size={args.batch}",
        "train.warmup_steps=5", "train.max_epochs=1", f"train.loss={args.loss}",
        f"model.shard_embeddings={str(args.shard).lower()}",
    ])  # fmt: skip

    class Timer(L.Callback):
        def __init__(self) -> None:
            self.seconds, self.cpu_seconds, self.tokens, self.steps = 0.0, 0.0, 0, 0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.started, self.cpu_started = time.perf_counter(), time.process_time()
            self.batch_tokens = int((batch["targets"] > 0).sum())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx >= args.warmup:
                self.seconds += time.perf_counter() - self.started
                self.cpu_seconds += time.process_time() - self.cpu_started
                self.tokens += self.batch_tokens
                self.steps += 1

    L.seed_everything(0, verbose=False)
    datamodule = SequenceDataModule(args.prepared, config.model, config.train, config.seed)
    module = RankerModule(config.model, config.train, datamodule.n_items, seed=config.seed)
    timer = Timer()
    trainer = L.Trainer(
        accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto", max_epochs=1,
        limit_train_batches=args.steps + args.warmup, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        use_distributed_sampler=False, callbacks=[timer],
    )  # fmt: skip
    trainer.fit(module, datamodule=datamodule)
    out = {"rank": trainer.global_rank, "world": world, "threads": args.threads, "steps": timer.steps,
           "seconds": timer.seconds, "cpu_seconds": timer.cpu_seconds, "tokens": timer.tokens,
           "per_rank_batch": datamodule.per_rank_batch_size()}  # fmt: skip
    Path(args.result).with_suffix(f".rank{trainer.global_rank}.json").write_text(json.dumps(out))


def run_setting(args: argparse.Namespace, prepared: Path, world: int, threads: int, shard: bool = False) -> dict:
    """Launch one setting with torchrun and summarise its ranks."""
    result = Path(args.workdir) / f"result-w{world}-t{threads}{'-sharded' if shard else ''}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
           __file__, "--worker", "--prepared", str(prepared), "--result", str(result), "--threads", str(threads),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--d-model", str(args.d_model),
           "--layers", str(args.layers), "--max-len", str(args.max_len), "--batch", str(args.batch),
           "--loss", args.loss, *(["--shard"] if shard else [])]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    ranks = [json.loads(result.with_suffix(f".rank{r}.json").read_text()) for r in range(world)]
    per_rank = [r["tokens"] / r["seconds"] for r in ranks]
    return {
        "processes": world, "threads_per_process": threads, "sharded_table": shard, "loss": args.loss,
        "per_rank_batch": ranks[0]["per_rank_batch"],
        "steps": ranks[0]["steps"], "seconds_per_step": float(np.mean([r["seconds"] / r["steps"] for r in ranks])),
        "tokens_per_s_per_rank": float(np.mean(per_rank)), "tokens_per_s_job": float(sum(per_rank)),
        "tokens_per_cpu_s_per_rank": float(np.mean([r["tokens"] / r["cpu_seconds"] for r in ranks])),
    }  # fmt: skip


def _fixtures():
    """``tests/training/training_fixtures.py`` (the tiny config and data of the tests)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("training_fixtures", FIXTURES / "training_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fit_worker(args: argparse.Namespace) -> None:
    """One rank of an agreement run: ``fit_ranker`` on the tiny config, metrics to JSON (rank 0)."""
    import torch

    from recsys_alibi.training.datamodule import SequenceDataModule
    from recsys_alibi.training.fit import fit_ranker

    torch.set_num_threads(1)
    fx = _fixtures()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ddp = [f"train.devices={world}", "train.strategy=ddp", "train.accelerator=cpu"] if world > 1 else []
    config = fx.tiny_config(Path(args.result), f"seed={args.seed}", *ddp)
    datamodule = SequenceDataModule(args.prepared, config.model, config.train, config.seed)
    fit = fit_ranker(config, datamodule, Path(args.result) / "checkpoints", progress=False)
    if fit.is_global_zero:
        Path(args.result).with_suffix(".json").write_text(json.dumps(fit.val_metrics))


def agreement(args: argparse.Namespace) -> dict:
    """Validation NDCG@10 of the tiny config: seeds 0..9 on 1 process, 0..4 on 2 processes."""
    prepared = _fixtures().write_walks(Path(args.workdir) / "walks")
    out: dict[str, list[float]] = {"1": [], "2": []}
    for world, seeds in ((1, range(10)), (2, range(5))):
        for seed in seeds:
            result = Path(args.workdir) / f"fit-w{world}-s{seed}"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
                   __file__, "--fit-worker", "--prepared", str(prepared), "--result", str(result),
                   "--seed", str(seed)]  # fmt: skip
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
            subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            out[str(world)].append(json.loads(result.with_suffix(".json").read_text())["val/ndcg_at_10"])
    one = np.array(out["1"])
    return {"ndcg_at_10": out, "one_process_spread": float(one.max() - one.min()),
            "one_process_std": float(one.std(ddof=1)),
            "two_minus_one_same_seed": [b - a for a, b in zip(out["1"], out["2"])]}  # fmt: skip


def memory_table(n_items: int = 10**7, widths=(64, 128), worlds=(1, 8, 64)) -> list[dict]:
    """Per-rank GiB of an (N, D) fp32 item table: replicated (DDP) and row-wise sharded.

    Replicated: weights + dense gradient + AdamW's 2 moments = 4 copies on every rank.
    Row-wise sharded (torchrec, fused row-wise Adagrad: no gradient tensor, one float of
    optimizer state per row): N / W rows of D + 1 floats.
    """
    rows = []
    for d in widths:
        table = n_items * d * 4
        for w in worlds:
            rows.append({"D": d, "W": w, "table_GiB": table / 2**30, "replicated_GiB": 4 * table / 2**30,
                         "sharded_GiB": n_items * (d + 1) * 4 / w / 2**30})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/recsys-alibi-scaling")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--users", type=int, default=4000)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--max-events", type=int, default=200)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--max-len", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--memory", action="store_true", help="print the memory table only")
    parser.add_argument("--agreement", action="store_true", help="1 vs 2 processes over seeds (tiny test config)")
    parser.add_argument("--sharded", action="store_true", help="2 processes, sampled softmax: replicated vs sharded")
    parser.add_argument("--loss", default="softmax", help=argparse.SUPPRESS)
    parser.add_argument("--shard", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fit-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--prepared", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    if args.fit_worker:
        fit_worker(args)
        return
    if args.agreement:
        print(json.dumps(agreement(args), indent=1))
        return
    if args.memory:
        print(json.dumps(memory_table(), indent=1))
        return
    prepared = write_prepared(Path(args.workdir) / "prepared", args.users, args.items, args.max_events)
    if args.sharded:
        args.loss = "sampled_softmax"
        results = [run_setting(args, prepared, 2, 1, shard=shard) for shard in (False, True)]
    else:
        results = [run_setting(args, prepared, world, threads) for world, threads in SETTINGS]
    print(json.dumps({"load_average": os.getloadavg(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
